// The worker's round logic (Session) against the server's (Engine), in-process with a fake clock
// and no sockets: registration, rounds bit for bit against the in-process reference, transient
// refusals retried on a timer, reconnects, resynchronisation after a server restart, the job's end
// as a typed error, traffic of another session or rank dropped; asynchronous jobs (pushes applied
// as they arrive, in any order, ages, refusals, replies lost and sent again).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <random>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include <sketchsgd/server/engine.hpp>
#include <sketchsgd/worker/session.hpp>
#include "support/helpers.hpp"
#include "support/ps_job.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

/// The server's Engine and what it sent to each peer; time moves only when a test says so.
struct Wire {
  explicit Wire(const JobConfig& cfg) : engine(cfg, quiet()) {}
  static Hooks quiet() {
    Hooks h;
    h.log = [](const std::string&) {};
    return h;
  }
  /// Hands what a worker queued to the server.
  void send(const PeerId& peer, Session::Outbox& out) {
    for (auto& f : out) {
      std::vector<Outgoing> o;
      engine.handle(peer, f, now, o);
      route(o);
    }
    out.clear();
  }
  void route(std::vector<Outgoing>& o) {
    for (auto& m : o) inbox[m.peer].push_back(std::move(m.frames));
  }
  void tick(Millis dt) {
    now += dt;
    std::vector<Outgoing> o;
    engine.tick(now, o);
    route(o);
  }

  Engine engine;
  Clock::time_point now = Clock::time_point{} + std::chrono::hours(1);
  std::map<PeerId, std::deque<Frames>> inbox;
};

JobConfig job(const std::string& spec, uint32_t world, uint64_t dim) {
  return test_job::make(spec, world, dim);
}

ClientOptions options(uint32_t rank, uint32_t world) {
  ClientOptions o;
  o.job = test_job::kJob;
  o.rank = rank;
  o.world = world;
  o.log = [](const std::string&) {};
  return o;
}

struct Worker {
  Worker(const JobConfig& cfg, uint32_t rank, std::span<const float> init, std::string p = "")
      : Worker(cfg, options(rank, cfg.world), init, std::move(p)) {}
  Worker(const JobConfig& cfg, ClientOptions o, std::span<const float> init, std::string p = "")
      : peer(p.empty() ? "w" + std::to_string(o.rank) : std::move(p)),
        codec(make_compressor(cfg.spec, cfg.dim)),
        session(std::move(o), *codec, init) {}

  void hello(Wire& w) {
    Session::Outbox out;
    session.hello(out);
    w.send(peer, out);
  }
  /// Hands every queued server message to the session, until it is synchronised.
  void registration(Wire& w) {
    auto& q = w.inbox[peer];
    while (!q.empty()) {
      const Frames f = std::move(q.front());
      q.pop_front();
      Session::Outbox out;
      session.handle_registration(f, w.now, out);
      w.send(peer, out);
    }
  }
  /// Hands every queued server message to the session; true when one made the step return.
  bool pump(Wire& w, StepResult& res) {
    auto& q = w.inbox[peer];
    bool stop = false;
    while (!q.empty()) {
      const Frames f = std::move(q.front());
      q.pop_front();
      Session::Outbox out;
      stop |= session.handle(f, w.now, out, res);
      w.send(peer, out);
    }
    return stop;
  }
  void push(Wire& w, uint64_t seed, StepResult& res) {
    const auto g =
        test::synthetic_grad(session.params(), session.options().rank, session.next_push(), seed);
    Session::Outbox out;
    session.push(g, out, res);
    w.send(peer, out);
  }

  PeerId peer;
  std::unique_ptr<Compressor> codec;
  Session session;
};

/// W workers registered with rank 0's initial model (others register first: their pulls wait).
std::vector<std::unique_ptr<Worker>> join(Wire& w, const JobConfig& cfg,
                                          const std::vector<float>& init) {
  std::vector<std::unique_ptr<Worker>> ws;
  for (uint32_t r = 0; r < cfg.world; ++r)
    ws.push_back(std::make_unique<Worker>(
        cfg, r, r == 0 ? std::span<const float>(init) : std::span<const float>()));
  for (uint32_t r = cfg.world; r-- > 0;) ws[r]->hello(w);
  for (int pass = 0; pass < 3; ++pass)
    for (auto& x : ws) x->registration(w);
  for (auto& x : ws) EXPECT_TRUE(x->session.synced()) << x->peer;
  return ws;
}

/// One round: every worker pushes and the messages flow until every session has its outcome.
void round(Wire& w, std::vector<std::unique_ptr<Worker>>& ws, uint64_t seed) {
  std::vector<StepResult> res(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) ws[i]->push(w, seed, res[i]);
  for (int pass = 0; pass < 3; ++pass)
    for (size_t i = 0; i < ws.size(); ++i) ws[i]->pump(w, res[i]);
  for (size_t i = 0; i < ws.size(); ++i)
    ASSERT_EQ(res[i].outcome, StepResult::Outcome::Updated) << "rank " << i;
}

class SessionCodecs : public ::testing::TestWithParam<std::string> {};

