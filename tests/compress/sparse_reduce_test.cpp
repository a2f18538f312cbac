// The sparse all-reduce's parts (compress/sparse_reduce.hpp): ranges, the owners' means against
// the all-gather's, the one threshold, what error feedback takes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/sparse_reduce.hpp>
#include <sketchsgd/core/error.hpp>
#include "compress/payload.hpp"
#include "compress/sparse_sum.hpp"

namespace sketchsgd {
namespace {

using sparse::Sparse;

/// A list of n distinct indices below dim (increasing), values of mixed sign and magnitude.
Sparse random_list(uint64_t dim, size_t n, std::mt19937& rng) {
  std::set<uint32_t> at;
  std::uniform_int_distribution<uint32_t> pick(0, uint32_t(dim - 1));
  while (at.size() < n) at.insert(pick(rng));
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-6.0f, 2.0f);
  Sparse s;
  for (uint32_t i : at) {
    s.indices.push_back(i);
    s.values.push_back(value(rng) * std::exp2(scale(rng)));
  }
  return s;
}

/// The whole reduce as W ranks run it, in one place: each rank's parts to their owners, the
/// owners' means, the summed counts, the kept values joined.
struct Reduced {
  Sparse update;
  std::vector<Sparse> dropped;  // per rank
  uint32_t split;
  sparse::Cut cut;
};

Reduced reduce(const std::vector<Sparse>& lists, const sparse::Ranges& ranges, uint64_t budget) {
  const uint32_t W = uint32_t(lists.size());
  std::vector<std::vector<Sparse>> parts;  // parts[s][r]: rank s's part for owner r
  for (const Sparse& l : lists) parts.push_back(sparse::split(l, ranges));
  std::vector<Sparse> means(W);
  std::vector<float> counts(sparse::kBuckets, 0.0f);
  for (uint32_t r = 0; r < W; ++r) {
    std::vector<Sparse> in;
    for (uint32_t s = 0; s < W; ++s) in.push_back(parts[s][r]);
    means[r] = sparse::mean(in, W);
    std::vector<float> mine(sparse::kBuckets, 0.0f);
    sparse::count(means[r], mine);
    for (uint32_t b = 0; b < sparse::kBuckets; ++b) counts[b] += mine[b];  // the all-reduce
  }
  Reduced out;
  out.split = sparse::split(counts, budget);
  std::vector<float> fine(sparse::kBuckets, 0.0f);
  for (const Sparse& m : means) {
    std::vector<float> mine(sparse::kBuckets, 0.0f);
    sparse::count_fine(m, out.split, mine);
    for (uint32_t b = 0; b < sparse::kBuckets; ++b) fine[b] += mine[b];  // the second all-reduce
  }
  out.cut = sparse::cut(counts, fine, out.split, budget);
  std::vector<Sparse> kept;
  for (const Sparse& m : means) kept.push_back(sparse::keep(m, out.cut));
  out.update = sparse::join(kept);
  for (const Sparse& l : lists) out.dropped.push_back(sparse::dropped(l, out.update.indices));
  return out;
}

Sparse gathered_mean(const std::vector<Sparse>& lists) {
  SparseSum sum;
  for (const Sparse& l : lists) sum.add(l.indices, l.values);
  return sum.mean(uint32_t(lists.size()));
}

void expect_bitwise(const Sparse& a, const Sparse& b) {
  ASSERT_EQ(a.indices, b.indices);
  ASSERT_EQ(a.values.size(), b.values.size());
  EXPECT_EQ(std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)), 0);
}

TEST(SparseReduce, RangesCoverTheIndexSpaceAndOwnersAgree) {
  for (uint32_t W : {1u, 3u, 8u}) {
    sparse::Ranges ranges(100, W);
    EXPECT_EQ(ranges.begin(0), 0u);
    EXPECT_EQ(ranges.end(W - 1), 100u);
    for (uint32_t i = 0; i < 100; ++i) {
      const uint32_t r = ranges.owner(i);
      EXPECT_GE(i, ranges.begin(r));
      EXPECT_LT(i, ranges.end(r));
    }
  }
  EXPECT_THROW(sparse::Ranges(10, 0), InvalidArgument);
  EXPECT_THROW(sparse::Ranges(uint64_t(1) << 33, 4), InvalidArgument);
}

/// Every owner's Profile of what the ranks' lists send it.
std::vector<sparse::Ranges::Profile> profiles(const std::vector<Sparse>& lists,
                                              const sparse::Ranges& ranges) {
  std::vector<std::vector<Sparse>> parts;
  for (const Sparse& l : lists) parts.push_back(sparse::split(l, ranges));
  std::vector<sparse::Ranges::Profile> out;
  for (uint32_t r = 0; r < ranges.world(); ++r) {
    std::vector<Sparse> in;
    for (const auto& p : parts) in.push_back(p[r]);
    out.push_back(ranges.profile(in));
  }
  return out;
}

