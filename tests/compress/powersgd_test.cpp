// The powersgd codec's contract: exact for a matrix of rank ≤ r,
// error feedback keeps what was not sent, the server's query is the orthonormalised sum of the
// workers' P factors, summed payloads give the messages' updates, state round trips, and corrupt
// bytes change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

struct Round {
  std::vector<std::unique_ptr<Compressor>> workers;
  std::unique_ptr<Aggregator> server;
  Round(const std::string& spec, uint64_t dim, uint32_t w) {
    for (uint32_t i = 0; i < w; ++i) workers.push_back(make_compressor(spec, dim));
    server = workers[0]->make_aggregator(w);
  }
  /// One two-phase round through messages; every worker applies; returns worker 0's step.
  std::vector<float> run(const std::vector<std::vector<float>>& grads, uint64_t round,
                         Bytes* query = nullptr) {
    for (uint32_t i = 0; i < workers.size(); ++i)
      server->add(workers[i]->encode(grads[i], round, i).bytes());
    const Message q = server->finish();
    EXPECT_EQ(server->expecting(), MessageKind::Answer);
    if (query) query->assign(q.bytes().begin(), q.bytes().end());
    for (uint32_t i = 0; i < workers.size(); ++i)
      server->add(workers[i]->answer(q.bytes(), i).bytes());
    const Message u = server->finish();
    std::vector<float> step(grads[0].size()), other(step.size());
    workers[0]->apply(u.bytes(), step);
    for (uint32_t i = 1; i < workers.size(); ++i) workers[i]->apply(u.bytes(), other);
    return step;
  }
};

/// A rows × cols matrix of rank r (sum of r outer products), then a tail of `tail` values.
std::vector<float> low_rank(uint64_t rows, uint64_t cols, uint64_t r, uint64_t tail,
                            uint64_t seed) {
  const auto a = test::gaussian(rows * r, seed), b = test::gaussian(cols * r, seed + 1);
  std::vector<float> m(rows * cols + tail, 0.0f);
  for (uint64_t i = 0; i < rows; ++i)
    for (uint64_t j = 0; j < cols; ++j)
      for (uint64_t l = 0; l < r; ++l) m[i * cols + j] += a[i * r + l] * b[j * r + l];
  const auto t = test::gaussian(tail, seed + 2);
  std::copy(t.begin(), t.end(), m.begin() + rows * cols);
  return m;
}

TEST(PowerSGD, RecoversARankRMatrixAndTheUncompressedTensorsExactly) {
  // Two workers with g1 = −0.5·g0, g0 of rank 3 on the matrix: the mean has rank 3, so a rank-3
  // round reproduces it (to float rounding) and the uncompressed tail exactly.
  const uint64_t rows = 60, cols = 45, tail = 7;
  auto g0 = low_rank(rows, cols, 3, tail, 1), g1 = g0;
  for (auto& v : g1) v *= -0.5f;
  Round job("powersgd:rank=3,layout=60x45+7", rows * cols + tail, 2);
  const auto step = job.run({g0, g1}, 0);
  double err = 0, norm = 0;
  for (size_t i = 0; i < step.size(); ++i) {
    const double want = 0.5 * (double(g0[i]) + double(g1[i]));
    err += (step[i] - want) * (step[i] - want);
    norm += want * want;
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-5);
  for (uint64_t i = rows * cols; i < step.size(); ++i)  // biases: the exact mean
    EXPECT_EQ(step[i], (g0[i] + g1[i]) * 0.5f);
  // A lower rank cannot be exact.
  Round low("powersgd:rank=1,layout=60x45+7", rows * cols + tail, 2);
  const auto s1 = low.run({g0, g1}, 0);
  double err1 = 0;
  for (size_t i = 0; i < rows * cols; ++i) {
    const double want = 0.5 * (double(g0[i]) + double(g1[i]));
    err1 += (s1[i] - want) * (s1[i] - want);
  }
  EXPECT_GT(std::sqrt(err1 / norm), 1e-2);
}

