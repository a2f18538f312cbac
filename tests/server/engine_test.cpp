// The parameter server's round logic, driven in-process with a fake clock (no sockets):
// registration checks, rounds for every codec bit for bit against the in-process reference,
// deadlines and policies, stale and duplicate traffic, garbage, checkpoints.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/server/engine.hpp>
#include "support/helpers.hpp"
#include "support/ps_job.hpp"
#include "support/ps_net.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

JobConfig job(const std::string& spec, uint32_t world, uint64_t dim) {
  return test_job::make(spec, world, dim);
}

std::vector<FakeWorker> start(Net& net, const JobConfig& cfg, std::span<const float> init) {
  std::vector<FakeWorker> ws;
  for (uint32_t r = 0; r < cfg.world; ++r) ws.emplace_back(r, cfg);
  // Ranks 1.. register and pull before rank 0 initialises: their pulls wait for the model.
  for (uint32_t r = cfg.world; r-- > 0;) ws[r].join(net, init);
  for (auto& w : ws) EXPECT_TRUE(w.take_model(net)) << "rank " << w.rank;
  return ws;
}

/// One round in which every worker pushes a synthetic gradient and applies the update. Each
/// worker is settled until its round ends: with a second round (p2 > 0) a worker's Update needs
/// every other worker's Answer, so one pass in rank order is not enough.
void run_round(Net& net, std::vector<FakeWorker>& ws, uint64_t t) {
  for (auto& w : ws) w.push(net, test::synthetic_grad(w.params, w.rank, t, 3));
  std::vector<std::optional<Type>> ended(ws.size());
  for (int pass = 0; pass < 4; ++pass)  // two phases need two passes; more means a hang
    for (size_t i = 0; i < ws.size(); ++i)
      if (!ended[i]) ended[i] = ws[i].settle(net);
  for (size_t i = 0; i < ws.size(); ++i) ASSERT_EQ(ended[i], Type::Update) << "rank " << i;
}

/// Workers that join a server restored from a checkpoint and take its model.
std::vector<FakeWorker> rejoin(Net& net, const JobConfig& cfg) {
  std::vector<FakeWorker> ws;
  for (uint32_t r = 0; r < cfg.world; ++r) {
    ws.emplace_back(r, cfg);
    ws[r].join(net, {});
    EXPECT_TRUE(ws[r].take_model(net)) << "rank " << r;
  }
  return ws;
}

class EngineCodecs : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineCodecs, RoundsMatchTheInProcessReferenceBitForBit) {
  constexpr uint64_t kDim = 3000;
  constexpr uint32_t kWorld = 3;
  const JobConfig cfg = job(GetParam(), kWorld, kDim);
  Net net(cfg);
  const auto init = test::initial_params(kDim, 7);
  auto ws = start(net, cfg, init);

  test::Job ref(cfg.spec, kDim, kWorld);
  std::vector<float> ref_params = init;
  for (uint64_t t = 0; t < 6; ++t) {
    std::vector<std::vector<float>> grads;
    for (auto& w : ws) {
      grads.push_back(test::synthetic_grad(w.params, w.rank, t, 11));
      w.push(net, grads.back());
    }
    for (int pass = 0; pass < 2; ++pass)  // second pass: updates after answers
      for (auto& w : ws) w.settle(net);
    for (auto& w : ws) ASSERT_EQ(w.round, t + 1) << "rank " << w.rank << " round " << t;
    const auto steps = ref.round(grads, t);
    kernels::cpu::axpy(ref_params.data(), steps[0].data(), kDim, -cfg.lr);
  }
  EXPECT_EQ(net.engine.round(), 6u);
  const auto model = net.engine.model();
  ASSERT_EQ(model.size(), kDim);
  EXPECT_EQ(std::memcmp(model.data(), ref_params.data(), kDim * 4), 0) << "server ≠ reference";
  for (auto& w : ws)
    EXPECT_EQ(std::memcmp(w.params.data(), ref_params.data(), kDim * 4), 0) << "rank " << w.rank;
  EXPECT_NE(std::memcmp(ref_params.data(), init.data(), kDim * 4), 0) << "nothing was trained";
}