TEST_P(SessionCodecs, TrainBitForBitLikeTheInProcessReference) {
  const JobConfig cfg = job(GetParam(), 3, 2000);
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 5);
  auto ws = join(w, cfg, init);
  test::Job ref(w.engine.config().spec, cfg.dim, cfg.world);
  std::vector<float> expect = init;
  for (uint64_t t = 0; t < 4; ++t) {
    std::vector<std::vector<float>> grads;
    for (auto& x : ws)
      grads.push_back(test::synthetic_grad(x->session.params(), x->session.options().rank, t, 11));
    round(w, ws, 11);
    const auto steps = ref.round(grads, t);
    kernels::cpu::axpy(expect.data(), steps[0].data(), cfg.dim, -cfg.lr);
  }
  for (auto& x : ws) {
    EXPECT_EQ(x->session.round(), 4u);
    EXPECT_EQ(std::memcmp(x->session.params().data(), expect.data(), cfg.dim * 4), 0) << x->peer;
  }
  EXPECT_EQ(std::memcmp(w.engine.model().data(), expect.data(), cfg.dim * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Codecs, SessionCodecs,
                         ::testing::ValuesIn(example_specs(Layout::parse("40x45+200"))),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

ClientOptions client(uint32_t id, const JobConfig& cfg, uint64_t round) {
  ClientOptions o = options(id, cfg.world);
  o.population = cfg.population();
  o.join_round = round;
  return o;
}

/// A round's sampled clients, made and registering (every one holds the initial model; the first
/// one in sends it).
std::vector<std::unique_ptr<Worker>> check_in(Wire& w, const JobConfig& cfg, uint64_t t,
                                              std::span<const float> init) {
  std::vector<std::unique_ptr<Worker>> cs;
  for (uint32_t id : sample_clients(cfg.population(), cfg.world, cfg.sample_seed(), t))
    cs.push_back(std::make_unique<Worker>(cfg, client(id, cfg, t), init,
                                          "c" + std::to_string(id) + "r" + std::to_string(t)));
  for (auto& c : cs) c->hello(w);
  for (int pass = 0; pass < 3; ++pass)
    for (auto& c : cs) c->registration(w);
  return cs;
}

class FederatedSessions : public ::testing::TestWithParam<bool> {};

// ahead: each round's clients check in while the round before runs, and take their slots and the
// model when it ends; the job trains the same model bit for bit.
TEST_P(FederatedSessions, ClientsTakeTheirSlotsTrainAndLeaveWithTheirRound) {
  const bool ahead = GetParam();
  JobConfig cfg = job("sketch:k=30,cols=300,fetch=1", 3, 600);
  cfg.mode = FederatedMode{.population = 40, .sample_seed = 4};
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 5);
  test::Job ref(w.engine.config().spec, cfg.dim, cfg.world);
  std::vector<float> expect = init;
  auto cs = check_in(w, cfg, 0, init);
  for (uint64_t t = 0; t < 4; ++t) {
    const auto sample = sample_clients(cfg.population(), cfg.world, cfg.sample_seed(), t);
    std::vector<std::unique_ptr<Worker>> next;
    if (ahead) {
      next = check_in(w, cfg, t + 1, init);
      for (auto& c : next) {
        EXPECT_TRUE(c->session.registered()) << c->peer << " not welcomed ahead of its round";
        EXPECT_FALSE(c->session.synced()) << c->peer << " has a model before its round opened";
      }
      EXPECT_EQ(w.engine.live_workers(), cfg.world) << "check-ins took this round's slots";
    }
    std::vector<std::vector<float>> grads;
    for (uint32_t slot = 0; slot < cs.size(); ++slot) {
      ASSERT_TRUE(cs[slot]->session.synced()) << "client " << sample[slot];
      EXPECT_EQ(cs[slot]->session.rank(), slot) << "client " << sample[slot];
      EXPECT_EQ(cs[slot]->session.round(), t);
      grads.push_back(test::synthetic_grad(cs[slot]->session.params(), sample[slot], t, 11));
    }
    round(w, cs, 11);
    for (auto& r : ref.workers) r = make_compressor(w.engine.config().spec, cfg.dim);  // stateless
    const auto steps = ref.round(grads, t);
    kernels::cpu::axpy(expect.data(), steps[0].data(), cfg.dim, -cfg.lr);
    for (auto& c : cs)
      EXPECT_EQ(std::memcmp(c->session.params().data(), expect.data(), cfg.dim * 4), 0) << c->peer;
    if (ahead) {
      for (auto& c : next) c->registration(w);  // the model of round t + 1, unasked
      EXPECT_EQ(w.engine.live_workers(), cfg.world);
      cs = std::move(next);
    } else {
      EXPECT_EQ(w.engine.live_workers(), 0u);
      if (t < 3) cs = check_in(w, cfg, t + 1, init);
    }
  }
  EXPECT_EQ(std::memcmp(w.engine.model().data(), expect.data(), cfg.dim * 4), 0);
  EXPECT_EQ(w.engine.rejected(), 0u);
}

INSTANTIATE_TEST_SUITE_P(CheckIn, FederatedSessions, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "Ahead" : "WithTheirRound"; });

TEST(Session, AFederatedClientCheckedInAheadCatchesUpThroughAnAbortedRound) {
  JobConfig cfg = job("topk:k=30", 3, 600);
  cfg.mode = FederatedMode{{Policy::Abort}, 40, 4};
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 5);
  auto cs = check_in(w, cfg, 0, init);
  auto next = check_in(w, cfg, 1, {});
  std::vector<StepResult> res(cs.size());
  cs[0]->push(w, 11, res[0]);  // the others never push: the round is aborted at its deadline
  w.tick(cfg.deadline + 1ms);
  cs[0]->pump(w, res[0]);
  EXPECT_EQ(res[0].outcome, StepResult::Outcome::Aborted);
  for (auto& c : next) {
    EXPECT_FALSE(c->session.synced());
    c->registration(w);
    ASSERT_TRUE(c->session.synced()) << c->peer << " did not catch up through the abort";
    EXPECT_EQ(c->session.round(), 1u);
    EXPECT_EQ(c->session.next_push(), 1u);
    EXPECT_EQ(std::memcmp(c->session.params().data(), init.data(), cfg.dim * 4), 0);
  }
}

/// Round 0 run by its sampled clients; then round 1's clients, registered, push to a server that
/// dies before it reads them. Round 1's clients, and the server's checkpoint of round 0.
struct Lost {
  std::vector<std::unique_ptr<Worker>> clients;
  Checkpoint at0;
};
Lost lost_pushes_of_round_1(Wire& w, const JobConfig& cfg, std::span<const float> init) {
  auto first = check_in(w, cfg, 0, init);
  Checkpoint at0 = w.engine.checkpoint();
  std::vector<StepResult> res(first.size());
  for (size_t i = 0; i < first.size(); ++i) first[i]->push(w, 11, res[i]);
  for (int pass = 0; pass < 3; ++pass)
    for (size_t i = 0; i < first.size(); ++i) first[i]->pump(w, res[i]);
  EXPECT_EQ(w.engine.round(), 1u);
  auto next = check_in(w, cfg, 1, {});
  for (auto& c : next) {
    EXPECT_TRUE(c->session.synced()) << c->peer;
    StepResult r;
    Session::Outbox lost;
    c->session.push(test::synthetic_grad(c->session.params(), c->session.options().rank, 1, 11),
                    lost, r);
  }
  return {std::move(next), std::move(at0)};
}

