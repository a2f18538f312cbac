// In-process simulation: W workers + aggregator train logistic regression with every codec.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

struct Case {
  const char* spec;
  float lr;
};

class Training : public testing::TestWithParam<Case> {};

TEST_P(Training, LogisticRegressionConverges) {
  const size_t dim = 2000, per_worker = 200;
  const uint32_t world = 4;
  const Data data = make_data(dim, per_worker * world, 42);
  test::Job job(GetParam().spec, dim, world);
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
      for (size_t j = 0; j < dim; ++j) models[w][j] -= GetParam().lr * steps[w][j];
  }
  for (uint32_t w = 1; w < world; ++w) ASSERT_EQ(models[w], models[0]) << "workers diverged";
  const double final_loss = loss_grad(data, models[0], 0, data.n, nullptr);
  int correct = 0;
  for (size_t i = 0; i < data.n; ++i) {
    double m = 0;
    for (size_t j = 0; j < dim; ++j) m += double(data.x[i * dim + j]) * models[0][j];
    correct += (m > 0) == (data.y[i] > 0);
  }
  EXPECT_LT(final_loss, 0.6 * initial) << GetParam().spec;
  EXPECT_GT(double(correct) / data.n, 0.85) << GetParam().spec;
}

INSTANTIATE_TEST_SUITE_P(
    EveryCodec, Training,
    testing::Values(
        Case{"dense", 2.0f}, Case{"topk:k=100", 2.0f}, Case{"topk:k=100,global=1", 2.0f},
        Case{"terngrad", 1.0f}, Case{"terngrad:clip=2.5,chunk=500", 1.0f}, Case{"signsgd", 0.002f},
        Case{"signsgd:ef=1", 1.0f}, Case{"sketch:rows=5,cols=1000,k=100,momentum=0.5", 1.0f},
        Case{"sketch:rows=5,cols=500,k=100,p2=3,momentum=0.5,hashing=1", 1.0f},
        Case{"sketch:rows=5,cols=1000,k=100,momentum=0.5,fetch=1", 1.0f},
        Case{"sketch:rows=5,cols=1000,k=100,momentum=0.5,hashing=random", 1.0f},
        Case{"sketch:rows=5,cols=1000,k=100,momentum=0.5,fetch=1,hashing=random", 1.0f},
        Case{"powersgd:rank=2,layout=40x45+200", 2.0f},
        Case{"topk:k=100,index=delta,wire=fp16", 2.0f},
        Case{"powersgd:rank=1,ef=0,warm=0,layout=40x45+200", 2.0f},
        // Optional layouts: biases whole beside the sketch, scales per tensor.
        Case{"sketch:rows=5,cols=1000,k=100,momentum=0.5,layout=40x45+200", 1.0f},
        Case{"sketch:rows=5,cols=1000,k=100,fetch=1,layout=40x45+200", 1.0f},
        Case{"signsgd:ef=1,layout=40x45+200", 1.0f}, Case{"terngrad:layout=40x45+200", 1.0f},
        Case{"qsgd", 1.0f}, Case{"qsgd:bits=2,bucket=128", 1.0f}, Case{"qsgd:bits=4,ef=1", 1.0f},
        Case{"qsgd:bits=8,norm=max,layout=40x45+200", 1.0f},
        Case{"sparseloco:chunk=100,k=10,decay=1", 2.0f},
        Case{"sparseloco:chunk=200,k=10,bits=4", 2.0f}),
    [](const testing::TestParamInfo<Case>& info) {
      std::string name;
      for (const char* c = info.param.spec; *c; ++c) name += std::isalnum(*c) ? *c : '_';
      return name;
    });

}  // namespace
}  // namespace sketchsgd
