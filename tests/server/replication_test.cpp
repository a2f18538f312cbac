// Replication in-process, with a fake clock: a backup holds its primary's state round by round
// (bit for bit, every codec), a round's outcome reaches no worker before the backup has it, the
// backup takes over wherever the primary dies and the job ends bit for bit as without the failure;
// deposed primaries, a lost backup, refused and corrupt replication traffic.
#include <gtest/gtest.h>

#include <cstring>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/replication.hpp>
#include "support/helpers.hpp"
#include "support/ps_job.hpp"
#include "support/ps_net.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

/// A primary with its workers, and a backup whose link to it this test carries by hand.
struct Pair {
  explicit Pair(const JobConfig& cfg)
      : cfg(cfg), primary(cfg), standby(cfg), backup(standby.engine, [](const std::string&) {}) {}

  static inline const PeerId kLink = "backup-link";
  void follow() {
    primary.deliver(kLink, backup.follow());
    pump();
  }
  /// Carries what the primary sent its backup, and the answers back.
  void pump() {
    while (auto m = primary.next(kLink)) {
      std::vector<Frames> replies;
      backup.handle(m->second, replies);
      for (auto& r : replies) primary.deliver(kLink, r);
    }
  }
  /// W workers of the job register with the primary (rank 0 with init), the backup following
  /// (rank 0's Init brings a Sync, which holds the rest until the backup has it).
  std::vector<FakeWorker> join(std::span<const float> init) {
    std::vector<FakeWorker> ws;
    for (uint32_t r = 0; r < cfg.world; ++r) ws.emplace_back(r, cfg);
    for (auto& w : ws) {
      w.join(primary, init);
      pump();
    }
    for (auto& w : ws) EXPECT_TRUE(w.take_model(primary)) << "rank " << w.rank;
    return ws;
  }
  /// The backup's state is the primary's, bit for bit.
  void expect_same() const {
    const Engine& a = primary.engine;
    const Engine& b = standby.engine;
    ASSERT_EQ(a.round(), b.round());
    ASSERT_EQ(a.model().size(), b.model().size());
    EXPECT_EQ(std::memcmp(a.model().data(), b.model().data(), a.model().size_bytes()), 0)
        << "round " << a.round();
    EXPECT_EQ(a.codec_state(), b.codec_state()) << "round " << a.round();
    EXPECT_EQ(a.checkpoint().outer, b.checkpoint().outer);
    EXPECT_EQ(a.checkpoint().outer_steps, b.checkpoint().outer_steps);
  }

  JobConfig cfg;
  Net primary;
  Net standby;  // the backup's engine: serves the workers once it has taken over
  Backup backup;
};

/// Every worker pushes `msgs` (one encoded gradient each, kept so it can be sent again after a
/// failover, as Session does) and settles.
std::vector<std::optional<Type>> push_and_settle(Net& net, std::vector<FakeWorker>& ws,
                                                 const std::vector<Frame>& msgs,
                                                 const std::function<void()>& between = {}) {
  for (size_t i = 0; i < ws.size(); ++i)
    net.deliver(ws[i].peer, {ws[i].mine(Type::Push, ws[i].round), msgs[i]});
  std::vector<std::optional<Type>> ended(ws.size());
  for (int pass = 0; pass < 4; ++pass) {
    if (between) between();
    for (size_t i = 0; i < ws.size(); ++i)
      if (!ended[i]) ended[i] = ws[i].settle(net);
  }
  return ended;
}

std::vector<Frame> encode_all(std::vector<FakeWorker>& ws, std::vector<std::vector<float>>& grads,
                              uint64_t t) {
  std::vector<Frame> msgs;
  for (auto& w : ws) {
    grads.push_back(test::synthetic_grad(w.params, w.rank, t, 11));
    msgs.push_back(bytes_frame(w.codec->encode(grads.back(), t, w.rank)));
  }
  return msgs;
}

/// Where the primary dies in the round after which the backup takes over.
enum class Death {
  BetweenRounds,    // every worker holds the last update
  BeforeTheCommit,  // the round ended on the primary; its commit never reached the backup
  AfterTheAck,      // the backup holds the round; no worker got its update
};

class Failover : public ::testing::TestWithParam<std::tuple<std::string, Death>> {};