/// The client's next push (of round 1) is what a new client's codec makes of the same gradient.
void expect_push_as_new(Worker& c, const JobConfig& cfg) {
  const auto g = test::synthetic_grad(c.session.params(), c.session.options().rank, 1, 11);
  Session::Outbox out;
  StepResult r;
  c.session.push(g, out, r);
  ASSERT_EQ(out.size(), 1u);
  const auto fresh = make_compressor(cfg.spec, cfg.dim)->encode(g, 1, c.session.rank());
  EXPECT_TRUE(std::ranges::equal(out[0][1].bytes(), fresh.bytes()))
      << c.peer << " did not push as a new client would";
}

// A server killed after round 0 ended comes back from its checkpoint of round 0; the clients of
// round 1 had pushed to it. Round 0 is run again (its clients are gone: aborted at its deadline),
// and each client of round 1 pushes once more, from the model it is given: as a client new to the
// job would, not carrying its first push's error feedback on top of the gradient (it would count
// the residual of a push the server never applied).
TEST(Session, AFederatedClientWhosePushWasLostPushesAgainAsANewClientWould) {
  JobConfig cfg = job("topk:k=30", 3, 600);
  cfg.mode = FederatedMode{{Policy::Quorum, 2}, 40, 4};
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 5);
  auto [next, at0] = lost_pushes_of_round_1(w, cfg, init);
  Wire back(cfg);
  back.engine.restore(at0);
  for (auto& c : next) c->hello(back);  // a new socket: what it had queued is gone
  for (int pass = 0; pass < 3; ++pass)
    for (auto& c : next) {
      StepResult r;
      c->pump(back, r);
    }
  back.tick(cfg.deadline / 2);
  back.tick(cfg.deadline);  // round 0 aborted: nobody came for it
  for (auto& c : next) {
    StepResult r;
    c->pump(back, r);
    ASSERT_EQ(c->session.round(), 1u) << c->peer;
    ASSERT_EQ(c->session.next_push(), 1u) << c->peer;
    expect_push_as_new(*c, cfg);
  }
}

// The server comes back at the client's round but with another model (it ran the round before
// again, with other clients' pushes): the client's pending push, computed on the model it held, is
// stale; it is dropped and computed again on the model it is given, as a new client's would be.
TEST(Session, AFederatedClientGivenAnotherModelOfItsRoundPushesAgainFromIt) {
  JobConfig cfg = job("topk:k=30", 3, 600);
  cfg.mode = FederatedMode{.population = 40, .sample_seed = 4};
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 5);
  auto next = lost_pushes_of_round_1(w, cfg, init).clients;
  Checkpoint other = w.engine.checkpoint();
  for (auto& v : other.params) v += 0.25f;
  Wire back(cfg);
  back.engine.restore(other);
  for (auto& c : next) c->hello(back);
  for (auto& c : next) {
    StepResult r;
    for (int pass = 0; pass < 3; ++pass) c->pump(back, r);
    EXPECT_EQ(r.outcome, StepResult::Outcome::Resynced) << c->peer;
    ASSERT_EQ(c->session.next_push(), 1u) << c->peer;
    ASSERT_EQ(std::memcmp(c->session.params().data(), other.params.data(), cfg.dim * 4), 0);
    expect_push_as_new(*c, cfg);
  }
  EXPECT_EQ(back.engine.round(), 1u) << "a stale push was merged";
}

TEST(Session, FederatedClientsOutsideTheSampleOrTwoRoundsEarlyAreRefused) {
  JobConfig cfg = job("sketch:k=30,cols=300,fetch=1", 3, 600);
  cfg.mode = FederatedMode{.population = 40, .sample_seed = 4};
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 5);
  auto cs = check_in(w, cfg, 0, init);
  round(w, cs, 11);
  // At round 1: a client that was not sampled is refused for good; one two rounds early waits
  // its turn (the server takes check-ins for the next round only).
  const auto now = sample_clients(cfg.population(), cfg.world, cfg.sample_seed(), 1);
  uint32_t outsider = 0;
  while (std::find(now.begin(), now.end(), outsider) != now.end()) ++outsider;
  Worker out(cfg, client(outsider, cfg, 1), {}, "outsider");
  out.hello(w);
  EXPECT_THROW(out.registration(w), ConfigMismatch);
  Worker early(cfg,
               client(sample_clients(cfg.population(), cfg.world, cfg.sample_seed(), 3)[0], cfg, 3),
               {}, "early");
  early.hello(w);
  early.registration(w);
  EXPECT_FALSE(early.session.registered());
  EXPECT_TRUE(early.session.next_tick()) << "no Hello again for a round not open yet";
  EXPECT_THROW(Worker(cfg, client(cfg.population(), cfg, 0), {}), InvalidArgument);
}

TEST(Session, TransientRefusalRetriesHelloWhenItsTimerIsDue) {
  const JobConfig cfg = job("topk:k=10", 2, 300);
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 2);
  auto ws = join(w, cfg, init);
  // A second process claims rank 1 while the first is alive: refused for now.
  Worker again(cfg, 1, {}, "again");
  again.hello(w);
  again.registration(w);
  EXPECT_FALSE(again.session.registered());
  const auto due = again.session.next_tick();
  ASSERT_TRUE(due);
  // Before a Welcome the session knows only its own heartbeat option (1 s): min(1 s, 500 ms).
  EXPECT_EQ(*due, w.now + 500ms) << "retry after min(heartbeat, 500 ms)";
  Session::Outbox out;
  again.session.tick(w.now + 450ms, out);
  EXPECT_TRUE(out.empty()) << "Hello again before its time";
  // The first rank 1 falls silent; rank 0 keeps its heartbeats up.
  for (int i = 0; i < 5; ++i) {
    Session::Outbox hb = {{Frame::own(
        encode(Envelope{Type::Heartbeat, test_job::kJob, 0, 0, 0, ws[0]->session.session()}))}};
    w.send(ws[0]->peer, hb);
    w.tick(100ms);
  }
  again.session.tick(w.now, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(again.session.next_tick());
  w.send(again.peer, out);
  again.registration(w);
  EXPECT_TRUE(again.session.synced());
  EXPECT_EQ(std::memcmp(again.session.params().data(), w.engine.model().data(), 1200), 0);
}

