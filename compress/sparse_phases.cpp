#include "sparse_phases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd {

namespace {
constexpr size_t kProfileBytes = sizeof(sparse::Ranges::Profile);
constexpr uint64_t kFailed = 0;  // a length no list has: the rank's input was not finite
}  // namespace

SparsePhases::SparsePhases(SparseListCodec& codec, uint64_t dim, uint32_t world, uint32_t rank)
    : codec_(codec),
      format_(codec.list_format()),
      dim_(dim),
      world_(world),
      rank_(rank),
      ranges_(dim, world),
      // A part holds at most a rank's list; an owner keeps at most its range of the union.
      part_limit_(payload::sparse_bytes(codec.budget(), format_)),
      kept_limit_(payload::sparse_bytes(std::min<uint64_t>(dim, uint64_t(world) * codec.budget()),
                                        format_) +
                  kProfileBytes) {}

void SparsePhases::put_length(uint64_t n) {
  for (auto& b : length_) {
    b = uint8_t(n & 0xFF);
    n >>= 8;
  }
}

std::vector<uint64_t> SparsePhases::lengths_of(std::span<const std::span<const uint8_t>> lengths,
                                               uint64_t limit, const char* what) const {
  SKETCHSGD_REQUIRE(lengths.size() == world_, InvalidArgument, "round: ", lengths.size(),
                    " lengths gathered in a group of ", world_);
  std::vector<uint64_t> out(world_);
  for (uint32_t r = 0; r < world_; ++r) {
    SKETCHSGD_REQUIRE(lengths[r].size() == sizeof(length_), WireError, "rank ", r,
                      " sent a length of ", lengths[r].size(), " bytes");
    uint64_t n = 0;
    for (size_t b = sizeof(length_); b-- > 0;) n = (n << 8) | lengths[r][b];
    SKETCHSGD_REQUIRE(n <= limit, WireError, "rank ", r, " sent ", what, " of ", n,
                      " bytes (limit ", limit, ")");
    out[r] = n;
  }
  return out;
}

std::span<const uint8_t> SparsePhases::start(std::span<const uint8_t> message) {
  fault_ = nullptr;
  out_.clear();
  if (message.empty()) {
    put_length(kFailed);
    return length_;
  }
  mine_ = codec_.pairs(message);
  uint64_t longest = 0;
  for (const auto& p : sparse::split(mine_, ranges_)) {
    out_.push_back(sparse::to_bytes(p, format_.delta, format_.values));
    longest = std::max<uint64_t>(longest, out_.back().size());
  }
  put_length(longest);
  return length_;
}

std::vector<std::span<const uint8_t>> SparsePhases::parts(
    std::span<const std::span<const uint8_t>> lengths) {
  const auto n = lengths_of(lengths, part_limit_, "a part");
  for (uint32_t r = 0; r < world_; ++r)
    SKETCHSGD_REQUIRE(n[r] != kFailed, NonFiniteError, "rank ", r,
                      "'s gradient was not finite (that rank raised NonFiniteError with the "
                      "coordinate); this step has no update");
  const uint64_t longest = *std::max_element(n.begin(), n.end());
  std::vector<std::span<const uint8_t>> out;
  for (auto& p : out_) {
    p.resize(longest, 0);
    out.push_back(p);
  }
  return out;
}

