// Seeded client sampling (kernels/sample.hpp): distinct, sorted, reproducible, uniform.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/sample.hpp>

namespace sketchsgd {
namespace {

TEST(SampleClients, DrawsDistinctClientsInOrderFromTheSeedAndRoundAlone) {
  for (uint64_t round = 0; round < 50; ++round) {
    const auto s = sample_clients(1000, 100, 7, round);
    ASSERT_EQ(s.size(), 100u);
    EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
    EXPECT_EQ(std::adjacent_find(s.begin(), s.end()), s.end()) << "a client drawn twice";
    EXPECT_LT(s.back(), 1000u);
    EXPECT_EQ(s, sample_clients(1000, 100, 7, round));
    EXPECT_NE(s, sample_clients(1000, 100, 7, round + 1));
    EXPECT_NE(s, sample_clients(1000, 100, 8, round));
  }
}

TEST(SampleClients, TakesEveryoneWhenEveryoneIsAsked) {
  const auto s = sample_clients(37, 37, 1, 3);
  for (uint32_t i = 0; i < 37; ++i) EXPECT_EQ(s[i], i);
  EXPECT_EQ(sample_clients(1, 1, 9, 9), std::vector<uint32_t>{0});
}

TEST(SampleClients, GivesEveryClientAndEveryPairTheirShare) {
  // 3 of 8 over 56,000 rounds: each client 21,000 times (sd ≈ 115), each of the 28 pairs 6,000
  // times (sd ≈ 74); six sd is a bound a correct sampler exceeds about once in 10^8 tries.
  const uint32_t n = 8, c = 3, rounds = 56000;
  std::vector<double> once(n, 0);
  std::map<std::pair<uint32_t, uint32_t>, double> pairs;
  for (uint64_t r = 0; r < rounds; ++r) {
    const auto s = sample_clients(n, c, 11, r);
    for (uint32_t i = 0; i < c; ++i) {
      ++once[s[i]];
      for (uint32_t j = i + 1; j < c; ++j) ++pairs[{s[i], s[j]}];
    }
  }
  const double each = double(rounds) * c / n, pair = rounds * (c * (c - 1.0)) / (n * (n - 1.0));
  for (double k : once) EXPECT_NEAR(k, each, 6 * std::sqrt(each * (1 - double(c) / n)));
  EXPECT_EQ(pairs.size(), n * (n - 1) / 2u);
  for (const auto& [p, k] : pairs)
    EXPECT_NEAR(k, pair, 6 * std::sqrt(pair)) << p.first << "," << p.second;
}

TEST(SampleClients, RefusesImpossibleRequests) {
  EXPECT_THROW(sample_clients(10, 0, 1, 0), InvalidArgument);
  EXPECT_THROW(sample_clients(10, 11, 1, 0), InvalidArgument);
  EXPECT_THROW(sample_clients(0, 1, 1, 0), InvalidArgument);
}

TEST(SampleClients, ScalesToLargePopulations) {
  const auto s = sample_clients(4000000000u, 1000, 5, 1);
  EXPECT_EQ(s.size(), 1000u);
  EXPECT_EQ(std::adjacent_find(s.begin(), s.end()), s.end());
  EXPECT_GT(s.back(), 2000000000u);  // the top half is reached (fails with chance 2^-1000)
}

}  // namespace
}  // namespace sketchsgd