TEST(Session, AServerOfAnEarlierEpochSendsTheWorkerOnToItsNextReplica) {
  // Registered with a backup that took over (epoch 1), the worker comes to a server of epoch 0
  // (the old primary, or a forged one): refused, marked elsewhere, once; the server goes on.
  const JobConfig cfg = job("topk:k=10", 2, 300);
  Wire later(cfg), older(cfg);
  later.engine.set_epoch(1);
  const auto init = test::initial_params(cfg.dim, 2);
  auto ws = join(later, cfg, init);
  Worker& w = *ws[1];
  EXPECT_FALSE(w.session.take_elsewhere());
  w.hello(older);
  w.registration(older);
  EXPECT_FALSE(w.session.registered());
  EXPECT_TRUE(w.session.take_elsewhere());
  EXPECT_FALSE(w.session.take_elsewhere()) << "once per refusal";
  EXPECT_EQ(older.engine.rejected(), 1u);
  // Back at the later server it registers as before, nothing sent on.
  w.hello(later);
  w.registration(later);
  EXPECT_TRUE(w.session.synced());
  EXPECT_FALSE(w.session.take_elsewhere());
}

TEST(Session, AWorkerAnswersABackupsProbeOnlyWhileLookingThenKeepsAwayFromTheOldEpoch) {
  const JobConfig cfg = job("topk:k=10", 2, 300);
  Wire primary(cfg);
  const auto init = test::initial_params(cfg.dim, 2);
  auto ws = join(primary, cfg, init);
  Worker& w = *ws[1];
  const auto probe = [&](uint64_t nonce, uint8_t release = 0, uint64_t epoch = 1) {
    return Frames{Frame::own(encode(Envelope{Type::Probe, cfg.job, 0, 1, 0, nonce})),
                  Frame::own(encode(ProbeInfo{epoch, release}))};
  };
  Session::Outbox out;
  StepResult res;
  // Registered: a probe (a Hello of before, answered late) is not answered.
  w.session.handle(probe(77), primary.now, out, res);
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(w.session.promised());
  // Looking again (its link registers anew), the worker answers with the probe's nonce and its
  // Hello's fields; a Hello it sent before the probe is welcomed by the old epoch meanwhile.
  w.hello(primary);
  ASSERT_EQ(primary.inbox[w.peer].size(), 1u);
  EXPECT_FALSE(w.session.registered());
  Bytes odd = encode(ProbeInfo{1, 0});
  odd.back() = 2;
  for (const Frames& bad : {Frames{probe(5)[0], Frame::own(std::move(odd))},
                            Frames{probe(5)[0], Frame::own(Bytes(3, 1))}}) {
    w.session.handle_registration(bad, primary.now, out);
    EXPECT_TRUE(out.empty()) << "a bad probe is dropped";
  }
  EXPECT_FALSE(w.session.promised());
  w.session.handle_registration(probe(77), primary.now, out);
  ASSERT_EQ(out.size(), 1u);
  const Envelope e = decode_envelope(out[0][0].bytes(), out[0].size() - 1);
  EXPECT_EQ(e.type, Type::Present);
  EXPECT_EQ(e.session, 77u);
  EXPECT_EQ(e.rank, 1u);
  EXPECT_EQ(e.round, w.session.round());
  const HelloInfo h = decode_hello(out[0][1].bytes());
  EXPECT_EQ(h.epoch, 1u) << "the epoch it promised";
  EXPECT_EQ(h.dim, cfg.dim);
  EXPECT_EQ(w.session.promised(), 1u);
  out.clear();
  // The Welcome of epoch 0 that crossed the probe is not taken: on to the next replica.
  w.registration(primary);
  EXPECT_FALSE(w.session.registered());
  EXPECT_TRUE(w.session.take_elsewhere());
  // Its Hellos claim the new epoch, however long it waits (the backup may have taken over
  // counting its answer), so the old epoch sends it on.
  primary.tick(3600s);
  w.session.tick(primary.now, out);
  w.hello(primary);
  w.registration(primary);
  EXPECT_FALSE(w.session.registered());
  EXPECT_TRUE(w.session.take_elsewhere());
  EXPECT_GE(primary.engine.rejected(), 1u);
  // A release of an older epoch than promised frees nothing; one of the promised epoch does,
  // and sends the worker back to the primary, which serves it again.
  w.session.handle_registration(probe(0, 1, 0), primary.now, out);
  EXPECT_EQ(w.session.promised(), 1u);
  EXPECT_FALSE(w.session.take_elsewhere());
  w.session.handle_registration(probe(0, 1, 1), primary.now, out);
  EXPECT_TRUE(out.empty()) << "a release is not answered";
  EXPECT_FALSE(w.session.promised());
  EXPECT_TRUE(w.session.take_elsewhere());
  w.hello(primary);
  w.registration(primary);
  EXPECT_TRUE(w.session.synced());
  EXPECT_FALSE(w.session.take_elsewhere());
}

TEST(Session, APushPastTheLastRoundRaisesJobFinishedAtOnce) {
  JobConfig cfg = job("dense", 2, 100);
  cfg.max_rounds = 1;
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 3));
  round(w, ws, 3);
  StepResult res;
  ws[0]->push(w, 3, res);
  try {
    ws[0]->pump(w, res);
    FAIL() << "no JobFinished";
  } catch (const JobFinished& e) {
    EXPECT_EQ(e.round(), 1u);
    EXPECT_NE(std::string(e.what()).find("finished at round 1"), std::string::npos) << e.what();
  }
}

TEST(Session, ServerRestartFromAnOlderCheckpointResynchronises) {
  const JobConfig cfg = job("topk:k=10", 2, 300);
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 4));
  round(w, ws, 4);
  const Checkpoint at1 = w.engine.checkpoint();
  round(w, ws, 4);
  round(w, ws, 4);
  // The server dies and comes back from the round-1 checkpoint; it knows no connection.
  Wire back(cfg);
  back.engine.restore(at1);
  std::vector<StepResult> res(2);
  for (size_t i = 0; i < 2; ++i) ws[i]->push(back, 4, res[i]);  // refused: not registered
  bool resynced[2] = {false, false};
  for (int pass = 0; pass < 4; ++pass)
    for (size_t i = 0; i < 2; ++i) resynced[i] |= ws[i]->pump(back, res[i]);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(resynced[i]) << "rank " << i;
    EXPECT_EQ(res[i].outcome, StepResult::Outcome::Resynced);
    EXPECT_EQ(ws[i]->session.round(), 1u);
    EXPECT_EQ(ws[i]->session.next_push(), 1u);
    EXPECT_EQ(std::memcmp(ws[i]->session.params().data(), at1.params.data(), 1200), 0);
  }
  round(back, ws, 4);  // and training goes on from there
  EXPECT_EQ(back.engine.round(), 2u);
}

