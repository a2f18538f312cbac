#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

SketchConfig cfg(uint64_t dim, uint32_t rows, uint32_t cols, uint64_t seed = 1,
                 Hashing h = Hashing::OnTheFly) {
  return SketchConfig{dim, rows, cols, seed, h};
}

TEST(CountSketch, Linearity) {
  const auto c = cfg(50000, 5, 3000);
  const auto a = test::gaussian(c.dim, 1), b = test::gaussian(c.dim, 2);
  std::vector<float> ab(c.dim);
  for (size_t j = 0; j < c.dim; ++j) ab[j] = a[j] + b[j];
  CountSketch sa(c), sb(c), sab(c);
  sa.accumulate(a);
  sb.accumulate(b);
  sab.accumulate(ab);
  sa += sb;
  for (size_t i = 0; i < sa.table().size(); ++i)
    ASSERT_NEAR(sa.table()[i], sab.table()[i], 1e-3f * (1 + std::fabs(sab.table()[i])));
  // Scaling: S(2a) = 2 S(a) exactly (powers of two).
  CountSketch s2(c), s1(c);
  s1.accumulate(a);
  s2.accumulate(a, 2.0f);
  for (size_t i = 0; i < s1.table().size(); ++i) ASSERT_EQ(s2.table()[i], 2 * s1.table()[i]);
}

TEST(CountSketch, SlicesEqualWhole) {
  const auto c = cfg(10000, 3, 500);
  const auto x = test::gaussian(c.dim, 4);
  CountSketch whole(c), parts(c);
  whole.accumulate(x);
  parts.accumulate(std::span(x).first(3000), 0, 1.0f);
  parts.accumulate(std::span(x).subspan(3000), 3000, 1.0f);
  for (size_t i = 0; i < whole.table().size(); ++i)
    ASSERT_NEAR(whole.table()[i], parts.table()[i], 1e-4f);
}

class PlantedHeavyHitters : public testing::TestWithParam<std::tuple<Hashing, uint32_t>> {};

TEST_P(PlantedHeavyHitters, RecoveredExactlyWithSigns) {
  // r ≥ 4: with r = 3 a coordinate that shares a heavy bucket in 2 rows (≈ 3·(100/c)²·d/2 ≈ 7 of
  // them here) has a heavy median, which is the sketch working as designed.
  const auto [mode, rows] = GetParam();
  const auto c = cfg(200000, rows, 20000, 11, mode);
  auto x = test::gaussian(c.dim, 5, 0.01f);
  const auto heavy = test::plant(x, 100, 5.0f, 6);
  CountSketch s(c);
  s.accumulate(x);
  const TopK top = s.top_k(heavy.size());
  auto got = top.indices;
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, heavy);
  for (size_t i = 0; i < top.indices.size(); ++i)
    EXPECT_NEAR(top.values[i], x[top.indices[i]], 0.1f) << top.indices[i];
  for (size_t i = 1; i < top.values.size(); ++i)
    EXPECT_GE(std::fabs(top.values[i - 1]), std::fabs(top.values[i]));
  const auto est = s.estimate(heavy);
  for (size_t i = 0; i < heavy.size(); ++i) EXPECT_NEAR(est[i], x[heavy[i]], 0.1f);
  const auto all = s.estimate_all();
  for (auto j : heavy) EXPECT_EQ(all[j], s.estimate(std::vector<uint32_t>{j})[0]);
}

INSTANTIATE_TEST_SUITE_P(Modes, PlantedHeavyHitters,
                         testing::Combine(testing::Values(Hashing::OnTheFly, Hashing::Precomputed),
                                          testing::Values(4u, 5u, 7u)));

TEST(CountSketch, OneRowIsAnUnbiasedEstimator) {
  // With r = 1 every coordinate sharing a heavy hitter's bucket looks heavy, so top-k needs r ≥ 3;
  // a single row still estimates each coordinate without bias: estimate = x_j + sign-noise.
  const auto c = cfg(50000, 1, 5000, 3);
  auto x = test::gaussian(c.dim, 5, 0.001f);
  const auto heavy = test::plant(x, 10, 5.0f, 6);
  CountSketch s(c);
  s.accumulate(x);
  const auto est = s.estimate(heavy);
  for (size_t i = 0; i < heavy.size(); ++i)
    EXPECT_NEAR(std::fabs(est[i]), std::fabs(x[heavy[i]]), 0.2f);
}

