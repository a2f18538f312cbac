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

TEST(Dense, HalfPrecisionOnTheWireHalvesTheBytesAndRoundsTheMeanOnce) {
  const auto g = test::grads(3, 1000, 2);
  for (const char* spec : {"dense:wire=fp16", "dense:wire=bf16"}) {
    test::Job job(spec, 1000, 3);
    const auto steps = job.round(g, 0);
    // Each worker's value (relative error ≤ eps) and the mean are rounded once.
    const float eps =
        std::string(spec).find("bf16") != std::string::npos ? 1.0f / 256 : 1.0f / 2048;
    for (size_t j = 0; j < 1000; ++j) {
      const float mean = ((g[0][j] + g[1][j]) + g[2][j]) / 3;
      const float size = (std::abs(g[0][j]) + std::abs(g[1][j]) + std::abs(g[2][j])) / 3;
      EXPECT_NEAR(steps[0][j], mean, eps * (size + std::abs(mean)) + 1e-7f) << spec << " " << j;
    }
    EXPECT_EQ(steps[0], steps[2]);
    EXPECT_NEAR(job.workers[0]->compression_ratio(), 4000.0 / 2048.0, 0.01) << spec;
  }
}

}  // namespace
}  // namespace sketchsgd