/// The server-side optimizers: Nesterov momentum, Adagrad, Adam (with a visible ε).
std::vector<OuterOptions> optimizers() {
  OuterOptions adagrad, adam;
  adagrad.kind = OuterKind::Adagrad;
  adagrad.eps = 1e-3f;
  adam.kind = OuterKind::Adam;
  adam.beta1 = 0.8f;
  return {OuterOptions{0.9f, true}, adagrad, adam};
}

TEST(Session, TheServersOptimizerRunsOnEveryWorkerAsOnTheServer) {
  // Nesterov momentum, Adagrad or Adam on the server: the Welcome tells the workers, each applies
  // the same step to its copy, and every copy equals the server's model bit for bit.
  for (const char* spec : {"dense", "topk:k=20", "sketch:k=30,cols=300,p2=2"})
    for (const OuterOptions& opt : optimizers()) {
      SCOPED_TRACE(std::string(to_string(opt.kind)));
      JobConfig cfg = job(spec, 3, 1500);
      cfg.outer = opt;
      Wire w(cfg);
      auto ws = join(w, cfg, test::initial_params(cfg.dim, 6));
      for (int t = 0; t < 4; ++t) round(w, ws, 6);
      for (auto& x : ws)
        EXPECT_EQ(std::memcmp(x->session.params().data(), w.engine.model().data(), cfg.dim * 4), 0)
            << spec << " " << x->peer;
      // Without the momentum the same rounds land elsewhere: the step is not the plain one.
      JobConfig plain = job(spec, 3, 1500);
      Wire p(plain);
      auto ps = join(p, plain, test::initial_params(plain.dim, 6));
      for (int t = 0; t < 4; ++t) round(p, ps, 6);
      EXPECT_NE(std::memcmp(p.engine.model().data(), w.engine.model().data(), cfg.dim * 4), 0);
    }
}

TEST(Session, AResyncCarriesTheOptimizersStateWithTheModel) {
  // The server restarts from a checkpoint of round 1 (model, optimizer state, Adam's step
  // count); the workers, two rounds further, resynchronise and the next round keeps every copy
  // equal to the server's.
  for (const OuterOptions& opt : optimizers()) {
    SCOPED_TRACE(std::string(to_string(opt.kind)));
    JobConfig cfg = job("dense", 2, 400);
    cfg.outer = opt;
    Wire w(cfg);
    auto ws = join(w, cfg, test::initial_params(cfg.dim, 8));
    round(w, ws, 8);
    const Checkpoint at1 = w.engine.checkpoint();
    ASSERT_EQ(at1.outer.size(), cfg.dim * opt.buffers());
    EXPECT_EQ(at1.outer_steps, opt.kind == OuterKind::Adam ? 1u : 0u);
    round(w, ws, 8);
    round(w, ws, 8);
    Wire back(cfg);
    back.engine.restore(at1);
    std::vector<StepResult> res(2);
    for (size_t i = 0; i < 2; ++i) ws[i]->push(back, 8, res[i]);
    for (int pass = 0; pass < 4; ++pass)
      for (size_t i = 0; i < 2; ++i) ws[i]->pump(back, res[i]);
    for (size_t i = 0; i < 2; ++i) ASSERT_EQ(res[i].outcome, StepResult::Outcome::Resynced);
    round(back, ws, 8);
    for (auto& x : ws)
      EXPECT_EQ(std::memcmp(x->session.params().data(), back.engine.model().data(), cfg.dim * 4), 0)
          << x->peer;
    // A checkpoint with optimizer state does not restore into a job of plain SGD.
    Wire plain(job("dense", 2, 400));
    EXPECT_THROW(plain.engine.restore(at1), ConfigMismatch);
  }
}

TEST(Session, AWorkerThatLostItsUpdateAppliesItWhenItRegistersAgain) {
  // Rank 1's Update is lost with its connection (a server that died while sending it, whose
  // backup holds the round). Registering again, it sends its pending push before its Pull: the
  // server answers with the lost Update, which rank 1 applies (its codec's state included),
  // rather than jumping to the model. The job then goes on exactly as one that lost nothing.
  const JobConfig cfg = job("sketch:k=30,cols=300,p2=2", 2, 600);
  const auto init = test::initial_params(cfg.dim, 4);
  Wire w(cfg), clean(cfg);
  auto ws = join(w, cfg, init), cs = join(clean, cfg, init);
  round(w, ws, 4);
  round(clean, cs, 4);
  std::vector<StepResult> res(2);
  for (size_t i = 0; i < 2; ++i) ws[i]->push(w, 4, res[i]);
  for (int pass = 0; pass < 3; ++pass) {
    ws[0]->pump(w, res[0]);
    auto& q = w.inbox[ws[1]->peer];
    while (!q.empty()) {
      const Frames f = std::move(q.front());
      q.pop_front();
      if (decode_envelope(f[0].bytes(), f.size() - 1).type == Type::Update) continue;  // lost
      Session::Outbox out;
      ws[1]->session.handle(f, w.now, out, res[1]);
      w.send(ws[1]->peer, out);
    }
  }
  ASSERT_EQ(res[0].outcome, StepResult::Outcome::Updated);
  ASSERT_EQ(ws[1]->session.round(), 1u);
  for (int i = 0; i < 4; ++i) w.tick(100ms);  // its old connection counts as dead
  ws[1]->peer = "w1-again";
  ws[1]->hello(w);
  for (int pass = 0; pass < 3; ++pass) EXPECT_FALSE(ws[1]->pump(w, res[1])) << "resynchronised";
  EXPECT_EQ(res[1].outcome, StepResult::Outcome::Updated);
  EXPECT_EQ(ws[1]->session.round(), 2u);
  round(clean, cs, 4);
  for (int t = 0; t < 3; ++t) {
    round(w, ws, 4);
    round(clean, cs, 4);
  }
  EXPECT_EQ(std::memcmp(w.engine.model().data(), clean.engine.model().data(), cfg.dim * 4), 0);
  for (auto& x : ws)
    EXPECT_EQ(std::memcmp(x->session.params().data(), w.engine.model().data(), cfg.dim * 4), 0)
        << x->peer;
}

