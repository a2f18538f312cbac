// The ZeroMQ server and worker clients on 127.0.0.1 (threads of this process): whole rounds over
// real sockets, bit for bit against the in-process reference; refusals reach the worker as errors;
// a raw client's malformed traffic is refused while the real workers keep training.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/server.hpp>
#include <sketchsgd/worker/client.hpp>
#include "support/helpers.hpp"
#include "support/ps_loopback.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

using test_loopback::client_options;
using test_loopback::options;
using test_loopback::Running;

class Loopback : public ::testing::TestWithParam<std::string> {};

TEST_P(Loopback, WorkersAndServerEndBitIdenticalToTheReference) {
  constexpr uint64_t kDim = 5000, kRounds = 5;
  constexpr uint32_t kWorld = 3;
  const std::string spec = GetParam();
  Running run(options(spec, kWorld, kDim, kRounds));
  const auto init = test::initial_params(kDim, 3);

  const auto final_params =
      test_loopback::train(run.server.endpoint(), spec, kWorld, kDim, kRounds, 9);
  for (uint32_t r = 0; r < kWorld; ++r) ASSERT_EQ(final_params[r].size(), kDim) << "rank " << r;

  test::Job ref(spec, kDim, kWorld);
  std::vector<float> p = init;
  std::vector<std::vector<float>> ps(kWorld, init);
  for (uint64_t t = 0; t < kRounds; ++t) {
    std::vector<std::vector<float>> grads;
    for (uint32_t r = 0; r < kWorld; ++r) grads.push_back(test::synthetic_grad(p, r, t, 9));
    const auto steps = ref.round(grads, t);
    kernels::cpu::axpy(p.data(), steps[0].data(), kDim, -0.125f);
  }
  for (uint32_t r = 0; r < kWorld; ++r)
    EXPECT_EQ(std::memcmp(final_params[r].data(), p.data(), kDim * 4), 0) << "rank " << r;
  EXPECT_EQ(run.finish(), kRounds);
  EXPECT_EQ(std::memcmp(run.server.engine().model().data(), p.data(), kDim * 4), 0) << "server";
}

TEST(LoopbackSharedIo, WorkersOnOneContextEndBitIdenticalToWorkersWithTheirOwn) {
  constexpr uint64_t kDim = 3000, kRounds = 4;
  constexpr uint32_t kWorld = 4;
  for (const char* spec : {"dense", "topk:k=50", "sketch:k=50,cols=500,p2=2"}) {
    std::vector<std::vector<float>> got[2];
    for (const bool shared : {false, true}) {
      Running run(options(spec, kWorld, kDim, kRounds));
      got[shared] =
          test_loopback::train(run.server.endpoint(), spec, kWorld, kDim, kRounds, 4, shared);
      EXPECT_EQ(run.finish(), kRounds) << spec;
    }
    for (uint32_t r = 0; r < kWorld; ++r) {
      ASSERT_EQ(got[1][r].size(), kDim) << spec << " rank " << r;
      EXPECT_EQ(got[0][r], got[1][r]) << spec << " rank " << r;
    }
  }
}

/// Threads of this process (Linux: /proc/self/status).
int threads_now() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

TEST(LoopbackSharedIo, AClientOnTheSharedContextStartsOneThreadOfItsOwn) {
  constexpr uint64_t kDim = 100;
  constexpr uint32_t kWorld = 8;
  const auto init = test::initial_params(kDim, 3);
  int added[2] = {0, 0};
  for (const bool shared : {false, true}) {
    Running run(options("dense", kWorld, kDim, 1));
    std::vector<std::unique_ptr<Client>> clients;
    int before = 0;
    for (uint32_t r = 0; r < kWorld; ++r) {  // rank 0 first: it gives the server its model
      clients.push_back(std::make_unique<Client>(
          client_options(run.server.endpoint(), r, kWorld, shared), make_compressor("dense", kDim),
          r == 0 ? std::span<const float>(init) : std::span<const float>()));
      if (r == 0) before = threads_now();  // the shared context's own threads are running now
    }
    ASSERT_GT(before, 0);
    added[shared] = threads_now() - before;
    clients.clear();
  }
  // A context of its own brings ZeroMQ's I/O and reaper threads besides the client's I/O thread.
  EXPECT_GE(added[false], 3 * int(kWorld - 1));
  EXPECT_LE(added[true], int(kWorld));  // one each (and room for one thread the test did not start)
}

