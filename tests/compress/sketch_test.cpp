// The sketch codec: planted heavy hitters found in one round, the second round's exact top-k,
// FetchSGD's reset at the update; with a layout, small tensors sent whole beside the table, the
// heavy hitters of the rest, and the update's contract on both (messages and summed payloads,
// all three modes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

TEST(Sketch, RecoversPlantedHeavyHittersInOneRound) {
  const size_t dim = 100000;
  for (const char* hashing : {"random", "blocked"}) {
    SCOPED_TRACE(hashing);
    test::Job job(std::string("sketch:rows=5,cols=8000,k=40,momentum=0,hashing=") + hashing, dim,
                  2);
    std::vector<std::vector<float>> g(2);
    g[0] = test::gaussian(dim, 9, 0.01f);
    g[1] = test::gaussian(dim, 10, 0.01f);
    const auto heavy = test::plant(g[0], 40, 3.0f, 11);
    for (auto j : heavy) g[1][j] = g[0][j];
    const auto step = job.round(g, 0)[0];
    for (auto j : heavy) EXPECT_NEAR(step[j], g[0][j], 0.05f) << j;
    EXPECT_EQ(std::count_if(step.begin(), step.end(), [](float v) { return v != 0; }), 40);
    EXPECT_NEAR(job.workers[0]->compression_ratio(), 400000.0 / (48 + 4 * 5 * 8000), 1e-9);
  }
}

TEST(Sketch, SecondRoundReturnsExactTopKOfSummedAccumulators) {
  const size_t dim = 20000, k = 30;
  const uint32_t world = 3;
  test::Job job("sketch:rows=5,cols=3000,k=30,p2=4,momentum=0", dim, world);
  ASSERT_TRUE(job.workers[0]->two_rounds());
  auto g = test::grads(world, dim, 12);
  for (auto& v : g) test::plant(v, 30, 6.0f, 13);  // same positions in every worker
  const auto step = job.round(g, 0)[0];
  std::vector<float> sum(dim);
  for (size_t j = 0; j < dim; ++j) sum[j] = ((0.0f + g[0][j]) + g[1][j]) + g[2][j];
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  kernels::cpu::topk(sum.data(), dim, k, idx.data(), val.data());
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(step[idx[i]], val[i] * (1.0f / 3)) << idx[i];
  EXPECT_EQ(std::count_if(step.begin(), step.end(), [](float v) { return v != 0; }), long(k));
}

TEST(Sketch, ApplyZeroesMomentumAndErrorAtUpdate) {
  const size_t dim = 5000;
  test::Job job("sketch:rows=5,cols=500,k=20,p2=10,momentum=0.9", dim, 1);
  auto g = test::grads(1, dim, 14);
  test::plant(g[0], 20, 10.0f, 15);
  const auto step = job.round(g, 0)[0];
  std::vector<uint32_t> applied;
  for (uint32_t j = 0; j < dim; ++j)
    if (step[j] != 0) applied.push_back(j);
  ASSERT_EQ(applied.size(), 20u);
  // Next round with a zero gradient: v = v + ρu, both zero at the applied coordinates, so the
  // exact values the worker reports there are 0 and elsewhere they are not.
  auto& worker = *job.workers[0];
  job.server->add(worker.encode(std::vector<float>(dim, 0.0f), 1, 0));
  const Message query = job.server->finish();
  ASSERT_EQ(job.server->expecting(), MessageKind::Answer);
  const Message answer = worker.answer(query, 0);
  ByteReader qr(payload_of(query)), ar(payload_of(answer));
  const uint32_t n = qr.get<uint32_t>();
  ASSERT_EQ(payload_of(answer).size(), 4u * n);  // the candidates' values, in query order
  int zeros = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t j = qr.get<uint32_t>();
    const float v = ar.get<float>();
    const bool was_applied = std::binary_search(applied.begin(), applied.end(), j);
    if (was_applied) EXPECT_EQ(v, 0.0f) << j;
    zeros += v == 0.0f;
  }
  EXPECT_LT(zeros, int(n));
}

// 2000 + 40 + 1500 + 30: biases at [2000, 2040) and [3540, 3570).
const Layout kLayout({{40, 50}, {40}, {30, 50}, {30}});
constexpr uint64_t kDim = 3570;