INSTANTIATE_TEST_SUITE_P(Every, EngineCodecs,
                         ::testing::ValuesIn(example_specs(Layout::parse("30x90+300"))),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

std::string refusal(Net& net, const PeerId& peer) {
  auto m = net.next(peer);
  if (!m || m->first.type != Type::Refuse) return "<no refusal>";
  return decode_refuse(m->second[1].bytes()).reason;
}

TEST(Engine, RegistrationRefusesEveryMismatchWithAReason) {
  const JobConfig cfg = job("sketch:k=20,cols=200", 2, 500);
  Net net(cfg);
  FakeWorker w(0, cfg);

  w.hello(net, 3);
  EXPECT_NE(refusal(net, w.peer).find("world size 3"), std::string::npos);

  const HelloInfo bad_dim{2, 501, w.codec->spec()};
  net.deliver(w.peer, {env(Type::Hello, cfg.job, 0, 0), Frame::own(encode(bad_dim))});
  EXPECT_NE(refusal(net, w.peer).find("dim 501"), std::string::npos);

  const HelloInfo bad_spec{2, 500, make_compressor("topk:k=20", 500)->spec()};
  net.deliver(w.peer, {env(Type::Hello, cfg.job, 0, 0), Frame::own(encode(bad_spec))});
  EXPECT_NE(refusal(net, w.peer).find("codec 'topk"), std::string::npos);

  const HelloInfo good{2, 500, w.codec->spec()};
  net.deliver(w.peer, {env(Type::Hello, cfg.job + 1, 0, 0), Frame::own(encode(good))});
  EXPECT_NE(refusal(net, w.peer).find("job id 43"), std::string::npos);

  net.deliver(w.peer, {env(Type::Hello, cfg.job, 0, 5), Frame::own(encode(good))});
  EXPECT_NE(refusal(net, w.peer).find("rank 5 outside"), std::string::npos);

  Bytes future = encode(Envelope{Type::Hello, cfg.job, 0, 0, 0});
  future[4] = kProtocolVersion + 1;  // a worker speaking the next protocol version
  net.deliver(w.peer, {Frame::own(future), Frame::own(encode(good))});
  EXPECT_NE(refusal(net, w.peer)
                .find("protocol version " + std::to_string(kProtocolVersion + 1) +
                      ", this server speaks " + std::to_string(kProtocolVersion)),
            std::string::npos);

  const HelloInfo federated{2, 500, w.codec->spec(), 100};
  net.deliver(w.peer, {env(Type::Hello, cfg.job, 0, 0), Frame::own(encode(federated))});
  EXPECT_NE(refusal(net, w.peer).find("population 100, the job has fixed workers"),
            std::string::npos);

  w.hello(net);
  ASSERT_EQ(net.next(w.peer)->first.type, Type::Welcome);
  // A second live connection claiming rank 0 is refused (retry later), not allowed to take over.
  net.deliver("intruder", {env(Type::Hello, cfg.job, 0, 0), Frame::own(encode(good))});
  auto m = net.next("intruder");
  ASSERT_TRUE(m && m->first.type == Type::Refuse);
  const RefuseInfo r = decode_refuse(m->second[1].bytes());
  EXPECT_TRUE(r.retry);
  EXPECT_NE(r.reason.find("held by a live connection"), std::string::npos);
  // Once the holder has been silent for dead_after heartbeats, a restarted worker takes the rank.
  net.now += 350ms;
  net.deliver("restarted", {env(Type::Hello, cfg.job, 0, 0), Frame::own(encode(good))});
  EXPECT_EQ(net.next("restarted")->first.type, Type::Welcome);
  // The old connection is no longer rank 0.
  net.deliver(w.peer, {env(Type::Pull, cfg.job, 0, 0)});
  EXPECT_NE(refusal(net, w.peer).find("not registered"), std::string::npos);
  EXPECT_EQ(net.engine.rejected(),
            10u);  // 8 refusals; the other-version hello also fails to decode
}

TEST(Engine, QuorumPolicyClosesWithoutADeadWorker) {
  JobConfig cfg = job("topk:k=10", 3, 200);
  cfg.closing() = {Policy::Quorum, 2};
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(200, 1));
  for (int i = 0; i < 2; ++i) ws[i].push(net, test::synthetic_grad(ws[i].params, i, 0, 3));
  net.tick(50ms);
  EXPECT_FALSE(ws[0].settle(net)) << "closed before rank 2 was known dead";
  // Ranks 0 and 1 keep showing liveness; rank 2 stays silent past 3 heartbeat intervals.
  for (int i = 0; i < 4; ++i) {
    for (int r = 0; r < 2; ++r) net.deliver(ws[r].peer, {ws[r].mine(Type::Heartbeat, 0)});
    net.tick(100ms);
  }
  EXPECT_EQ(net.engine.live_workers(), 2u);
  EXPECT_EQ(ws[0].settle(net), Type::Update);
  EXPECT_EQ(ws[1].settle(net), Type::Update);
  EXPECT_EQ(net.engine.round(), 1u);
  // The dead worker comes back with its round-0 push: stale, so it gets round 0's update again.
  ws[2].push(net, test::synthetic_grad(ws[2].params, 2, 0, 3));
  EXPECT_EQ(ws[2].settle(net), Type::Update);
  EXPECT_EQ(std::memcmp(ws[2].params.data(), ws[0].params.data(), 800), 0);
  EXPECT_EQ(net.engine.live_workers(), 3u);
}

