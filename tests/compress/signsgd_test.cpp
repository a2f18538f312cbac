// The signsgd codec: exact sign packing, the majority vote, and EF-signSGD's scaled signs.
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

TEST(SignSGD, SignPackingExactAndMajorityVote) {
  const size_t dim = 1001;
  test::Job one("signsgd", dim, 1);
  auto g = test::grads(1, dim, 4);
  g[0][7] = 0.0f;
  const auto s = one.round(g, 0)[0];
  for (size_t j = 0; j < dim; ++j) ASSERT_EQ(s[j], g[0][j] < 0 ? -1.0f : 1.0f) << j;
  EXPECT_NEAR(one.workers[0]->compression_ratio(), 4004.0 / (48 + 4 * 32), 1e-9);

  for (uint32_t world : {2u, 3u, 4u}) {
    test::Job job("signsgd", dim, world);
    const auto gw = test::grads(world, dim, 5 + world);
    const auto steps = job.round(gw, 0);
    for (size_t j = 0; j < dim; ++j) {
      int vote = 0;
      for (uint32_t w = 0; w < world; ++w) vote += gw[w][j] < 0 ? -1 : 1;
      ASSERT_EQ(steps[0][j], float(vote > 0) - float(vote < 0)) << world << " " << j;  // ties → 0
    }
  }
}

TEST(SignSGD, ErrorFeedbackScaledSigns) {
  const size_t dim = 300;
  test::Job job("signsgd:ef=1,chunk=100", dim, 2);
  const auto g = test::grads(2, dim, 6);
  const auto step = job.round(g, 0)[0];
  std::vector<float> want(dim, 0.0f);
  for (int w = 0; w < 2; ++w)
    for (size_t c = 0; c < 3; ++c) {
      double l1 = 0;
      for (size_t j = c * 100; j < c * 100 + 100; ++j) l1 += std::fabs(g[w][j]);
      for (size_t j = c * 100; j < c * 100 + 100; ++j)
        want[j] += float(l1 / 100) * (g[w][j] < 0 ? -1.0f : 1.0f) / 2;
    }
  for (size_t j = 0; j < dim; ++j) EXPECT_NEAR(step[j], want[j], 1e-5f);
  // Error feedback: with zero gradients afterwards, the sum of all steps approaches the mean
  // gradient (nothing is lost, only delayed).
  std::vector<double> total(step.begin(), step.end());
  for (int r = 1; r < 400; ++r) {
    const auto s = job.round({std::vector<float>(dim, 0.0f), std::vector<float>(dim, 0.0f)}, r)[0];
    for (size_t j = 0; j < dim; ++j) total[j] += s[j];
  }
  double err = 0, norm = 0;
  for (size_t j = 0; j < dim; ++j) {
    const double mean = (g[0][j] + g[1][j]) / 2.0;
    err += (total[j] - mean) * (total[j] - mean);
    norm += mean * mean;
  }
  EXPECT_LT(std::sqrt(err / norm), 0.1);
}

}  // namespace
}  // namespace sketchsgd