struct Sparse {
  std::vector<uint32_t> idx;
  std::vector<float> val;
};

/// The update's entries, read through a fresh codec's apply (every written coordinate is
/// non-zero here).
Sparse entries(const std::string& spec, const Message& update) {
  std::vector<float> step(kDim, 0.0f);
  make_compressor(spec, kLayout)->apply(update.bytes(), step);
  Sparse s;
  for (uint32_t j = 0; j < kDim; ++j)
    if (step[j] != 0.0f) {
      s.idx.push_back(j);
      s.val.push_back(step[j]);
    }
  return s;
}

/// W workers, one round through messages (and answers for p2); every worker applies.
Message round(std::vector<std::unique_ptr<Compressor>>& workers, Aggregator& server,
              const std::vector<std::vector<float>>& grads, uint64_t r) {
  for (uint32_t i = 0; i < workers.size(); ++i)
    server.add(workers[i]->encode(grads[i], r, i).bytes());
  Message m = server.finish();
  if (server.expecting() == MessageKind::Answer) {
    for (uint32_t i = 0; i < workers.size(); ++i)
      server.add(workers[i]->answer(m.bytes(), i).bytes());
    m = server.finish();
  }
  std::vector<float> step(kDim);
  for (auto& w : workers) w->apply(m.bytes(), step);
  return m;
}

std::vector<float> mean_of(const std::vector<std::vector<float>>& grads) {
  std::vector<float> m(kDim, 0.0f);
  for (const auto& g : grads)
    for (uint64_t j = 0; j < kDim; ++j) m[j] += g[j];
  for (auto& x : m) x /= float(grads.size());
  return m;
}

/// The whole tensors (those in [lo, hi) and the last bias) at their exact mean; k heavy hitters,
/// none inside them; the payload is the table plus the whole values; and whole
/// coordinates keep no momentum or error from round to round.
void expect_whole(const std::string& spec, uint32_t lo = 2000, uint32_t hi = 2040) {
  SCOPED_TRACE(spec);
  auto whole = [&](uint32_t j) { return (j >= lo && j < hi) || j >= 3540; };
  const uint64_t n_whole = (hi - lo) + 30, cells = 3 * 400;  // rows=3, cols=400 below
  const uint32_t W = 3;
  std::vector<std::unique_ptr<Compressor>> workers;
  for (uint32_t i = 0; i < W; ++i) workers.push_back(make_compressor(spec, kLayout));
  auto server = workers[0]->make_aggregator(W);
  EXPECT_EQ(workers[0]->sum_size(MessageKind::Gradient), cells + n_whole);
  const auto probe = make_compressor(spec, kLayout)->encode(test::gaussian(kDim, 5), 0, 0);
  EXPECT_EQ(payload_of(probe.bytes()).size(), 4 * (cells + n_whole));
  for (uint64_t r = 0; r < 3; ++r) {
    std::vector<std::vector<float>> grads;
    for (uint32_t i = 0; i < W; ++i) grads.push_back(test::gaussian(kDim, 100 * r + i + 1));
    const std::vector<uint32_t> planted = {5, 777, 1999, 3000, 3539};  // in the matrices
    for (auto& g : grads)
      for (uint32_t j : planted)
        if (!whole(j)) g[j] = 40.0f;
    const Message u = round(workers, *server, grads, r);
    const Sparse s = entries(spec, u);
    const auto mean = mean_of(grads);
    uint64_t heavy = 0, n = 0;
    for (size_t e = 0; e < s.idx.size(); ++e) {
      if (whole(s.idx[e])) {
        // Momentum and error are reset at whole coordinates: the update is this round's mean.
        EXPECT_NEAR(s.val[e], mean[s.idx[e]], 1e-5f) << s.idx[e] << " round " << r;
        ++n;
      } else {
        ++heavy;
      }
    }
    EXPECT_EQ(n, n_whole) << r;
    EXPECT_EQ(heavy, 60u) << r;  // k, chosen past the whole tensors
    for (uint32_t j : planted)
      EXPECT_TRUE(whole(j) || std::binary_search(s.idx.begin(), s.idx.end(), j)) << j;
  }
}