TEST_P(Failover, TheJobEndsBitForBitAsWithoutTheFailure) {
  constexpr uint64_t kDim = 3000, kRounds = 6, kDies = 3;
  constexpr uint32_t kWorld = 3;
  const auto& [spec, death] = GetParam();
  const JobConfig cfg = test_job::make(spec, kWorld, kDim);
  Pair p(cfg);
  p.follow();  // before rank 0's Init: the state follows when the model comes
  EXPECT_FALSE(p.backup.synced());
  const auto init = test::initial_params(kDim, 7);
  std::vector<FakeWorker> ws = p.join(init);
  ASSERT_TRUE(p.backup.synced());

  test::Job ref(cfg.spec, kDim, kWorld);
  std::vector<float> ref_params = init;
  Net* serving = &p.primary;
  for (uint64_t t = 0; t < kRounds; ++t) {
    std::vector<std::vector<float>> grads;
    const auto msgs = encode_all(ws, grads, t);
    if (t < kDies) {
      const auto ended = push_and_settle(p.primary, ws, msgs, [&] { p.pump(); });
      for (size_t i = 0; i < ws.size(); ++i) ASSERT_EQ(ended[i], Type::Update) << "rank " << i;
      p.expect_same();
    } else if (t == kDies) {
      // The primary's last round: it dies where the parameter says.
      for (size_t i = 0; i < ws.size(); ++i)
        p.primary.deliver(ws[i].peer, {ws[i].mine(Type::Push, t), msgs[i]});
      for (int pass = 0; pass < 2; ++pass) {  // a second round's queries and answers
        if (death == Death::AfterTheAck) p.pump();
        for (auto& w : ws)
          while (auto m = p.primary.next(w.peer))
            if (m->first.type == Type::Query) {
              const Message a = w.codec->answer(m->second[1].bytes(), w.rank);
              p.primary.deliver(w.peer, {w.mine(Type::Answer, t), bytes_frame(a)});
            }
      }
      if (death == Death::AfterTheAck) EXPECT_EQ(p.standby.engine.round(), t + 1);
      if (death == Death::BeforeTheCommit) EXPECT_EQ(p.standby.engine.round(), t);
      if (death == Death::BetweenRounds) {
        p.pump();
        for (auto& w : ws) ASSERT_EQ(w.settle(p.primary), Type::Update);
      }
      for (auto& w : ws) EXPECT_EQ(w.settle(p.primary), std::nullopt) << "an update leaked";
      // The workers find the primary gone and register with the backup, which takes over.
      (void)p.backup.promote();
      serving = &p.standby;
      for (auto& w : ws) {
        w.join(p.standby, {});
        ASSERT_TRUE(w.take_model(p.standby)) << "rank " << w.rank;
      }
      if (death == Death::BeforeTheCommit) {
        // Nobody saw the round end: its pushes go again, to the backup.
        const auto ended = push_and_settle(p.standby, ws, msgs);
        for (size_t i = 0; i < ws.size(); ++i) ASSERT_EQ(ended[i], Type::Update) << "rank " << i;
      }
    } else {
      const auto ended = push_and_settle(*serving, ws, msgs);
      for (size_t i = 0; i < ws.size(); ++i) ASSERT_EQ(ended[i], Type::Update) << "rank " << i;
    }
    const auto steps = ref.round(grads, t);
    kernels::cpu::axpy(ref_params.data(), steps[0].data(), kDim, -cfg.lr);
  }
  ASSERT_EQ(p.standby.engine.round(), kRounds);
  EXPECT_EQ(p.standby.engine.epoch(), 1u);
  const auto model = p.standby.engine.model();
  EXPECT_EQ(std::memcmp(model.data(), ref_params.data(), kDim * 4), 0) << "backup ≠ reference";
  for (auto& w : ws) {
    ASSERT_EQ(w.round, kRounds);
    EXPECT_EQ(std::memcmp(w.params.data(), ref_params.data(), kDim * 4), 0) << "rank " << w.rank;
  }
  EXPECT_NE(std::memcmp(ref_params.data(), init.data(), kDim * 4), 0) << "nothing was trained";
}

std::vector<std::tuple<std::string, Death>> failovers() {
  std::vector<std::tuple<std::string, Death>> v;
  for (const auto& s : example_specs(Layout::parse("30x90+300")))
    v.emplace_back(s, Death::BeforeTheCommit);
  // Where the primary dies matters to the protocol, not to the codec: one of each kind.
  for (const char* s : {"sketch:k=20,cols=200,fetch=1", "topk:k=40"}) {
    v.emplace_back(s, Death::BetweenRounds);
    v.emplace_back(s, Death::AfterTheAck);
  }
  return v;
}