TEST(PowerSGD, QueryIsTheOrthonormalisedSumOfTheWorkersP) {
  const uint64_t dim = 30 * 20 + 5;
  Round job("powersgd:rank=2,layout=30x20+5", dim, 3);
  std::vector<std::vector<float>> g;
  for (uint32_t i = 0; i < 3; ++i) g.push_back(test::gaussian(dim, 10 + i));
  // The P factors the workers send, summed by hand (a second, identical set of workers).
  Round twin("powersgd:rank=2,layout=30x20+5", dim, 3);
  std::vector<float> sum(30 * 2 + 5, 0.0f);
  for (uint32_t i = 0; i < 3; ++i) {
    const Message m = twin.workers[i]->encode(g[i], 0, i);
    const auto payload = m.bytes().subspan(kHeaderBytes);
    ASSERT_EQ(payload.size(), sum.size() * 4);
    for (size_t j = 0; j < sum.size(); ++j) {
      float v;
      std::memcpy(&v, payload.data() + 4 * j, 4);
      sum[j] += v;
    }
  }
  kernels::cpu::orthonormalize(sum.data(), 30, 2);
  Bytes query;
  job.run(g, 0, &query);
  ASSERT_EQ(query.size(), kHeaderBytes + 30 * 2 * 4);
  for (size_t j = 0; j < 60; ++j) {
    float v;
    std::memcpy(&v, query.data() + kHeaderBytes + 4 * j, 4);
    EXPECT_FLOAT_EQ(v, sum[j]) << j;
  }
  // Orthonormal columns.
  double dot = 0, n0 = 0;
  for (size_t i = 0; i < 30; ++i) {
    dot += double(sum[2 * i]) * sum[2 * i + 1];
    n0 += double(sum[2 * i]) * sum[2 * i];
  }
  EXPECT_NEAR(dot, 0.0, 1e-5);
  EXPECT_NEAR(n0, 1.0, 1e-5);
}

TEST(PowerSGD, ErrorFeedbackKeepsWhatWasNotSent) {
  const uint64_t dim = 40 * 30;
  const auto g = test::gaussian(dim, 5);
  const std::vector<float> zero(dim, 0.0f);
  auto residual = [&](const char* spec) {
    Round job(spec, dim, 1);
    const auto s1 = job.run({g}, 0);
    const auto s2 = job.run({zero}, 1);  // with ef=1: an approximation of what s1 missed
    double before = 0, after = 0, second = 0;
    for (size_t i = 0; i < dim; ++i) {
      before += (g[i] - s1[i]) * (g[i] - s1[i]);
      after += (g[i] - s1[i] - s2[i]) * (g[i] - s1[i] - s2[i]);
      second += s2[i] * s2[i];
    }
    return std::make_tuple(before, after, second);
  };
  const auto [b1, a1, s1] = residual("powersgd:rank=2,layout=40x30");
  EXPECT_GT(s1, 0.0);
  EXPECT_LT(a1, 0.95 * b1);  // the second round sent part of the first one's residual
  const auto [b0, a0, s0] = residual("powersgd:rank=2,ef=0,layout=40x30");
  EXPECT_EQ(s0, 0.0);  // nothing kept
  EXPECT_EQ(a0, b0);
}

TEST(PowerSGD, EveryRankRecoversAMatrixOfThatRankAndCompressesMomentum) {
  // Ranks on both sides of the kernels' switch from transposed factors to register tiles (rank 4),
  // and past one vector of factors (8).
  const uint64_t rows = 80, cols = 66, tail = 3;  // rank 16 still compresses 2x (min_rate)
  for (uint64_t r : {1, 2, 4, 5, 8, 16}) {
    SCOPED_TRACE(r);
    const auto g = low_rank(rows, cols, r, tail, 7 + r);
    const std::string layout = ",layout=80x66+3";
    Round job("powersgd:rank=" + std::to_string(r) + layout, rows * cols + tail, 1);
    const auto step = job.run({g}, 0);
    double err = 0, norm = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      err += (step[i] - g[i]) * (step[i] - g[i]);
      norm += double(g[i]) * g[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-5);
    // momentum=0.9 without error feedback, gradients in one rank-r space: each step is the
    // momentum u = 0.9·u + g itself.
    Round mom("powersgd:rank=" + std::to_string(r) + ",momentum=0.9,ef=0" + layout,
              rows * cols + tail, 1);
    std::vector<double> u(g.size(), 0.0);
    for (uint64_t round = 0; round < 3; ++round) {
      auto gr = g;
      for (auto& v : gr) v *= 1.0f - 0.7f * float(round);
      for (size_t i = 0; i < u.size(); ++i) u[i] = 0.9 * u[i] + gr[i];
      const auto s = mom.run({gr}, round);
      double e = 0, n = 0;
      for (size_t i = 0; i < u.size(); ++i) {
        e += (s[i] - u[i]) * (s[i] - u[i]);
        n += u[i] * u[i];
      }
      EXPECT_LT(std::sqrt(e / n), 1e-4) << round;
    }
  }
}