TEST(CountSketch, PrecomputedAndOnTheFlyAgreeBitForBit) {
  const auto x = test::gaussian(123457, 8);
  CountSketch a(cfg(x.size(), 5, 4099, 3, Hashing::OnTheFly));
  CountSketch b(cfg(x.size(), 5, 4099, 3, Hashing::Precomputed));
  a.accumulate(x);
  b.accumulate(x);
  ASSERT_TRUE(std::equal(a.table().begin(), a.table().end(), b.table().begin()));
  EXPECT_EQ(a.estimate_all(), b.estimate_all());
  const auto ta = a.top_k(1000), tb = b.top_k(1000);
  EXPECT_EQ(ta.indices, tb.indices);
  EXPECT_EQ(ta.values, tb.values);
  a += b;  // different modes, same hashes: mergeable
}

TEST(CountSketch, L2EstimateAccurateOverSeeds) {
  // Each row's sum of squares is an unbiased estimate of ‖x‖² with variance ≤ 2‖x‖⁴/c; the median
  // of 5 rows is within 10 % for c = 2000 in the vast majority of seeds. Fixed seeds:
  // deterministic.
  const auto x = test::gaussian(100000, 9);
  double norm = 0;
  for (float v : x) norm += double(v) * v;
  norm = std::sqrt(norm);
  int within = 0;
  double mean_ratio = 0;
  const int seeds = 200;
  for (int s = 0; s < seeds; ++s) {
    CountSketch sk(cfg(x.size(), 5, 2000, uint64_t(s)));
    sk.accumulate(x);
    const double r = sk.l2_estimate() / norm;
    within += std::fabs(r - 1) < 0.1;
    mean_ratio += r;
  }
  EXPECT_GE(within, seeds * 95 / 100);
  EXPECT_NEAR(mean_ratio / seeds, 1.0, 0.02);
}

TEST(CountSketch, SerializeRoundTripAndCorruption) {
  const auto c = cfg(3000, 3, 101, 77, Hashing::Precomputed);
  CountSketch s(c);
  s.accumulate(test::gaussian(c.dim, 10));
  const Bytes bytes = s.serialize();
  const CountSketch back = CountSketch::deserialize(bytes);
  EXPECT_TRUE(back.config().compatible(c));
  EXPECT_EQ(back.config().hashing, Hashing::Precomputed);
  EXPECT_TRUE(std::equal(s.table().begin(), s.table().end(), back.table().begin()));
  EXPECT_EQ(back.top_k(10).indices, s.top_k(10).indices);

  for (size_t cut : {size_t(0), size_t(3), size_t(20), bytes.size() - 1})
    EXPECT_THROW(CountSketch::deserialize(std::span(bytes).first(cut)), WireError) << cut;
  Bytes longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(CountSketch::deserialize(longer), WireError);
  for (size_t pos : {size_t(0), size_t(5), size_t(17), size_t(40), bytes.size() - 2}) {
    Bytes bad = bytes;
    bad[pos] ^= 0x10;
    EXPECT_THROW(CountSketch::deserialize(bad), WireError) << pos;
  }
}

TEST(CountSketch, ZeroBucketsClearsExactlyTheCellsOfThoseCoordinates) {
  const SketchConfig cfg{5000, 5, 300, 9};
  CountSketch s(cfg);
  s.accumulate(test::gaussian(cfg.dim, 4));
  const std::vector<uint32_t> hit = {3, 777, 4999};
  s.zero_buckets(hit);
  for (float v : s.estimate(hit)) EXPECT_EQ(v, 0.0f);
  // Every cell zeroed is a bucket of one of those coordinates; the rest is untouched.
  CountSketch marks(cfg);
  std::vector<float> ind(cfg.dim, 0.0f);
  for (uint32_t j : hit) ind[j] = 1.0f;
  marks.accumulate(ind);
  CountSketch fresh(cfg);
  fresh.accumulate(test::gaussian(cfg.dim, 4));
  size_t zeroed = 0;
  for (size_t c = 0; c < s.table().size(); ++c) {
    if (marks.table()[c] != 0.0f) {
      EXPECT_EQ(s.table()[c], 0.0f);
      ++zeroed;
    } else {
      EXPECT_EQ(s.table()[c], fresh.table()[c]);
    }
  }
  EXPECT_GE(zeroed, 5u);
  const std::vector<uint32_t> bad = {5000};
  EXPECT_THROW(s.zero_buckets(bad), InvalidArgument);
  EXPECT_THROW(s.scale(std::numeric_limits<float>::infinity()), InvalidArgument);
}