TEST(Session, PendingPushesGoOutAgainAfterAReconnect) {
  const JobConfig cfg = job("topk:k=10", 2, 300);
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 6));
  // Rank 1's push is lost with its old connection.
  StepResult r0, r1;
  ws[0]->push(w, 6, r0);
  const auto g = test::synthetic_grad(ws[1]->session.params(), 1, 0, 6);
  Session::Outbox lost;
  ws[1]->session.push(g, lost, r1);
  // The link noticed a silent server, made a new socket (a new peer id) and says so.
  ws[1]->peer = "w1-again";
  for (int i = 0; i < 4; ++i) w.tick(100ms);  // the old connection counts as dead
  ws[1]->hello(w);
  for (int pass = 0; pass < 3; ++pass) {
    ws[1]->pump(w, r1);
    ws[0]->pump(w, r0);
  }
  EXPECT_EQ(r0.outcome, StepResult::Outcome::Updated);
  EXPECT_EQ(r1.outcome, StepResult::Outcome::Updated);
  EXPECT_EQ(w.engine.round(), 1u);
  EXPECT_EQ(std::memcmp(ws[0]->session.params().data(), ws[1]->session.params().data(), 1200), 0);
}

TEST(Session, MessagesOfAnotherSessionRankOrJobAreDropped) {
  const JobConfig cfg = job("dense", 1, 50);
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 7));
  Session& s = ws[0]->session;
  StepResult res;
  ws[0]->push(w, 7, res);
  ASSERT_EQ(w.inbox["w0"].size(), 1u);
  const Frames update = w.inbox["w0"].front();
  w.inbox["w0"].clear();
  const Envelope e = decode_envelope(update[0].bytes(), update.size() - 1);
  ASSERT_EQ(e.type, Type::Update);
  auto forged = [&](uint64_t job, uint32_t rank, uint64_t session) {
    Frames f = update;
    f[0] = Frame::own(encode(Envelope{Type::Update, job, e.round, rank, 0, session}));
    return f;
  };
  Session::Outbox out;
  const uint64_t j = test_job::kJob;
  for (const Frames& f :
       {forged(j, 0, e.session + 1), forged(j, 1, e.session), forged(j + 1, 0, e.session), Frames{},
        Frames{Frame::own(Bytes(40, 0))}}) {
    EXPECT_FALSE(s.handle(f, w.now, out, res));
    EXPECT_EQ(s.round(), 0u) << "applied a message that is not this session's";
  }
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(s.handle(update, w.now, out, res));
  EXPECT_EQ(s.round(), 1u);
  EXPECT_EQ(std::memcmp(s.params().data(), w.engine.model().data(), 200), 0);
}

TEST(Session, BadOptionsAndInitialParametersAreRefused) {
  const auto codec = make_compressor("dense", 10);
  const std::vector<float> ten(10, 0.5f);
  EXPECT_THROW(Session(options(2, 2), *codec, ten), InvalidArgument);
  EXPECT_THROW(Session(options(0, 1), *codec, std::vector<float>(9)), InvalidArgument);
  std::vector<float> nan = ten;
  nan[3] = std::nanf("");
  EXPECT_THROW(Session(options(0, 1), *codec, nan), NonFiniteError);
  ClientOptions zero = options(0, 1);
  zero.timeout = 0ms;
  EXPECT_THROW(Session(zero, *codec, ten), InvalidArgument);
  EXPECT_NO_THROW(Session(options(1, 2), *codec, {}));  // only rank 0 brings a model
}

// ---- asynchronous jobs (Downpour): every push applied as it arrives, answered to its pusher

JobConfig async_job(const std::string& spec, uint32_t world, uint64_t dim) {
  JobConfig c = job(spec, world, dim);
  c.mode = AsyncMode{};
  return c;
}

/// One step of one worker: its push, then the server's replies (its update, then the model it
/// fetches with it) until it is settled.
StepResult async_step(Wire& w, Worker& x, uint64_t seed) {
  StepResult res;
  x.push(w, seed, res);
  x.pump(w, res);
  EXPECT_TRUE(x.session.settled()) << x.peer;
  return res;
}

bool same(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

struct AsyncRun {
  std::vector<float> model;
  std::vector<uint64_t> ages;
  std::vector<float> lrs;
};

/// The pushes in this order of ranks (each worker fetching with every push).
AsyncRun run_async(const JobConfig& cfg, const std::vector<uint32_t>& order) {
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 8));
  AsyncRun out;
  for (uint32_t r : order) {
    const StepResult res = async_step(w, *ws[r], 21);
    EXPECT_EQ(res.outcome, StepResult::Outcome::Updated) << "rank " << r;
    out.ages.push_back(res.age);
    out.lrs.push_back(res.lr);
    // Its fetch went right behind its push: it holds the server's model, its own update in.
    EXPECT_TRUE(same(ws[r]->session.params(), w.engine.model())) << "rank " << r;
  }
  EXPECT_EQ(w.engine.round(), order.size());
  out.model.assign(w.engine.model().begin(), w.engine.model().end());
  return out;
}

std::vector<std::string> one_round_specs() {
  std::vector<std::string> out;
  for (const auto& s : example_specs(Layout::parse("40x45+200")))
    if (!make_compressor(s, 2000)->two_rounds()) out.push_back(s);
  return out;
}

class AsyncSessions : public ::testing::TestWithParam<std::string> {};

TEST_P(AsyncSessions, EachPushIsAppliedAtOnceWithItsAgeAndTheSameOrderReplaysBitForBit) {
  const JobConfig cfg = async_job(GetParam(), 3, 2000);
  std::vector<std::vector<float>> models;
  for (uint64_t seed : {1, 2}) {
    std::vector<uint32_t> order;
    for (uint32_t r = 0; r < 3; ++r) order.insert(order.end(), 3, r);
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    const AsyncRun a = run_async(cfg, order), b = run_async(cfg, order);
    EXPECT_EQ(a.model, b.model) << "the same arrival order, another model";
    // A push's age: the other workers' pushes since its pusher's last (its fetch came with it).
    std::vector<size_t> last(3, 0);
    for (size_t i = 0; i < order.size(); ++i) {
      const uint64_t age = i - last[order[i]];
      last[order[i]] = i + 1;
      EXPECT_EQ(a.ages[i], age) << "push " << i;
      EXPECT_EQ(a.lrs[i], cfg.lr / 3.0f / float(1 + age)) << "push " << i;
    }
    models.push_back(a.model);
  }
  EXPECT_NE(models[0], models[1]) << "two arrival orders ended on one model";
}

