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
#include "support/ps_job.hpp"
#include "support/ps_net.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kPopulation = 50, kPerRound = 4;
constexpr uint64_t kDim = 300;

JobConfig federated(const std::string& spec) {
  JobConfig c = test_job::make(spec, kPerRound, kDim);
  c.population = kPopulation;
  c.sample_seed = 9;
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
  const auto sample = sample_clients(cfg.population, cfg.world, cfg.sample_seed, round);
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
std::vector<std::vector<float>> run_round(Net& net, const JobConfig& cfg, std::span<const float> init) {
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
  const auto sample = sample_clients(kPopulation, kPerRound, cfg.sample_seed, 0);
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
  FakeWorker early(sample_clients(kPopulation, kPerRound, cfg.sample_seed, 1)[0], cfg, 1);
  early.hello(net);
  EXPECT_NE(refusal(net, early.peer, &retry).find("round 1 is not open yet"), std::string::npos);
  EXPECT_TRUE(retry);
  FakeWorker fixed(sample[0], cfg);
  fixed.population = 0;  // a worker of a fixed-worker job
  fixed.hello(net);
  EXPECT_NE(refusal(net, fixed.peer).find("population 0, the job has 50 clients"), std::string::npos);

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

class FederatedCodecs : public ::testing::TestWithParam<const char*> {};

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
  EXPECT_EQ(std::memcmp(net.engine.model().data(), expect.data(), kDim * 4), 0) << "server ≠ reference";
  EXPECT_NE(std::memcmp(expect.data(), init.data(), kDim * 4), 0) << "nothing was trained";
}

INSTANTIATE_TEST_SUITE_P(Every, FederatedCodecs,
                         ::testing::Values("dense", "topk:k=30", "signsgd", "sketch:k=30,cols=200,fetch=1",
                                           "sketch:k=30,cols=200,p2=2", "powersgd:rank=2,layout=10x30"));

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
  EXPECT_NE(refusal(net, late.peer, &retry).find("came for round 0, which is over"), std::string::npos);
  EXPECT_FALSE(retry);
  EXPECT_EQ(net.engine.round(), 1u);
}

TEST(Federated, AClientThatNeverComesIsClosedOverAtTheDeadline) {
  JobConfig cfg = federated("dense");
  cfg.policy = Policy::Quorum;
  cfg.min_workers = 3;
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
  cfg.policy = Policy::Quorum;
  cfg.min_workers = 3;
  cfg.deadline = 60s;
  Net net(cfg);
  const auto init = test::initial_params(kDim, 3);
  auto cs = arrive(net, cfg, init);  // all four registered; the last falls silent
  for (size_t i = 0; i + 1 < cs.size(); ++i) cs[i].push(net, test::synthetic_grad(cs[i].params, cs[i].id, 0, 5));
  for (int i = 0; i < 5; ++i) {  // the others keep beating; the last is dead after 3 × 100 ms
    net.tick(100ms);
    for (size_t j = 0; j + 1 < cs.size(); ++j) net.deliver(cs[j].peer, {cs[j].mine(Type::Heartbeat, 0)});
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
  EXPECT_EQ(std::memcmp(resumed.engine.model().data(), straight.engine.model().data(), kDim * 4), 0);
  // Without the server's momentum and error sketches the job goes elsewhere.
  Checkpoint lost = c;
  lost.codec_state = Net(cfg).engine.checkpoint().codec_state;
  Net amnesiac(cfg);
  amnesiac.engine.restore(lost);
  for (int t = 0; t < 2; ++t) run_round(amnesiac, cfg, {});
  EXPECT_NE(std::memcmp(amnesiac.engine.model().data(), straight.engine.model().data(), kDim * 4), 0);
}

TEST(Federated, TheJobRefusesSettingsItCannotRun) {
  JobConfig cfg = federated("dense");
  cfg.population = kPerRound - 1;
  EXPECT_THROW(Engine{cfg}, InvalidArgument);
  cfg = federated("dense");
  cfg.staleness = 1;
  EXPECT_THROW(Engine{cfg}, InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::ps