TEST(LoopbackSharedIo, ClientsComeAndGoOnTheSharedContext) {
  // Each client's wake-up pipe is an inproc endpoint of the shared context, released in the
  // background when its client goes: a new client must never collide with a departed one's.
  constexpr uint64_t kDim = 64;
  Running run(options("dense", 1, kDim, 1000));
  const auto init = test::initial_params(kDim, 3);
  for (int i = 0; i < 40; ++i) {
    Client c(client_options(run.server.endpoint(), 0, 1, true), make_compressor("dense", kDim),
             init);
    ASSERT_EQ(c.params().size(), kDim) << "client " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Loopback, ::testing::ValuesIn(example_specs()),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

TEST(LoopbackStaleness, FastWorkerRunsAheadBoundedAndAllEndEqual) {
  constexpr uint64_t kDim = 2000, kRounds = 10;
  auto o = options("topk:k=40", 2, kDim, kRounds);
  o.job.as<SyncMode>().staleness = 2;
  Running run(o);
  const auto got = test_loopback::train_stale(run.server.endpoint(), "topk:k=40", kDim, kRounds, 2);
  ASSERT_EQ(got.params[0].size(), kDim);
  EXPECT_EQ(got.max_ahead[0], 2u) << "the fast worker never used its slack";
  EXPECT_LE(got.max_ahead[1], 2u);
  EXPECT_EQ(run.finish(), kRounds);
  EXPECT_EQ(std::memcmp(got.params[0].data(), got.params[1].data(), kDim * 4), 0);
  EXPECT_EQ(std::memcmp(got.params[0].data(), run.server.engine().model().data(), kDim * 4), 0);
}

TEST(LoopbackAsync, AFastWorkerFinishesBeforeTheSlowOnePushesAndBothEndOnTheServersModel) {
  // In a round job rank 0 would wait for rank 1's first push (its client's timeout); here rank 1
  // pushes only once rank 0 has done all its steps.
  constexpr uint64_t kDim = 2000, kFast = 12, kSlow = 4;
  auto o = options("topk:k=40", 2, kDim, 0);
  o.job.mode = AsyncMode{};
  Running run(o);
  const auto init = test::initial_params(kDim, 3);
  std::promise<void> slow_ready, fast_done, slow_done;
  auto ready_future = slow_ready.get_future().share();
  auto fast_future = fast_done.get_future().share(), slow_future = slow_done.get_future().share();
  std::vector<std::vector<float>> params(2);
  std::vector<std::string> errors(2);
  auto worker = [&](uint32_t r) {
    bool told = false;  // the other worker waits for this one's steps (and rank 0 for rank 1's
                        // registration: a failing rank 1 tells both)
    try {
      Client c(client_options(run.server.endpoint(), r, 2), make_compressor("topk:k=40", kDim),
               r == 0 ? std::span<const float>(init) : std::span<const float>());
      if (!c.async()) throw Error("the client does not know the job is asynchronous");
      // Rank 1 holds the first model: its first push is then kFast updates of rank 0's old.
      if (r == 1) slow_ready.set_value();
      if (r == 0 && ready_future.wait_for(30s) != std::future_status::ready)
        throw Error("the slow worker did not register");
      if (r == 1 && fast_future.wait_for(30s) != std::future_status::ready)
        throw Error("the fast worker was held back");
      for (uint64_t t = 0; t < (r == 0 ? kFast : kSlow); ++t) {
        const auto res = c.step(test::synthetic_grad(c.params(), r, t, 4));
        if (res.outcome != StepResult::Outcome::Updated) throw Error("push not applied");
        if (r == 1 && res.age != (t == 0 ? kFast : 0)) throw Error("wrong age");
      }
      (r == 0 ? fast_done : slow_done).set_value();
      told = true;
      if (r == 0 && slow_future.wait_for(30s) != std::future_status::ready)
        throw Error("the slow worker did not finish");
      c.fetch();
      params[r].assign(c.params().begin(), c.params().end());
    } catch (const std::exception& e) {
      errors[r] = e.what();
      if (!told) (r == 0 ? fast_done : slow_done).set_value();
      if (r == 1 && ready_future.wait_for(0s) != std::future_status::ready) slow_ready.set_value();
    }
  };
  std::thread fast(worker, 0), slow(worker, 1);
  fast.join();
  slow.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(run.finish(), kFast + kSlow);
  ASSERT_EQ(params[0].size(), kDim);
  ASSERT_EQ(params[1].size(), kDim);
  EXPECT_EQ(std::memcmp(params[0].data(), params[1].data(), kDim * 4), 0);
  EXPECT_EQ(std::memcmp(params[0].data(), run.server.engine().model().data(), kDim * 4), 0);
}

TEST(LoopbackRestart, ServerRestartedWithoutCheckpointGoesOnFromRankZerosModelAndRound) {
  constexpr uint64_t kDim = 1000;
  auto o = options("topk:k=20", 2, kDim, 0);
  o.job.heartbeat = 100ms;
  auto first = std::make_unique<Running>(o);
  const std::string endpoint = first->server.endpoint();
  const auto init = test::initial_params(kDim, 3);
  std::atomic<int> phase{0};  // 2: the new server is up
  std::vector<std::vector<float>> final_params(2);
  std::vector<std::string> errors(2);
  std::vector<int> resynced(2, 0);
  std::vector<std::thread> ws;
  std::atomic<int> ready{0};
  for (uint32_t r = 0; r < 2; ++r)
    ws.emplace_back([&, r] {
      try {
        auto c = client_options(endpoint, r, 2);
        c.heartbeat = 100ms;
        Client client(c, make_compressor("topk:k=20", kDim),
                      r == 0 ? std::span<const float>(init) : std::span<const float>());
        for (uint64_t t = 0; t < 3; ++t)
          client.step(test::synthetic_grad(client.params(), r, t, 9));
        ++ready;
        while (phase < 2) std::this_thread::sleep_for(5ms);
        // The new server knows nothing: rank 0 gives it its model and its round, and the job
        // goes on from there (both workers hold that model: nobody resynchronises).
        for (int n = 0; n < 20 && client.round() < 6; ++n) {
          const auto res = client.step(test::synthetic_grad(client.params(), r, client.round(), 9));
          if (res.outcome == StepResult::Outcome::Resynced) ++resynced[r];
        }
        final_params[r].assign(client.params().begin(), client.params().end());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  while (ready < 2) std::this_thread::sleep_for(5ms);
  const std::vector<float> before(first->server.engine().model().begin(),
                                  first->server.engine().model().end());
  first.reset();  // the server goes away (no checkpoint)
  o.bind = endpoint;
  o.job.max_rounds = 6;
  Running second(o);
  phase = 2;
  for (auto& t : ws) t.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_EQ(resynced[0] + resynced[1], 0);
  // The new server started from rank 0's model at its round 3, then ran rounds 3..5 (not the
  // first three again).
  EXPECT_EQ(second.finish(), 3u);
  EXPECT_EQ(second.server.engine().round(), 6u);
  const auto model = second.server.engine().model();
  EXPECT_EQ(std::memcmp(final_params[0].data(), model.data(), kDim * 4), 0);
  EXPECT_EQ(std::memcmp(final_params[1].data(), model.data(), kDim * 4), 0);
  EXPECT_NE(std::memcmp(before.data(), model.data(), kDim * 4), 0);
}

TEST(LoopbackRefusal, MismatchedWorkerGetsTheServersReason) {
  Running run(options("sketch:k=20,cols=200", 2, 1000, 0));
  auto o = client_options(run.server.endpoint(), 1, 2);
  try {
    Client c(o, make_compressor("topk:k=20", 1000), {});
    FAIL() << "registration with another codec was accepted";
  } catch (const ConfigMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("the job runs 'sketch"), std::string::npos) << e.what();
  }
  o.world = 3;
  EXPECT_THROW(Client(o, make_compressor("sketch:k=20,cols=200", 1000), {}), ConfigMismatch);
}

TEST(LoopbackRefusal, BadClientOptionsAreTypedErrors) {
  const std::vector<float> init(10, 0.0f);
  auto o = client_options("not-an-endpoint", 0, 1);
  EXPECT_THROW(Client(o, make_compressor("dense", 10), init), InvalidArgument);
  o = client_options("tcp://127.0.0.1:1", 2, 2);  // rank outside the world
  EXPECT_THROW(Client(o, make_compressor("dense", 10), init), InvalidArgument);
  o = client_options("tcp://127.0.0.1:1", 0, 1);
  EXPECT_THROW(Client(o, make_compressor("dense", 10), std::vector<float>(9)), InvalidArgument);
  std::vector<float> nan = init;
  nan[3] = std::nanf("");
  EXPECT_THROW(Client(o, make_compressor("dense", 10), nan), NonFiniteError);
  EXPECT_THROW(Client(o, nullptr, init), InvalidArgument);
}

TEST(LoopbackRefusal, NoServerMeansATimeoutNotAHang) {
  auto o = client_options("tcp://127.0.0.1:1", 0, 1);  // nothing listens on port 1
  o.timeout = 600ms;
  o.heartbeat = 100ms;
  const std::vector<float> init(10, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(Client(o, make_compressor("dense", 10), init), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(LoopbackLate, WorkersPastTheLastRoundAreToldAtOnceNotAtTheirTimeout) {
  constexpr uint64_t kDim = 500;
  auto so = options("topk:k=20", 1, kDim, 2);
  so.finish_grace = 10s;  // the server lingers after its last round, answering late workers
  Running run(so);
  const auto init = test::initial_params(kDim, 3);
  auto o = client_options(run.server.endpoint(), 0, 1);
  o.timeout = 30s;
  std::vector<float> final_model;
  {
    Client c(o, make_compressor("topk:k=20", kDim), init);
    for (uint64_t t = 0; t < 2; ++t) c.step(test::synthetic_grad(c.params(), 0, t, 3));
    final_model.assign(c.params().begin(), c.params().end());
    // This worker wants a third round.
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.step(test::synthetic_grad(c.params(), 0, 2, 3));
      FAIL() << "a push past the last round was not refused";
    } catch (const JobFinished& e) {
      EXPECT_EQ(e.round(), 2u);
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "waited for its timeout";
  }
  // A worker that connects after the end still gets the final model, then the same answer.
  const auto t0 = std::chrono::steady_clock::now();
  Client late(o, make_compressor("topk:k=20", kDim), init);
  EXPECT_EQ(late.round(), 2u);
  ASSERT_EQ(late.params().size(), kDim);
  EXPECT_EQ(std::memcmp(late.params().data(), final_model.data(), kDim * 4), 0);
  EXPECT_THROW(late.step(test::synthetic_grad(late.params(), 0, 2, 3)), JobFinished);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(run.finish(), 2u);
  EXPECT_EQ(run.server.engine().late_requests(), 2u);
}

/// Two workers train `steps` steps of `spec` at the server, starting once `abuse` (on a thread
/// of its own, told to stop when they are done) has sent `before` messages; each one's error
/// ("" when none) and final parameters.
struct Trained {
  std::vector<std::string> errors = std::vector<std::string>(2);
  std::vector<std::vector<float>> params = std::vector<std::vector<float>>(2);
};
using Abuse = std::function<void(const std::atomic<bool>& done, std::atomic<int>& sent)>;
Trained train_while(Running& run, const std::string& spec, uint64_t dim, uint64_t steps, int before,
                    const Abuse& abuse) {
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  std::thread abuser([&] { abuse(done, sent); });
  for (int i = 0; i < 30000 && sent < before; ++i) std::this_thread::sleep_for(1ms);
  const auto init = test::initial_params(dim, 3);
  Trained out;
  std::vector<std::thread> ws;
  for (uint32_t r = 0; r < 2; ++r)
    ws.emplace_back([&, r] {
      try {
        Client c(client_options(run.server.endpoint(), r, 2), make_compressor(spec, dim),
                 r == 0 ? std::span<const float>(init) : std::span<const float>());
        for (uint64_t t = 0; t < steps; ++t)
          if (c.step(test::synthetic_grad(c.params(), r, t, 9)).outcome !=
              StepResult::Outcome::Updated)
            throw Error("step not updated");
        out.params[r].assign(c.params().begin(), c.params().end());
      } catch (const std::exception& e) {
        out.errors[r] = e.what();
      }
    });
  for (auto& t : ws) t.join();
  done = true;
  abuser.join();
  return out;
}

TEST(LoopbackAbuse, RawClientGarbageIsRefusedWhileWorkersTrain) {
  constexpr uint64_t kDim = 2000, kRounds = 8;
  Running run(options("sketch:k=20,cols=300", 2, kDim, kRounds));
  const Abuse abuse = [&](const std::atomic<bool>& done, std::atomic<int>& sent) {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(run.server.endpoint());
    std::mt19937 rng(1);
    const Bytes env_ok = encode(Envelope{Type::Push, 5, 0, 1, 0});
    const Bytes hello = encode(Envelope{Type::Hello, 5, 0, 0, 0});
    for (int i = 0; i < 3000 && !done; ++i, ++sent) {
      std::vector<zmq::message_t> parts;
      switch (i % 5) {
        case 0:
          parts.emplace_back(size_t(rng() % 100));
          break;  // random short frame
        case 1:
          parts.emplace_back(env_ok.data(), env_ok.size());
          break;  // missing payload
        case 2:
          for (int k = 0; k < 20; ++k) parts.emplace_back(env_ok.data(), env_ok.size());
          break;  // too many frames
        case 3: {
          Bytes b = env_ok;
          b[rng() % b.size()] ^= uint8_t(1 + rng() % 255);
          parts.emplace_back(b.data(), b.size());
          parts.emplace_back(size_t(64));
          break;
        }
        case 4:
          parts.emplace_back(hello.data(), hello.size());
          parts.emplace_back(size_t(3));  // truncated hello
          break;
      }
      for (size_t k = 0; k < parts.size(); ++k)
        (void)s.send(parts[k],
                     k + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (i % 50 == 49) std::this_thread::sleep_for(2ms);
    }
    // Last, a frame over the job's size limit: ZeroMQ drops this connection.
    zmq::message_t huge(size_t(1) << 22);
    (void)s.send(huge, zmq::send_flags::dontwait);
    std::this_thread::sleep_for(50ms);
  };
  const auto t = train_while(run, "sketch:k=20,cols=300", kDim, kRounds, 200, abuse);
  EXPECT_EQ(t.errors[0], "");
  EXPECT_EQ(t.errors[1], "");
  EXPECT_EQ(run.finish(), kRounds);
  EXPECT_GT(run.server.engine().rejected(), 0u);
}

class LoopbackForged : public ::testing::TestWithParam<bool> {};

TEST_P(LoopbackForged, ClaimedEpochsDeposalsAndFollowsEndNoJob) {
  // A server with no backup, round or asynchronous, while a peer that reaches its port sends
  // what once ended a job with one message: Hellos of this very job claiming later epochs
  // (2^31, 2^56), Deposed notices without the server's token, and Follows (it may become the
  // backup, which never acknowledges: a held round, then a cool-down).
  constexpr uint64_t kDim = 1000, kSteps = 8;
  const bool async = GetParam();
  auto o = options("topk:k=30", 2, kDim, async ? 0 : kSteps);
  if (async) o.job.mode = AsyncMode{};
  o.job.deadline = 1500ms;
  Running run(o);
  const std::string spec = make_compressor("topk:k=30", kDim)->spec();
  const Abuse abuse = [&](const std::atomic<bool>& done, std::atomic<int>& sent) {
    zmq::context_t ctx;
    std::vector<zmq::socket_t> socks;
    for (int i = 0; i < 4; ++i) {
      socks.emplace_back(ctx, zmq::socket_type::dealer);
      socks.back().set(zmq::sockopt::linger, 0);
      socks.back().connect(run.server.endpoint());
    }
    const auto send = [](zmq::socket_t& s, const std::vector<Bytes>& parts) {
      for (size_t k = 0; k < parts.size(); ++k) {
        zmq::message_t m(parts[k].data(), parts[k].size());
        (void)s.send(m, (k + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none) |
                            zmq::send_flags::dontwait);
      }
    };
    std::mt19937_64 rng(2);
    for (int i = 0; i < 100000 && !done; ++i, ++sent) {  // for as long as the job runs
      HelloInfo h{2, kDim, spec, 0, ShardId{0, 1, 0, kDim}, 0};
      auto& s = socks[i % socks.size()];
      switch (i % 4) {
        case 0:
          h.epoch = i % 8 ? uint64_t(1) << 31 : uint64_t(72057594021150720);
          send(s, {encode(Envelope{Type::Hello, test_loopback::kJob, 0, uint32_t(i / 4 % 2), 0}),
                   encode(h)});
          break;
        case 1:
          send(s, {encode(Envelope{Type::Deposed, test_loopback::kJob, 0, 0, 0}),
                   encode(DeposedInfo{rng(), "forged"})});
          break;
        case 2:
          h.epoch = i % 8 == 2 ? 5 : 0;  // a later epoch, or a would-be backup
          send(s, {encode(Envelope{Type::Follow, test_loopback::kJob, 0, 0, 0}), encode(h)});
          break;
        case 3:
          send(s, {encode(Envelope{Type::Deposed, test_loopback::kJob, 0, 0, 0}),
                   encode_text("no token")});
          break;
      }
      if (i % 20 == 19) std::this_thread::sleep_for(1ms);
    }
  };
  const auto t = train_while(run, "topk:k=30", kDim, kSteps, 100, abuse);
  EXPECT_EQ(t.errors[0], "");
  EXPECT_EQ(t.errors[1], "");
  EXPECT_EQ(run.server.deposed(), "");
  EXPECT_EQ(run.server.engine().round(), async ? 2 * kSteps : kSteps);
  if (!async) {
    EXPECT_EQ(t.params[0], t.params[1]);
    const auto model = run.server.engine().model();
    EXPECT_EQ(std::vector<float>(model.begin(), model.end()), t.params[0]);
  }
  (void)run.finish();
  EXPECT_EQ(run.server.deposed(), "");
  EXPECT_GT(run.server.engine().rejected(), 0u);
}

INSTANTIATE_TEST_SUITE_P(RoundsAndAsync, LoopbackForged, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Async" : "Rounds"; });

}  // namespace
}  // namespace sketchsgd::ps

namespace sketchsgd::ps {
namespace {

TEST(LoopbackCurve, OnlyListedKeysConnectAndEachIsBoundToItsRank) {
  const CurveKeys server = curve_keypair(), k0 = curve_keypair(), k1 = curve_keypair(),
                  stranger = curve_keypair();
  auto o = options("dense", 2, 100, 0);
  o.curve_secret = server.secret_key;
  o.curve_clients = {{0, k0.public_key}, {1, k1.public_key}};
  Running run(o);
  const std::vector<float> init(100, 0.5f);
  auto with = [&](uint32_t rank, const CurveKeys& k) {
    auto c = client_options(run.server.endpoint(), rank, 2);
    c.timeout = 1500ms;
    c.heartbeat = 100ms;
    c.curve_server_key = server.public_key;
    c.curve_public = k.public_key;
    c.curve_secret = k.secret_key;
    return c;
  };
  {
    Client c(with(0, k0), make_compressor("dense", 100), init);
    EXPECT_EQ(c.params()[0], 0.5f);
  }
  // An unlisted key never gets past the handshake.
  EXPECT_THROW(Client(with(1, stranger), make_compressor("dense", 100), {}), TimeoutError);
  // A listed key claiming another rank is refused with the reason.
  try {
    Client c(with(0, k1), make_compressor("dense", 100), init);
    FAIL() << "rank 1's key registered as rank 0";
  } catch (const ConfigMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("bound to rank 1"), std::string::npos) << e.what();
  }
  // Without CURVE at all: no handshake, no registration.
  auto plain = client_options(run.server.endpoint(), 1, 2);
  plain.timeout = 1000ms;
  EXPECT_THROW(Client(plain, make_compressor("dense", 100), {}), TimeoutError);
}

TEST(LoopbackCurve, ABackupFollowsWithTheServersOwnKeyPairAndTakesOverForTheListedWorkers) {
  const CurveKeys server = curve_keypair(), k0 = curve_keypair(), k1 = curve_keypair(),
                  other = curve_keypair();
  constexpr uint64_t kDim = 100, kRounds = 8;
  auto o = options("topk:k=10", 2, kDim, kRounds);
  o.job.heartbeat = 100ms;
  o.curve_secret = server.secret_key;
  o.curve_clients = {{0, k0.public_key}, {1, k1.public_key}};
  Running primary(o);
  auto b = o;
  b.replica_of = primary.server.endpoint();
  Running backup(b);
  // A server of another key pair never gets past the primary's handshake.
  auto x = b;
  x.curve_secret = other.secret_key;
  Running stranger(x);

  const std::string endpoints = primary.server.endpoint() + "|" + backup.server.endpoint();
  const auto init = test::initial_params(kDim, 3);
  std::vector<std::vector<float>> params(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ws;
  for (uint32_t r = 0; r < 2; ++r)
    ws.emplace_back([&, r] {
      try {
        auto c = client_options(endpoints, r, 2);
        c.curve_server_key = server.public_key;
        c.curve_public = (r ? k1 : k0).public_key;
        c.curve_secret = (r ? k1 : k0).secret_key;
        Client client(c, make_compressor("topk:k=10", kDim),
                      r == 0 ? std::span<const float>(init) : std::span<const float>());
        for (uint64_t t = 0; client.round() < kRounds; ++t) {
          client.step(test::synthetic_grad(client.params(), r, client.round(), 9));
          if (r == 0 && t == 2) primary.finish();  // the primary goes away mid-job
        }
        params[r].assign(client.params().begin(), client.params().end());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ws) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  backup.finish();
  stranger.finish();
  const Engine& e = backup.server.engine();
  EXPECT_EQ(e.round(), kRounds);
  EXPECT_EQ(e.epoch(), 1u) << "the backup did not take over";
  ASSERT_EQ(params[0].size(), kDim);
  EXPECT_EQ(params[0], params[1]);
  EXPECT_TRUE(std::equal(params[0].begin(), params[0].end(), e.model().begin()));
  EXPECT_FALSE(stranger.server.engine().has_model()) << "a stranger's server followed";
}

}  // namespace
}  // namespace sketchsgd::ps