TEST(PowerSGD, StateRoundTripsAndCorruptBytesChangeNothing) {
  const uint64_t dim = 30 * 20 + 5;
  const std::string spec = "powersgd:rank=2,layout=30x20+5";
  Round a(spec, dim, 2);
  std::vector<std::vector<float>> g{test::gaussian(dim, 1), test::gaussian(dim, 2)};
  a.run(g, 0);
  // Resume worker state into fresh workers: the next round is bit-identical.
  Round b(spec, dim, 2);
  for (int i = 0; i < 2; ++i) b.workers[i]->load_state(a.workers[i]->save_state());
  g = {test::gaussian(dim, 3), test::gaussian(dim, 4)};
  EXPECT_EQ(a.run(g, 1), b.run(g, 1));
  auto state = a.workers[0]->save_state();
  state[state.size() / 2] ^= 1;
  EXPECT_THROW(b.workers[0]->load_state(state), WireError);
  EXPECT_THROW(b.workers[0]->load_state({}), WireError);
  EXPECT_EQ(a.workers[0]->save_state(), b.workers[0]->save_state());

  // Corrupt or truncated query, answer and update: typed errors, then the round goes on as if
  // they never came.
  for (int i = 0; i < 2; ++i) a.server->add(a.workers[i]->encode(g[i], 2, i).bytes());
  const Message q = a.server->finish();
  Bytes bad(q.bytes().begin(), q.bytes().end());
  bad.pop_back();
  EXPECT_THROW(a.workers[0]->answer(bad, 0), WireError);
  Bytes nan(q.bytes().begin(), q.bytes().end());
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(nan.data() + kHeaderBytes + 8, &inf, 4);
  EXPECT_THROW(a.workers[0]->answer(nan, 0), WireError);  // CRC or finiteness: refused
  Message ans = a.workers[1]->answer(q.bytes(), 1);
  Bytes short_ans(ans.bytes().begin(), ans.bytes().end() - 4);
  EXPECT_THROW(a.server->add(short_ans), WireError);
  EXPECT_EQ(a.server->count(), 0u);
}

/// Steps equal to float rounding (relative to the largest value).
void expect_near(const std::vector<float>& x, const std::vector<float>& y) {
  ASSERT_EQ(x.size(), y.size());
  float scale = 0.0f;
  for (float v : y) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 1e-5f * (1.0f + scale)) << i;
}

