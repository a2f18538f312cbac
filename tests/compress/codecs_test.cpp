#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

std::vector<std::vector<float>> grads(uint32_t world, size_t dim, uint64_t seed) {
  std::vector<std::vector<float>> g;
  for (uint32_t w = 0; w < world; ++w) g.push_back(test::gaussian(dim, seed * 100 + w));
  return g;
}

TEST(Registry, BuildsEveryCodecAndCanonicalSpecRoundTrips) {
  for (const char* spec : {"dense", "topk:k=10", "terngrad", "signsgd:ef=1", "signsgd",
                           "sketch:rows=3,cols=100,k=10,p2=2,momentum=0.5",
                           "powersgd:rank=2,wire=fp16,layout=20x40+200", "qsgd:bits=2,norm=max"}) {
    auto c = make_compressor(spec, 1000);
    auto again = make_compressor(c->spec(), 1000);
    EXPECT_EQ(again->spec(), c->spec()) << spec;
    EXPECT_EQ(again->id(), c->id());
  }
  EXPECT_EQ(make_compressor("topk:k=10", 1000)->spec(),
            "topk:k=10,global=0,ef=1,momentum=0,index=u32,wire=fp32,budget=global,dense_below=0");
  EXPECT_EQ(Registry::instance().entries().size(), 7u);
}

