#include <sketchsgd/compress/sparse_reduce.hpp>

#include <algorithm>
#include <cmath>

#include <sketchsgd/core/error.hpp>

#include "payload.hpp"
#include "sparse_sum.hpp"

namespace sketchsgd::sparse {

Ranges::Ranges(uint64_t dim, uint32_t world) {
  SKETCHSGD_REQUIRE(world > 0, InvalidArgument, "sparse reduce: a group of 0 ranks");
  SKETCHSGD_REQUIRE(dim <= (uint64_t(1) << 32), InvalidArgument, "sparse reduce: dim ", dim,
                    " past 32-bit indices");
  bounds_.resize(world + 1);
  for (uint32_t r = 0; r <= world; ++r) bounds_[r] = dim * r / world;
}

Ranges::Profile Ranges::profile(std::span<const Sparse> parts) const {
  std::vector<uint32_t> all;
  for (const Sparse& p : parts) all.insert(all.end(), p.indices.begin(), p.indices.end());
  std::sort(all.begin(), all.end());
  Profile out;
  out.count = uint32_t(all.size());
  if (!all.empty())
    for (int q = 0; q < 3; ++q) out.quartiles[q] = all[all.size() * (q + 1) / 4];
  return out;
}

void Ranges::balance(std::span<const Profile> profiles) {
  const uint32_t W = world();
  SKETCHSGD_REQUIRE(profiles.size() == W, InvalidArgument, "sparse reduce: ", profiles.size(),
                    " profiles for ", W, " ranges");
  // The pairs' cumulative count as a piecewise-linear function of the index: per range, points
  // at its begin, quartiles and end.
  std::vector<double> at, below;
  double total = 0;
  for (uint32_t r = 0; r < W; ++r) {
    const Profile& p = profiles[r];
    const double c = p.count;
    at.push_back(double(begin(r)));
    below.push_back(total);
    if (p.count > 0)
      for (int q = 0; q < 3; ++q) {
        const double x = std::clamp(double(p.quartiles[q]), double(begin(r)), double(end(r)));
        at.push_back(std::max(x, at.back()));
        below.push_back(total + c * (q + 1) / 4);
      }
    total += c;
  }
  at.push_back(double(dim()));
  below.push_back(total);
  if (total <= 0) return;
  std::vector<uint64_t> next(bounds_);
  size_t s = 0;
  for (uint32_t r = 1; r < W; ++r) {
    const double want = total * r / W;
    while (s + 2 < at.size() && below[s + 1] < want) ++s;
    const double span = below[s + 1] - below[s];
    const double x = span > 0 ? at[s] + (at[s + 1] - at[s]) * (want - below[s]) / span : at[s];
    next[r] = std::clamp<uint64_t>(uint64_t(std::llround(x)), next[r - 1], dim());
  }
  bounds_.swap(next);
}

uint32_t Ranges::owner(uint32_t index) const {
  // The last boundary at or below index; empty ranges (equal boundaries) skipped.
  const auto it = std::upper_bound(bounds_.begin() + 1, bounds_.end() - 1, uint64_t(index));
  return uint32_t(it - bounds_.begin() - 1);
}

std::vector<Sparse> split(const Sparse& mine, const Ranges& ranges) {
  std::vector<Sparse> parts(ranges.world());
  size_t i = 0;
  for (uint32_t r = 0; r < ranges.world(); ++r) {
    const size_t from = i;
    while (i < mine.indices.size() && mine.indices[i] < ranges.end(r)) ++i;
    parts[r].indices.assign(mine.indices.begin() + from, mine.indices.begin() + i);
    parts[r].values.assign(mine.values.begin() + from, mine.values.begin() + i);
  }
  SKETCHSGD_REQUIRE(i == mine.indices.size(), InvalidArgument, "sparse reduce: index ",
                    mine.indices.empty() ? 0 : mine.indices.back(), " past dim ", ranges.dim());
  return parts;
}

Sparse mean(std::span<const Sparse> parts, uint32_t world) {
  SparseSum sum;
  for (const Sparse& p : parts) sum.add(p.indices, p.values);
  return sum.mean(world);
}

void count(const Sparse& s, std::span<float> counts) {
  SKETCHSGD_REQUIRE(counts.size() == kBuckets, InvalidArgument, "sparse reduce: ", counts.size(),
                    " counts for ", kBuckets, " buckets");
  for (float v : s.values) counts[bucket(v)] += 1.0f;
}

uint32_t split(std::span<const float> counts, uint64_t budget) {
  SKETCHSGD_REQUIRE(counts.size() == kBuckets, InvalidArgument, "sparse reduce: ", counts.size(),
                    " counts for ", kBuckets, " buckets");
  double kept = 0;
  for (uint32_t b = kBuckets; b-- > 0;) {
    if (kept + counts[b] > double(budget)) return b;
    kept += counts[b];
  }
  return kBuckets;
}

void count_fine(const Sparse& s, uint32_t b, std::span<float> counts) {
  SKETCHSGD_REQUIRE(counts.size() == kBuckets, InvalidArgument, "sparse reduce: ", counts.size(),
                    " counts for ", kBuckets, " sub-buckets");
  for (float v : s.values)
    if (bucket(v) == b) counts[fine(v)] += 1.0f;
}

Cut cut(std::span<const float> counts, std::span<const float> fine_counts, uint32_t b,
        uint64_t budget) {
  SKETCHSGD_REQUIRE(counts.size() == kBuckets && fine_counts.size() == kBuckets, InvalidArgument,
                    "sparse reduce: ", counts.size(), " and ", fine_counts.size(), " counts for ",
                    kBuckets, " buckets");
  if (b >= kBuckets) return {};
  double kept = 0;  // the values above bucket b
  for (uint32_t a = b + 1; a < kBuckets; ++a) kept += counts[a];
  const bool above = kept > 0;
  uint32_t top = kBuckets, lowest = kBuckets;  // b's top non-empty sub-bucket, its lowest kept
  for (uint32_t f = kBuckets; f-- > 0;) {
    if (fine_counts[f] == 0) continue;
    if (top == kBuckets) top = f;
    if (kept + fine_counts[f] > double(budget)) break;
    kept += fine_counts[f];
    lowest = f;
  }
  if (lowest < kBuckets) return {b, lowest};
  if (above || top == kBuckets) return {b + 1, 0};  // none of b fits: what lies above it
  return {b, top};                                  // nothing would be kept: b's top whole
}

Sparse keep(const Sparse& s, Cut c) {
  Sparse out;
  for (size_t i = 0; i < s.indices.size(); ++i) {
    const uint32_t b = bucket(s.values[i]);
    if (b > c.bucket || (b == c.bucket && fine(s.values[i]) >= c.fine)) {
      out.indices.push_back(s.indices[i]);
      out.values.push_back(s.values[i]);
    }
  }
  return out;
}

Sparse dropped(const Sparse& mine, std::span<const uint32_t> update) {
  Sparse out;
  size_t j = 0;
  for (size_t i = 0; i < mine.indices.size(); ++i) {
    while (j < update.size() && update[j] < mine.indices[i]) ++j;
    if (j < update.size() && update[j] == mine.indices[i]) continue;
    out.indices.push_back(mine.indices[i]);
    out.values.push_back(mine.values[i]);
  }
  return out;
}

Sparse join(std::span<const Sparse> lists) {
  Sparse out;
  for (const Sparse& l : lists) {
    SKETCHSGD_REQUIRE(
        l.indices.empty() || out.indices.empty() || l.indices.front() > out.indices.back(),
        WireError, "sparse reduce: a range's values overlap the one before");
    out.indices.insert(out.indices.end(), l.indices.begin(), l.indices.end());
    out.values.insert(out.values.end(), l.values.begin(), l.values.end());
  }
  return out;
}

Bytes to_bytes(const Sparse& s, bool delta, WireFloat values) {
  Bytes out;
  ByteWriter w(out);
  payload::write_sparse(w, s.indices, s.values, {delta, values});
  return out;
}

Sparse from_bytes(std::span<const uint8_t> bytes, uint64_t dim, uint64_t max_count, bool delta,
                  WireFloat values) {
  ByteReader r(bytes, "sparse reduce list");
  Sparse s = payload::read_sparse(r, dim, max_count, {delta, values});
  r.expect_end();
  return s;
}

}  // namespace sketchsgd::sparse
