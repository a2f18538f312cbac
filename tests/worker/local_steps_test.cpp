// Local steps over the ZeroMQ parameter server on 127.0.0.1 (Downpour's n_push and n_fetch, the
// server's outer step): every holder of the model ends bit-identical, nothing a worker changed is
// lost across fetches, and bad knobs are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/server/server.hpp>
#include <sketchsgd/worker/local_steps.hpp>
#include "support/ps_loopback.hpp"
#include "support/ps_synthetic.hpp"

namespace sketchsgd::ps {
namespace {

using test_loopback::client_options;
using test_loopback::Running;

ServerOptions server_options(const std::string& spec, uint32_t world, uint64_t dim, uint64_t rounds,
                             float lr, OuterOptions outer) {
  ServerOptions o = test_loopback::options(spec, world, dim, rounds);
  o.job.lr = lr;
  o.job.outer = outer;
  return o;
}

/// One local SGD step of the worker's own: θ −= 0.05 · g(θ).
void local_sgd(std::vector<float>& p, uint32_t rank, uint64_t step) {
  const auto g = test::synthetic_grad(p, rank, step, 17);
  kernels::cpu::axpy(p.data(), g.data(), p.size(), -0.05f);
}

struct Outcome {
  std::vector<float> params, model;  // the worker's copy and the client's (the server's) model
  std::string error;
};

/// W workers, each taking `steps` local steps with LocalSteps(knobs).
std::vector<Outcome> train(Running& run, const std::string& spec, uint32_t world, uint64_t dim,
                           uint64_t steps, LocalOptions knobs, const std::vector<float>& init) {
  std::vector<Outcome> out(world);
  std::vector<std::thread> ts;
  for (uint32_t r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        Client c(client_options(run.server.endpoint(), r, world), make_compressor(spec, dim),
                 r == 0 ? std::span<const float>(init) : std::span<const float>());
        LocalSteps local(c, knobs);
        std::vector<float> p(dim);
        local.start(p);
        for (uint64_t t = 0; t < steps; ++t) {
          local_sgd(p, r, t);
          local.after_step(p);
        }
        out[r].params = p;
        out[r].model.assign(c.params().begin(), c.params().end());
      } catch (const std::exception& e) {
        out[r].error = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return out;
}

TEST(LocalSteps, DiLoCoOverTheServerKeepsEveryCopyBitIdentical) {
  // Pushes every 4 steps, Nesterov outer momentum: after the last round every worker's model,
  // its client's and the server's agree bit for bit (the outer step runs everywhere alike).
  constexpr uint64_t kDim = 3000;
  for (const char* spec : {"dense", "dense:wire=fp16", "topk:k=300", "qsgd:bits=4"}) {
    Running run(server_options(spec, 3, kDim, 5, 0.7f, {0.9f, true}));
    const auto init = test::initial_params(kDim, 2);
    const auto got = train(run, spec, 3, kDim, 20, {4, 4}, init);
    for (uint32_t r = 0; r < 3; ++r) {
      ASSERT_EQ(got[r].error, "") << spec << " rank " << r;
      EXPECT_EQ(std::memcmp(got[r].params.data(), got[r].model.data(), kDim * 4), 0) << spec;
      EXPECT_EQ(std::memcmp(got[r].model.data(), got[0].model.data(), kDim * 4), 0) << spec;
    }
    EXPECT_EQ(run.finish(), 5u) << spec;
    EXPECT_EQ(std::memcmp(run.server.engine().model().data(), got[0].model.data(), kDim * 4), 0)
        << spec;
    EXPECT_NE(std::memcmp(got[0].model.data(), init.data(), kDim * 4), 0)
        << spec << ": no training";
  }
}

TEST(LocalSteps, AveragingEveryHStepsIsTheMeanOfTheWorkersModels) {
  // Dense, lr 1, no momentum, fetch = push = 3: the server's model after a round is the mean of
  // the workers' local models (model averaging), up to float rounding.
  constexpr uint64_t kDim = 2000;
  Running run(server_options("dense", 2, kDim, 1, 1.0f, {}));
  const auto init = test::initial_params(kDim, 3);
  const auto got = train(run, "dense", 2, kDim, 3, {3, 3}, init);
  std::vector<std::vector<float>> local(2, init);
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].error, "");
    for (uint64_t t = 0; t < 3; ++t) local_sgd(local[r], r, t);
  }
  for (size_t i = 0; i < kDim; ++i)
    ASSERT_NEAR(got[0].model[i], 0.5f * (local[0][i] + local[1][i]), 1e-6f) << i;
}