std::string failover_name(const ::testing::TestParamInfo<std::tuple<std::string, Death>>& info) {
  const char* when[] = {"BetweenRounds", "BeforeTheCommit", "AfterTheAck"};
  const ::testing::TestParamInfo<std::string> spec(std::get<0>(info.param), info.index);
  return test::spec_name(spec) + "_" + when[int(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(Every, Failover, ::testing::ValuesIn(failovers()), failover_name);

struct Started {
  Pair pair;
  std::vector<FakeWorker> ws;
  std::vector<float> init;
};

/// Two rounds without a backup, then one follows (it catches up with one Sync).
std::unique_ptr<Started> started(const std::string& spec = "topk:k=30") {
  const JobConfig cfg = test_job::make(spec, 2, 600);
  // Pair is never moved (its parts hold references to each other): built in place.
  auto s = std::unique_ptr<Started>(new Started{Pair(cfg), {}, test::initial_params(600, 5)});
  for (uint32_t r = 0; r < 2; ++r) s->ws.emplace_back(r, cfg);
  for (auto& w : s->ws) w.join(s->pair.primary, s->init);
  for (auto& w : s->ws) EXPECT_TRUE(w.take_model(s->pair.primary));
  for (uint64_t t = 0; t < 2; ++t) {
    std::vector<std::vector<float>> grads;
    const auto ended = push_and_settle(s->pair.primary, s->ws, encode_all(s->ws, grads, t));
    for (const auto& e : ended) EXPECT_EQ(e, Type::Update);
  }
  s->pair.follow();
  EXPECT_TRUE(s->pair.backup.synced());
  s->pair.expect_same();
  return s;
}

class ReplicatedOptimizer : public ::testing::TestWithParam<OuterKind> {};

TEST_P(ReplicatedOptimizer, ItsStateFollowsBitForBit) {
  // DiLoCo over the parameter server (Nesterov outside), or Downpour's Adagrad, or Adam: every
  // holder of the model runs the step, whose state the backup rebuilds from the updates alone.
  JobConfig cfg = test_job::make("topk:k=30", 2, 600);
  cfg.outer = OuterOptions{0.9f, true};
  if (GetParam() != OuterKind::Sgd) cfg.outer = OuterOptions{0.0f, false, GetParam()};
  Pair p(cfg);
  p.follow();
  std::vector<FakeWorker> ws = p.join(test::initial_params(600, 5));
  for (uint64_t t = 0; t < 5; ++t) {
    std::vector<std::vector<float>> grads;
    const auto ended = push_and_settle(p.primary, ws, encode_all(ws, grads, t), [&] { p.pump(); });
    for (const auto& e : ended) ASSERT_EQ(e, Type::Update);
    p.expect_same();
  }
  const auto outer = p.standby.engine.checkpoint().outer;
  ASSERT_EQ(outer.size(), 600u * cfg.outer.buffers());
  EXPECT_TRUE(std::any_of(outer.begin(), outer.end(), [](float v) { return v != 0; }));
}

INSTANTIATE_TEST_SUITE_P(Every, ReplicatedOptimizer,
                         ::testing::Values(OuterKind::Sgd, OuterKind::Adagrad, OuterKind::Adam),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(Replication, RoundsThatEndTogetherAreCommittedOneByOne) {
  // Bounded staleness with a quorum: two workers push rounds 0 and 1, the third is dead; one
  // tick closes both rounds, and the backup gets both commits in order.
  JobConfig cfg = test_job::make("topk:k=30", 3, 600);
  cfg.mode = SyncMode{{Policy::Quorum, 2}, 2};
  Pair p(cfg);
  p.follow();
  std::vector<FakeWorker> ws = p.join(test::initial_params(600, 5));
  for (uint64_t t = 0; t < 2; ++t)
    for (uint32_t r = 0; r < 2; ++r) {
      const auto g = test::synthetic_grad(ws[r].params, r, t, 11);
      p.primary.deliver(ws[r].peer,
                        {ws[r].mine(Type::Push, t), bytes_frame(ws[r].codec->encode(g, t, r))});
    }
  EXPECT_EQ(p.primary.engine.round(), 0u);
  size_t commits = 0;
  for (int i = 0; i < 12 && p.primary.engine.round() < 2; ++i) {
    p.primary.tick(p.cfg.heartbeat);  // rank 2 falls silent, then dead: the quorum closes
    p.primary.deliver(Pair::kLink, {env(Type::Heartbeat, p.cfg.job, 0, 0)});
  }
  ASSERT_EQ(p.primary.engine.round(), 2u) << "both rounds closed";
  for (const auto& m : p.primary.inbox[Pair::kLink])
    commits += decode_envelope(m[0].bytes(), m.size() - 1).type == Type::Commit;
  EXPECT_EQ(commits, 2u);
  EXPECT_TRUE(p.primary.primary.holding());
  p.pump();
  EXPECT_FALSE(p.primary.primary.holding());
  p.expect_same();
}

/// Every worker pushes round t; the round ends on the primary and waits for the backup.
/// The Syncs the primary sent `peer` since last asked (what else it sent is dropped).
size_t syncs_to(Net& net, const PeerId& peer) {
  size_t n = 0;
  while (auto m = net.next(peer)) n += m->first.type == Type::Sync;
  return n;
}

void hold_round(Started& s, uint64_t t) {
  std::vector<std::vector<float>> grads;
  (void)push_and_settle(s.pair.primary, s.ws, encode_all(s.ws, grads, t));
  ASSERT_TRUE(s.pair.primary.primary.holding());
}

TEST(Replication, AnAsynchronousPushTheBackupHoldsIsAnsweredThereNotAppliedAgain) {
  // Rank 1's second push (its pusher and push number are not the defaults a Commit that lost
  // them would decode to): committed, then the primary dies before rank 1 hears of it.
  JobConfig cfg = test_job::make("topk:k=30", 2, 600);
  cfg.mode = AsyncMode{};
  Pair p(cfg);
  p.follow();
  auto ws = p.join(test::initial_params(600, 5));
  FakeWorker& w1 = ws[1];
  w1.push(p.primary, test::synthetic_grad(w1.params, 1, 0, 11));
  p.pump();
  ASSERT_EQ(w1.settle(p.primary), Type::Update);
  const Frame msg = bytes_frame(w1.codec->encode(test::synthetic_grad(w1.params, 1, 1, 11), 1, 1));
  p.primary.deliver(w1.peer, {w1.mine(Type::Push, 1), msg});
  EXPECT_FALSE(p.primary.next(w1.peer)) << "the update went out before the backup had it";
  p.pump();  // committed and acknowledged; the primary dies before its pusher hears of it
  p.expect_same();
  ASSERT_EQ(p.standby.engine.round(), 2u);
  (void)p.backup.promote();
  for (auto& w : ws) {
    w.join(p.standby, {});
    ASSERT_TRUE(w.take_model(p.standby)) << "rank " << w.rank;
  }
  EXPECT_EQ(w1.round, 2u) << "the backup does not know push #1 was applied";
  EXPECT_EQ(ws[0].round, 0u);
  p.standby.deliver(w1.peer, {w1.mine(Type::Push, 1), msg});  // sent again
  const auto reply = p.standby.next(w1.peer);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->first.type, Type::Update);
  EXPECT_EQ(reply->first.round, 1u);
  EXPECT_EQ(decode_update_info(reply->second[1].bytes()).push, 1u);
  EXPECT_EQ(decode_update_info(reply->second[1].bytes()).pusher, 1u);
  EXPECT_EQ(p.standby.engine.round(), 2u) << "applied twice";
  ws[0].push(p.standby, test::synthetic_grad(ws[0].params, 0, 0, 11));
  EXPECT_EQ(ws[0].settle(p.standby), Type::Update) << "rank 0's first push";
  EXPECT_EQ(p.standby.engine.round(), 3u);
}

TEST(Replication, ARoundsOutcomeWaitsForTheBackupsAcknowledgement) {
  auto s = started();
  Pair& p = s->pair;
  std::vector<std::vector<float>> grads;
  const auto msgs = encode_all(s->ws, grads, 2);
  const auto ended = push_and_settle(p.primary, s->ws, msgs);
  for (const auto& e : ended) EXPECT_EQ(e, std::nullopt) << "an update before the backup has it";
  EXPECT_TRUE(p.primary.primary.holding());
  EXPECT_EQ(p.primary.engine.round(), 3u);
  EXPECT_EQ(p.standby.engine.round(), 2u);
  // A push sent again meanwhile is not answered with the held outcome.
  p.primary.deliver(s->ws[0].peer, {s->ws[0].mine(Type::Push, 2), msgs[0]});
  EXPECT_EQ(s->ws[0].settle(p.primary), std::nullopt);
  p.pump();
  EXPECT_FALSE(p.primary.primary.holding());
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), Type::Update);
  p.expect_same();
}

TEST(Replication, ALostBackupReleasesTheHeldRoundAndThePrimaryGoesOnAlone) {
  auto s = started();
  Pair& p = s->pair;
  hold_round(*s, 2);
  for (int i = 0; i < 3; ++i) p.primary.tick(p.cfg.heartbeat);  // not yet dead
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), std::nullopt);
  p.primary.tick(p.cfg.heartbeat);
  EXPECT_FALSE(p.primary.primary.has_backup());
  p.primary.inbox[Pair::kLink].clear();  // the commit it never acknowledged
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), Type::Update);
  std::vector<std::vector<float>> grads;
  const auto ended = push_and_settle(p.primary, s->ws, encode_all(s->ws, grads, 3));
  for (const auto& e : ended) EXPECT_EQ(e, Type::Update);
  EXPECT_EQ(p.primary.inbox[Pair::kLink].size(), 0u) << "commits to a lost backup";
  // The backup was only slow: its next heartbeat is refused (the primary forgot it), so it stops
  // counting as a state to take over with and follows again, catching up with one Sync.
  p.primary.deliver(Pair::kLink, {env(Type::Heartbeat, p.cfg.job, 0, 0)});
  auto refused = p.primary.next(Pair::kLink);
  ASSERT_TRUE(refused);
  ASSERT_EQ(refused->first.type, Type::Refuse);
  std::vector<Frames> replies;
  p.backup.handle(refused->second, replies);
  EXPECT_FALSE(p.backup.synced());
  ASSERT_EQ(replies.size(), 1u);
  p.primary.deliver(Pair::kLink, replies[0]);
  p.pump();
  EXPECT_TRUE(p.backup.synced());
  EXPECT_TRUE(p.primary.primary.has_backup());
  p.expect_same();
}