INSTANTIATE_TEST_SUITE_P(Codecs, AsyncSessions, ::testing::ValuesIn(one_round_specs()),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

TEST(Async, ADenseStepIsThePushScaledByTheWorldAndItsAge) {
  JobConfig cfg = async_job("dense", 2, 500);
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 4);
  auto ws = join(w, cfg, init);
  const auto g0 = test::synthetic_grad(ws[0]->session.params(), 0, 0, 3);
  const auto g1 = test::synthetic_grad(ws[1]->session.params(), 1, 0, 3);
  EXPECT_EQ(async_step(w, *ws[0], 3).age, 0u);
  EXPECT_EQ(async_step(w, *ws[1], 3).age, 1u);  // computed before rank 0's update
  std::vector<float> expect = init;
  kernels::cpu::axpy(expect.data(), g0.data(), cfg.dim, -(cfg.lr / 2));
  kernels::cpu::axpy(expect.data(), g1.data(), cfg.dim, -(cfg.lr / 2 / 2));
  EXPECT_TRUE(same(w.engine.model(), expect));

  // Without the age's scaling, the step is lr / world whatever its age.
  cfg.as<AsyncMode>().age_scaled = false;
  Wire u(cfg);
  auto us = join(u, cfg, init);
  async_step(u, *us[0], 3);
  EXPECT_EQ(async_step(u, *us[1], 3).lr, cfg.lr / 2);
}

TEST(Async, AWorkerThatFallsSilentHoldsNobodyBack) {
  const JobConfig cfg = async_job("topk:k=10", 3, 300);
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 2));
  for (int i = 0; i < 5; ++i) w.tick(100ms);  // rank 2 never speaks again: dead
  EXPECT_EQ(w.engine.live_workers(), 0u);     // nobody has spoken since: each comes back on push
  for (int t = 0; t < 5; ++t)
    for (uint32_t r : {0u, 1u})
      EXPECT_EQ(async_step(w, *ws[r], 1).outcome, StepResult::Outcome::Updated);
  EXPECT_EQ(w.engine.round(), 10u);
  EXPECT_EQ(w.engine.live_workers(), 2u);
}

TEST(Async, APushOlderThanTheBoundIsRefusedAndItsErrorFeedbackKept) {
  JobConfig cfg = async_job("topk:k=10", 2, 300);
  cfg.as<AsyncMode>().max_age = 1;
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 5));
  async_step(w, *ws[1], 5);
  async_step(w, *ws[1], 5);  // rank 0's model is two updates of others old now
  const std::vector<float> before(w.engine.model().begin(), w.engine.model().end());
  const StepResult refused = async_step(w, *ws[0], 5);
  EXPECT_EQ(refused.outcome, StepResult::Outcome::Aborted);
  EXPECT_EQ(w.engine.round(), 2u);
  EXPECT_TRUE(same(w.engine.model(), before));
  EXPECT_TRUE(same(ws[0]->session.params(), before)) << "the refusal brings the model with it";
  // The refused push stayed in rank 0's error feedback: a zero gradient now sends it.
  StepResult res;
  Session::Outbox out;
  ws[0]->session.push(std::vector<float>(cfg.dim, 0.0f), out, res);
  w.send(ws[0]->peer, out);
  ws[0]->pump(w, res);
  EXPECT_EQ(res.outcome, StepResult::Outcome::Updated);
  EXPECT_EQ(res.age, 0u);
  EXPECT_FALSE(same(w.engine.model(), before));
  EXPECT_EQ(w.engine.round(), 3u);
}

TEST(Async, APushSentAgainAfterItsReplyWasLostIsAnsweredNotAppliedTwice) {
  const JobConfig cfg = async_job("topk:k=10", 2, 300);
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 6));
  StepResult res;
  ws[0]->push(w, 6, res);
  w.inbox[ws[0]->peer].clear();  // the update and the model are lost with the connection
  EXPECT_EQ(w.engine.round(), 1u);
  ws[0]->peer = "w0-again";
  for (int i = 0; i < 4; ++i) w.tick(100ms);
  ws[0]->hello(w);  // the pending push goes out again before the pull
  for (int pass = 0; pass < 2; ++pass) ws[0]->pump(w, res);
  EXPECT_EQ(res.outcome, StepResult::Outcome::Updated);
  EXPECT_TRUE(ws[0]->session.settled());
  EXPECT_EQ(ws[0]->session.round(), 1u);
  EXPECT_EQ(w.engine.round(), 1u) << "applied twice";
  EXPECT_TRUE(same(ws[0]->session.params(), w.engine.model()));
  EXPECT_EQ(async_step(w, *ws[0], 6).outcome, StepResult::Outcome::Updated);
  EXPECT_EQ(w.engine.round(), 2u);
}

TEST(Async, APushFromTheFutureOrCarryingAnotherSendersMessageChangesNothing) {
  const JobConfig cfg = async_job("topk:k=10", 2, 300);
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 7));
  const auto g = test::synthetic_grad(ws[0]->session.params(), 0, 0, 7);
  auto push = [&](uint64_t number, uint32_t sender) {
    const Bytes msg = ws[0]->codec->encode(g, number, sender).release();
    Session::Outbox out{
        {Frame::own(encode(Envelope{Type::Push, cfg.job, number, 0, 0, ws[0]->session.session()})),
         Frame::own(msg)}};
    w.send(ws[0]->peer, out);
  };
  push(5, 0);  // its push #0 has not come: #5 is from the future
  auto& q = w.inbox[ws[0]->peer];
  ASSERT_EQ(q.size(), 1u);
  const Envelope e = decode_envelope(q.front()[0].bytes(), q.front().size() - 1);
  EXPECT_EQ(e.type, Type::Refuse);
  const RefuseInfo why = decode_refuse(q.front()[1].bytes());
  EXPECT_TRUE(why.retry);
  EXPECT_NE(why.reason.find("push #5 of rank 0 comes before #0"), std::string::npos) << why.reason;
  q.clear();
  push(0, 1);  // rank 0's connection, rank 1's message
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(w.engine.round(), 0u);
  EXPECT_EQ(w.engine.rejected(), 2u);
}

