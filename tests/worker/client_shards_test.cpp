// Sharded jobs over real sockets on 127.0.0.1: S servers in threads of this process, Clients
// naming all S. Dense shards end bit-identical to one server; other codecs keep every worker and
// server in step; a plan that differs is refused; a killed shard restarts from its checkpoint
// while the others go on; a shard that stays down is a timeout; one shard's abuse leaves the
// others serving.
#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include <sketchsgd/ps/shards.hpp>
#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/server.hpp>
#include <sketchsgd/worker/client.hpp>
#include "support/ps_loopback.hpp"
#include "support/ps_synthetic.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;
using test_loopback::client_options;
using test_loopback::Running;

ServerOptions shard_options(const std::string& spec, uint32_t world, uint64_t dim, uint64_t rounds,
                            uint32_t count, uint32_t index) {
  const ShardPlan p = plan_shards(spec, dim, count)[index];
  ServerOptions o = test_loopback::options(p.spec, world, p.dim, rounds);
  o.job.shard = p.id;
  return o;
}

struct Shards {
  /// adjust: changes every shard's options alike (staleness, a federated population).
  Shards(const std::string& spec, uint32_t world, uint64_t dim, uint64_t rounds, uint32_t count,
         const std::function<void(ServerOptions&)>& adjust = {}) {
    for (uint32_t i = 0; i < count; ++i) {
      ServerOptions o = shard_options(spec, world, dim, rounds, count, i);
      if (adjust) adjust(o);
      servers.push_back(std::make_unique<Running>(std::move(o)));
    }
  }
  std::string endpoints() const {
    std::string e;
    for (const auto& s : servers) e += (e.empty() ? "" : ",") + s->server.endpoint();
    return e;
  }
  /// Every (stopped) server's model is its range of params, bit for bit.
  void expect_models_are(std::span<const float> params, const std::string& spec,
                         uint64_t dim) const {
    for (const auto& p : plan_shards(spec, dim, uint32_t(servers.size())))
      EXPECT_EQ(std::memcmp(servers[p.id.index]->server.engine().model().data(),
                            params.data() + p.id.begin, p.dim * 4),
                0)
          << spec << " shard " << p.id.index;
  }
  std::vector<std::unique_ptr<Running>> servers;
};

/// The workers of loopback tests, on synthetic gradients of seed 5.
std::vector<std::vector<float>> train(const std::string& endpoints, const std::string& spec,
                                      uint32_t world, uint64_t dim, uint64_t rounds) {
  return test_loopback::train(endpoints, spec, world, dim, rounds, 5);
}

TEST(ShardedLoopback, DenseShardsEndBitIdenticalToOneServer) {
  constexpr uint64_t kDim = 3001, kRounds = 4;
  constexpr uint32_t kWorld = 2;
  Running one(test_loopback::options("dense", kWorld, kDim, kRounds));
  const auto ref = train(one.server.endpoint(), "dense", kWorld, kDim, kRounds);
  for (const uint32_t s : {2u, 3u}) {
    Shards shards("dense", kWorld, kDim, kRounds, s);
    const auto got = train(shards.endpoints(), "dense", kWorld, kDim, kRounds);
    for (uint32_t r = 0; r < kWorld; ++r) {
      ASSERT_EQ(got[r].size(), kDim);
      EXPECT_EQ(std::memcmp(got[r].data(), ref[r].data(), kDim * 4), 0) << s << " shards";
    }
    for (auto& sv : shards.servers) EXPECT_EQ(sv->finish(), kRounds);
    shards.expect_models_are(ref[0], "dense", kDim);
  }
}

TEST(ShardedLoopback, AsynchronousShardsEndBitIdenticalToOneServer) {
  // Each shard keeps its own versions; pushes in one order give every shard the ages one server
  // would see, so dense shards apply the same steps to their ranges.
  constexpr uint64_t kDim = 3001;
  const auto async = [](ServerOptions& o) { o.job.mode = AsyncMode{}; };
  const auto run = [&](const std::string& endpoints) {
    const auto init = test::initial_params(kDim, 3);
    Client c0(client_options(endpoints, 0, 2), make_compressor("dense", kDim), init);
    Client c1(client_options(endpoints, 1, 2), make_compressor("dense", kDim), {});
    for (uint64_t t = 0; t < 4; ++t) {  // one thread: an asynchronous step waits for nobody
      EXPECT_EQ(c0.step(test::synthetic_grad(c0.params(), 0, t, 5)).outcome,
                StepResult::Outcome::Updated);
      if (t % 2) EXPECT_EQ(c1.step(test::synthetic_grad(c1.params(), 1, t, 5)).age, 2u);
    }
    c0.fetch();
    return std::vector<float>(c0.params().begin(), c0.params().end());
  };
  auto o = test_loopback::options("dense", 2, kDim, 0);
  async(o);
  Running one(o);
  const auto ref = run(one.server.endpoint());
  Shards shards("dense", 2, kDim, 0, 3, async);
  const auto got = run(shards.endpoints());
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), kDim * 4), 0);
  EXPECT_EQ(one.finish(), 6u);
  for (auto& sv : shards.servers) EXPECT_EQ(sv->finish(), 6u);
  shards.expect_models_are(ref, "dense", kDim);
}