TEST(Replication, APrimaryWhoseBackupTookOverIsDeposedAndSendsNoUpdate) {
  auto s = started();
  Pair& p = s->pair;
  const Frames notice = p.backup.promote();
  EXPECT_EQ(decode_envelope(notice[0].bytes(), 1).type, Type::Deposed);
  EXPECT_EQ(p.standby.engine.epoch(), 1u);
  // Should the notice be lost, the primary's next round is refused so.
  std::vector<std::vector<float>> grads;
  (void)push_and_settle(p.primary, s->ws, encode_all(s->ws, grads, 2), [&] { p.pump(); });
  ASSERT_TRUE(p.primary.primary.deposed());
  EXPECT_NE(p.primary.primary.deposed()->find("took over at round 2 as epoch 1"), std::string::npos)
      << *p.primary.primary.deposed();
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), std::nullopt);
  EXPECT_EQ(p.standby.engine.round(), 2u);
}

TEST(Replication, AWorkerOfALaterEpochIsSentOnAndDeposesNothing) {
  // A worker's epoch is hearsay (a forged field, or a worker that registered elsewhere): the
  // server refuses it, marked "elsewhere" so the worker tries its next replica, and goes on.
  const JobConfig cfg = test_job::make("dense", 2, 100);
  Net net(cfg);
  FakeWorker w(1, cfg);
  HelloInfo hello{2, 100, net.engine.config().spec, 0, ShardId{0, 1, 0, 100}, 1};
  for (uint64_t epoch : {uint64_t(1), uint64_t(1) << 31, uint64_t(72057594021150720)}) {
    hello.epoch = epoch;
    net.deliver(w.peer, {env(Type::Hello, cfg.job, 0, 1), Frame::own(encode(hello))});
    const auto m = net.next(w.peer);
    ASSERT_TRUE(m);
    ASSERT_EQ(m->first.type, Type::Refuse);
    const RefuseInfo r = decode_refuse(m->second[1].bytes());
    EXPECT_TRUE(r.retry);
    EXPECT_TRUE(r.elsewhere);
    EXPECT_NE(r.reason.find("epoch " + std::to_string(epoch)), std::string::npos) << r.reason;
    EXPECT_FALSE(net.primary.deposed());
  }
  EXPECT_EQ(net.engine.live_workers(), 0u);
  // Of the same epoch (or none): welcomed, with the server's epoch.
  net.engine.set_epoch(1);
  hello.epoch = 1;
  net.deliver(w.peer, {env(Type::Hello, cfg.job, 0, 1), Frame::own(encode(hello))});
  const auto m = net.next(w.peer);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->first.type, Type::Welcome);
  EXPECT_EQ(decode_welcome(m->second[1].bytes()).epoch, 1u);
  EXPECT_FALSE(decode_refuse(encode(RefuseInfo{true, Type::Push, "x"})).elsewhere);
}

TEST(Replication, OnlyItsOwnBackupsTokenDeposesAPrimary) {
  auto s = started();
  Pair& p = s->pair;
  const PeerId stranger = "stranger";
  // A notice without the token of the primary's Sync (forged, or of another primary's backup),
  // truncated, or of the wrong shape: dropped, the job goes on.
  p.primary.deliver(stranger,
                    {env(Type::Deposed, p.cfg.job, 0, 0), Frame::own(encode(DeposedInfo{7, "x"}))});
  p.primary.deliver(stranger, {env(Type::Deposed, p.cfg.job, 0, 0), bytes_frame(Bytes(3, 1))});
  p.primary.deliver(stranger, {env(Type::Deposed, p.cfg.job, 0, 0)});
  p.primary.deliver(Pair::kLink,
                    {env(Type::Deposed, p.cfg.job, 0, 0), Frame::own(encode(DeposedInfo{0, ""}))});
  EXPECT_FALSE(p.primary.primary.deposed());
  std::vector<std::vector<float>> grads;
  auto ended = push_and_settle(p.primary, s->ws, encode_all(s->ws, grads, 2), [&] { p.pump(); });
  for (const auto& e : ended) EXPECT_EQ(e, Type::Update);
  // A Follow of a later epoch carries no evidence either: refused for good, nothing deposed.
  JobConfig later_cfg = p.cfg;
  Net later_net(later_cfg);
  later_net.engine.set_epoch(3);
  Backup later(later_net.engine, [](const std::string&) {});
  p.primary.tick(p.cfg.heartbeat * (p.cfg.dead_after + 1));  // the backup's role is free
  p.primary.deliver(stranger, later.follow());
  auto m = p.primary.next(stranger);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->first.type, Type::Refuse);
  EXPECT_FALSE(decode_refuse(m->second[1].bytes()).retry);
  EXPECT_FALSE(p.primary.primary.deposed());
  // The backup's own notice deposes it, from any connection (one made after a cut link).
  const Frames notice = p.backup.promote();
  EXPECT_EQ(decode_envelope(p.backup.reconnected()[0].bytes(), 1).type, Type::Deposed);
  p.primary.deliver("backup-again", notice);
  ASSERT_TRUE(p.primary.primary.deposed());
  EXPECT_NE(p.primary.primary.deposed()->find("as epoch 1"), std::string::npos);
}