/// On the CPU a round's error subtraction waits for the next absorb at ranks up to 4 (rewritten
/// on the next q's columns): nothing of it shows but rounding. Ranks past 4 (subtracted at
/// once) and up to 4 (deferred) in one layout take the next steps, the last one from the errors
/// alone (zero gradients), whether a worker's state was saved in between or not (a saved state
/// keeps the owed P̂: PowerSGD.SavingTheStateChangesNothing); an update applied twice (the
/// second apply finds the first one's subtraction owed and writes it out: equal to rounding).
TEST(PowerSGD, DeferredErrorSubtractionIsInvisible) {
  for (const auto& [spec, dim] :
       {std::pair<std::string, uint64_t>{"powersgd:rank=2,layout=30x20+5", 605},
        {"powersgd:rank=5,min_rate=0.5,layout=40x30+30x3+4", 1294}}) {
    SCOPED_TRACE(spec);
    auto grads = [&](uint64_t seed) {
      return std::vector<std::vector<float>>{test::gaussian(dim, seed),
                                             test::gaussian(dim, seed + 1)};
    };
    const std::vector<std::vector<float>> zero(2, std::vector<float>(dim, 0.0f));
    Round a(spec, dim, 2), b(spec, dim, 2);
    a.run(grads(1), 0);
    b.run(grads(1), 0);
    for (auto& w : a.workers) w->save_state();
    expect_near(a.run(grads(3), 1), b.run(grads(3), 1));
    expect_near(a.run(zero, 2), b.run(zero, 2));
    auto update = [&](Round& job) {
      for (uint32_t i = 0; i < 2; ++i)
        job.server->add(job.workers[i]->encode(grads(5)[i], 3, i).bytes());
      const Message q = job.server->finish();
      for (uint32_t i = 0; i < 2; ++i)
        job.server->add(job.workers[i]->answer(q.bytes(), i).bytes());
      return job.server->finish();
    };
    const Message ua = update(a), ub = update(b);
    std::vector<float> sa(dim), sb(dim);
    for (uint32_t i = 0; i < 2; ++i) {
      a.workers[i]->apply(ua.bytes(), sa);
      a.workers[i]->save_state();
      a.workers[i]->apply(ua.bytes(), sa);
      b.workers[i]->apply(ub.bytes(), sb);
      b.workers[i]->apply(ub.bytes(), sb);
    }
    expect_near(sa, sb);
    expect_near(a.run(zero, 4), b.run(zero, 4));
  }
}

/// Saving a worker's state changes nothing it does: a job whose workers save every round takes
/// the same steps as one that never saves, bit for bit, and a job resumed from those states
/// takes them too, where the error's subtraction is deferred (rank 2) or not (rank 6). (Saving
/// once wrote the deferred subtraction out, which rounds otherwise than the next absorb.)
TEST(PowerSGD, SavingTheStateChangesNothing) {
  for (const auto& [spec, dim] :
       {std::pair<std::string, uint64_t>{"powersgd:rank=2,layout=30x20+5", 605},
        {"powersgd:rank=6,min_rate=0.5,layout=40x30+30x3+4", 1294}}) {
    SCOPED_TRACE(spec);
    Round saves(spec, dim, 2), never(spec, dim, 2);
    for (uint64_t round = 0; round < 4; ++round) {
      const auto g = test::grads(2, dim, 30 + round);
      ASSERT_EQ(saves.run(g, round), never.run(g, round)) << round;
      for (auto& w : saves.workers) w->save_state();
    }
    const auto g = test::grads(2, dim, 99);
    Round resumed(spec, dim, 2);
    for (uint32_t i = 0; i < 2; ++i) resumed.workers[i]->load_state(saves.workers[i]->save_state());
    EXPECT_EQ(resumed.run(g, 4), never.run(g, 4));
  }
}