TEST(Async, ARestoredServerTakesEachWorkersPushNumberFromItsHello) {
  const JobConfig cfg = async_job("topk:k=10", 2, 300);
  Wire w(cfg);
  auto ws = join(w, cfg, test::initial_params(cfg.dim, 9));
  for (int t = 0; t < 3; ++t) async_step(w, *ws[t % 2], 9);
  const Checkpoint c = w.engine.checkpoint();
  EXPECT_EQ(c.round, 3u);
  Wire again(cfg);  // the server restarted from its checkpoint
  again.engine.restore(c);
  for (auto& x : ws) {
    x->peer += "-again";
    x->hello(again);
    StepResult res;
    x->pump(again, res);
    EXPECT_TRUE(x->session.settled());
    EXPECT_TRUE(same(x->session.params(), c.params));
  }
  EXPECT_EQ(async_step(again, *ws[0], 9).outcome, StepResult::Outcome::Updated);  // its #2
  EXPECT_EQ(async_step(again, *ws[1], 9).outcome, StepResult::Outcome::Updated);  // its #1
  EXPECT_EQ(again.engine.round(), 5u);
  EXPECT_EQ(again.engine.rejected(), 0u);
}

TEST(Async, AWorkerFetchesEveryNthPushAndAppliesItsOwnUpdatesBetween) {
  JobConfig cfg = async_job("topk:k=10", 2, 300);
  cfg.outer.kind = OuterKind::Adagrad;  // each worker applies its own update as the server does
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 3);
  ClientOptions o = options(0, 2);
  o.fetch_every = 3;
  Worker a(cfg, o, init);
  Worker b(cfg, 1, {});
  a.hello(w);
  b.hello(w);
  for (int pass = 0; pass < 3; ++pass) {
    a.registration(w);
    b.registration(w);
  }
  ASSERT_TRUE(a.session.synced() && b.session.synced());
  for (int t = 1; t <= 6; ++t) {
    async_step(w, b, 3);
    const std::vector<float> before(w.engine.model().begin(), w.engine.model().end());
    const StepResult res = async_step(w, a, 3);
    EXPECT_EQ(same(a.session.params(), w.engine.model()), t % 3 == 0) << "push " << t;
    // The fetched model (with Adagrad's state) is counted with the step that brought it.
    EXPECT_EQ(res.fetched, t % 3 == 0);
    EXPECT_EQ(res.bytes_down >= 2 * cfg.dim * 4, t % 3 == 0) << res.bytes_down;
    EXPECT_FALSE(same(w.engine.model(), before));
  }
  // Alone, a worker that never fetches holds what the server holds.
  JobConfig one = async_job("topk:k=10", 1, 300);
  one.outer.kind = OuterKind::Adagrad;
  Wire solo(one);
  ClientOptions never = options(0, 1);
  never.fetch_every = 0;
  Worker s(one, never, init);
  s.hello(solo);
  for (int pass = 0; pass < 2; ++pass) s.registration(solo);
  for (int t = 0; t < 4; ++t) async_step(solo, s, 4);
  EXPECT_TRUE(same(s.session.params(), solo.engine.model()));
}

TEST(Async, APushCountsForItsWorkersWeightWhichARoundJobRefuses) {
  // Rank 1 pushes every 3H steps where rank 0 pushes every H: each of its pushes counts 3 times.
  JobConfig cfg = async_job("dense", 2, 500);
  cfg.as<AsyncMode>().age_scaled = false;
  Wire w(cfg);
  const auto init = test::initial_params(cfg.dim, 4);
  ClientOptions heavy = options(1, 2);
  heavy.weight = 3.0f;
  Worker a(cfg, 0, init), b(cfg, heavy, {});
  a.hello(w);
  b.hello(w);
  for (int pass = 0; pass < 3; ++pass) {
    a.registration(w);
    b.registration(w);
  }
  const auto ga = test::synthetic_grad(a.session.params(), 0, 0, 3);
  const auto gb = test::synthetic_grad(b.session.params(), 1, 0, 3);
  const float one = cfg.lr * 1.0f / 2.0f / 1.0f, three = cfg.lr * 3.0f / 2.0f / 1.0f;
  EXPECT_EQ(async_step(w, a, 3).lr, one);
  EXPECT_EQ(async_step(w, b, 3).lr, three);
  std::vector<float> expect = init;
  kernels::cpu::axpy(expect.data(), ga.data(), cfg.dim, -one);
  kernels::cpu::axpy(expect.data(), gb.data(), cfg.dim, -three);
  EXPECT_TRUE(same(w.engine.model(), expect));

  Wire rounds(job("dense", 2, 500));
  Worker c(rounds.engine.config(), heavy, {});
  c.hello(rounds);
  EXPECT_THROW(c.registration(rounds), ConfigMismatch);
  for (const float bad : {0.0f, -1.0f, std::nanf(""), 2e6f}) {
    ClientOptions o = options(1, 2);
    o.weight = bad;
    EXPECT_THROW(Worker(cfg, o, {}), InvalidArgument) << bad;
  }
}

/// Which of the mode-specific fields a mode type has.
struct Fields {
  bool staleness, population, close, max_age;
};
template <class Mode>
constexpr Fields kHas{requires(Mode m){m.staleness;
}  // namespace
, requires(Mode m) {
  m.population;
}
, requires(Mode m) {
  m.close;
}
, requires(Mode m) {
  m.max_age;
}
};  // namespace sketchsgd::ps

TEST(Async, JobsThatCannotRunAsynchronouslyAreRefused) {
  std::string two_round;
  for (const auto& s : example_specs())
    if (make_compressor(s, 2000)->two_rounds()) two_round = s;
  ASSERT_FALSE(two_round.empty());
  EXPECT_THROW(Engine(async_job(two_round, 2, 2000)), InvalidArgument);
  // No staleness, population or round policy can be written for an asynchronous job, nor an
  // age bound for a job in rounds: each mode holds only its own fields.
  static_assert(!kHas<AsyncMode>.staleness && !kHas<AsyncMode>.population &&
                !kHas<AsyncMode>.close && !kHas<SyncMode>.max_age);
  static_assert(kHas<SyncMode>.staleness && kHas<FederatedMode>.population &&
                kHas<FederatedMode>.close && kHas<AsyncMode>.max_age);
  JobConfig c = async_job("topk:k=10", 2, 300);
  EXPECT_THROW(c.closing(), InvalidArgument);
  EXPECT_EQ(c.policy(), Policy::Wait);
  EXPECT_EQ(c.staleness(), 0u);
  EXPECT_EQ(job("topk:k=10", 2, 300).max_age(), 0u);
}

}  // namespace
}  // namespace sketchsgd::ps