TEST(Replication, APrimaryWithoutABackupIsNeverDeposed) {
  // No Sync went anywhere: no notice can carry its token (0 is never one).
  const JobConfig cfg = test_job::make("topk:k=10", 2, 100);
  Net net(cfg);
  for (uint64_t token : {uint64_t(0), uint64_t(1), ~uint64_t(0)})
    net.deliver("x", {env(Type::Deposed, cfg.job, 0, 0), Frame::own(encode(DeposedInfo{token}))});
  EXPECT_FALSE(net.primary.deposed());
}

TEST(Replication, AFloodOfFollowsCostsOneSyncAnInterval) {
  auto s = started();
  Pair& p = s->pair;
  const auto syncs = [&](const PeerId& peer) { return syncs_to(p.primary, peer); };
  // Other connections, while the backup is live: not answered at all.
  for (int i = 0; i < 2000; ++i)
    p.primary.deliver("flood" + std::to_string(i % 50), p.backup.follow());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(syncs("flood" + std::to_string(i)), 0u);
  EXPECT_TRUE(p.primary.primary.has_backup());
  // The backup itself, again and again within an interval: one Sync when the interval is over.
  for (int i = 0; i < 1000; ++i) p.primary.deliver(Pair::kLink, p.backup.follow());
  EXPECT_EQ(syncs(Pair::kLink), 0u);
  p.primary.tick(p.cfg.heartbeat);
  EXPECT_EQ(syncs(Pair::kLink), 1u);
  p.primary.tick(p.cfg.heartbeat);
  EXPECT_EQ(syncs(Pair::kLink), 0u);
  // The backup, quiet past dead_after intervals, is replaced by the next connection to follow.
  p.primary.tick(p.cfg.heartbeat * (p.cfg.dead_after + 1));
  p.primary.deliver("restarted", p.backup.follow());
  EXPECT_EQ(syncs("restarted"), 1u);
}

// Found by scripts/chaos.py: the backup's link was cut and it connected again; the kernel resent
// the Follow of its old connection when the link returned, the primary took that one (nobody was
// following), refused the new connection's as another connection's while the backup was live,
// lost the old one unacknowledged, kept the backup out for a cool-down and died in it.
TEST(Replication, TheBackupOnALaterConnectionReplacesItsEarlierOneAtOnce) {
  auto s = started();
  Pair& p = s->pair;
  const auto syncs = [&](const PeerId& peer) { return syncs_to(p.primary, peer); };
  const auto carry = [&](const PeerId& link) {  // the backup's side of this connection
    while (auto m = p.primary.next(link)) {
      std::vector<Frames> replies;
      p.backup.handle(m->second, replies);
      for (auto& r : replies) p.primary.deliver(link, r);
    }
  };
  const auto anonymous = [](Frames f) {  // a stranger's copy: no token
    Envelope e = decode_envelope(f[0].bytes(), f.size() - 1);
    e.session = 0;
    e.rank = 99;
    f[0] = Frame::own(encode(e));
    return f;
  };
  const Frames old_follow = p.backup.reconnected();  // connection 1: held by the cut link
  const Frames new_follow = p.backup.reconnected();  // connection 2: the one it uses
  p.primary.tick(p.cfg.heartbeat * (p.cfg.dead_after + 1));
  ASSERT_FALSE(p.primary.primary.has_backup());
  p.primary.inbox[Pair::kLink].clear();
  p.primary.deliver("old-link", old_follow);  // delivered first: taken, nobody follows
  EXPECT_EQ(syncs("old-link"), 1u);
  hold_round(*s, 2);  // the old connection is gone: nobody acknowledges
  p.primary.deliver("new-link", new_follow);
  carry("new-link");
  EXPECT_FALSE(p.primary.primary.holding()) << "the new connection's Follow was not answered";
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), Type::Update);
  p.expect_same();
  // What the old connection still delivers is not answered; a stranger is not either.
  p.primary.deliver("old-link", old_follow);
  EXPECT_EQ(syncs("old-link"), 0u);
  p.primary.deliver("stranger", anonymous(new_follow));
  EXPECT_EQ(syncs("stranger"), 0u);

  // The same race after the backup fell silent, the earlier connection's Follow lost
  // unacknowledged while holding a round (a strike, a cool-down): the cool-down keeps strangers
  // out, not the backup's later connection.
  p.primary.tick(p.cfg.heartbeat * (p.cfg.dead_after + 1));
  ASSERT_FALSE(p.primary.primary.has_backup());
  p.primary.inbox["new-link"].clear();
  const Frames third = p.backup.reconnected(), fourth = p.backup.reconnected();
  p.primary.deliver("link-3", third);
  EXPECT_EQ(syncs("link-3"), 1u);
  hold_round(*s, 3);
  while (p.primary.primary.has_backup()) p.primary.tick(p.cfg.heartbeat);  // the deadline
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), Type::Update);
  p.primary.deliver("stranger", anonymous(fourth));
  EXPECT_EQ(syncs("stranger"), 0u) << "a stranger followed in the cool-down";
  p.primary.deliver("link-4", fourth);
  carry("link-4");
  EXPECT_TRUE(p.primary.primary.has_backup()) << "the backup was kept out by the cool-down";
  p.expect_same();
  // One such pass an Ack: a holder of the token that replaces the backup and acknowledges
  // nothing is lost at the deadline, and its next connection waits out the cool-down.
  p.primary.deliver("link-5", p.backup.reconnected());
  EXPECT_EQ(syncs("link-5"), 1u);
  hold_round(*s, 4);
  while (p.primary.primary.has_backup()) p.primary.tick(p.cfg.heartbeat);
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), Type::Update);
  p.primary.deliver("link-6", p.backup.reconnected());
  EXPECT_EQ(syncs("link-6"), 0u) << "passed the cool-down twice without an Ack";
  EXPECT_FALSE(p.primary.primary.has_backup());
}