TEST(ShardedLoopback, CompressedShardsKeepWorkersAndServersInStep) {
  constexpr uint64_t kDim = 4000, kRounds = 4;
  constexpr uint32_t kWorld = 2, kShards = 3;
  for (const std::string spec : {"topk:k=40", "sketch:rows=3,cols=600,k=40"}) {
    Shards shards(spec, kWorld, kDim, kRounds, kShards);
    const auto got = train(shards.endpoints(), spec, kWorld, kDim, kRounds);
    ASSERT_EQ(got[0].size(), kDim) << spec;
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), kDim * 4), 0) << spec;
    for (auto& sv : shards.servers) sv->finish();
    shards.expect_models_are(got[0], spec, kDim);
  }
}

TEST(ShardedLoopback, LaterShardsWaitingForTheFirstToRegisterSendNothingTheServerRefuses) {
  // Rank 1 comes first and waits in its first shard's registration for the model rank 0 brings;
  // its other shards' links must not heartbeat meanwhile (unregistered, under a rank they do not
  // know yet: the server would refuse them and the sessions log the refusals as misaddressed).
  constexpr uint64_t kDim = 600;
  constexpr uint32_t kWorld = 2;
  Shards shards("dense", kWorld, kDim, 1, 3);
  std::mutex mu;
  std::vector<std::string> lines;
  auto o = client_options(shards.endpoints(), 1, kWorld);
  o.heartbeat = 100ms;  // until registration tells the server's
  o.log = [&](const std::string& s) {
    std::lock_guard lock(mu);
    lines.push_back(s);
  };
  const auto init = test::initial_params(kDim, 3);
  std::vector<float> second;
  std::thread late([&] {
    std::this_thread::sleep_for(800ms);
    Client c0(client_options(shards.endpoints(), 0, kWorld), make_compressor("dense", kDim), init);
    (void)c0.step(test::synthetic_grad(c0.params(), 0, 0, 5));
  });
  {
    Client c1(o, make_compressor("dense", kDim), {});
    (void)c1.step(test::synthetic_grad(c1.params(), 1, 0, 5));
  }
  late.join();
  std::lock_guard lock(mu);
  for (const auto& s : lines) EXPECT_EQ(s.find("dropped"), std::string::npos) << s;
}

/// A federated job's rounds (C of N clients sampled a round, each a new stateless Client on
/// synthetic gradients of seed 5, the round's first bringing the model in round 0); the model
/// every client of the last round ended with (each round's clients must agree). ahead: each
/// round's clients check in once the round before has opened, while it runs.
std::vector<float> federated(const std::string& endpoints, const std::string& spec,
                             uint32_t population, uint32_t per_round, uint64_t dim, uint64_t rounds,
                             bool shared_io, bool ahead = false) {
  const auto init = test::initial_params(dim, 3);
  std::vector<std::vector<std::vector<float>>> got(rounds,
                                                   std::vector<std::vector<float>>(per_round));
  std::vector<std::vector<std::string>> errors(rounds, std::vector<std::string>(per_round));
  std::atomic<int64_t> opened{-1};  // the last round whose clients hold the model
  auto client = [&](uint64_t t, uint32_t i) {
    try {
      const auto who = sample_clients(population, per_round, 1, t);
      auto o = client_options(endpoints, who[i], per_round, shared_io);
      o.population = population;
      o.join_round = t;
      o.timeout = 30s;
      for (auto deadline = Clock::now() + 30s; opened.load() + 1 < int64_t(t);) {
        if (Clock::now() > deadline)
          throw Error("round " + std::to_string(t - 1) + " never opened");
        std::this_thread::sleep_for(1ms);
      }
      Client c(o, make_compressor(spec, dim),
               t == 0 ? std::span<const float>(init) : std::span<const float>());
      for (int64_t seen = opened.load();
           seen < int64_t(t) && !opened.compare_exchange_weak(seen, t);) {
      }
      // Time for the next round's clients to check in while this one runs (they come once it
      // has opened, here): a device computing its gradient.
      if (ahead) std::this_thread::sleep_for(100ms);
      const auto res = c.step(test::synthetic_grad(c.params(), who[i], t, 5));
      if (res.outcome != StepResult::Outcome::Updated) throw Error("round not updated");
      got[t][i].assign(c.params().begin(), c.params().end());
    } catch (const std::exception& e) {
      errors[t][i] = e.what();
    }
  };
  for (uint64_t t = 0; t < rounds;) {
    // ahead: every round's clients at once, each waiting for the round before to open; else one
    // round's clients, then the next round's.
    const uint64_t end = ahead ? rounds : t + 1;
    std::vector<std::thread> ts;
    for (uint64_t r = t; r < end; ++r)
      for (uint32_t i = 0; i < per_round; ++i) ts.emplace_back(client, r, i);
    for (auto& th : ts) th.join();
    t = end;
  }
  for (uint64_t t = 0; t < rounds; ++t) {
    for (uint32_t i = 0; i < per_round; ++i) EXPECT_EQ(errors[t][i], "") << "round " << t;
    for (uint32_t i = 1; i < per_round; ++i) EXPECT_EQ(got[t][i], got[t][0]) << "round " << t;
  }
  return got[rounds - 1][0];
}