TEST(SparseReduce, BalanceGivesEachRangeAnEvenShare) {
  // Pairs crowded into the top tenth of the space, denser at its end: even ranges would give the
  // last owner all of them.
  const uint64_t dim = 64000;
  const uint32_t W = 8;
  std::mt19937 rng(2);
  std::vector<Sparse> lists;
  for (int s = 0; s < 4; ++s) {
    Sparse hot = random_list(6400, 800, rng);
    for (uint32_t& i : hot.indices) i = uint32_t(dim - 1 - (6399 - i) * (6399 - i) / 6400);
    hot.indices.erase(std::unique(hot.indices.begin(), hot.indices.end()), hot.indices.end());
    hot.values.resize(hot.indices.size());
    lists.push_back(hot);
  }
  sparse::Ranges ranges(dim, W);
  size_t total = 0;
  for (const Sparse& l : lists) total += l.indices.size();
  auto busiest = [&] {
    std::vector<size_t> per(W, 0);
    for (const Sparse& l : lists)
      for (uint32_t i : l.indices) ++per[ranges.owner(i)];
    return double(*std::max_element(per.begin(), per.end())) / (double(total) / W);
  };
  EXPECT_EQ(busiest(), double(W));  // all in the last range
  for (int step = 0; step < 3; ++step) ranges.balance(profiles(lists, ranges));
  EXPECT_LT(busiest(), 1.3);  // within 30 % of an even share
  for (uint32_t i = 0; i < dim; i += 7) EXPECT_LT(i, ranges.end(ranges.owner(i)));
  // Nothing received: unchanged.
  sparse::Ranges same(1000, 4);
  same.balance(std::vector<sparse::Ranges::Profile>(4));
  EXPECT_EQ(same.end(0), 250u);
  EXPECT_THROW(same.balance(std::vector<sparse::Ranges::Profile>(3)), InvalidArgument);
}

TEST(SparseReduce, SplitRefusesAnIndexPastDim) {
  Sparse s{{3, 12}, {1.0f, 2.0f}};
  EXPECT_THROW(sparse::split(s, sparse::Ranges(10, 2)), InvalidArgument);
}

TEST(SparseReduce, WithinBudgetTheUpdateIsTheAllGathersBitForBit) {
  std::mt19937 rng(7);
  for (uint32_t W : {2u, 5u, 16u}) {
    std::vector<Sparse> lists;
    for (uint32_t s = 0; s < W; ++s) lists.push_back(random_list(5000, 40, rng));
    const Sparse want = gathered_mean(lists);
    sparse::Ranges ranges(5000, W);
    const Reduced got = reduce(lists, ranges, want.indices.size());
    EXPECT_EQ(got.split, sparse::kBuckets);
    expect_bitwise(got.update, want);
    for (const Sparse& d : got.dropped) EXPECT_TRUE(d.indices.empty());
    // Any ranges give the same update: the balanced ones too.
    ranges.balance(profiles(lists, ranges));
    expect_bitwise(reduce(lists, ranges, want.indices.size()).update, want);
  }
}

TEST(SparseReduce, TheCodecsAllGatherUpdateIsTheSparseReducesWithinBudget) {
  // Messages of the real codec, and the update its aggregator makes from them: the update the
  // sparse reduce makes from the same messages' lists.
  const uint32_t W = 4;
  const uint64_t dim = 3000;
  auto codec = make_compressor("topk:k=30", dim);
  auto aggregator = codec->make_aggregator(W);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<Sparse> lists;
  for (uint32_t s = 0; s < W; ++s) {
    auto worker = make_compressor("topk:k=30", dim);
    std::vector<float> grad(dim);
    for (float& v : grad) v = g(rng);
    const Message m = worker->encode(grad, 0, s);
    aggregator->add(m.bytes());
    ByteReader r(payload_of(m.bytes()));
    lists.push_back(payload::read_sparse(r, dim, 30));
  }
  const Message update = aggregator->finish();
  ByteReader r(payload_of(update.bytes()));
  const Sparse want = payload::read_sparse(r, dim, dim);
  expect_bitwise(reduce(lists, sparse::Ranges(dim, W), W * 30).update, want);
}

/// A value's place in the selection: bucket, then fine sub-bucket.
uint32_t key(float v) {
  return sparse::bucket(v) << 9 | sparse::fine(v);
}