TEST(Replication, ABackupOfAnotherJobOrAnUnreplicableJobIsRefused) {
  const JobConfig cfg = test_job::make("topk:k=10", 2, 100);
  Pair p(cfg);
  JobConfig other = cfg;
  other.spec = make_compressor("topk:k=11", 100)->spec();
  Net other_net(other);
  Backup wrong(other_net.engine, [](const std::string&) {});
  p.primary.deliver(Pair::kLink, wrong.follow());
  auto m = p.primary.next(Pair::kLink);
  ASSERT_TRUE(m);
  std::vector<Frames> replies;
  EXPECT_THROW(wrong.handle(m->second, replies), ConfigMismatch);
  EXPECT_FALSE(p.primary.primary.has_backup());

  JobConfig federated = cfg;
  federated.mode = FederatedMode{.population = 10};
  Net federated_net(federated);
  federated_net.deliver(Pair::kLink, p.backup.follow());
  m = federated_net.next(Pair::kLink);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.type, Type::Refuse);
  EXPECT_NE(decode_refuse(m->second[1].bytes()).reason.find("federated"), std::string::npos);

  // With CURVE only the job's own server key pair may follow, not a worker's.
  JobConfig curve = cfg;
  curve.authenticated = true;
  Engine engine(curve);
  Primary primary(engine, [](const std::string&) {});
  std::vector<Outgoing> out;
  primary.handle(Pair::kLink, p.backup.follow(), Clock::now(), out, "0");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(decode_refuse(out[0].frames[1].bytes()).reason.find("server key"), std::string::npos);
  EXPECT_FALSE(primary.has_backup());
  out.clear();
  primary.handle(Pair::kLink, p.backup.follow(), Clock::now(), out, kServerUser);
  EXPECT_TRUE(primary.has_backup());
}

TEST(Replication, TheBackupTakesOverOnceEveryWorkerAnsweredItsProbeWhileThePrimaryWasSilent) {
  const JobConfig cfg = test_job::make("topk:k=10", 2, 100);
  Pair p(cfg);
  const std::string spec = p.standby.engine.config().spec;
  const auto hello = [&](uint64_t job, uint32_t rank, HelloInfo h, uint64_t round = 0) {
    return Frames{env(Type::Hello, job, round, rank), Frame::own(encode(h))};
  };
  const HelloInfo good{2, 100, spec};
  // The worker's answer to a probe: the Probe's nonce as its session, its Hello's info.
  const auto answer = [&](const Frames& probe, HelloInfo h = {2, 100, ""}) {
    const Envelope e = decode_envelope(probe.at(0).bytes(), probe.size() - 1);
    EXPECT_EQ(e.type, Type::Probe);
    if (h.spec.empty()) h.spec = spec;
    return Frames{Frame::own(encode(Envelope{Type::Present, cfg.job, 0, e.rank, 0, e.session})),
                  Frame::own(encode(h))};
  };
  using V = Backup::Verdict;
  const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(2);
  const auto window = cfg.heartbeat * cfg.dead_after;
  const auto silent = t0 + window;
  EXPECT_EQ(p.backup.consider(hello(cfg.job, 1, good), silent), V::Ignore) << "no state yet";
  p.follow();
  (void)p.join(test::initial_params(100, 3));
  ASSERT_TRUE(p.backup.synced());
  p.backup.heard(t0);
  for (const Frames& bad :
       {hello(cfg.job + 1, 1, good), hello(cfg.job, 2, good), hello(cfg.job, 0, {3, 100, spec}),
        hello(cfg.job, 0, {2, 101, spec}), hello(cfg.job, 0, {2, 100, "dense"}),
        Frames{env(Type::Heartbeat, cfg.job, 0, 0)}, Frames{bytes_frame(Bytes(40, 0xAB))}})
    EXPECT_EQ(p.backup.consider(bad, silent), V::Ignore);
  // The primary heard from within dead_after heartbeats: a worker that came does not count, and
  // one that claims the epoch this backup would take over as (it answered a probe before the
  // primary was heard again) is released, to go back to the primary.
  EXPECT_EQ(p.backup.consider(hello(cfg.job, 0, good), silent - 1ms), V::Ignore);
  HelloInfo waiting = good;
  waiting.epoch = p.standby.engine.epoch() + 1;
  ASSERT_EQ(p.backup.consider(hello(cfg.job, 0, waiting), silent - 1ms), V::Release);
  const Frames release = p.backup.release(hello(cfg.job, 0, waiting));
  const Envelope re = decode_envelope(release[0].bytes(), release.size() - 1);
  EXPECT_EQ(re.type, Type::Probe);
  EXPECT_EQ(re.rank, 0u);
  EXPECT_EQ(decode_probe(release[1].bytes()).release, 1);
  EXPECT_EQ(decode_probe(release[1].bytes()).epoch, waiting.epoch);
  // A Hello alone never counts (it may have waited in the network while its worker went back to
  // the primary): it is probed.
  ASSERT_EQ(p.backup.consider(hello(cfg.job, 0, good), silent), V::Probe);
  const Frames probe0 = p.backup.probe(hello(cfg.job, 0, good), silent);
  const ProbeInfo pi = decode_probe(probe0[1].bytes());
  EXPECT_EQ(pi.epoch, p.standby.engine.epoch() + 1);
  EXPECT_EQ(pi.release, 0);
  EXPECT_EQ(p.backup.hold(), 2 * window);
  // Answers that prove nothing: no probe of this rank, another nonce, or too late.
  Frames forged = answer(probe0);
  forged[0] = Frame::own(encode(
      Envelope{Type::Present, cfg.job, 0, 1, 0, decode_envelope(probe0[0].bytes(), 1).session}));
  EXPECT_EQ(p.backup.consider(forged, silent), V::Ignore) << "rank 1 was not probed";
  Frames guessed = answer(probe0);
  guessed[0] = Frame::own(encode(Envelope{Type::Present, cfg.job, 0, 0, 0,
                                          decode_envelope(probe0[0].bytes(), 1).session + 2}));
  EXPECT_EQ(p.backup.consider(guessed, silent), V::Ignore) << "another nonce";
  EXPECT_EQ(p.backup.consider(answer(probe0), silent + window + 1ms), V::Ignore) << "late";
  EXPECT_EQ(p.backup.consider(answer(probe0, {3, 100, ""}), silent), V::Ignore) << "a bad Hello";
  // Probed again, rank 0 answers in time: 1 of 2.
  ASSERT_EQ(p.backup.consider(hello(cfg.job, 0, good), silent), V::Probe);
  const Frames again0 = p.backup.probe(hello(cfg.job, 0, good), silent);
  EXPECT_NE(decode_envelope(again0[0].bytes(), 1).session,
            decode_envelope(probe0[0].bytes(), 1).session);
  EXPECT_EQ(p.backup.consider(answer(probe0), silent), V::Ignore) << "the earlier probe's";
  EXPECT_EQ(p.backup.consider(answer(again0), silent), V::Ignore) << "1 of 2";
  EXPECT_EQ(p.backup.consider(answer(again0), silent), V::Ignore) << "an answer counts once";
  // Rank 1 answers after rank 0's answer stopped counting (hold()): still 1 of 2.
  const auto expired = silent + p.backup.hold() + 1ms;
  ASSERT_EQ(p.backup.consider(hello(cfg.job, 1, good), expired), V::Probe);
  const Frames probe1 = p.backup.probe(hello(cfg.job, 1, good), expired);
  EXPECT_EQ(p.backup.consider(answer(probe1), expired), V::Ignore) << "rank 0's answer expired";
  // The primary again: those that answered are forgotten, and so are the probes out.
  ASSERT_EQ(p.backup.consider(hello(cfg.job, 0, good), expired), V::Probe);
  const Frames before = p.backup.probe(hello(cfg.job, 0, good), expired);
  p.backup.heard(expired);
  EXPECT_EQ(p.backup.consider(answer(before), expired + 1ms), V::Ignore) << "heard: no release";
  const auto later = expired + window;
  EXPECT_EQ(p.backup.consider(answer(before), later), V::Ignore) << "a probe of before";
  ASSERT_EQ(p.backup.consider(hello(cfg.job, 0, good), later), V::Probe);
  const Frames a = p.backup.probe(hello(cfg.job, 0, good), later);
  ASSERT_EQ(p.backup.consider(hello(cfg.job, 1, good), later), V::Probe);
  const Frames b = p.backup.probe(hello(cfg.job, 1, good), later);
  EXPECT_EQ(p.backup.consider(answer(a), later), V::Ignore);
  EXPECT_EQ(p.backup.consider(answer(b), later + window), V::TakeOver);
  // A worker that applied a round this backup never had: the primary went on without it.
  EXPECT_EQ(p.backup.consider(hello(cfg.job, 1, good, p.standby.engine.round() + 1), later),
            V::Behind);
  EXPECT_FALSE(p.backup.promoted());
}

