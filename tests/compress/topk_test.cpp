// The topk codec: the residual stays in the error feedback, the server sums and reselects, and
// with a layout small tensors go whole and k is split per layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

TEST(TopK, ResidualIsInputMinusSent) {
  const size_t dim = 2000, k = 50;
  test::Job job("topk:k=50", dim, 1);
  const auto g = test::grads(1, dim, 2);
  const auto s1 = job.round(g, 0)[0];
  // Sent: exactly the top-k of g.
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  kernels::cpu::topk(g[0].data(), dim, k, idx.data(), val.data());
  std::vector<float> residual = g[0];
  for (size_t i = 0; i < k; ++i) {
    EXPECT_EQ(s1[idx[i]], g[0][idx[i]]);
    residual[idx[i]] = 0;
  }
  EXPECT_EQ(std::count_if(s1.begin(), s1.end(), [](float v) { return v != 0; }), long(k));
  // A zero gradient next: what is sent is the top-k of the residual.
  const auto s2 = job.round({std::vector<float>(dim, 0.0f)}, 1)[0];
  kernels::cpu::topk(residual.data(), dim, k, idx.data(), val.data());
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(s2[idx[i]], residual[idx[i]]);
  EXPECT_NEAR(job.workers[0]->compression_ratio(), 8000.0 / (48 + 4 + 8 * 50), 1e-9);
}

TEST(TopK, ServerSumsSparseAndGlobalReselects) {
  const size_t dim = 500;
  for (int global : {0, 1}) {
    test::Job job("topk:k=20,ef=0,global=" + std::to_string(global), dim, 2);
    const auto g = test::grads(2, dim, 3);
    const auto steps = job.round(g, 0);
    std::vector<float> want(dim, 0.0f);
    for (int w = 0; w < 2; ++w) {
      std::vector<uint32_t> idx(20);
      std::vector<float> val(20);
      kernels::cpu::topk(g[w].data(), dim, 20, idx.data(), val.data());
      for (int i = 0; i < 20; ++i) want[idx[i]] += val[i];
    }
    for (auto& v : want) v /= 2;
    if (global) {
      std::vector<uint32_t> idx(20);
      std::vector<float> val(20);
      kernels::cpu::topk(want.data(), dim, 20, idx.data(), val.data());
      std::vector<float> kept(dim, 0.0f);
      for (int i = 0; i < 20; ++i) kept[idx[i]] = val[i];
      want = kept;
    }
    EXPECT_EQ(steps[0], want) << global;
    EXPECT_EQ(steps[1], want);
  }
}

/// The server sums the workers' sparse vectors coordinate by coordinate, equal coordinates in the
/// order of their values' bits, so the update is the same bit for bit whatever order the
/// messages arrive in (a parameter server takes them as they come).
TEST(TopK, TheSumDoesNotDependOnArrivalOrder) {
  const size_t dim = 64, k = 40, W = 6;
  const auto g = test::grads(W, dim, 11);
  std::vector<Message> msgs;
  for (uint32_t w = 0; w < W; ++w)
    msgs.push_back(make_compressor("topk:k=40,ef=0", dim)->encode(g[w], 0, w));
  // The reference: each coordinate's sent values sorted by bits, summed in float, then / W.
  std::vector<std::vector<float>> sent(dim);
  for (size_t w = 0; w < W; ++w) {
    std::vector<uint32_t> idx(k);
    std::vector<float> val(k);
    kernels::cpu::topk(g[w].data(), dim, k, idx.data(), val.data());
    for (size_t i = 0; i < k; ++i) sent[idx[i]].push_back(val[i]);
  }
  std::vector<float> want(dim, 0.0f);
  for (size_t j = 0; j < dim; ++j) {
    std::sort(sent[j].begin(), sent[j].end(),
              [](float a, float b) { return float_bits(a) < float_bits(b); });
    float acc = 0.0f;
    for (float v : sent[j]) acc += v;
    want[j] = sent[j].empty() ? 0.0f : acc / float(W);
  }
  std::vector<uint32_t> order(W);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937 rng(5);
  auto codec = make_compressor("topk:k=40,ef=0", dim);
  for (int trial = 0; trial < 24; ++trial) {
    auto agg = codec->make_aggregator(W);
    for (uint32_t w : order) agg->add(msgs[w].bytes());
    std::vector<float> step(dim, -1.0f);
    codec->apply(agg->finish().bytes(), step);
    ASSERT_EQ(step, want) << "arrival order of trial " << trial;
    std::shuffle(order.begin(), order.end(), rng);
  }
}

/// topk with a layout: small tensors whole, k per layer adding up exactly, or global over the
/// large tensors only; without a layout, as before.
TEST(TopK, LayoutSendsSmallTensorsWholeAndSplitsKPerLayer) {
  const Layout layout({{40, 50}, {40}, {10, 40}, {10}});  // 2000 + 40 + 400 + 10
  const uint64_t dim = layout.size();
  auto g = test::gaussian(dim, 4);
  for (uint64_t j = 2040; j < 2440; ++j) g[j] *= 1e-3f;  // a quiet layer
  auto sent = [&](const std::string& spec) {
    auto c = make_compressor(spec, layout);
    auto a = c->make_aggregator(1);
    a->add(c->encode(g, 0, 0).bytes());
    std::vector<float> step(dim);
    c->apply(a->finish().bytes(), step);
    std::vector<uint32_t> idx;
    for (uint32_t j = 0; j < dim; ++j)
      if (step[j] != 0.0f) idx.push_back(j);
    return idx;
  };
  auto count = [](const std::vector<uint32_t>& idx, uint32_t lo, uint32_t hi) {
    return std::count_if(idx.begin(), idx.end(), [&](uint32_t j) { return j >= lo && j < hi; });
  };
  const auto layer = sent("topk:k=120,budget=layer");
  EXPECT_EQ(layer.size(), 120u + 40 + 10);  // the shares add up to k, biases whole
  EXPECT_EQ(count(layer, 2000, 2040), 40);  // bias 1 whole
  EXPECT_EQ(count(layer, 2440, 2450), 10);  // bias 2 whole
  EXPECT_EQ(count(layer, 0, 2000), 100);    // 120 · 2000 / 2400 = 100
  EXPECT_EQ(count(layer, 2040, 2440), 20);  // the quiet layer keeps its share
  const auto global = sent("topk:k=120");
  EXPECT_EQ(global.size(), 120u + 50);
  EXPECT_EQ(count(global, 2040, 2440), 0);  // globally, the quiet layer loses out
  EXPECT_EQ(count(global, 0, 2000), 120);
  // dense_below sends the small matrix whole too; without a layout, plain top-k.
  EXPECT_EQ(sent("topk:k=120,budget=layer,dense_below=500").size(), 120u + 40 + 400 + 10);
  auto plain = make_compressor("topk:k=120", dim);
  EXPECT_EQ(plain->max_payload(MessageKind::Gradient), 4u + 120 * 8);
  // Odd shares still add up: 7 over sizes 2000 and 400 → 5.83 + 1.17 → 6 + 1.
  EXPECT_EQ(sent("topk:k=7,budget=layer").size(), 7u + 50);
}

}  // namespace
}  // namespace sketchsgd