TEST(SparseReduce, OverBudgetItKeepsTheLargestAndReturnsTheRest) {
  std::mt19937 rng(11);
  const uint32_t W = 8;
  std::vector<Sparse> lists;
  for (uint32_t s = 0; s < W; ++s) lists.push_back(random_list(4000, 60, rng));
  const Sparse all = gathered_mean(lists);
  for (uint64_t budget : {1, 60, 200}) {
    const Reduced got = reduce(lists, sparse::Ranges(4000, W), budget);
    ASSERT_LT(got.split, sparse::kBuckets);
    EXPECT_LE(got.update.indices.size(), budget);
    EXPECT_FALSE(got.update.indices.empty());
    // Kept: exactly the mean's values at or past the cut, at their all-gather value; and as
    // many as the budget allows: with the next key down the count would pass it.
    const uint32_t at = got.cut.bucket << 9 | got.cut.fine;
    size_t above = 0, next = 0;
    uint32_t below = 0;
    for (float v : all.values)
      if (key(v) >= at)
        ++above;
      else
        below = std::max(below, key(v));
    for (float v : all.values) next += key(v) == below;
    EXPECT_EQ(got.update.indices.size(), above);
    EXPECT_GT(above + next, budget);
    for (size_t i = 0, j = 0; i < got.update.indices.size(); ++i) {
      while (all.indices[j] != got.update.indices[i]) ++j;
      EXPECT_EQ(got.update.values[i], all.values[j]);
    }
    // Each rank's dropped pairs are its own the update lacks: with those it kept, its list.
    for (uint32_t s = 0; s < W; ++s) {
      size_t in_update = 0;
      for (uint32_t i : lists[s].indices)
        in_update += std::binary_search(got.update.indices.begin(), got.update.indices.end(), i);
      EXPECT_EQ(got.dropped[s].indices.size() + in_update, lists[s].indices.size());
      for (uint32_t i : got.dropped[s].indices)
        EXPECT_FALSE(std::binary_search(got.update.indices.begin(), got.update.indices.end(), i));
    }
  }
}

TEST(SparseReduce, TheCutKeepsAllThatFitsAndNeverNothing) {
  std::vector<float> counts(sparse::kBuckets, 0.0f), fine(sparse::kBuckets, 0.0f);
  EXPECT_EQ(sparse::split(counts, 10), sparse::kBuckets);  // nothing at all: everything fits
  counts[300] = 50;
  counts[200] = 5;
  EXPECT_EQ(sparse::split(counts, 55), sparse::kBuckets);
  EXPECT_EQ(sparse::split(counts, 54), 200u);
  EXPECT_EQ(sparse::split(counts, 10), 300u);
  // Bucket 200 holds 5 (fine 7: 2, fine 3: 3): 52 keeps its top sub-bucket, 51 none of it.
  fine[7] = 2;
  fine[3] = 3;
  EXPECT_EQ(sparse::cut(counts, fine, 200, 52).bucket, 200u);
  EXPECT_EQ(sparse::cut(counts, fine, 200, 52).fine, 7u);
  EXPECT_EQ(sparse::cut(counts, fine, 200, 51).bucket, 201u);
  // The top bucket past the budget: its top sub-bucket kept whole, never nothing.
  std::fill(fine.begin(), fine.end(), 0.0f);
  fine[9] = 30;
  fine[4] = 20;
  EXPECT_EQ(sparse::cut(counts, fine, 300, 10).fine, 9u);
  EXPECT_EQ(sparse::cut(counts, fine, 300, 40).fine, 9u);
  EXPECT_EQ(sparse::cut(counts, fine, 300, 50).fine, 4u);
  const auto all = sparse::cut(counts, fine, sparse::kBuckets, 10);
  EXPECT_EQ(all.bucket, 0u);
  EXPECT_EQ(all.fine, 0u);
  EXPECT_THROW(sparse::split(std::vector<float>(3), 1), InvalidArgument);
  EXPECT_THROW(sparse::cut(counts, std::vector<float>(3), 0, 1), InvalidArgument);
  EXPECT_EQ(sparse::bucket(0.0f), 0u);
  EXPECT_LT(sparse::bucket(1.0f), sparse::bucket(1.5f));
  EXPECT_EQ(sparse::bucket(-2.0f), sparse::bucket(2.0f));
  EXPECT_EQ(sparse::bucket(1.0f), sparse::bucket(1.25f));
  EXPECT_LT(sparse::fine(1.0f), sparse::fine(1.25f));
}

TEST(SparseReduce, ListsTravelAsBytesAndCorruptOnesAreRefused) {
  std::mt19937 rng(5);
  const Sparse s = random_list(10000, 100, rng);
  for (bool delta : {false, true}) {
    const Bytes b = sparse::to_bytes(s, delta, WireFloat::F32);
    expect_bitwise(sparse::from_bytes(b, 10000, 100, delta, WireFloat::F32), s);
    EXPECT_THROW(
        sparse::from_bytes(std::span(b).first(b.size() - 1), 10000, 100, delta, WireFloat::F32),
        WireError);
    EXPECT_THROW(sparse::from_bytes(b, 10000, 99, delta, WireFloat::F32), WireError);
    EXPECT_THROW(sparse::from_bytes(b, s.indices.back(), 100, delta, WireFloat::F32), WireError);
    Bytes longer = b;
    longer.push_back(0);
    EXPECT_THROW(sparse::from_bytes(longer, 10000, 100, delta, WireFloat::F32), WireError);
  }
  EXPECT_THROW(sparse::to_bytes({{1}, {1e6f}}, false, WireFloat::F16), NonFiniteError);
}

TEST(SparseReduce, JoinRefusesRangesOutOfOrder) {
  std::vector<Sparse> l{{{5}, {1.0f}}, {{3}, {1.0f}}};
  EXPECT_THROW(sparse::join(l), WireError);
}

}  // namespace
}  // namespace sketchsgd