TEST(Replication, ABackupBehindAWorkerSendsItBackAndFollowsAgain) {
  // The primary loses its backup (cut off) and ends a round alone; the workers then come to the
  // backup holding that round. It sends them back and asks for the whole state; taking over
  // would undo an update every worker applied.
  auto s = started();
  Pair& p = s->pair;
  const uint64_t held = p.standby.engine.round();
  auto& primary = p.primary;
  primary.tick(primary.engine.config().heartbeat * 10);  // the backup is silent: dropped
  std::vector<std::vector<float>> grads;
  const auto ended = push_and_settle(primary, s->ws, encode_all(s->ws, grads, held));
  for (const auto& e : ended) ASSERT_EQ(e, Type::Update);
  ASSERT_EQ(primary.engine.round(), held + 1);
  ASSERT_EQ(p.standby.engine.round(), held) << "the backup has not seen the round";
  const Frames h = {env(Type::Hello, primary.engine.config().job, s->ws[0].round, 0),
                    Frame::own(encode(HelloInfo{2, 600, primary.engine.config().spec}))};
  EXPECT_TRUE(p.backup.behind(h));
  const RefuseInfo r = decode_refuse(p.backup.refusal(h)[1].bytes());
  EXPECT_TRUE(r.retry);
  EXPECT_TRUE(r.elsewhere);
  EXPECT_NE(r.reason.find("went on without it"), std::string::npos) << r.reason;
  // Once it has taken over, such a worker is refused for good: the job's state is split.
  (void)p.backup.promote();
  EXPECT_FALSE(decode_refuse(p.backup.refusal(h)[1].bytes()).retry);
}

TEST(Replication, ABackupThatFoundItselfBehindHoldsNoStateUntilTheNextSync) {
  auto s = started();
  Pair& p = s->pair;
  const Frames again = p.backup.unsync();
  EXPECT_FALSE(p.backup.synced());
  EXPECT_EQ(decode_envelope(again[0].bytes(), again.size() - 1).type, Type::Follow);
  EXPECT_THROW((void)p.backup.promote(), Error) << "nothing to take over with";
  // Its Follow brings the whole state again (within an interval of the last Sync).
  p.primary.deliver(Pair::kLink, again);
  p.primary.tick(p.cfg.heartbeat);
  p.pump();
  EXPECT_TRUE(p.backup.synced());
  p.expect_same();
}

TEST(Replication, ACorruptCommitChangesNothingOnTheBackup) {
  auto s = started("sketch:k=20,cols=200,fetch=1");
  Pair& p = s->pair;
  hold_round(*s, 2);
  auto m = p.primary.next(Pair::kLink);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->first.type, Type::Commit);
  const auto before = p.standby.engine.checkpoint();
  std::vector<Frames> replies;
  for (size_t cut : {size_t(1), m->second[2].size() / 2}) {
    Frames bad = m->second;
    const auto b = bad[2].bytes();
    bad[2] = bytes_frame(b.first(b.size() - cut));
    p.backup.handle(bad, replies);
  }
  Frames bad_state = m->second;
  CommitInfo c = decode_commit_info(bad_state[1].bytes());
  c.codec_state.resize(c.codec_state.size() / 2);
  bad_state[1] = Frame::own(encode(c));
  p.backup.handle(bad_state, replies);
  Frames wrong_round = m->second;
  wrong_round[0] = env(Type::Commit, p.cfg.job, 7, 0);
  p.backup.handle(wrong_round, replies);
  const auto after = p.standby.engine.checkpoint();
  EXPECT_EQ(after.round, before.round);
  EXPECT_EQ(after.params, before.params);
  EXPECT_EQ(after.codec_state, before.codec_state);
  // Each is answered with a Follow: the primary's whole state, again.
  ASSERT_EQ(replies.size(), 4u);
  for (const auto& r : replies) EXPECT_EQ(decode_envelope(r[0].bytes(), 1).type, Type::Follow);
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), std::nullopt);
  for (const auto& r : replies) p.primary.deliver(Pair::kLink, r);
  p.primary.tick(p.cfg.heartbeat);  // one whole state an interval, however often asked
  p.pump();
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), Type::Update);
  p.expect_same();
}

