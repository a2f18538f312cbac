// The dense codec: the update is the workers' mean.
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

TEST(Dense, MeanOfWorkers) {
  test::Job job("dense", 1000, 3);
  const auto g = test::grads(3, 1000, 1);
  const auto steps = job.round(g, 0);
  for (size_t j = 0; j < 1000; ++j)
    EXPECT_FLOAT_EQ(steps[0][j], ((g[0][j] + g[1][j]) + g[2][j]) / 3);
  EXPECT_EQ(steps[0], steps[2]);
  EXPECT_NEAR(job.workers[0]->compression_ratio(), 4000.0 / 4048.0, 1e-9);
}

}  // namespace
}  // namespace sketchsgd