/// blocks=B: the layout as FSDP shards it (B chunks, chunk b holding rows b·n/B.. of every
/// tensor) gives every matrix's factors as the unblocked layout does, read in place: the steps
/// equal the unblocked codec's on the same gradients in parameter order (to Q's summation
/// order), round after round (error feedback, warm start; rank 2 defers the error subtraction,
/// rank 6 does not), and the uncompressed tensors' mean exactly.
TEST(PowerSGD, RowBlocksAreTheMatricesFactoredWhole) {
  const std::vector<std::pair<uint64_t, uint64_t>> shapes = {{24, 20}, {24, 1}, {16, 18}};
  const uint64_t B = 2, dim = 24 * 20 + 24 + 16 * 18;
  // where[i]: coordinate i of the parameter-major vector in the blocked (chunk-major) one
  std::vector<uint64_t> where(dim);
  uint64_t at = 0, chunk = dim / B;
  for (const auto& [rows, cols] : shapes) {
    uint64_t before = 0;  // the chunk's values ahead of this tensor's block
    for (const auto& [r2, c2] : shapes) {
      if (r2 == rows && c2 == cols) break;
      before += r2 / B * c2;
    }
    for (uint64_t i = 0; i < rows * cols; ++i)
      where[at + i] =
          (i / cols) / (rows / B) * chunk + before + (i / cols) % (rows / B) * cols + i % cols;
    at += rows * cols;
  }
  for (const std::string& opts : {"rank=2", "rank=6,min_rate=1"}) {
    SCOPED_TRACE(opts);
    Round flat("powersgd:" + opts + ",layout=24x20+24+16x18", dim, 2);
    Round blocked("powersgd:" + opts + ",blocks=2,layout=12x20+12+8x18+12x20+12+8x18", dim, 2);
    for (uint64_t round = 0; round < 4; ++round) {
      auto g = test::grads(2, dim, 10 + round);
      auto gb = g;
      for (uint32_t w = 0; w < 2; ++w)
        for (uint64_t i = 0; i < dim; ++i) gb[w][where[i]] = g[w][i];
      const auto want = flat.run(g, round), got = blocked.run(gb, round);
      for (uint64_t i = 0; i < dim; ++i) {
        if (i >= 480 && i < 504)  // the bias: its mean, exactly
          ASSERT_EQ(got[where[i]], want[i]) << i;
        else
          ASSERT_NEAR(got[where[i]], want[i], 1e-4f * (1 + std::abs(want[i]))) << i;
      }
    }
  }
  // Chunks that are not the same tensors, or a count of tensors that does not divide, are refused.
  EXPECT_THROW(make_compressor("powersgd:rank=2,blocks=2,layout=12x20+12+8x18+12x20+8x18+12", dim),
               InvalidArgument);
  EXPECT_THROW(
      make_compressor("powersgd:rank=2,blocks=2,layout=12x20+12+8x18", 12 * 20 + 12 + 8 * 18),
      InvalidArgument);
}