TEST(Replication, ABackupThatNeverAcknowledgesIsDroppedAtTheDeadline) {
  auto s = started();
  Pair& p = s->pair;
  hold_round(*s, 2);
  const Frame hb = env(Type::Heartbeat, p.cfg.job, 0, 0);
  for (auto t = Millis(0); t <= p.cfg.deadline; t += p.cfg.heartbeat) {
    p.primary.deliver(Pair::kLink, {hb});  // alive, but the commit went nowhere
    p.primary.tick(p.cfg.heartbeat);
  }
  EXPECT_FALSE(p.primary.primary.has_backup());
  for (auto& w : s->ws) EXPECT_EQ(w.settle(p.primary), Type::Update);
}

TEST(Replication, ABackupSilentBeforeTheModelCameFollowsAgainAtOnce) {
  // It followed before rank 0's Init, so nothing was asked of it (and, unanswered, it sends no
  // heartbeats): lost for silence, it earns no cool-down and follows again when it reconnects.
  const JobConfig cfg = test_job::make("topk:k=30", 2, 600);
  Pair p(cfg);
  p.follow();
  EXPECT_TRUE(p.primary.primary.has_backup());
  p.primary.tick(cfg.heartbeat * (cfg.dead_after + 1));
  EXPECT_FALSE(p.primary.primary.has_backup());
  std::vector<FakeWorker> ws = p.join(test::initial_params(600, 5));
  p.primary.deliver(Pair::kLink, p.backup.follow());
  p.pump();
  EXPECT_TRUE(p.backup.synced());
  p.expect_same();
}

TEST(Replication, ABackupThatFollowedBeforeTheModelIsSilentOnlyFromItsFirstSync) {
  // Found by scripts/chaos.py: the model came just before its silence reached dead_after
  // heartbeats; the primary sent it the state and, in the same breath, found it silent, lost it
  // holding that state (a strike) and kept it out for the cool-down.
  const JobConfig cfg = test_job::make("topk:k=30", 2, 600);
  Pair p(cfg);
  p.follow();
  p.primary.tick(cfg.heartbeat * cfg.dead_after - Millis(10));
  p.primary.now += Millis(20);  // past dead_after heartbeats when the Init comes
  std::vector<FakeWorker> ws;
  for (uint32_t r = 0; r < cfg.world; ++r) ws.emplace_back(r, cfg);
  ws[0].join(p.primary, test::initial_params(600, 5));  // its Init: the backup's first Sync
  p.primary.tick(Millis(1));
  EXPECT_TRUE(p.primary.primary.has_backup()) << "lost the moment it was first asked";
  p.pump();
  EXPECT_TRUE(p.backup.synced());
  ws[1].join(p.primary, {});
  p.pump();
  for (auto& w : ws) EXPECT_TRUE(w.take_model(p.primary)) << "rank " << w.rank;
  p.expect_same();
}

TEST(Replication, ABackupLostBeforeItAcknowledgedKeepsTheNextOutForACoolDown) {
  // A peer that follows and never acknowledges holds one round until the deadline; the next
  // peer to follow waits out a cool-down that doubles with each such loss.
  const JobConfig cfg = test_job::make("topk:k=30", 2, 600);
  Pair p(cfg);
  std::vector<FakeWorker> ws = p.join(test::initial_params(600, 5));
  const auto syncs = [&](const PeerId& peer) { return syncs_to(p.primary, peer); };
  const Frame hb = env(Type::Heartbeat, cfg.job, 0, 0);
  Millis held{0};
  for (int strike = 1; strike <= 2; ++strike) {
    const PeerId fake = "fake" + std::to_string(strike);
    p.primary.deliver(fake, p.backup.follow());
    ASSERT_EQ(syncs(fake), 1u) << "strike " << strike;
    const uint64_t t = p.primary.engine.round();
    std::vector<std::vector<float>> grads;
    (void)push_and_settle(p.primary, ws, encode_all(ws, grads, t));
    ASSERT_TRUE(p.primary.primary.holding());
    for (held = Millis(0); p.primary.primary.has_backup(); held += cfg.heartbeat) {
      p.primary.deliver(fake, {hb});  // alive, never acknowledging
      p.primary.tick(cfg.heartbeat);
    }
    EXPECT_LE(held, cfg.deadline + cfg.heartbeat);
    for (auto& w : ws) ASSERT_EQ(w.settle(p.primary), Type::Update);
    // Another peer within the cool-down: nothing sent, nothing held.
    const Millis cool = std::max(cfg.deadline, cfg.heartbeat * cfg.dead_after) * (1 << strike);
    p.primary.tick(cool - cfg.heartbeat);
    p.primary.deliver("early", p.backup.follow());
    EXPECT_EQ(syncs("early"), 0u) << "strike " << strike;
    EXPECT_FALSE(p.primary.primary.has_backup());
    p.primary.tick(cfg.heartbeat);
  }
  // Past the cool-down a backup that acknowledges is taken, and clears the strikes.
  p.primary.deliver(Pair::kLink, p.backup.follow());
  p.pump();
  EXPECT_TRUE(p.backup.synced());
  EXPECT_TRUE(p.primary.primary.has_backup());
  p.expect_same();
}

}  // namespace
}  // namespace sketchsgd::ps