// Found by scripts/chaos.py: a primary paused through the last round woke, ended it (its workers'
// pushes had waited in its socket), found every worker declared dead (their connections had gone
// while it slept) and stopped before they came back for the last update.
TEST(Engine, AFinishedServerAwaitsTheWorkersOfTheLastRoundNotTheLongDead) {
  JobConfig cfg = job("topk:k=10", 3, 200);
  cfg.closing() = {Policy::Quorum, 2};
  cfg.max_rounds = 2;
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(200, 6));
  // Round 0 without rank 2, declared dead (silent past dead_after heartbeats) and gone for good.
  for (int i = 0; i < 2; ++i) ws[i].push(net, test::synthetic_grad(ws[i].params, i, 0, 3));
  for (int t = 0; t < 4; ++t) {
    for (int r = 0; r < 2; ++r) net.deliver(ws[r].peer, {ws[r].mine(Type::Heartbeat, 0)});
    net.tick(100ms);
  }
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ws[r].settle(net), Type::Update);
  EXPECT_EQ(net.engine.awaited_workers(), 2u);
  // The last round: ranks 0 and 1 push, then fall silent (paused, cut off) and are declared dead.
  for (int i = 0; i < 2; ++i) ws[i].push(net, test::synthetic_grad(ws[i].params, i, 1, 3));
  ASSERT_TRUE(net.engine.finished());
  for (int t = 0; t < 4; ++t) net.tick(100ms);
  EXPECT_EQ(net.engine.live_workers(), 0u);
  EXPECT_EQ(net.engine.awaited_workers(), 2u) << "the last round's workers are coming back";
  // Rank 0 comes back (its old connection's Update lost), gets the last update and says Bye.
  ws[0].peer = "peer-0-again";
  ws[0].hello(net);
  const auto welcome = net.next(ws[0].peer);
  ASSERT_EQ(welcome->first.type, Type::Welcome);
  ws[0].session = welcome->first.session;
  ws[0].push(net, test::synthetic_grad(ws[0].params, 0, 1, 3));
  EXPECT_EQ(ws[0].settle(net), Type::Update);
  net.deliver(ws[0].peer, {ws[0].mine(Type::Bye, 2)});
  EXPECT_EQ(net.engine.awaited_workers(), 1u);
  net.deliver(ws[1].peer, {ws[1].mine(Type::Bye, 2)});
  EXPECT_EQ(net.engine.awaited_workers(), 0u) << "rank 2, dead before the last round, is awaited";
}

TEST(Engine, AbortPolicyEndsTheRoundAtTheDeadline) {
  JobConfig cfg = job("dense", 2, 100);
  cfg.closing().policy = Policy::Abort;
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(100, 2));
  const std::vector<float> before(net.engine.model().begin(), net.engine.model().end());
  ws[0].push(net, test::synthetic_grad(ws[0].params, 0, 0, 3));
  net.tick(900ms);
  EXPECT_FALSE(ws[0].settle(net));
  net.deliver(ws[1].peer, {ws[1].mine(Type::Heartbeat, 0)});
  net.tick(200ms);
  EXPECT_EQ(ws[0].settle(net), Type::Abort);
  EXPECT_EQ(ws[1].settle(net), Type::Abort);
  EXPECT_EQ(net.engine.round(), 1u);
  EXPECT_EQ(std::memcmp(net.engine.model().data(), before.data(), 400), 0)
      << "abort changed the model";
  // The next round runs normally.
  for (auto& w : ws) w.push(net, test::synthetic_grad(w.params, w.rank, 1, 3));
  EXPECT_EQ(ws[0].settle(net), Type::Update);
}

TEST(Engine, TheDeadlineToWakeForIsTheRunningPhasesOnly) {
  // The server sleeps until its next tick or this deadline, whichever is first: a quorum round
  // closes at its deadline, not up to a tick later.
  JobConfig cfg = job("dense", 2, 100);
  cfg.closing() = {Policy::Quorum, 1};
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(100, 2));
  EXPECT_FALSE(net.engine.deadline()) << "no round has started";
  const auto pushed = net.now;
  ws[0].push(net, test::synthetic_grad(ws[0].params, 0, 0, 3));
  ASSERT_TRUE(net.engine.deadline());
  EXPECT_EQ(*net.engine.deadline(), pushed + cfg.deadline);
  net.deliver(ws[1].peer, {ws[1].mine(Type::Heartbeat, 0)});
  net.tick(cfg.deadline);
  EXPECT_EQ(ws[0].settle(net), Type::Update);  // closed with one at the deadline
  EXPECT_FALSE(net.engine.deadline());
  for (const Policy p : {Policy::Wait}) {  // waiting has nothing to wake for
    JobConfig w = cfg;
    w.closing().policy = p;
    Net other(w);
    auto os = start(other, w, test::initial_params(100, 2));
    os[0].push(other, test::synthetic_grad(os[0].params, 0, 0, 3));
    EXPECT_FALSE(other.engine.deadline());
  }
}

TEST(Engine, WaitPolicyWaitsPastTheDeadline) {
  JobConfig cfg = job("dense", 2, 100);
  cfg.closing().policy = Policy::Wait;
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(100, 2));
  ws[0].push(net, test::synthetic_grad(ws[0].params, 0, 0, 3));
  for (int i = 0; i < 30; ++i) net.tick(100ms);  // rank 1 dead and past the deadline
  EXPECT_FALSE(ws[0].settle(net));
  ws[1].push(net, test::synthetic_grad(ws[1].params, 1, 0, 3));
  EXPECT_EQ(ws[0].settle(net), Type::Update);
  EXPECT_EQ(ws[1].settle(net), Type::Update);
}

class TwoRoundCodecs : public ::testing::TestWithParam<std::string> {};

