// In-process simulation: W workers + aggregator train logistic regression with every codec.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <sketchsgd/compress/registry.hpp>
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

struct Data {
  size_t dim, n;
  std::vector<float> x;  // n × dim
  std::vector<float> y;  // ±1
};

/// Linearly separable-ish data from a sparse true weight vector (a few heavy coordinates, as
/// gradients of real models have).
Data make_data(size_t dim, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(dim, 0.0f);
  for (size_t j = 0; j < dim; j += 37) w[j] = nd(rng) * 3;
  Data d{dim, n, std::vector<float>(n * dim), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    double dot = 0;
    for (size_t j = 0; j < dim; ++j) {
      const float v = nd(rng) / std::sqrt(float(dim) / 37);
      d.x[i * dim + j] = v;
      dot += v * w[j];
    }
    d.y[i] = dot + 0.1 * nd(rng) > 0 ? 1.0f : -1.0f;
  }
  return d;
}

/// Mean logistic loss and its gradient over rows [lo, hi).
double loss_grad(const Data& d, const std::vector<float>& w, size_t lo, size_t hi,
                 std::vector<float>* g) {
  if (g) std::fill(g->begin(), g->end(), 0.0f);
  double loss = 0;
  for (size_t i = lo; i < hi; ++i) {
    const float* xi = &d.x[i * d.dim];
    double m = 0;
    for (size_t j = 0; j < d.dim; ++j) m += double(xi[j]) * w[j];
    m *= d.y[i];
    loss += std::log1p(std::exp(-m));
    if (g) {
      const float coef = float(-d.y[i] / (1 + std::exp(m)) / double(hi - lo));
      for (size_t j = 0; j < d.dim; ++j) (*g)[j] += coef * xi[j];
    }
  }
  return loss / double(hi - lo);
}

class Training : public testing::TestWithParam<CodecExample> {};

TEST_P(Training, LogisticRegressionConverges) {
  const size_t dim = 2000, per_worker = 200;
  const uint32_t world = 4;
  const Data data = make_data(dim, per_worker * world, 42);
  const CodecExample& x = GetParam();
  test::Job job(x.train.empty() ? x.spec : x.spec + "," + x.train, dim, world);
  std::vector<std::vector<float>> models(world, std::vector<float>(dim, 0.0f));
  const double initial = loss_grad(data, models[0], 0, data.n, nullptr);
  std::vector<std::vector<float>> g(world, std::vector<float>(dim));
  for (int step = 0; step < 300; ++step) {
    for (uint32_t w = 0; w < world; ++w) {
      const size_t lo = w * per_worker + (step % 4) * 50;  // minibatch of 50 from the shard
      loss_grad(data, models[w], lo, lo + 50, &g[w]);
    }
    const auto steps = job.round(g, uint64_t(step));
    for (uint32_t w = 0; w < world; ++w)
      for (size_t j = 0; j < dim; ++j) models[w][j] -= x.lr * steps[w][j];
  }
  for (uint32_t w = 1; w < world; ++w) ASSERT_EQ(models[w], models[0]) << "workers diverged";
  const double final_loss = loss_grad(data, models[0], 0, data.n, nullptr);
  int correct = 0;
  for (size_t i = 0; i < data.n; ++i) {
    double m = 0;
    for (size_t j = 0; j < dim; ++j) m += double(data.x[i * dim + j]) * models[0][j];
    correct += (m > 0) == (data.y[i] > 0);
  }
  EXPECT_LT(final_loss, 0.6 * initial) << x.spec;
  EXPECT_GT(double(correct) / data.n, 0.85) << x.spec;
}

// Every registered example, with the layout for the codecs that take one: a new codec is trained
// here as soon as it registers.
INSTANTIATE_TEST_SUITE_P(EveryCodec, Training,
                         testing::ValuesIn(example_cases(Layout::parse("40x45+200"))),
                         [](const testing::TestParamInfo<CodecExample>& info) {
                           std::string name;
                           for (const char c : info.param.spec) name += std::isalnum(c) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace sketchsgd