// FetchSGD's selection: the top-k in index order with their buckets zeroed here and in the
// other sketches, exactly what top_k then zero_buckets on each gives.
TEST(CountSketch, ExtractTopKEqualsTopKThenZeroBuckets) {
  for (const SketchConfig c : {SketchConfig{20000, 1, 3000, 5, Hashing::Blocked},
                               SketchConfig{20000, 5, 900, 6, Hashing::OnTheFly}}) {
    auto x = test::gaussian(c.dim, 8);
    test::plant(x, 40, 20.0f, 9);
    CountSketch error(c), momentum(c);
    error.accumulate(x);
    momentum.accumulate(test::gaussian(c.dim, 10));
    CountSketch error2 = error.to(Device::cpu()), momentum2 = momentum.to(Device::cpu());
    const TopK want = error2.top_k(60, TopKOrder::Index);
    momentum2.zero_buckets(want.indices);
    error2.zero_buckets(want.indices);
    CountSketch* also[] = {&momentum};
    const TopK got = error.extract_top_k(60, also);
    EXPECT_EQ(got.indices, want.indices);
    EXPECT_EQ(got.values, want.values);
    EXPECT_TRUE(std::equal(error.table().begin(), error.table().end(), error2.table().begin()));
    EXPECT_TRUE(
        std::equal(momentum.table().begin(), momentum.table().end(), momentum2.table().begin()));
    // Another shape, the sketch itself, or k past dim: refused, nothing changed.
    CountSketch other(SketchConfig{c.dim, c.rows, c.cols + 1, c.seed, c.hashing});
    CountSketch* bad[] = {&other};
    CountSketch* self[] = {&error};
    const auto before = std::vector<float>(error.table().begin(), error.table().end());
    EXPECT_THROW(error.extract_top_k(5, bad), InvalidArgument);
    EXPECT_THROW(error.extract_top_k(5, self), InvalidArgument);
    EXPECT_THROW(error.extract_top_k(c.dim + 1), InvalidArgument);
    EXPECT_TRUE(std::equal(before.begin(), before.end(), error.table().begin()));
  }
}

TEST(CountSketch, BadInput) {
  EXPECT_THROW(CountSketch(cfg(0, 5, 10)), InvalidArgument);
  EXPECT_THROW(CountSketch(cfg(1ull << 32, 5, 10)), InvalidArgument);
  EXPECT_THROW(CountSketch(cfg(10, 0, 10)), InvalidArgument);
  EXPECT_THROW(CountSketch(cfg(10, 33, 10)), InvalidArgument);
  EXPECT_THROW(CountSketch(cfg(10, 5, 0)), InvalidArgument);
  EXPECT_THROW(CountSketch(cfg(10, 16, 1u << 31)), InvalidArgument);  // table too large
  CountSketch s(cfg(100, 3, 10));
  const std::vector<float> short_vec(99, 1.0f);
  EXPECT_THROW(s.accumulate(short_vec), InvalidArgument);
  const std::vector<float> slice(10, 1.0f);
  EXPECT_THROW(s.accumulate(slice, 95, 1.0f), InvalidArgument);
  EXPECT_THROW(s.top_k(101), InvalidArgument);
  EXPECT_THROW(s.estimate(std::vector<uint32_t>{100}), InvalidArgument);
  CountSketch other(cfg(100, 3, 10, 2));
  EXPECT_THROW(s += other, ConfigMismatch);
  CountSketch wider(cfg(100, 3, 11));
  EXPECT_THROW(s += wider, ConfigMismatch);
  EXPECT_THROW(s.add_table(std::vector<float>(29)), ConfigMismatch);
}

TEST(CountSketch, NonFiniteRejectedAndStateKept) {
  const auto c = cfg(20000, 5, 1000);
  const auto x = test::gaussian(c.dim, 12);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto y = test::gaussian(c.dim, 13);
    y[15000] = bad;  // past several blocks: the partial sum must be undone
    CountSketch empty(c);
    EXPECT_THROW(empty.accumulate(y), NonFiniteError);
    EXPECT_TRUE(
        std::all_of(empty.table().begin(), empty.table().end(), [](float v) { return v == 0; }));
    CountSketch full(c);
    full.accumulate(x);
    const std::vector<float> before(full.table().begin(), full.table().end());
    try {
      full.accumulate(y);
      FAIL() << "no throw";
    } catch (const NonFiniteError& e) {
      EXPECT_NE(std::string(e.what()).find("15000"), std::string::npos) << e.what();
    }
    for (size_t i = 0; i < before.size(); ++i) ASSERT_NEAR(full.table()[i], before[i], 1e-4f);
  }
}

}  // namespace
}  // namespace sketchsgd
