// The terngrad codec: unbiased over rounds at two bits a value, and clipping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

TEST(TernGrad, UnbiasedOverRoundsAndTwoBitsPerElement) {
  const size_t dim = 256;
  test::Job job("terngrad:chunk=64", dim, 1);
  const auto g = test::grads(1, dim, 7);
  std::vector<double> mean(dim, 0.0);
  const int rounds = 4000;
  for (int r = 0; r < rounds; ++r) {
    const auto s = job.round(g, r)[0];
    for (size_t j = 0; j < dim; ++j) mean[j] += s[j];
  }
  for (size_t c = 0; c < 4; ++c) {
    float smax = 0;
    for (size_t j = c * 64; j < c * 64 + 64; ++j) smax = std::max(smax, std::fabs(g[0][j]));
    for (size_t j = c * 64; j < c * 64 + 64; ++j) {
      const double p = std::fabs(g[0][j]) / smax, sd = smax * std::sqrt(p * (1 - p) / rounds);
      EXPECT_NEAR(mean[j] / rounds, g[0][j], 6 * sd + 1e-6) << j;
    }
  }
  EXPECT_EQ(job.workers[0]->last_message_bytes(), 48u + 4 + 4 * 4 + dim / 4);
  // Reproducible: the same seed, round and sender give the same codes.
  auto a = make_compressor("terngrad:chunk=64", dim), b = make_compressor("terngrad:chunk=64", dim);
  const auto ma = a->encode(g[0], 3, 1), mb = b->encode(g[0], 3, 1), mc = b->encode(g[0], 4, 1);
  EXPECT_TRUE(std::equal(ma.bytes().begin(), ma.bytes().end(), mb.bytes().begin()));
  EXPECT_FALSE(std::equal(ma.bytes().begin(), ma.bytes().end(), mc.bytes().begin()));
}

TEST(TernGrad, ClippingSaturates) {
  const size_t dim = 1000;
  auto g = test::gaussian(dim, 8);
  g[10] = 100.0f;  // outlier: with clip=2.5 the scaler is ~2.5σ, so the outlier saturates
  test::Job job("terngrad:clip=2.5", dim, 1);
  const auto s = job.round({g}, 0)[0];
  double sum = 0, sq = 0;
  for (float v : g) sum += v, sq += double(v) * v;
  const double sd = std::sqrt(sq / dim - (sum / dim) * (sum / dim));
  const float smax = *std::max_element(s.begin(), s.end());
  EXPECT_NEAR(smax, 2.5 * sd, 1e-4 * sd);  // the scaler is 2.5σ, far below max|g| = 100
  EXPECT_EQ(s[10], smax);                  // the saturated outlier is always sent, at +s
}

}  // namespace
}  // namespace sketchsgd