// Found by scripts/chaos.py (two-round jobs stalled with every process live): a worker cut off
// while its round was in its second phase registered again and pushed the round again, and the
// server dropped that push ("in its second phase") and waited for an answer to a Query that had
// gone to the old connection.
TEST_P(TwoRoundCodecs, AQueriedWorkerThatRegistersAgainIsAskedAgain) {
  JobConfig cfg = job(GetParam(), 2, 200);
  cfg.closing().policy = Policy::Wait;
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(200, 5));
  const Message g0 = ws[0].codec->encode(test::synthetic_grad(ws[0].params, 0, 0, 3), 0, 0);
  net.deliver(ws[0].peer, {ws[0].mine(Type::Push, 0), bytes_frame(g0)});
  ws[1].push(net, test::synthetic_grad(ws[1].params, 1, 0, 3));
  ASSERT_EQ(net.next(ws[0].peer)->first.type, Type::Query);  // lost with the old connection
  // Rank 0's old connection falls silent while rank 1 stays live (its Query waits for it, so the
  // phase does not close on the dead rank's missing answer); rank 0 comes back on another.
  for (int i = 0; i < 4; ++i) {
    net.deliver(ws[1].peer, {ws[1].mine(Type::Heartbeat, 0)});
    net.tick(100ms);
  }
  ws[0].peer = "peer-0-again";
  ws[0].hello(net);
  const auto welcome = net.next(ws[0].peer);
  ASSERT_EQ(welcome->first.type, Type::Welcome);
  ws[0].session = welcome->first.session;
  // As a Session does: its push without an outcome again, then a Pull.
  net.deliver(ws[0].peer, {ws[0].mine(Type::Push, 0), bytes_frame(g0)});
  net.deliver(ws[0].peer, {ws[0].mine(Type::Pull, 0)});
  const uint64_t rejected = net.engine.rejected();
  EXPECT_FALSE(ws[0].settle(net));  // answers, if asked; the round waits for rank 1
  ASSERT_EQ(ws[1].settle(net), Type::Update) << "the round waits for rank 0's answer";
  EXPECT_EQ(ws[0].settle(net), Type::Update);
  EXPECT_EQ(net.engine.round(), 1u);
  EXPECT_EQ(net.engine.rejected(), rejected) << "a message of the job was refused";
  EXPECT_EQ(std::memcmp(ws[0].params.data(), ws[1].params.data(), 800), 0);
  // A rank whose Answer arrived is not asked again: its push again is a duplicate.
  const Message g1 = ws[0].codec->encode(test::synthetic_grad(ws[0].params, 0, 1, 3), 1, 0);
  net.deliver(ws[0].peer, {ws[0].mine(Type::Push, 1), bytes_frame(g1)});
  ws[1].push(net, test::synthetic_grad(ws[1].params, 1, 1, 3));
  EXPECT_FALSE(ws[0].settle(net));  // answers its Query; rank 1 has not yet
  net.deliver(ws[0].peer, {ws[0].mine(Type::Push, 1), bytes_frame(g1)});
  EXPECT_FALSE(net.next(ws[0].peer)) << "asked again after it answered";
  EXPECT_EQ(ws[1].settle(net), Type::Update);
  EXPECT_EQ(ws[0].settle(net), Type::Update);
  EXPECT_EQ(net.engine.round(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Every, TwoRoundCodecs,
                         ::testing::Values("sketch:k=10,cols=50,p2=2",
                                           "powersgd:rank=2,layout=10x20"),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

TEST(Engine, DuplicateFutureAndGarbageTrafficChangesNothing) {
  const JobConfig cfg = job("topk:k=10", 2, 200);
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(200, 4));
  const auto g0 = test::synthetic_grad(ws[0].params, 0, 0, 3);
  ws[0].push(net, g0);
  const uint64_t rejected = net.engine.rejected();
  ws[0].push(net, g0);  // duplicate: the aggregator refuses the second copy
  EXPECT_EQ(net.engine.rejected(), rejected + 1);

  const PeerId p = ws[1].peer;
  const Frame good_env = ws[1].mine(Type::Push, 0);
  std::vector<Frames> garbage = {
      {},
      {Frame::own(Bytes{1, 2, 3})},
      {Frame::own(Bytes(32, 0))},
      {good_env},                                                  // push without its payload frame
      {good_env, Frame::own(Bytes(10, 7))},                        // payload not a wire message
      {good_env, Frame::own(Bytes(10, 7)), Frame::own({})},        // too many frames
      {env(Type::Push, cfg.job, 0, 0), Frame::own(Bytes(64, 0))},  // another rank's identity
      {ws[1].mine(Type::Update, 0), Frame::own({}), Frame::own({})},  // server-only type
      {ws[1].mine(Type::Init, 0), Frame::own(Bytes(800, 0))},         // init from rank 1
  };
  Bytes truncated = encode(Envelope{Type::Pull, cfg.job, 0, 1, 0});
  truncated.pop_back();
  garbage.push_back({Frame::own(truncated)});
  Bytes bad_version = encode(Envelope{Type::Pull, cfg.job, 0, 1, 0});
  bad_version[4] = 9;
  garbage.push_back({Frame::own(bad_version)});
  // A push whose message claims rank 0 inside rank 1's envelope.
  garbage.push_back({good_env, bytes_frame(ws[0].codec->encode(g0, 0, 0))});
  for (auto& f : garbage) net.deliver(p, f);
  EXPECT_EQ(net.engine.rejected(), rejected + 1 + garbage.size());
  EXPECT_EQ(net.engine.round(), 0u);

  // A push of a future round makes the server resend its model (resynchronisation).
  const Message ahead = ws[1].codec->encode(test::synthetic_grad(ws[1].params, 1, 5, 3), 5, 1);
  net.deliver(p, {ws[1].mine(Type::Push, 5), bytes_frame(ahead)});
  auto m = net.next(p);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.type, Type::Model);
  EXPECT_EQ(m->first.round, 0u);

  ws[1].push(net, test::synthetic_grad(ws[1].params, 1, 0, 3));
  EXPECT_EQ(ws[0].settle(net), Type::Update);
  EXPECT_EQ(ws[1].settle(net), Type::Update);
  EXPECT_EQ(net.engine.round(), 1u);
}

/// The Engine writes nothing itself: it hands a snapshot out once the initial model came (a
/// server killed before its first round's end restarts with it: a federated job's later clients
/// hold none), every checkpoint_every rounds and after the last one (marked last), and takes none
/// when no one asked for them.
TEST(Engine, SnapshotsAreHandedOutAtTheInitialModelEveryNRoundsAndAfterTheLast) {
  JobConfig cfg = job("topk:k=10", 2, 200);
  cfg.max_rounds = 5;
  cfg.checkpoint_every = 2;
  std::vector<std::pair<uint64_t, bool>> handed;
  std::vector<float> model;
  Net net(cfg, [&](Checkpoint c, bool last) {
    handed.emplace_back(c.round, last);
    model = c.params;
  });
  const auto init = test::initial_params(200, 4);
  auto ws = start(net, cfg, init);
  ASSERT_EQ(handed, (std::vector<std::pair<uint64_t, bool>>{{0, false}}));
  EXPECT_EQ(model, init);
  for (uint64_t t = 0; t < 5; ++t) run_round(net, ws, t);
  ASSERT_TRUE(net.engine.finished());
  EXPECT_EQ(handed, (std::vector<std::pair<uint64_t, bool>>{
                        {0, false}, {2, false}, {4, false}, {5, true}}));
  EXPECT_EQ(model, std::vector<float>(net.engine.model().begin(), net.engine.model().end()));
}

TEST(Engine, AnInitFromALaterRoundStartsTheJobThere) {
  // A server restarted without a checkpoint gets rank 0's current model: the job goes on from
  // rank 0's round (capped at the job's last), not from round 0 again. An asynchronous job's
  // Init names rank 0's own pushes, not a version: its round stays.
  for (const bool async : {false, true}) {
    JobConfig cfg = test_job::make("topk:k=10", 2, 100);
    if (async) cfg.mode = AsyncMode{};
    cfg.max_rounds = 10;
    for (const uint64_t at : {uint64_t(4), uint64_t(25)}) {
      Net net(cfg);
      FakeWorker w(0, cfg, at);
      w.join(net, test::initial_params(100, 1));
      ASSERT_TRUE(net.engine.has_model());
      EXPECT_EQ(net.engine.round(), async ? 0u : std::min<uint64_t>(at, 10))
          << (async ? "async" : "rounds") << " at " << at;
    }
  }
}

TEST(Engine, AfterTheLastRoundPushesAreToldTheJobFinished) {
  JobConfig cfg = job("topk:k=10", 2, 200);
  cfg.max_rounds = 2;
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(200, 4));
  for (uint64_t t = 0; t < 2; ++t) run_round(net, ws, t);
  ASSERT_TRUE(net.engine.finished());
  // A worker that wants round 2 gets "finished at round 2" at once, not silence.
  ws[0].push(net, test::synthetic_grad(ws[0].params, 0, 2, 3));
  auto m = net.next(ws[0].peer);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.type, Type::Finished);
  EXPECT_EQ(m->first.round, 2u);
  EXPECT_NE(decode_text(m->second[1].bytes()).find("finished at round 2"), std::string::npos);
  // A late worker may still register and pull the final model; its push is answered the same.
  net.deliver(ws[1].peer, {ws[1].mine(Type::Bye, 2)});
  FakeWorker late(1, cfg);
  late.peer = "late";
  late.join(net, {});
  ASSERT_TRUE(late.take_model(net));
  EXPECT_EQ(late.round, 2u);
  EXPECT_EQ(std::memcmp(late.params.data(), net.engine.model().data(), 800), 0);
  late.push(net, test::synthetic_grad(late.params, 1, 2, 3));
  EXPECT_EQ(net.next(late.peer)->first.type, Type::Finished);
  // So is a push from a connection that never registered.
  net.deliver("stranger", {env(Type::Push, cfg.job, 7, 1), Frame::own(Bytes(64, 0))});
  EXPECT_EQ(net.next("stranger")->first.type, Type::Finished);
  EXPECT_EQ(net.engine.late_requests(), 3u);
  // A worker that missed the last update still gets it again, not "finished".
  ws[0].round = 1;
  ws[0].push(net, test::synthetic_grad(ws[0].params, 0, 1, 3));
  EXPECT_EQ(net.next(ws[0].peer)->first.type, Type::Update);
  EXPECT_EQ(net.engine.round(), 2u);
}

TEST(Engine, ReplayedPushesFromAnotherConnectionOrIntoARestartAreRefused) {
  JobConfig cfg = job("topk:k=10", 2, 200);
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(200, 4));
  // An eavesdropper without CURVE captured rank 1's hello and its push of round 0.
  const HelloInfo hello{2, 200, ws[1].codec->spec()};
  const Frames captured_hello = {env(Type::Hello, cfg.job, 0, 1), Frame::own(encode(hello))};
  const Message g1 = ws[1].codec->encode(test::synthetic_grad(ws[1].params, 1, 0, 3), 0, 1);
  const Frames captured_push = {ws[1].mine(Type::Push, 0), bytes_frame(g1)};
  // Replayed from another connection while rank 1 is alive: the rank is not handed over.
  net.deliver("mallory", captured_hello);
  EXPECT_EQ(net.next("mallory")->first.type, Type::Refuse);
  net.deliver("mallory", captured_push);
  EXPECT_EQ(net.next("mallory")->first.type, Type::Refuse);  // not registered
  // Once rank 1 has gone quiet the replayed hello takes the rank, but its session token is new:
  // the captured push carries the old one and is refused and counted.
  for (int i = 0; i < 4; ++i) {
    net.deliver(ws[0].peer, {ws[0].mine(Type::Heartbeat, 0)});
    net.tick(100ms);
  }
  net.deliver("mallory", captured_hello);
  EXPECT_EQ(net.next("mallory")->first.type, Type::Welcome);
  const uint64_t rejected = net.engine.rejected();
  net.deliver("mallory", captured_push);
  EXPECT_EQ(net.engine.replays(), 1u);
  EXPECT_EQ(net.engine.rejected(), rejected + 1);
  ws[0].push(net, test::synthetic_grad(ws[0].params, 0, 0, 3));
  net.tick(10ms);
  EXPECT_EQ(net.engine.round(), 0u) << "the replayed push counted as rank 1's gradient";
  EXPECT_FALSE(ws[0].settle(net));

  // Into a server restarted from a checkpoint: new tokens, so the same captures change nothing.
  Net again(cfg);
  again.engine.restore(net.engine.checkpoint());
  again.deliver("mallory", captured_hello);
  EXPECT_EQ(again.next("mallory")->first.type, Type::Welcome);
  again.deliver("mallory", captured_push);
  EXPECT_EQ(again.engine.replays(), 1u);
  // A heartbeat of another session is ignored, not counted as a replay.
  again.deliver("mallory", {ws[1].mine(Type::Heartbeat, 0)});
  EXPECT_EQ(again.engine.replays(), 1u);
}

TEST(Engine, CheckpointRestoreResumesWithoutApplyingARoundTwice) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("sketchsgd-ckpt-" + std::to_string(::getpid()) + ".bin");
  JobConfig cfg = job("sketch:k=20,cols=300", 2, 400);
  cfg.checkpoint_every = 2;
  std::vector<float> model;
  std::vector<std::pair<uint64_t, bool>> handed;  // (round, last) of each snapshot
  {
    Net net(cfg, [&](Checkpoint c, bool last) {
      handed.emplace_back(c.round, last);
      save_checkpoint(path.string(), c);
    });
    auto ws = start(net, cfg, test::initial_params(400, 5));
    for (uint64_t t = 0; t < 5; ++t) {
      for (auto& w : ws) w.push(net, test::synthetic_grad(w.params, w.rank, t, 3));
      for (auto& w : ws) ASSERT_EQ(w.settle(net), Type::Update);
      if (t == 3) model.assign(net.engine.model().begin(), net.engine.model().end());
    }
  }
  const auto c = load_checkpoint(path.string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->round, 4u);  // written at 0, after 2 and 4; round 5 was lost with the "crash"
  EXPECT_EQ(handed, (std::vector<std::pair<uint64_t, bool>>{{0, false}, {2, false}, {4, false}}));
  Net net(cfg);
  net.engine.restore(*c);
  EXPECT_EQ(net.engine.round(), 4u);
  EXPECT_EQ(std::memcmp(net.engine.model().data(), model.data(), 1600), 0);
  FakeWorker w(0, cfg);
  w.join(net, {});
  ASSERT_TRUE(w.take_model(net));
  EXPECT_EQ(w.round, 4u);

  // Restoring a checkpoint of another job or codec is refused.
  Checkpoint other = *c;
  other.job = 7;
  EXPECT_THROW(net.engine.restore(other), ConfigMismatch);
  other = *c;
  other.params.pop_back();
  EXPECT_THROW(net.engine.restore(other), ConfigMismatch);

  // Corrupt and truncated files are typed errors; a missing one is "no checkpoint".
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t cut : {size_t(0), size_t(3), size_t(20), bytes.size() - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), std::streamsize(cut));
    EXPECT_THROW(load_checkpoint(path.string()), WireError) << "cut at " << cut;
  }
  bytes[100] ^= 1;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), std::streamsize(bytes.size()));
  EXPECT_THROW(load_checkpoint(path.string()), WireError);
  std::filesystem::remove(path);
  EXPECT_FALSE(load_checkpoint(path.string()));
}

TEST(Engine, TheOuterMomentumSurvivesACheckpointAndTheJobContinuesBitForBit) {
  // A local-steps job's server (Nesterov outer step): restored after round 2 from its checkpoint
  // (through the file), it ends round 4 with the same model as the server that never stopped;
  // restored without the momentum buffer it does not. Pushes do not depend on the workers'
  // copies, so both servers see the same bytes.
  JobConfig cfg = job("dense", 2, 300);
  cfg.outer = OuterOptions{0.9f, true};
  const auto base = test::initial_params(300, 9);
  auto rounds = [&](Net& net, std::vector<FakeWorker>& ws, uint64_t from, uint64_t to) {
    for (uint64_t t = from; t < to; ++t) {
      for (auto& w : ws) w.push(net, test::synthetic_grad(base, w.rank, t, 3));
      for (auto& w : ws) ASSERT_EQ(w.settle(net), Type::Update) << "round " << t;
    }
  };
  Net straight(cfg);
  auto ws = start(straight, cfg, base);
  rounds(straight, ws, 0, 2);
  const Checkpoint at2 = straight.engine.checkpoint();
  ASSERT_EQ(at2.outer.size(), 300u);
  EXPECT_TRUE(std::any_of(at2.outer.begin(), at2.outer.end(), [](float m) { return m != 0; }));
  rounds(straight, ws, 2, 4);

  const auto path = std::filesystem::temp_directory_path() /
                    ("sketchsgd-outer-" + std::to_string(::getpid()) + ".bin");
  save_checkpoint(path.string(), at2);
  const auto loaded = load_checkpoint(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->outer, at2.outer);

  auto resumed = [&](Checkpoint c) {
    Net net(cfg);
    net.engine.restore(c);
    auto again = rejoin(net, cfg);
    rounds(net, again, 2, 4);
    return std::vector<float>(net.engine.model().begin(), net.engine.model().end());
  };
  const std::vector<float> want(straight.engine.model().begin(), straight.engine.model().end());
  EXPECT_EQ(std::memcmp(resumed(*loaded).data(), want.data(), want.size() * 4), 0);
  Checkpoint forgetful = *loaded;
  forgetful.outer.clear();  // an old (v1) checkpoint: momentum starts again from zero
  EXPECT_NE(resumed(forgetful), want);

  // A buffer of the wrong length, a non-finite one, or one given to a server without momentum.
  Net net(cfg);
  Checkpoint bad = *loaded;
  bad.outer.pop_back();
  EXPECT_THROW(net.engine.restore(bad), WireError);
  bad = *loaded;
  bad.outer[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(net.engine.restore(bad), WireError);
  JobConfig plain = cfg;
  plain.outer = OuterOptions{};
  Net without(plain);
  EXPECT_THROW(without.engine.restore(*loaded), ConfigMismatch);
}

TEST(Engine, TheHashingModeIsCheckedAtRegistrationAndOnRestore) {
  const JobConfig cfg = job("sketch:k=20,cols=200", 1, 500);  // blocked hashing, the default
  Net net(cfg);
  FakeWorker w(0, cfg);
  const HelloInfo random{1, 500,
                         make_compressor("sketch:k=20,cols=200,hashing=random", 500)->spec()};
  net.deliver(w.peer, {env(Type::Hello, cfg.job, 0, 0), Frame::own(encode(random))});
  auto m = net.next(w.peer);
  ASSERT_TRUE(m && m->first.type == Type::Refuse);
  EXPECT_NE(decode_refuse(m->second[1].bytes()).reason.find("hashing=blocked"), std::string::npos);
  // A checkpoint of an older version names random hashing as hashing=0: the same codec as
  // hashing=random today, and another than the blocked default.
  JobConfig old = job("sketch:k=20,cols=200,hashing=random", 1, 500);
  Net a(old);
  Checkpoint c = a.engine.checkpoint();
  c.params.assign(500, 0.5f);
  c.spec = "sketch:rows=5,cols=200,k=20,p2=0,momentum=0.9,seed=1,hashing=0,fetch=0";
  Net b(old);
  EXPECT_NO_THROW(b.engine.restore(c));
  EXPECT_THROW(net.engine.restore(c), ConfigMismatch);
}

TEST(Engine, FetchSgdSketchesSurviveACheckpointAndAnAbort) {
  JobConfig cfg = job("sketch:k=30,cols=300,fetch=1,momentum=0.9", 2, 1000);
  cfg.closing().policy = Policy::Abort;
  Net a(cfg);
  auto wa = start(a, cfg, test::initial_params(1000, 8));
  for (uint64_t t = 0; t < 3; ++t) run_round(a, wa, t);
  // An aborted round in between drops only that round's partial merge.
  wa[0].push(a, test::synthetic_grad(wa[0].params, 0, 3, 3));
  for (int i = 0; i < 12; ++i) {
    a.deliver(wa[0].peer, {wa[0].mine(Type::Heartbeat, 0)});
    a.deliver(wa[1].peer, {wa[1].mine(Type::Heartbeat, 0)});
    a.tick(100ms);
  }
  for (auto& w : wa) ASSERT_EQ(w.settle(a), Type::Abort);
  const Checkpoint c = a.engine.checkpoint();
  EXPECT_FALSE(c.codec_state.empty());

  Net b(cfg);
  b.engine.restore(c);
  auto wb = rejoin(b, cfg);
  run_round(a, wa, 4);
  run_round(b, wb, 4);
  EXPECT_EQ(std::memcmp(a.engine.model().data(), b.engine.model().data(), 4000), 0)
      << "restored FetchSGD state differs";
  Checkpoint broken = c;
  broken.codec_state.resize(10);
  Net d(cfg);
  EXPECT_THROW(d.engine.restore(broken), WireError);
  broken.codec_state.clear();
  EXPECT_THROW(d.engine.restore(broken), WireError);
}

TEST(CudaEngine, SketchServerOnTheGpuMatchesTheCpuAcrossACheckpoint) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  // The aggregator (table sums, unsketch, FetchSGD's sketches) on the GPU, workers on the CPU.
  for (const char* spec :
       {"sketch:k=40,cols=500,p2=2,momentum=0.9", "sketch:k=40,cols=500,fetch=1,momentum=0.9"}) {
    SCOPED_TRACE(spec);
    JobConfig on_cpu = job(spec, 2, 3000), on_gpu = on_cpu;
    on_gpu.device = Device::cuda();
    Net a(on_cpu), b(on_gpu);
    const auto init = test::initial_params(3000, 9);
    auto wa = start(a, on_cpu, init), wb = start(b, on_gpu, init);
    for (uint64_t t = 0; t < 3; ++t) {
      run_round(a, wa, t);
      run_round(b, wb, t);
    }
    ASSERT_EQ(std::memcmp(a.engine.model().data(), b.engine.model().data(), 12000), 0);
    // Servers restarted from each checkpoint, with fresh workers rejoining both (with p2 the
    // workers' momentum and error start again from zero, so both sides must restart alike): the
    // restored GPU server keeps its aggregator on the GPU and its state, and still matches.
    Net ca(on_cpu), cb(on_gpu);
    ca.engine.restore(a.engine.checkpoint());
    cb.engine.restore(b.engine.checkpoint());
    auto wca = rejoin(ca, on_cpu), wcb = rejoin(cb, on_gpu);
    for (uint64_t t = 3; t < 5; ++t) {
      run_round(ca, wca, t);
      run_round(cb, wcb, t);
    }
    EXPECT_EQ(std::memcmp(ca.engine.model().data(), cb.engine.model().data(), 12000), 0);
  }
}

TEST(Engine, BoundedStalenessHoldsEarlyPushesUpToTauRoundsAhead) {
  JobConfig cfg = job("topk:k=20", 2, 300);
  cfg.as<SyncMode>().staleness = 2;
  Net net(cfg);
  auto ws = start(net, cfg, test::initial_params(300, 6));
  // Rank 0 runs ahead: rounds 0, 1, 2 on its stale parameters.
  const auto p0 = ws[0].params;
  for (uint64_t t = 0; t < 3; ++t) {
    const Message m = ws[0].codec->encode(test::synthetic_grad(p0, 0, t, 3), t, 0);
    net.deliver(ws[0].peer, {ws[0].mine(Type::Push, t), bytes_frame(m)});
  }
  EXPECT_FALSE(net.next(ws[0].peer)) << "nothing closes without rank 1";
  // Round 3 would be τ + 1 ahead: the server answers with its model instead of holding it.
  const Message far = ws[0].codec->encode(test::synthetic_grad(p0, 0, 3, 3), 3, 0);
  net.deliver(ws[0].peer, {ws[0].mine(Type::Push, 3), bytes_frame(far)});
  auto m = net.next(ws[0].peer);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.type, Type::Model);
  // Rank 1 pushes round by round; each push closes one round with rank 0's held push.
  for (uint64_t t = 0; t < 3; ++t) {
    ws[1].push(net, test::synthetic_grad(ws[1].params, 1, t, 3));
    EXPECT_EQ(ws[1].settle(net), Type::Update);
    EXPECT_EQ(net.engine.round(), t + 1);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ws[0].settle(net), Type::Update);
  EXPECT_EQ(std::memcmp(ws[0].params.data(), ws[1].params.data(), 1200), 0);
  EXPECT_EQ(std::memcmp(ws[0].params.data(), net.engine.model().data(), 1200), 0);

  JobConfig two = job("sketch:k=10,cols=100,p2=2", 2, 300);
  two.as<SyncMode>().staleness = 1;
  EXPECT_THROW(Engine{two}, InvalidArgument);
}

TEST(Engine, ConfigIsValidated) {
  JobConfig c = job("dense", 2, 10);
  c.closing().min_workers = 3;
  EXPECT_THROW(Engine{c}, InvalidArgument);
  c = job("dense", 0, 10);
  EXPECT_THROW(Engine{c}, InvalidArgument);
  c = job("nonsense", 2, 10);
  EXPECT_THROW(Engine{c}, InvalidArgument);
  c = job("dense", 2, 10);
  c.lr = std::numeric_limits<float>::infinity();
  EXPECT_THROW(Engine{c}, InvalidArgument);
  EXPECT_THROW(parse_policy("sometimes"), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::ps