TEST(SketchLayout, SmallTensorsGoWholeAndHeavyHittersComeFromTheRest) {
  expect_whole("sketch:rows=3,cols=400,k=60,momentum=0.9");
  expect_whole("sketch:rows=3,cols=400,k=60,momentum=0.9,p2=2,index=delta");
  expect_whole("sketch:rows=3,cols=400,k=60,fetch=1");
  expect_whole("sketch:rows=3,cols=400,k=60,hashing=random");
  // dense_below=1600 sends the 30 x 50 matrix whole too.
  expect_whole("sketch:rows=3,cols=400,k=60,dense_below=1600", 2000, 3540);
}

/// Summed payloads (an all-reduce) give the update the messages give, byte for byte where the
/// sums are exact (values k/4), for a plain and a FetchSGD sketch.
TEST(SketchLayout, SummedPayloadsGiveTheSameUpdate) {
  for (const std::string spec :
       {"sketch:rows=3,cols=400,k=60,momentum=0.9", "sketch:rows=1,cols=400,k=60,fetch=1"}) {
    SCOPED_TRACE(spec);
    const uint32_t W = 2;
    auto a = make_compressor(spec, kLayout), b = make_compressor(spec, kLayout);
    auto c = make_compressor(spec, kLayout), d = make_compressor(spec, kLayout);
    auto s1 = a->make_aggregator(W), s2 = a->make_aggregator(W);
    for (uint64_t r = 0; r < 3; ++r) {
      std::vector<std::vector<float>> g;
      for (uint32_t i = 0; i < W; ++i) {
        g.push_back(test::gaussian(kDim, 7 * r + i));
        for (auto& x : g.back()) x = std::round(x * 4.0f) / 4.0f;
      }
      s1->add(a->encode(g[0], r, 0).bytes());
      s1->add(b->encode(g[1], r, 1).bytes());
      const Message u1 = s1->finish();
      std::vector<float> t1(c->sum_size(MessageKind::Gradient)), t2(t1.size());
      c->encode_sum(g[0], r, t1);
      d->encode_sum(g[1], r, t2);
      for (size_t j = 0; j < t1.size(); ++j) t1[j] += t2[j];
      s2->add_sum(t1, W, r);
      const Message u2 = s2->finish();
      ASSERT_EQ(payload_of(u1.bytes()).size(), payload_of(u2.bytes()).size());
      EXPECT_TRUE(std::ranges::equal(payload_of(u1.bytes()), payload_of(u2.bytes()))) << r;
      std::vector<float> step(kDim);
      for (auto* w : {a.get(), b.get(), c.get(), d.get()}) w->apply(u1.bytes(), step);
    }
  }
}

/// Layout or not, the same spec text rules: the layout joins the canonical spec, must fit dim,
/// and a corrupt whole-tensor value (non-finite) is refused like a corrupt cell.
TEST(SketchLayout, LayoutIsPartOfTheSpecAndValuesAreValidated) {
  const auto c = make_compressor("sketch:rows=3,cols=400,k=60", kLayout);
  EXPECT_NE(c->spec().find(",layout=40x50+40+30x50+30"), std::string::npos) << c->spec();
  EXPECT_EQ(make_compressor(c->spec(), kDim)->spec(), c->spec());
  EXPECT_THROW(make_compressor("sketch:rows=3,cols=400,k=60,layout=40x50+40", kDim),
               InvalidArgument);
  auto server = c->make_aggregator(1);
  const Message m = c->encode(test::gaussian(kDim, 3), 0, 0);
  Bytes bad(m.bytes().begin(), m.bytes().end());
  const size_t last = bad.size() - 4;  // the last bias value
  const float inf = INFINITY;
  std::memcpy(bad.data() + last, &inf, 4);
  EXPECT_THROW(server->add(bad), WireError);
  std::vector<float> sum(c->sum_size(MessageKind::Gradient), 0.0f);
  sum.back() = NAN;
  EXPECT_THROW(server->add_sum(sum, 1, 0), WireError);
  server->add(m.bytes());  // nothing was taken from the refused ones
  EXPECT_NO_THROW(server->finish());
}

}  // namespace
}  // namespace sketchsgd
