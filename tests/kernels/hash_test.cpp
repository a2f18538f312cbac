#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include <sketchsgd/kernels/hash.hpp>

namespace sketchsgd {
namespace {

TEST(Hash, BucketInRangeAndSignsBalanced) {
  const uint32_t cols = 1000;
  const auto h = hash::row_hash(7, 0);
  std::vector<uint32_t> counts(cols, 0);
  int negative = 0;
  const int n = 1000000;
  for (int j = 0; j < n; ++j) {
    const uint32_t p = hash::locate(h, uint32_t(j), cols);
    ASSERT_LT(hash::bucket_of(p), cols);
    ++counts[hash::bucket_of(p)];
    negative += (p & hash::kSignBit) ? 1 : 0;
  }
  // Chi-square of bucket counts against uniform must not exceed a truly random assignment's
  // (mean cols − 1 = 999, sd ≈ 44.7; 6 sd margin). Consecutive keys under a linear hash spread
  // more evenly than random, so there is no lower bound.
  double chi2 = 0;
  const double expect = double(n) / cols;
  for (auto c : counts) chi2 += (c - expect) * (c - expect) / expect;
  EXPECT_LT(chi2, 999 + 6 * 44.7);
  // Random keys: the chi-square then behaves as for a random assignment.
  std::fill(counts.begin(), counts.end(), 0);
  for (int j = 0; j < n; ++j)
    ++counts[hash::bucket_of(hash::locate(h, uint32_t(hash::splitmix64(uint64_t(j))), cols))];
  chi2 = 0;
  for (auto c : counts) chi2 += (c - expect) * (c - expect) / expect;
  EXPECT_NEAR(chi2, 999, 6 * 44.7);
  EXPECT_NEAR(double(negative) / n, 0.5, 0.005);  // 5 sd of a fair coin over 1e6 draws
}

TEST(Hash, PairCollisionRateIsOneOverCols) {
  // Pairwise independence: for fixed j ≠ j', P[h(j) = h(j')] = 1/c over the choice of seed.
  const uint32_t cols = 64;
  int hits = 0;
  const int trials = 200000;
  for (int s = 0; s < trials; ++s) {
    const auto h = hash::row_hash(uint64_t(s), 0);
    hits += hash::bucket_of(hash::locate(h, 12345, cols)) ==
            hash::bucket_of(hash::locate(h, 12346, cols));
  }
  const double p = 1.0 / cols, sd = std::sqrt(p * (1 - p) / trials);
  EXPECT_NEAR(double(hits) / trials, p, 6 * sd);
}

TEST(Hash, RowsAndSeedsDiffer) {
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (uint64_t seed : {0ull, 1ull, 2ull, 0xFFFFFFFFull})
    for (uint32_t r = 0; r < 32; ++r) {
      const auto h = hash::row_hash(seed, r);
      EXPECT_TRUE(seen.insert({h.a, h.b}).second) << "seed " << seed << " row " << r;
    }
}

TEST(Hash, PrecomputedTableMatchesOnTheFly) {
  kernels::SketchLayout s{100000, 5, 777, 99, nullptr};
  std::vector<uint32_t> packed(s.rows * s.dim);
  kernels::cpu::precompute_hashes(s, packed.data());
  for (uint32_t r = 0; r < s.rows; ++r) {
    const auto h = hash::row_hash(s.seed, r);
    for (uint32_t j = 0; j < s.dim; ++j)
      ASSERT_EQ(packed[r * s.dim + j], hash::locate(h, j, s.cols)) << r << "," << j;
  }
}

TEST(Hash, SameInAnotherProcess) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(len, 0);
  exe[len] = 0;
  const std::string cmd = std::string(exe) + " --dump-hashes 424242 3 5000 2000";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  for (uint32_t r = 0; r < 3; ++r)
    for (uint32_t j = 0; j < 2000; ++j) {
      unsigned v = 0;
      ASSERT_EQ(std::fscanf(p, "%u", &v), 1);
      ASSERT_EQ(v, hash::locate(hash::row_hash(424242, r), j, 5000));
    }
  EXPECT_EQ(pclose(p), 0);
}

TEST(Elementwise, MedianOddAndEven) {
  float a[] = {5, 1, 3};
  EXPECT_EQ(elem::median_inplace(a, 3), 3.0f);
  float b[] = {4, -1, 10, 2};
  EXPECT_EQ(elem::median_inplace(b, 4), 3.0f);  // mean of the middle two, not the lower (2)
  float c[] = {-7};
  EXPECT_EQ(elem::median_inplace(c, 1), -7.0f);
}

TEST(Elementwise, PhiloxKnownAnswer) {
  // Known-answer vectors published with Random123 (philox4x32, 10 rounds).
  auto z = elem::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
  auto f = elem::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(f.v[0], 0x408f276du);
  EXPECT_EQ(f.v[1], 0x41c83b0eu);
  EXPECT_EQ(f.v[2], 0xa20bc7c6u);
  EXPECT_EQ(f.v[3], 0x6d5451fdu);
}

TEST(Elementwise, TernaryRoundingProbabilities) {
  // P(nonzero) = |g|/s; sign kept; saturates beyond s.
  EXPECT_EQ(elem::ternary_round(0.5f, 1.0f, 0.49f), elem::kTernPlus);
  EXPECT_EQ(elem::ternary_round(0.5f, 1.0f, 0.51f), elem::kTernZero);
  EXPECT_EQ(elem::ternary_round(-0.5f, 1.0f, 0.2f), elem::kTernMinus);
  EXPECT_EQ(elem::ternary_round(-3.0f, 1.0f, 0.999f), elem::kTernMinus);
  EXPECT_EQ(elem::ternary_round(0.0f, 1.0f, 0.0f), elem::kTernZero);
}

}  // namespace
}  // namespace sketchsgd