/// A NaN or ±Inf (in a factored matrix or an uncompressed tensor) is refused with its
/// coordinate, through encode and encode_sum, and the worker goes on bit for bit as if it never
/// came (its error feedback and momentum exactly as they were, not to rounding) — with an error
/// subtraction owed (ranks up to 4), past 4, and with momentum.
TEST(PowerSGD, NonFiniteGradientIsRefusedAndLeavesEveryBitAsItWas) {
  for (const auto& [spec, dim] :
       {std::pair<std::string, uint64_t>{"powersgd:rank=2,layout=30x20+5", 605},
        {"powersgd:rank=2,momentum=0.9,layout=30x20+5", 605},
        {"powersgd:rank=5,min_rate=0.5,layout=40x30+30x3+4", 1294}}) {
    SCOPED_TRACE(spec);
    auto grads = [&](uint64_t seed) {
      return std::vector<std::vector<float>>{test::gaussian(dim, seed),
                                             test::gaussian(dim, seed + 1)};
    };
    Round a(spec, dim, 2), b(spec, dim, 2);
    a.run(grads(1), 0);
    b.run(grads(1), 0);
    for (const uint64_t at : {uint64_t(7), uint64_t(dim - 2)}) {  // a matrix; the dense tail
      auto bad = grads(3)[0];
      bad[at] = at == 7 ? std::nanf("") : -std::numeric_limits<float>::infinity();
      bad[at + 1] = std::numeric_limits<float>::infinity();
      try {
        a.workers[0]->encode(bad, 1, 0);
        ADD_FAILURE() << "encode took a non-finite gradient";
      } catch (const NonFiniteError& e) {
        EXPECT_NE(std::string(e.what()).find("encode: non-finite value"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("coordinate " + std::to_string(at)), std::string::npos)
            << e.what();
      }
      std::vector<float> out(a.workers[1]->sum_size(MessageKind::Gradient));
      EXPECT_THROW(a.workers[1]->encode_sum(bad, 1, out), NonFiniteError);
    }
    EXPECT_EQ(a.run(grads(3), 1), b.run(grads(3), 1));
    const std::vector<std::vector<float>> zero(2, std::vector<float>(dim, 0.0f));
    EXPECT_EQ(a.run(zero, 2), b.run(zero, 2));
  }
}

TEST(PowerSGD, SixteenBitWireHalvesTheBytesAndStaysClose) {
  const uint64_t dim = 60 * 45 + 7;
  std::vector<std::vector<float>> g{test::gaussian(dim, 1), test::gaussian(dim, 2)};
  Round f32("powersgd:rank=2,layout=60x45+7", dim, 2);
  for (const char* wire : {"fp16", "bf16"}) {
    Round w16(std::string("powersgd:rank=2,wire=") + wire + ",layout=60x45+7", dim, 2);
    EXPECT_EQ(2 * w16.workers[0]->max_payload(MessageKind::Gradient),
              f32.workers[0]->max_payload(MessageKind::Gradient));
    EXPECT_EQ(w16.workers[0]->sum_format(MessageKind::Gradient),
              std::string(wire) == "fp16" ? WireFloat::F16 : WireFloat::BF16);
    Round ref("powersgd:rank=2,layout=60x45+7", dim, 2);
    const auto a = ref.run(g, 0), b = w16.run(g, 0);
    double err = 0, norm = 0;
    for (size_t i = 0; i < dim; ++i) {
      err += (a[i] - b[i]) * (a[i] - b[i]);
      norm += a[i] * a[i];
    }
    EXPECT_LT(std::sqrt(err / norm), std::string(wire) == "fp16" ? 1e-2 : 5e-2) << wire;
    EXPECT_GT(err, 0.0) << wire;  // really rounded
  }
  // A value beyond fp16's range is refused before anything is sent.
  Round big("powersgd:rank=2,wire=fp16,layout=60x45+7", dim, 1);
  std::vector<float> huge(dim, 1e5f);
  EXPECT_THROW(big.workers[0]->encode(huge, 0, 0), NonFiniteError);
}

/// wire=int8: a byte a value and a scale per column of 64 rows through a parameter server
/// (each message's scales its own; replies in fp16), near the fp32 round; only summable codecs
/// offer it.
TEST(PowerSGD, Int8WireTakesAByteAValueAndStaysClose) {
  const uint64_t dim = 60 * 45 + 7;
  std::vector<std::vector<float>> g{test::gaussian(dim, 1), test::gaussian(dim, 2)};
  Round i8("powersgd:rank=2,wire=int8,layout=60x45+7", dim, 2);
  const Compressor& c = *i8.workers[0];
  EXPECT_EQ(c.sum_format(MessageKind::Gradient), WireFloat::I8);
  EXPECT_EQ(c.sum_format(MessageKind::Answer), WireFloat::I8);
  EXPECT_EQ(c.sum_format(MessageKind::Query), WireFloat::F16);
  EXPECT_EQ(c.sum_format(MessageKind::Update), WireFloat::F16);
  EXPECT_EQ(c.sum_columns(MessageKind::Gradient), 2u);
  EXPECT_EQ(c.max_payload(MessageKind::Gradient), wire_size(WireFloat::I8, 60 * 2 + 7, 2));
  EXPECT_EQ(c.max_payload(MessageKind::Answer), wire_size(WireFloat::I8, 45 * 2, 2));
  EXPECT_EQ(c.max_payload(MessageKind::Update), 2 * (60 * 2 + 45 * 2 + 7));
  Round ref("powersgd:rank=2,layout=60x45+7", dim, 2);
  for (uint64_t round = 0; round < 3; ++round) {
    const auto a = ref.run(g, round), b = i8.run(g, round);
    double err = 0, norm = 0;
    for (size_t i = 0; i < dim; ++i) {
      err += (a[i] - b[i]) * (a[i] - b[i]);
      norm += a[i] * a[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 0.05) << "round " << round;
    EXPECT_GT(err, 0.0) << "round " << round;  // really rounded
  }
  EXPECT_EQ(make_compressor("dense:wire=int8", 100)->sum_format(MessageKind::Gradient),
            WireFloat::I8);
  EXPECT_EQ(make_compressor("sketch:rows=1,cols=50,k=5,wire=int8", 1000)
                ->sum_columns(MessageKind::Gradient),
            1u);
  EXPECT_THROW(make_compressor("topk:k=10,wire=int8", 1000), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd
