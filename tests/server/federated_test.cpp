// A federated job on the parameter server's Engine (fake network, fake clock): only the clients
// sampled for a round register, each for the slot of its place in the sample; every round's
// clients are new, stateless and gone at its end; rounds match the in-process reference bit for
// bit; a client that never comes or falls silent is closed over by the deadline rules; the sample
// and FetchSGD's server sketches survive a checkpoint.
#include <gtest/gtest.h>

#include <cstring>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include <sketchsgd/server/engine.hpp>
#include "support/helpers.hpp"
#include "support/ps_job.hpp"
#include "support/ps_net.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kPopulation = 50, kPerRound = 4;
constexpr uint64_t kDim = 300;

template <class Mode>
constexpr bool kHasStaleness = requires(Mode m) {
  m.staleness;
};

JobConfig federated(const std::string& spec) {
  JobConfig c = test_job::make(spec, kPerRound, kDim);
  c.mode = FederatedMode{.population = kPopulation, .sample_seed = 9};
  return c;
}

std::string refusal(Net& net, const PeerId& peer, bool* retry = nullptr) {
  auto m = net.next(peer);
  if (!m || m->first.type != Type::Refuse) return "<no refusal>";
  const RefuseInfo r = decode_refuse(m->second[1].bytes());
  if (retry) *retry = r.retry;
  return r.reason;
}

/// The clients sampled for the engine's current round (but the slot `absent`), registered and
/// holding the model.
std::vector<FakeWorker> arrive(Net& net, const JobConfig& cfg, std::span<const float> init,
                               uint32_t absent = ~0u) {
  std::vector<FakeWorker> cs;
  const uint64_t round = net.engine.round();
  const auto sample = sample_clients(cfg.population(), cfg.world, cfg.sample_seed(), round);
  for (uint32_t slot = 0; slot < sample.size(); ++slot) {
    if (slot == absent) continue;
    const uint32_t id = sample[slot];
    cs.emplace_back(id, cfg, round);
    cs.back().peer = "client-" + std::to_string(id) + "-round-" + std::to_string(round);
  }
  for (auto& c : cs) c.join(net, init);
  for (auto& c : cs) EXPECT_TRUE(c.take_model(net)) << "client " << c.id;
  return cs;
}

/// One round of fresh clients pushing synthetic gradients; returns their gradients in slot order.
std::vector<std::vector<float>> run_round(Net& net, const JobConfig& cfg,
                                          std::span<const float> init) {
  auto cs = arrive(net, cfg, init);
  const uint64_t t = net.engine.round();
  std::vector<std::vector<float>> grads(cs.size());
  for (auto& c : cs) {
    grads[c.rank] = test::synthetic_grad(c.params, c.id, t, 5);
    c.push(net, grads[c.rank]);
  }
  for (int pass = 0; pass < 3; ++pass)
    for (auto& c : cs) c.settle(net);
  for (auto& c : cs) EXPECT_EQ(c.round, t + 1) << "client " << c.id << " got no update";
  return grads;
}

TEST(Federated, OnlyTheSampledClientsRegisterEachForTheSlotOfItsPlace) {
  const JobConfig cfg = federated("dense");
  Net net(cfg);
  const auto sample = sample_clients(kPopulation, kPerRound, cfg.sample_seed(), 0);
  uint32_t outsider = 0;
  while (std::find(sample.begin(), sample.end(), outsider) != sample.end()) ++outsider;

  bool retry = true;
  FakeWorker out(outsider, cfg);
  out.hello(net);
  EXPECT_NE(refusal(net, out.peer, &retry).find("is not sampled in round 0"), std::string::npos);
  EXPECT_FALSE(retry);
  FakeWorker stranger(kPopulation, cfg);
  stranger.hello(net);
  EXPECT_NE(refusal(net, stranger.peer).find("outside the population [0, 50)"), std::string::npos);
  FakeWorker early(sample_clients(kPopulation, kPerRound, cfg.sample_seed(), 2)[0], cfg, 2);
  early.hello(net);
  EXPECT_NE(refusal(net, early.peer, &retry).find("round 2 is not open yet"), std::string::npos);
  EXPECT_TRUE(retry);
  uint32_t next_outsider = 0;
  const auto next = sample_clients(kPopulation, kPerRound, cfg.sample_seed(), 1);
  while (std::find(next.begin(), next.end(), next_outsider) != next.end()) ++next_outsider;
  FakeWorker not_next(next_outsider, cfg, 1);
  not_next.hello(net);
  EXPECT_NE(refusal(net, not_next.peer, &retry).find("is not sampled in round 1"),
            std::string::npos);
  EXPECT_FALSE(retry);
  FakeWorker fixed(sample[0], cfg);
  fixed.population = 0;  // a worker of a fixed-worker job
  fixed.hello(net);
  EXPECT_NE(refusal(net, fixed.peer).find("population 0, the job has 50 clients"),
            std::string::npos);

  for (uint32_t slot = kPerRound; slot-- > 0;) {
    FakeWorker c(sample[slot], cfg);
    c.hello(net);
    const auto w = net.next(c.peer);
    ASSERT_TRUE(w);
    EXPECT_EQ(w->first.type, Type::Welcome);
    EXPECT_EQ(w->first.rank, slot) << "client " << sample[slot];
  }
  EXPECT_EQ(net.engine.live_workers(), kPerRound);
}

class FederatedCodecs : public ::testing::TestWithParam<std::string> {};

TEST_P(FederatedCodecs, RoundsOfNewStatelessClientsMatchTheInProcessReference) {
  const JobConfig cfg = federated(GetParam());
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  test::Job ref(net.engine.config().spec, kDim, kPerRound);
  std::vector<float> expect = init;
  for (uint64_t t = 0; t < 6; ++t) {
    const auto grads = run_round(net, cfg, init);
    // Stateless clients: every round's codecs are new (the aggregator keeps the server's state).
    for (auto& w : ref.workers) w = make_compressor(net.engine.config().spec, kDim);
    const auto steps = ref.round(grads, t);
    kernels::cpu::axpy(expect.data(), steps[0].data(), kDim, -cfg.lr);
    EXPECT_EQ(net.engine.live_workers(), 0u) << "round " << t << "'s clients still hold slots";
  }
  EXPECT_EQ(net.engine.round(), 6u);
  EXPECT_EQ(net.engine.rejected(), 0u);
  EXPECT_EQ(std::memcmp(net.engine.model().data(), expect.data(), kDim * 4), 0)
      << "server ≠ reference";
  EXPECT_NE(std::memcmp(expect.data(), init.data(), kDim * 4), 0) << "nothing was trained";
}

INSTANTIATE_TEST_SUITE_P(Every, FederatedCodecs,
                         ::testing::ValuesIn(example_specs(Layout::parse("10x25+50"))),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

TEST(Federated, AClientOfAClosedRoundIsToldItIsOverNotServed) {
  const JobConfig cfg = federated("topk:k=30");
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  auto cs = arrive(net, cfg, init);
  for (auto& c : cs) c.push(net, test::synthetic_grad(c.params, c.id, 0, 5));
  for (auto& c : cs) ASSERT_EQ(c.settle(net), Type::Update);
  // Its slot is gone with its round: a second push is refused, a second registration too.
  FakeWorker& late = cs[1];
  late.push(net, test::synthetic_grad(late.params, late.id, 1, 5));
  EXPECT_NE(refusal(net, late.peer).find("not registered"), std::string::npos);
  late.round = 0;
  late.hello(net);
  bool retry = true;
  EXPECT_NE(refusal(net, late.peer, &retry).find("came for round 0, which is over"),
            std::string::npos);
  EXPECT_FALSE(retry);
  EXPECT_EQ(net.engine.round(), 1u);
}

TEST(Federated, AClientThatNeverComesIsClosedOverAtTheDeadline) {
  JobConfig cfg = federated("dense");
  cfg.closing() = {Policy::Quorum, 3};
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  // The last sampled client never comes: it is not "dead", it may be on its way.
  auto cs = arrive(net, cfg, init, kPerRound - 1);
  for (auto& c : cs) c.push(net, test::synthetic_grad(c.params, c.id, 0, 5));
  net.tick(500ms);
  for (auto& c : cs) EXPECT_EQ(c.settle(net), std::nullopt) << "closed before the deadline";
  net.tick(600ms);
  for (auto& c : cs) EXPECT_EQ(c.settle(net), Type::Update);
  EXPECT_EQ(net.engine.round(), 1u);
}

TEST(Federated, AClientThatFallsSilentIsClosedOverOnceDead) {
  JobConfig cfg = federated("dense");
  cfg.closing() = {Policy::Quorum, 3};
  cfg.deadline = 60s;
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  auto cs = arrive(net, cfg, init);  // all four registered; the last falls silent
  for (size_t i = 0; i + 1 < cs.size(); ++i)
    cs[i].push(net, test::synthetic_grad(cs[i].params, cs[i].id, 0, 5));
  for (int i = 0; i < 5; ++i) {  // the others keep beating; the last is dead after 3 × 100 ms
    net.tick(100ms);
    for (size_t j = 0; j + 1 < cs.size(); ++j)
      net.deliver(cs[j].peer, {cs[j].mine(Type::Heartbeat, 0)});
  }
  for (size_t i = 0; i + 1 < cs.size(); ++i) EXPECT_EQ(cs[i].settle(net), Type::Update);
}

TEST(Federated, TheSampleAndTheServerSketchesSurviveACheckpoint) {
  const JobConfig cfg = federated("sketch:k=30,cols=200,fetch=1");
  const auto init = test::initial_params(kDim, 3);
  Net straight(cfg);
  for (int t = 0; t < 5; ++t) run_round(straight, cfg, init);

  Net first(cfg);
  for (int t = 0; t < 3; ++t) run_round(first, cfg, init);
  const Checkpoint c = first.engine.checkpoint();
  Net resumed(cfg);
  resumed.engine.restore(c);
  for (int t = 0; t < 2; ++t) run_round(resumed, cfg, {});
  EXPECT_EQ(resumed.engine.round(), 5u);
  EXPECT_EQ(std::memcmp(resumed.engine.model().data(), straight.engine.model().data(), kDim * 4),
            0);
  // Without the server's momentum and error sketches the job goes elsewhere.
  Checkpoint lost = c;
  lost.codec_state = Net(cfg).engine.checkpoint().codec_state;
  Net amnesiac(cfg);
  amnesiac.engine.restore(lost);
  for (int t = 0; t < 2; ++t) run_round(amnesiac, cfg, {});
  EXPECT_NE(std::memcmp(amnesiac.engine.model().data(), straight.engine.model().data(), kDim * 4),
            0);
}

/// The clients sampled for the engine's next round, checked in: welcomed, with the model of the
/// current round.
std::vector<FakeWorker> check_in_ahead(Net& net, const JobConfig& cfg) {
  std::vector<FakeWorker> cs;
  const uint64_t round = net.engine.round() + 1;
  const auto sample = sample_clients(cfg.population(), cfg.world, cfg.sample_seed(), round);
  for (uint32_t id : sample) {
    cs.emplace_back(id, cfg, round);
    cs.back().peer = "client-" + std::to_string(id) + "-ahead-" + std::to_string(round);
  }
  for (auto& c : cs) {
    c.join(net, {});
    EXPECT_EQ(c.rank, uint32_t(&c - cs.data())) << "client " << c.id << ": not its slot";
    EXPECT_TRUE(c.take_model(net)) << "client " << c.id << ": no model with its Welcome";
    EXPECT_EQ(c.round, round - 1);
    EXPECT_EQ(std::memcmp(c.params.data(), net.engine.model().data(), c.params.size() * 4), 0);
    EXPECT_FALSE(net.next(c.peer)) << "client " << c.id << " got more than the model";
  }
  return cs;
}

// A client of the next round checks in while this one runs and gets this round's model; when its
// round opens it gets this round's update, as a fixed worker would, so the model's download is
// off its round's path.
TEST(Federated, TheNextRoundsClientsCheckInWhileThisOneRunsAndCatchUpWhenItOpens) {
  const JobConfig cfg = federated("sketch:k=30,cols=200,fetch=1");
  const auto init = test::initial_params(kDim, 3);
  Net straight(cfg);
  for (int t = 0; t < 4; ++t) run_round(straight, cfg, init);

  Net net(cfg);
  auto cs = arrive(net, cfg, init);
  for (uint64_t t = 0; t < 4; ++t) {
    auto next = check_in_ahead(net, cfg);
    EXPECT_EQ(net.engine.live_workers(), kPerRound) << "check-ins took round " << t << "'s slots";
    // While waiting they may beat (and are not refused for it), not push.
    for (auto& c : next) net.deliver(c.peer, {c.mine(Type::Heartbeat, t + 1)});
    for (auto& c : next)
      EXPECT_FALSE(net.next(c.peer)) << "client " << c.id << " heartbeat refused";
    const uint64_t rejected = net.engine.rejected();
    FakeWorker eager(next[0].id, cfg, t + 1);  // its codec, not next[0]'s
    eager.peer = next[0].peer;
    eager.session = next[0].session;
    eager.rank = next[0].rank;
    eager.push(net, test::synthetic_grad(init, next[0].id, t + 1, 5));
    EXPECT_EQ(net.engine.rejected(), rejected + 1) << "a push before its round opened was taken";
    for (auto& c : cs) c.push(net, test::synthetic_grad(c.params, c.id, t, 5));
    for (auto& c : cs) EXPECT_EQ(c.settle(net), Type::Update) << "client " << c.id;
    for (auto& c : next) {
      ASSERT_EQ(c.settle(net), Type::Update)
          << "client " << c.id << ": nothing when its round opened";
      EXPECT_EQ(c.round, t + 1);
      EXPECT_EQ(std::memcmp(c.params.data(), net.engine.model().data(), kDim * 4), 0);
    }
    EXPECT_EQ(net.engine.live_workers(), kPerRound);
    cs = std::move(next);
  }
  EXPECT_EQ(net.engine.round(), 4u);
  EXPECT_EQ(std::memcmp(net.engine.model().data(), straight.engine.model().data(), kDim * 4), 0)
      << "checking in ahead changed the training";
}

TEST(Federated, ACheckedInClientHoldsItsSlotUntilItLeavesOrFallsSilent) {
  JobConfig cfg = federated("dense");
  cfg.max_rounds = 3;
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  auto cs = arrive(net, cfg, init);
  auto next = check_in_ahead(net, cfg);
  // Another connection of a checked-in client waits while the first is alive.
  FakeWorker again(next[1].id, cfg, 1);
  again.peer = "again";
  bool retry = false;
  again.hello(net);
  EXPECT_NE(refusal(net, again.peer, &retry).find("held by a live connection"), std::string::npos);
  EXPECT_TRUE(retry);
  // One connection is one registration: a client of this round cannot check in for the next.
  FakeWorker twice(next[2].id, cfg, 1);
  twice.peer = cs[0].peer;
  twice.hello(net);
  EXPECT_NE(refusal(net, twice.peer).find("already rank 0 of round 0"), std::string::npos);
  // Once it says Bye its slot is free; a silent one's is free once it is dead.
  net.deliver(next[1].peer, {next[1].mine(Type::Bye, 1)});
  again.join(net, {});
  EXPECT_EQ(again.rank, 1u);
  EXPECT_TRUE(again.take_model(net));
  for (int i = 0; i < 4; ++i) {  // 3 × 100 ms without a heartbeat from next[2]
    net.tick(100ms);
    for (auto& c : cs) net.deliver(c.peer, {c.mine(Type::Heartbeat, 0)});
  }
  FakeWorker third(next[2].id, cfg, 1);
  third.peer = "third";
  third.join(net, {});
  EXPECT_EQ(third.rank, 2u);
  EXPECT_TRUE(third.take_model(net));
  // The replaced connections get nothing when round 1 opens; their successors get the model.
  for (auto& c : cs) c.push(net, test::synthetic_grad(c.params, c.id, 0, 5));
  for (auto& c : cs) EXPECT_EQ(c.settle(net), Type::Update);
  EXPECT_FALSE(net.next(next[1].peer));
  EXPECT_FALSE(net.next(next[2].peer));
  EXPECT_EQ(again.settle(net), Type::Update);
  EXPECT_EQ(third.settle(net), Type::Update);
  EXPECT_EQ(next[0].settle(net), Type::Update);
  EXPECT_EQ(std::memcmp(third.params.data(), net.engine.model().data(), kDim * 4), 0);
  // A check-in for a round past the job's last is told the job ends first.
  FakeWorker late(sample_clients(kPopulation, kPerRound, cfg.sample_seed(), 3)[0], cfg, 3);
  late.hello(net);
  const auto m = net.next(late.peer);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.type, Type::Finished);
  EXPECT_NE(decode_text(m->second[1].bytes()).find("ends before round 3"), std::string::npos);
}

TEST(Federated, AClientCheckedInBeforeThereIsAModelGetsItWhenItsRoundOpens) {
  const JobConfig cfg = federated("topk:k=30");
  const auto init = test::initial_params(kDim, 3);
  Net net(cfg);
  FakeWorker early(sample_clients(kPopulation, kPerRound, cfg.sample_seed(), 1)[2], cfg, 1);
  early.join(net, {});  // no initial parameters: it cannot give the server a model
  EXPECT_EQ(early.rank, 2u);
  EXPECT_FALSE(net.next(early.peer)) << "a model before there is one";
  run_round(net, cfg, init);
  ASSERT_TRUE(early.take_model(net));
  EXPECT_EQ(early.round, 1u);
  EXPECT_EQ(std::memcmp(early.params.data(), net.engine.model().data(), kDim * 4), 0);
}

TEST(Federated, ClientsCheckedInAfterAnAbortedRoundStartFromTheModelItLeftUnchanged) {
  JobConfig cfg = federated("dense");
  cfg.closing().policy = Policy::Abort;
  const auto init = test::initial_params(kDim, 3);
  Net net(cfg);
  auto cs = arrive(net, cfg, init, kPerRound - 1);  // the last sampled client never comes
  auto next = check_in_ahead(net, cfg);
  for (auto& c : cs) c.push(net, test::synthetic_grad(c.params, c.id, 0, 5));
  net.tick(cfg.deadline + 1ms);
  for (auto& c : cs) EXPECT_EQ(c.settle(net), Type::Abort);
  for (auto& c : next) {
    EXPECT_EQ(c.settle(net), Type::Abort) << "client " << c.id;
    EXPECT_EQ(c.round, 1u);
    EXPECT_EQ(std::memcmp(c.params.data(), init.data(), kDim * 4), 0);
  }
  EXPECT_EQ(std::memcmp(net.engine.model().data(), init.data(), kDim * 4), 0);
}

// A round's clients come for it alone: short of its quorum at the deadline, it is aborted (not
// held open for clients that are not coming, with the next round's waiting behind it).
TEST(Federated, ARoundShortOfItsQuorumAtTheDeadlineIsAbortedAndTheNextOneOpens) {
  JobConfig cfg = federated("dense");
  cfg.closing() = {Policy::Quorum, 3};
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  auto cs = arrive(net, cfg, init);
  cs.erase(cs.begin() + 2, cs.end());  // two of four push; the others are not heard of again
  for (auto& c : cs) c.push(net, test::synthetic_grad(c.params, c.id, 0, 5));
  auto next = check_in_ahead(net, cfg);
  net.tick(cfg.deadline / 2);
  for (auto& c : cs) EXPECT_EQ(c.settle(net), std::nullopt) << "closed before the deadline";
  net.tick(cfg.deadline);
  for (auto& c : cs) EXPECT_EQ(c.settle(net), Type::Abort);
  EXPECT_EQ(net.engine.round(), 1u);
  EXPECT_EQ(std::memcmp(net.engine.model().data(), init.data(), kDim * 4), 0);
  for (auto& c : next) {
    EXPECT_EQ(c.settle(net), Type::Abort) << "client " << c.id;
    EXPECT_EQ(c.round, 1u);
  }
}

// After a restart from a checkpoint older than the round the clients were at, the round may have
// no client left to come: a deadline after it was first seen empty it is aborted, unless the
// policy is to wait.
TEST(Federated, ARoundNoClientPushesInIsAbortedADeadlineLaterUnlessThePolicyWaits) {
  for (const Policy policy : {Policy::Quorum, Policy::Abort, Policy::Wait}) {
    JobConfig cfg = federated("dense");
    cfg.closing() = {policy, 3};
    Net net(cfg);
    const auto init = test::initial_params(kDim, 3);
    run_round(net, cfg, init);
    const Checkpoint at1 = net.engine.checkpoint();
    Net back(cfg);
    back.engine.restore(at1);
    back.tick(cfg.deadline / 2);
    back.tick(cfg.deadline / 2 + 1ms);
    EXPECT_EQ(back.engine.round(), 1u) << "aborted before a deadline went by empty";
    back.tick(cfg.deadline);
    EXPECT_EQ(back.engine.round(), policy == Policy::Wait ? 1u : 2u) << to_string(policy);
    EXPECT_EQ(std::memcmp(back.engine.model().data(), at1.params.data(), kDim * 4), 0);
  }
}

// A round's clients that registered may train for longer than a deadline (the round's counts from
// its first push): while one is live the round stays open; once none is, the rule above applies.
TEST(Federated, AnEmptyRoundStaysOpenWhileAClientOfItIsLive) {
  JobConfig cfg = federated("dense");
  cfg.closing() = {Policy::Quorum, 3};
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  run_round(net, cfg, init);
  auto cs = arrive(net, cfg, {});  // round 1's clients, registered, training
  for (int i = 0; i < 25; ++i) {   // 2.5 deadlines' worth of heartbeats
    net.tick(100ms);
    for (auto& c : cs) net.deliver(c.peer, {c.mine(Type::Heartbeat, 1)});
  }
  EXPECT_EQ(net.engine.round(), 1u) << "aborted while its clients were training";
  net.tick(400ms);  // silent: dead after 3 x 100 ms
  EXPECT_EQ(net.engine.live_workers(), 0u);
  net.tick(cfg.deadline / 2);
  EXPECT_EQ(net.engine.round(), 1u);
  net.tick(cfg.deadline);
  EXPECT_EQ(net.engine.round(), 2u);
}

TEST(Federated, ARestoredServerForgetsCheckInsAndTheClientsRegisterAgain) {
  const JobConfig cfg = federated("dense");
  const auto init = test::initial_params(kDim, 3);
  Net net(cfg);
  run_round(net, cfg, init);
  auto next = check_in_ahead(net, cfg);
  net.engine.restore(net.engine.checkpoint());  // at round 1, as a restarted server would be
  net.deliver(next[0].peer, {next[0].mine(Type::Heartbeat, 2)});
  EXPECT_NE(refusal(net, next[0].peer).find("not registered"), std::string::npos);
}

TEST(Federated, TheJobRefusesSettingsItCannotRun) {
  JobConfig cfg = federated("dense");
  cfg.as<FederatedMode>().population = kPerRound - 1;
  EXPECT_THROW(Engine{cfg}, InvalidArgument);
  cfg.as<FederatedMode>().population = 0;
  EXPECT_THROW(Engine{cfg}, InvalidArgument);
  // Its clients leave after their round: a federated job has no bounded staleness to set.
  static_assert(!kHasStaleness<FederatedMode>);
  EXPECT_EQ(federated("dense").staleness(), 0u);
}

}  // namespace
}  // namespace sketchsgd::ps