TEST(Registry, ClearErrors) {
  auto message = [](const std::string& spec, uint64_t dim = 1000) {
    try {
      make_compressor(spec, dim);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("zip").find("known: dense, powersgd, qsgd, signsgd, sketch, terngrad, topk"),
            std::string::npos);
  EXPECT_NE(message("topk:kk=3").find("unknown option 'kk'"), std::string::npos);
  EXPECT_NE(message("topk:kk=3").find("global=<int>"), std::string::npos);  // lists accepted
  EXPECT_NE(message("topk:k=").find("no value"), std::string::npos);
  EXPECT_NE(message("topk:k").find("not key=value"), std::string::npos);
  EXPECT_NE(message("topk:k=abc").find("not a number"), std::string::npos);
  EXPECT_NE(message("topk:k=1.5").find("must be an integer"), std::string::npos);
  EXPECT_NE(message("topk:k=1,k=2").find("given twice"), std::string::npos);
  EXPECT_NE(message("sketch:momentum=1.5").find("outside [0, 0.999]"), std::string::npos);
  EXPECT_NE(message("topk:k=1001").find("exceeds dim"), std::string::npos);
  EXPECT_NE(message("sketch:k=5000").find("exceeds dim"), std::string::npos);
  EXPECT_NE(message("sketch:k=10,p2=2,fetch=1").find("no second round"), std::string::npos);
  EXPECT_NE(message("dense", 0).find("dim"), std::string::npos);
  EXPECT_NE(message("topk:k=nan").find("not a number"), std::string::npos);
}

/// A part of the model gets its share of the budgets (k, cols), rounded half to even and at
/// least 1; 0 (the codec's default) stays; other options and the canonical form are kept.
TEST(Registry, ShareSpecScalesOnlyBudgets) {
  EXPECT_EQ(share_spec("sketch:k=1000,cols=90001,rows=3", 0.25),
            make_compressor("sketch:k=250,cols=22500,rows=3", 1000000)->spec());
  EXPECT_EQ(share_spec("topk:k=10", 0.25), make_compressor("topk:k=2", 1000)->spec());  // 2.5
  EXPECT_EQ(share_spec("topk:k=10", 0.35), make_compressor("topk:k=4", 1000)->spec());  // 3.5
  EXPECT_EQ(share_spec("topk:k=10", 0.01), make_compressor("topk:k=1", 1000)->spec());
  EXPECT_EQ(share_spec("topk", 0.5), make_compressor("topk", 1000)->spec());  // k=0: default
  EXPECT_EQ(share_spec("powersgd:rank=4", 0.1),
            "powersgd:rank=4,momentum=0,min_rate=2,ef=1,"
            "warm=1,seed=1,wire=fp32");
  EXPECT_EQ(share_spec(" qsgd:bits=2 "), make_compressor("qsgd:bits=2", 1000)->spec());
  EXPECT_THROW(share_spec("topk:k=10", 0.0), InvalidArgument);
  EXPECT_THROW(share_spec("topk:k=10", 1.5), InvalidArgument);
  EXPECT_THROW(share_spec("topk:kk=10", 0.5), InvalidArgument);
  EXPECT_THROW(share_spec("nosuch", 0.5), InvalidArgument);
}

TEST(Dense, MeanOfWorkers) {
  test::Job job("dense", 1000, 3);
  const auto g = grads(3, 1000, 1);
  const auto steps = job.round(g, 0);
  for (size_t j = 0; j < 1000; ++j)
    EXPECT_FLOAT_EQ(steps[0][j], ((g[0][j] + g[1][j]) + g[2][j]) / 3);
  EXPECT_EQ(steps[0], steps[2]);
  EXPECT_NEAR(job.workers[0]->compression_ratio(), 4000.0 / 4048.0, 1e-9);
}

TEST(TopK, ResidualIsInputMinusSent) {
  const size_t dim = 2000, k = 50;
  test::Job job("topk:k=50", dim, 1);
  const auto g = grads(1, dim, 2);
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
    const auto g = grads(2, dim, 3);
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

TEST(SignSGD, SignPackingExactAndMajorityVote) {
  const size_t dim = 1001;
  test::Job one("signsgd", dim, 1);
  auto g = grads(1, dim, 4);
  g[0][7] = 0.0f;
  const auto s = one.round(g, 0)[0];
  for (size_t j = 0; j < dim; ++j) ASSERT_EQ(s[j], g[0][j] < 0 ? -1.0f : 1.0f) << j;
  EXPECT_NEAR(one.workers[0]->compression_ratio(), 4004.0 / (48 + 4 * 32), 1e-9);

  for (uint32_t world : {2u, 3u, 4u}) {
    test::Job job("signsgd", dim, world);
    const auto gw = grads(world, dim, 5 + world);
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
  const auto g = grads(2, dim, 6);
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

TEST(TernGrad, UnbiasedOverRoundsAndTwoBitsPerElement) {
  const size_t dim = 256;
  test::Job job("terngrad:chunk=64", dim, 1);
  const auto g = grads(1, dim, 7);
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
  auto g = grads(world, dim, 12);
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
  auto g = grads(1, dim, 14);
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

TEST(Aggregator, ProtocolErrorsChangeNothing) {
  const size_t dim = 100;
  auto worker = make_compressor("topk:k=5", dim);
  auto codec = make_compressor("topk:k=5", dim);
  auto agg = codec->make_aggregator(2);
  const auto g = test::gaussian(dim, 16);
  EXPECT_THROW(agg->finish(), ProtocolError);
  const Message m0 = worker->encode(g, 7, 0);
  EXPECT_THROW(agg->add(worker->encode(g, 7, 2)), ProtocolError);  // sender ≥ W
  agg->add(m0);
  EXPECT_THROW(agg->add(m0), ProtocolError);                       // duplicate
  EXPECT_THROW(agg->add(worker->encode(g, 8, 1)), ProtocolError);  // other round
  auto dense = make_compressor("dense", dim);
  EXPECT_THROW(agg->add(dense->encode(g, 7, 1)), ConfigMismatch);
  auto other_dim = make_compressor("topk:k=5", dim + 1);
  EXPECT_THROW(agg->add(other_dim->encode(test::gaussian(dim + 1, 1), 7, 1)), ConfigMismatch);
  EXPECT_EQ(agg->count(), 1u);
  const Message update = agg->finish();
  EXPECT_THROW(agg->add(update), ProtocolError);  // an Update is not a Gradient
  std::vector<float> step(dim);
  EXPECT_THROW(worker->apply(m0, step), ProtocolError);
  EXPECT_THROW(worker->answer(update, 0), ProtocolError);  // topk has no second round
  EXPECT_THROW(worker->encode(g, 0, kServerRank), InvalidArgument);
  std::vector<float> wrong(dim + 1);
  EXPECT_THROW(worker->apply(update, wrong), InvalidArgument);
  worker->apply(update, step);
  EXPECT_EQ(std::count_if(step.begin(), step.end(), [](float v) { return v != 0; }), 5);
  EXPECT_THROW(codec->make_aggregator(0), InvalidArgument);
}

TEST(Codecs, NonFiniteGradientRejectedStateUnchanged) {
  for (const char* spec :
       {"dense", "topk:k=10", "terngrad", "signsgd:ef=1", "sketch:cols=50,k=10", "qsgd:ef=1",
        "powersgd:rank=2,layout=25x40", "powersgd:rank=2,momentum=0.9,layout=25x40"}) {
    auto a = make_compressor(spec, 1000), b = make_compressor(spec, 1000);
    auto g = test::gaussian(1000, 17);
    auto bad = g;
    bad[500] = std::nanf("");
    EXPECT_THROW(a->encode(bad, 0, 0), NonFiniteError) << spec;
    EXPECT_THROW(a->encode(std::vector<float>(999), 0, 0), InvalidArgument) << spec;
    const auto ma = a->encode(g, 1, 0), mb = b->encode(g, 1, 0);
    EXPECT_TRUE(
        std::equal(ma.bytes().begin(), ma.bytes().end(), mb.bytes().begin(), mb.bytes().end()))
        << spec;
  }
}

}  // namespace
}  // namespace sketchsgd

namespace sketchsgd {
namespace {
TEST(Aggregator, OutlivesTheCompressorThatMadeIt) {
  auto agg = make_compressor("topk:k=3", 50)->make_aggregator(1);  // compressor destroyed here
  auto worker = make_compressor("topk:k=3", 50);
  agg->add(worker->encode(test::gaussian(50, 1), 0, 0));
  std::vector<float> step(50);
  worker->apply(agg->finish(), step);
  EXPECT_EQ(std::count_if(step.begin(), step.end(), [](float v) { return v != 0; }), 3);
}
}  // namespace
}  // namespace sketchsgd

namespace sketchsgd {
namespace {

// apply_step (the sparse fast path, and a server's own codec) equals apply() + axpy bit for bit,
// state included.
TEST(Codecs, ApplyStepEqualsApplyThenAxpyBitForBit) {
  constexpr uint64_t dim = 4000;
  for (const char* spec :
       {"dense", "topk:k=50", "terngrad", "signsgd", "signsgd:ef=1", "qsgd", "sketch:cols=500,k=50",
        "sketch:cols=500,k=50,p2=2", "sketch:cols=500,k=50,fetch=1"}) {
    test::Job a(spec, dim, 2), b(spec, dim, 2);
    std::vector<float> pa = test::gaussian(dim, 3), pb = pa, pc = pa;
    for (uint64_t t = 0; t < 3; ++t) {
      const std::vector<std::vector<float>> g = {test::gaussian(dim, 10 + t),
                                                 test::gaussian(dim, 20 + t)};
      const auto steps = a.round(g, t);  // apply() on a's workers
      kernels::cpu::axpy(pa.data(), steps[0].data(), dim, -0.3f);
      // b's workers take the same round through apply_step.
      for (uint32_t w = 0; w < 2; ++w) b.server->add(b.workers[w]->encode(g[w], t, w));
      Message out = b.server->finish();
      if (b.server->expecting() == MessageKind::Answer) {
        for (uint32_t w = 0; w < 2; ++w) b.server->add(b.workers[w]->answer(out, w));
        out = b.server->finish();
      }
      std::vector<float> scratch = pb;
      b.workers[0]->apply_step(out, pb, 0.3f);
      b.workers[1]->apply_step(out, scratch, 0.3f);
      b.server_codec->apply_step(out, pc, 0.3f);
      ASSERT_EQ(std::memcmp(pa.data(), pb.data(), dim * 4), 0) << spec << " round " << t;
      ASSERT_EQ(std::memcmp(pa.data(), pc.data(), dim * 4), 0) << spec << " round " << t;
    }
    std::vector<float> short_params(dim - 1);
    EXPECT_THROW(b.server_codec->apply_step(a.last_update, short_params, 0.1f), InvalidArgument)
        << spec;
    EXPECT_THROW(b.server_codec->apply_step(a.last_update, pc, std::nanf("")), InvalidArgument)
        << spec;
    Bytes bad(a.last_update.bytes().begin(), a.last_update.bytes().end());
    bad.back() ^= 1;
    const std::vector<float> before = pc;
    EXPECT_THROW(b.server_codec->apply_step(bad, pc, 0.1f), WireError) << spec;
    EXPECT_EQ(std::memcmp(before.data(), pc.data(), dim * 4), 0)
        << spec << ": corrupt update wrote";
  }
}

}  // namespace
}  // namespace sketchsgd