TEST(LocalSteps, FetchingBetweenPushesLosesNothingOfTheWorkersSteps) {
  // One worker, dense, lr 1: the server's model is the start plus every local step's change,
  // even though fetches (every 3 steps) replace the local model between pushes (every 2).
  constexpr uint64_t kDim = 1000;
  constexpr uint64_t kSteps = 12;
  Running run(server_options("dense", 1, kDim, kSteps / 2, 1.0f, {}));
  const auto init = test::initial_params(kDim, 4);
  std::vector<double> expect(init.begin(), init.end());
  std::string error;
  std::vector<float> model;
  try {
    Client c(client_options(run.server.endpoint(), 0, 1), make_compressor("dense", kDim), init);
    LocalSteps local(c, {2, 3});
    std::vector<float> p(kDim);
    local.start(p);
    for (uint64_t t = 0; t < kSteps; ++t) {
      const std::vector<float> before = p;
      local_sgd(p, 0, t);
      for (size_t i = 0; i < kDim; ++i) expect[i] += double(p[i]) - double(before[i]);
      local.after_step(p);
    }
    model.assign(c.params().begin(), c.params().end());
  } catch (const std::exception& e) {
    error = e.what();
  }
  ASSERT_EQ(error, "");
  for (size_t i = 0; i < kDim; ++i) ASSERT_NEAR(model[i], expect[i], 1e-5) << i;
}

TEST(LocalSteps, AsynchronousDiLoCoAppliesEachPseudoGradientAsItArrives) {
  // An asynchronous server with the outer Nesterov step: each worker's change every 4 steps is
  // applied when it comes; fetching every 2 steps asks the server (between pushes too).
  constexpr uint64_t kDim = 1000;
  ServerOptions o = server_options("topk:k=100", 2, kDim, 0, 0.7f, {0.9f, true});
  o.job.mode = AsyncMode{};
  Running run(o);
  const auto init = test::initial_params(kDim, 5);
  const auto got = train(run, "topk:k=100", 2, kDim, 12, {4, 2}, init);
  bool last = false;
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].error, "") << "rank " << r;
    EXPECT_EQ(std::memcmp(got[r].params.data(), got[r].model.data(), kDim * 4), 0) << r;
    last |= std::memcmp(got[r].model.data(), run.server.engine().model().data(), kDim * 4) == 0;
  }
  EXPECT_TRUE(last) << "the worker that pushed last does not hold the server's model";
  EXPECT_EQ(run.finish(), 6u);  // 3 pushes each, none refused
  EXPECT_NE(std::memcmp(run.server.engine().model().data(), init.data(), kDim * 4), 0);
}

TEST(LocalSteps, BadKnobsAndANonFiniteChangeAreRefusedAndNothingIsLost) {
  constexpr uint64_t kDim = 500;
  Running run(server_options("dense", 1, kDim, 3, 1.0f, {}));
  const auto init = test::initial_params(kDim, 5);
  Client c(client_options(run.server.endpoint(), 0, 1), make_compressor("dense", kDim), init);
  EXPECT_THROW(LocalSteps(c, {0, 1}), InvalidArgument);
  EXPECT_THROW(LocalSteps(c, {1, 0}), InvalidArgument);
  LocalSteps local(c, {1, 1});
  std::vector<float> short_params(kDim - 1);
  EXPECT_THROW(local.start(short_params), InvalidArgument);
  std::vector<float> p(kDim);
  local.start(p);
  local_sgd(p, 0, 0);
  const std::vector<float> good = p;
  p[7] = std::nanf("");
  EXPECT_THROW(local.after_step(p), NonFiniteError);
  EXPECT_EQ(c.round(), 0u);  // nothing was pushed
  EXPECT_EQ(local.steps(), 0u);
  p = good;  // the caller repairs its model: the same step goes through
  const auto r = local.after_step(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, StepResult::Outcome::Updated);
  for (size_t i = 0; i < kDim; ++i) ASSERT_NEAR(c.params()[i], good[i], 1e-6f) << i;
}

}  // namespace
}  // namespace sketchsgd::ps