void SparsePhases::receive(std::span<const std::span<const uint8_t>> received,
                           std::span<float> counts) {
  std::fill(counts.begin(), counts.end(), 0.0f);
  try {
    SKETCHSGD_REQUIRE(received.size() == world_, InvalidArgument, "round: ", received.size(),
                      " parts received in a group of ", world_);
    std::vector<payload::Sparse> parts;
    for (uint32_t s = 0; s < world_; ++s) {
      try {
        ByteReader r(received[s], "sparse reduce part");
        parts.push_back(payload::read_sparse(r, dim_, codec_.budget(), format_));
        const auto rest = received[s].subspan(received[s].size() - r.left());
        SKETCHSGD_REQUIRE(std::all_of(rest.begin(), rest.end(), [](uint8_t b) { return b == 0; }),
                          WireError, "bytes set past its list");
        const auto& idx = parts.back().indices;
        SKETCHSGD_REQUIRE(
            idx.empty() || (idx.front() >= ranges_.begin(rank_) && idx.back() < ranges_.end(rank_)),
            WireError, "pairs outside rank ", rank_, "'s range");
      } catch (const Error& e) {
        throw WireError("round: rank " + std::to_string(s) + "'s part for rank " +
                        std::to_string(rank_) + " does not decode: " + e.what());
      }
    }
    mean_ = sparse::mean(parts, world_);
    profile_ = ranges_.profile(parts);
    sparse::count(mean_, counts);
  } catch (const Error&) {
    fault_ = std::current_exception();
    std::fill(counts.begin(), counts.end(), std::numeric_limits<float>::quiet_NaN());
  }
}

void SparsePhases::counted(std::span<const float> counts, std::span<float> fine_counts) {
  if (fault_) std::rethrow_exception(fault_);
  SKETCHSGD_REQUIRE(
      std::none_of(counts.begin(), counts.end(), [](float c) { return std::isnan(c); }), WireError,
      "another rank received a part that does not decode (that rank raised "
      "WireError saying which); this step has no update");
  counts_.assign(counts.begin(), counts.end());
  split_ = sparse::split(counts, codec_.budget());
  std::fill(fine_counts.begin(), fine_counts.end(), 0.0f);
  sparse::count_fine(mean_, split_, fine_counts);
}

std::span<const uint8_t> SparsePhases::refined(std::span<const float> fine_counts) {
  const auto c = sparse::cut(counts_, fine_counts, split_, codec_.budget());
  const payload::Sparse kept = sparse::keep(mean_, c);
  Bytes b = sparse::to_bytes(kept, format_.delta, format_.values);
  const size_t at = b.size();
  b.resize(at + kProfileBytes);
  std::memcpy(b.data() + at, &profile_, kProfileBytes);
  kept_ = std::move(b);
  put_length(kept_.size());
  return length_;
}

std::span<const uint8_t> SparsePhases::padded(std::span<const std::span<const uint8_t>> lengths) {
  kept_sizes_ = lengths_of(lengths, kept_limit_, "kept values");
  for (uint64_t n : kept_sizes_)
    SKETCHSGD_REQUIRE(n >= kProfileBytes, WireError, "an owner sent kept values of ", n,
                      " bytes, shorter than their profile");
  kept_.resize(*std::max_element(kept_sizes_.begin(), kept_sizes_.end()), 0);
  return kept_;
}

payload::Sparse SparsePhases::update(std::span<const std::span<const uint8_t>> gathered) {
  SKETCHSGD_REQUIRE(gathered.size() == world_, InvalidArgument, "round: ", gathered.size(),
                    " owners' values gathered in a group of ", world_);
  std::vector<payload::Sparse> kept;
  profiles_.assign(world_, {});
  for (uint32_t r = 0; r < world_; ++r) {
    SKETCHSGD_REQUIRE(gathered[r].size() >= kept_sizes_[r], WireError, "owner ", r,
                      "'s values: ", gathered[r].size(), " bytes gathered of ", kept_sizes_[r]);
    const auto list = gathered[r].first(kept_sizes_[r] - kProfileBytes);
    std::memcpy(&profiles_[r], gathered[r].data() + list.size(), kProfileBytes);
    kept.push_back(sparse::from_bytes(list, dim_, dim_, format_.delta, format_.values));
    const auto& idx = kept.back().indices;
    SKETCHSGD_REQUIRE(
        idx.empty() || (idx.front() >= ranges_.begin(r) && idx.back() < ranges_.end(r)), WireError,
        "owner ", r, " kept values outside its range");
  }
  return sparse::join(kept);
}

void SparsePhases::settle(const payload::Sparse& update) {
  codec_.refund(sparse::dropped(mine_, update.indices));
  ranges_.balance(profiles_);
}

}  // namespace sketchsgd