TEST(ShardedLoopback, FederatedClientsOverShardsEndBitIdenticalToOneServer) {
  constexpr uint64_t kDim = 901, kRounds = 3;
  constexpr uint32_t kPopulation = 12, kPerRound = 3;
  auto one_options = test_loopback::options("dense", kPerRound, kDim, kRounds);
  one_options.job.mode = FederatedMode{.population = kPopulation};
  Running one(one_options);
  const auto ref =
      federated(one.server.endpoint(), "dense", kPopulation, kPerRound, kDim, kRounds, false);
  ASSERT_EQ(ref.size(), kDim);
  Shards shards("dense", kPerRound, kDim, kRounds, 3,
                [](ServerOptions& o) { o.job.mode = FederatedMode{.population = kPopulation}; });
  const auto got =
      federated(shards.endpoints(), "dense", kPopulation, kPerRound, kDim, kRounds, true);
  ASSERT_EQ(got.size(), kDim);
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), kDim * 4), 0);
  EXPECT_EQ(one.finish(), kRounds);
  for (auto& sv : shards.servers) EXPECT_EQ(sv->finish(), kRounds);
}

TEST(ShardedLoopback, FederatedClientsCheckingInAheadEndBitIdenticalToOnesThatComeWithTheirRound) {
  constexpr uint64_t kDim = 901, kRounds = 4;
  constexpr uint32_t kPopulation = 12, kPerRound = 3;
  auto one_options = test_loopback::options("topk:k=40", kPerRound, kDim, kRounds);
  one_options.job.mode = FederatedMode{.population = kPopulation};
  Running one(one_options);
  const auto ref =
      federated(one.server.endpoint(), "topk:k=40", kPopulation, kPerRound, kDim, kRounds, true);
  ASSERT_EQ(ref.size(), kDim);
  EXPECT_EQ(one.finish(), kRounds);
  Running again(one_options);
  const auto got = federated(again.server.endpoint(), "topk:k=40", kPopulation, kPerRound, kDim,
                             kRounds, true, true);
  ASSERT_EQ(got.size(), kDim);
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), kDim * 4), 0);
  EXPECT_EQ(again.finish(), kRounds);
  // Over two shards: each server takes its check-ins on its own.
  const auto federated_job = [](ServerOptions& o) {
    o.job.mode = FederatedMode{.population = kPopulation};
  };
  Shards shards("topk:k=40", kPerRound, kDim, kRounds, 2, federated_job);
  const auto with_round =
      federated(shards.endpoints(), "topk:k=40", kPopulation, kPerRound, kDim, kRounds, true);
  for (auto& sv : shards.servers) EXPECT_EQ(sv->finish(), kRounds);
  Shards shards_again("topk:k=40", kPerRound, kDim, kRounds, 2, federated_job);
  const auto sharded = federated(shards_again.endpoints(), "topk:k=40", kPopulation, kPerRound,
                                 kDim, kRounds, true, true);
  ASSERT_EQ(sharded.size(), kDim);
  EXPECT_EQ(std::memcmp(sharded.data(), with_round.data(), kDim * 4), 0);
  for (auto& sv : shards_again.servers) EXPECT_EQ(sv->finish(), kRounds);
}

TEST(ShardedLoopback, BoundedStalenessOverShardsKeepsEveryShardInStep) {
  // Each shard keeps its own rounds and slack: the fast worker runs ahead on all of them at once,
  // and after sync() both workers hold every shard's model.
  constexpr uint64_t kDim = 2000, kRounds = 10;
  Shards shards("topk:k=40", 2, kDim, kRounds, 3,
                [](ServerOptions& o) { o.job.as<SyncMode>().staleness = 2; });
  const auto got = test_loopback::train_stale(shards.endpoints(), "topk:k=40", kDim, kRounds, 2);
  ASSERT_EQ(got.params[0].size(), kDim);
  EXPECT_EQ(got.max_ahead[0], 2u) << "the fast worker never used its slack";
  EXPECT_LE(got.max_ahead[1], 2u);
  EXPECT_EQ(std::memcmp(got.params[0].data(), got.params[1].data(), kDim * 4), 0);
  for (auto& sv : shards.servers) EXPECT_EQ(sv->finish(), kRounds);
  shards.expect_models_are(got.params[0], "topk:k=40", kDim);
}

TEST(ShardedLoopback, AClientOfAnotherPlanIsRefused) {
  constexpr uint64_t kDim = 900;
  Shards shards("topk:k=30", 1, kDim, 2, 3);
  auto o = client_options(shards.endpoints(), 0, 1);
  o.timeout = 5s;
  const auto init = test::initial_params(kDim, 1);
  // Two of the three endpoints: the client plans two shards.
  const std::string two =
      shards.servers[0]->server.endpoint() + "," + shards.servers[1]->server.endpoint();
  o.server = two;
  EXPECT_THROW(Client(o, make_compressor("topk:k=30", kDim), init), ConfigMismatch);
  // All three, in another order.
  o.server = shards.servers[1]->server.endpoint() + "," + shards.servers[0]->server.endpoint() +
             "," + shards.servers[2]->server.endpoint();
  EXPECT_THROW(Client(o, make_compressor("topk:k=30", kDim), init), ConfigMismatch);
  // Another k: every shard's share differs.
  o.server = shards.endpoints();
  EXPECT_THROW(Client(o, make_compressor("topk:k=31", kDim), init), ConfigMismatch);
  Client good(o, make_compressor("topk:k=30", kDim), init);
  EXPECT_EQ(good.shards(), 3u);
  EXPECT_EQ(std::memcmp(good.params().data(), init.data(), kDim * 4), 0);
  // A NaN anywhere is refused before any shard is sent anything.
  auto bad = test::synthetic_grad(good.params(), 0, 0, 1);
  bad[kDim - 1] = NAN;
  EXPECT_THROW(good.step(bad), NonFiniteError);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(good.shard_round(i), 0u);
  EXPECT_EQ(good.step(test::synthetic_grad(good.params(), 0, 0, 1)).outcome,
            StepResult::Outcome::Updated);
}

// A shard's replicas are listed with '|': more than 8, or an empty one, is the caller's error,
// said before anything is sent (were it not checked, the client would wait out its timeout).
TEST(ShardedLoopback, AReplicaListOfMoreThanEightOrWithAnEmptyItemIsRefused) {
  constexpr uint64_t kDim = 100;
  const auto init = test::initial_params(kDim, 1);
  auto o = client_options("tcp://127.0.0.1:5600", 0, 1);
  o.timeout = 2s;
  std::string nine;
  for (int i = 0; i < 9; ++i)
    nine += (i ? "|tcp://127.0.0.1:" : "tcp://127.0.0.1:") + std::to_string(5600 + i);
  const std::pair<std::string, std::string> cases[] = {
      {nine, "at most 8"},
      {"tcp://127.0.0.1:5600||tcp://127.0.0.1:5601", "empty item"},
      {"tcp://127.0.0.1:5600|", "empty item"},
      {"tcp://127.0.0.1:5600|tcp://127.0.0.1:5601,|tcp://127.0.0.1:5602", "empty item"}};
  for (const auto& [servers, why] : cases) {
    o.server = servers;
    try {
      Client c(o, make_compressor("topk:k=3", kDim), init);
      ADD_FAILURE() << servers << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << servers << ": " << e.what();
    }
  }
}

TEST(ShardedLoopback, AKilledShardRestartsFromItsCheckpointWhileTheOthersGoOn) {
  constexpr uint64_t kDim = 2000, kRounds = 8;
  const std::string spec = "topk:k=50";
  const auto dir =
      std::filesystem::temp_directory_path() / ("sketchsgd-shard-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string ckpt = (dir / "shard1.ckpt").string();
  std::filesystem::remove(ckpt);
  Shards shards(spec, 1, kDim, kRounds, 2);
  auto o1 = shard_options(spec, 1, kDim, kRounds, 2, 1);
  shards.servers[1].reset();
  o1.checkpoint = ckpt;
  o1.job.checkpoint_every = 2;
  shards.servers[1] = std::make_unique<Running>(o1);

  auto o = client_options(shards.endpoints(), 0, 1);
  const auto init = test::initial_params(kDim, 2);
  Client c(o, make_compressor(spec, kDim), init);
  for (uint64_t t = 0; t < 3; ++t)
    ASSERT_EQ(c.step(test::synthetic_grad(c.params(), 0, t, 4)).outcome,
              StepResult::Outcome::Updated);
  // Shard 1 dies after round 2 (its checkpoint holds rounds 0-1) and comes back on its port.
  o1.bind = shards.servers[1]->server.endpoint();
  shards.servers[1].reset();
  shards.servers[1] = std::make_unique<Running>(o1);
  EXPECT_EQ(shards.servers[1]->server.engine().round(), 2u);
  bool resynced = false;
  StepResult last;
  for (int guard = 0; c.round() < kRounds && guard < 20; ++guard) {
    last = c.step(test::synthetic_grad(c.params(), 0, c.round(), 4));
    resynced |= last.outcome == StepResult::Outcome::Resynced;
  }
  EXPECT_TRUE(resynced);
  // The last step ran shard 1's last round alone (shard 0's job had finished: left out).
  EXPECT_EQ(last.outcome, StepResult::Outcome::Updated);
  EXPECT_EQ(last.round, kRounds - 1);
  EXPECT_GT(last.bytes_up, 0u);
  EXPECT_EQ(c.round(), kRounds);
  for (auto& s : shards.servers) {
    s->finish();
    EXPECT_EQ(s->server.engine().round(), kRounds);
  }
  // Shard 0 never stopped: its range and rounds ran on. Both ranges match their servers.
  shards.expect_models_are(c.params(), spec, kDim);
  std::filesystem::remove_all(dir);
}

TEST(ShardedLoopback, AShardThatStaysDownIsATimeoutWhileTheOthersCompleteTheRound) {
  constexpr uint64_t kDim = 1000;
  Shards shards("dense", 1, kDim, 10, 3);
  auto o = client_options(shards.endpoints(), 0, 1);
  o.timeout = 1500ms;
  const auto init = test::initial_params(kDim, 2);
  Client c(o, make_compressor("dense", kDim), init);
  c.step(test::synthetic_grad(c.params(), 0, 0, 4));
  shards.servers[2].reset();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(c.step(test::synthetic_grad(c.params(), 0, 1, 4)), TimeoutError);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 1400ms);
  EXPECT_LT(waited, 10s);
  EXPECT_EQ(c.shard_round(0), 2u);
  EXPECT_EQ(c.shard_round(1), 2u);
  EXPECT_EQ(c.shard_round(2), 1u);
  // The shards that completed moved their ranges on.
  EXPECT_EQ(std::memcmp(shards.servers[0]->server.engine().model().data(), c.params().data(),
                        shards.servers[0]->server.engine().model().size() * 4),
            0);
}

TEST(ShardedLoopback, GarbageAtOneShardLeavesTheJobTraining) {
  constexpr uint64_t kDim = 2000, kRounds = 6;
  Shards shards("sketch:rows=3,cols=400,k=30", 2, kDim, kRounds, 2);
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  std::thread abuser([&] {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(shards.servers[1]->server.endpoint());
    const Bytes push = encode(Envelope{Type::Push, test_loopback::kJob, 0, 1, 0});
    for (int i = 0; i < 2000 && !done; ++i, ++sent) {
      zmq::message_t a(push.data(), push.size()), b(size_t(100 + i % 50));
      (void)s.send(a, zmq::send_flags::sndmore);
      (void)s.send(b, zmq::send_flags::none);  // a push of no registration, junk payload
      if (i % 50 == 49) std::this_thread::sleep_for(2ms);
    }
  });
  while (sent < 100) std::this_thread::sleep_for(1ms);
  const auto got = train(shards.endpoints(), "sketch:rows=3,cols=400,k=30", 2, kDim, kRounds);
  done = true;
  abuser.join();
  ASSERT_EQ(got[0].size(), kDim);
  EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), kDim * 4), 0);
  for (auto& s : shards.servers) EXPECT_EQ(s->finish(), kRounds);
  EXPECT_GT(shards.servers[1]->server.engine().rejected(), 0u);
  EXPECT_EQ(shards.servers[0]->server.engine().rejected(), 0u);
}

}  // namespace
}  // namespace sketchsgd::ps
