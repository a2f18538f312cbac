#include "sim/sim.hpp"
#include "sim/network.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <sstream>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include <sketchsgd/ps/liveness.hpp>
#include <sketchsgd/ps/shards.hpp>
#include <sketchsgd/server/checkpoint.hpp>
#include <sketchsgd/server/replica.hpp>
#include <sketchsgd/worker/session.hpp>
#include "support/ps_job.hpp"
#include "support/ps_synthetic.hpp"

namespace sketchsgd::ps::sim {

const char* to_string(Kind k) {
  switch (k) {
    case Kind::Rounds:
      return "rounds";
    case Kind::Quorum:
      return "quorum";
    case Kind::Stale:
      return "stale";
    case Kind::Async:
      return "async";
    case Kind::Restart:
      return "restart";
    case Kind::Sharded:
      return "sharded";
    case Kind::Federated:
      return "federated";
  }
  return "?";
}

Kind parse_kind(const std::string& s) {
  for (Kind k : kKinds)
    if (s == to_string(k)) return k;
  throw InvalidArgument("sim: unknown job kind '" + s +
                        "' (rounds, quorum, stale, async, restart, sharded, federated)");
}

namespace {

using namespace std::chrono_literals;

uint64_t fnv(std::span<const uint8_t> b, uint64_t h = 1469598103934665603ull) {
  for (uint8_t x : b) h = (h ^ x) * 1099511628211ull;
  return h;
}
uint64_t hash_of(std::span<const float> v, std::span<const uint8_t> extra = {}) {
  return fnv(extra, fnv({reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes()}));
}
double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

bool is_heartbeat(const Frames& f, uint64_t job, Envelope* e = nullptr) {
  if (f.size() != 1) return false;
  try {
    const Envelope x = decode_envelope(f[0].bytes(), 0);
    if (e) *e = x;
    return x.type == Type::Heartbeat && x.job == job;
  } catch (const Error&) {
    return false;
  }
}

struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class World {
 public:
  World(const Scenario& s, uint64_t seed, bool keep_trace, bool faults)
      : sc_(s), rng_(seed), keep_(keep_trace) {
    shards_ = s.kind == Kind::Sharded ? 2 : 1;
    replicated_ = s.kind != Kind::Restart && s.kind != Kind::Federated;
    plan_ = plan_shards(s.spec, s.dim, shards_);
    init_ = test::initial_params(s.dim, 5);
    for (uint32_t sh = 0; sh < shards_; ++sh) {
      JobConfig c = test_job::make(plan_[sh].spec, s.world, plan_[sh].dim);
      if (shards_ > 1) c.shard = plan_[sh].id;
      c.max_rounds = s.rounds;
      c.deadline = 1000ms;
      switch (s.kind) {
        case Kind::Quorum:
          c.policy = Policy::Quorum;
          c.min_workers = s.world - 1;
          break;
        case Kind::Stale:
          c.staleness = 1;
          break;
        case Kind::Async:
          c.async = true;
          c.max_rounds = s.rounds * s.world;
          break;
        case Kind::Restart:
          c.checkpoint_every = 1;
          break;
        case Kind::Federated:
          c.population = 3 * s.world;
          c.policy = Policy::Quorum;
          c.min_workers = s.world - 1;
          c.checkpoint_every = 1;
          break;
        default:
          break;
      }
      cfgs_.push_back(c);
      add_server(sh, false);
      if (replicated_) add_server(sh, true);
    }
    if (federated())
      for (uint64_t round = 0; round < s.rounds; ++round)
        for (uint32_t id :
             sample_clients(cfgs_[0].population, s.world, cfgs_[0].sample_seed, round))
          add_worker(id, round);
    else
      for (uint32_t r = 0; r < s.world; ++r) add_worker(r);
    if (faults) schedule_faults(seed);
  }

  Report go() {
    Report rep;
    for (size_t i = 0; i < servers_.size(); ++i) start_server(int(i), false);
    // A round's clients come about as the one before ends (those early are told to try again).
    for (size_t w = 0; w < workers_.size(); ++w)
      at(now_ + std::chrono::milliseconds(rng_() % 50 + 25 * workers_[w]->join),
         [this, w] { start_worker(int(w)); });
    const auto limit = start_ + std::chrono::minutes(10);
    try {
      while (!all_done() && clock_.step(limit)) {
        now_ = clock_.now();
        ++events_;
        check();
      }
      if (!all_done()) throw Violation("no progress: " + states());
      final_checks();
    } catch (const Violation& v) {
      rep.ok = false;
      rep.violation = v.what();
    }
    rep.trace = std::move(trace_);
    rep.events = events_;
    rep.faults = faults_;
    rep.finished = std::all_of(workers_.begin(), workers_.end(),
                               [](const auto& w) { return w->state == WState::Done; });
    rep.failed_workers =
        uint32_t(std::count_if(workers_.begin(), workers_.end(),
                               [](const auto& w) { return w->state == WState::Failed; }));
    rep.sim_seconds = ms(now_ - start_) / 1000;
    if (!rep.finished) rep.ended_by = cause_;
    return rep;
  }

  /// The model every worker holds at the end (rounds kinds; a federated job's last clients),
  /// for the fault-free reference.
  std::vector<float> final_model() const {
    return workers_.empty() ? std::vector<float>{} : workers_.back()->full();
  }
  void expect(std::vector<float> ref) { reference_ = std::move(ref); }

 private:
  void at(Clock::time_point t, std::function<void()> f) { clock_.at(t, std::move(f)); }

  void note(const std::string& s) {
    if (keep_) trace_.push_back(std::to_string(int64_t(ms(now_ - start_))) + " ms: " + s);
  }
  void fault(const std::string& s) {
    ++faults_;
    trace_.push_back(std::to_string(int64_t(ms(now_ - start_))) + " ms: FAULT " + s);
  }

  // ---- nodes: servers 0..S-1, then workers (numbers for partitions and pauses)
  enum class SState { Up, Down, Stopped };
  enum class WState { Idle, Joining, Working, Done, Failed };

  struct Server {
    std::string name;
    uint32_t shard = 0;
    bool backup = false;
    int primary = -1;  // its primary's index (a backup)
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Replica> replica;
    SState state = SState::Down;
    std::string exit;
    uint32_t incarnation = 0;
    std::map<PeerId, int> peers;  // connections of this incarnation
    int up = -1;                  // a backup's connection to its primary
    Liveness alive;
    Clock::time_point last_up_send{};
    bool answered = false;
    std::optional<Bytes> disk;     // the checkpoint file
    std::optional<Bytes> writing;  // a snapshot on its way to the disk
    uint64_t max_epoch = 0;        // the highest it reached
  };

  struct Part {
    std::unique_ptr<Compressor> codec;
    std::unique_ptr<Session> session;
    std::vector<int> endpoints;  // server indices: primary, then backup
    size_t current = 0;
    int conn = -1;
    Liveness alive;
    Clock::time_point last_send{};
    bool elsewhere = false;
    bool finished = false;  // JobFinished
    bool joined = false;    // the first registration is done (Client::join returned)
    uint64_t seen_round = UINT64_MAX;
  };

  struct Worker {
    uint32_t rank = 0;  // a federated client's id
    uint64_t join = 0;  // a federated client's round
    std::vector<Part> parts;
    std::vector<ShardPlan> plan;
    WState state = WState::Idle;
    std::string exit;
    Clock::time_point progress_at{};
    bool computing = false;
    std::vector<float> full() const {
      std::vector<float> v;
      for (const auto& p : parts) {
        const auto s = p.session->params();
        v.insert(v.end(), s.begin(), s.end());
      }
      return v;
    }
  };

  /// What a connection is to the job (the network knows only its two nodes).
  struct Conn {
    bool from_server = false;  // a backup's link to its primary
    int client = 0;            // worker or server index
    int part = 0;              // the worker's shard
    int server = 0;
    uint32_t incarnation = 0;  // of the server when it last heard this connection
    uint32_t gen = 0;          // the server-side identity (new after a server restart)
    int id = 0;
    PeerId peer() const { return "c" + std::to_string(id) + "." + std::to_string(gen); }
  };

  int node_of_worker(int w) const { return int(servers_.size()) + w; }

  void add_server(uint32_t shard, bool backup) {
    auto s = std::make_unique<Server>();
    s->shard = shard;
    s->backup = backup;
    s->name = std::string(backup ? "backup" : "primary") +
              (shards_ > 1 ? std::to_string(shard) : std::string());
    if (!replicated_) s->name = "server";
    if (backup) s->primary = int(servers_.size()) - 1;
    servers_.push_back(std::move(s));
  }

  void add_worker(uint32_t rank, uint64_t join = 0) {
    auto w = std::make_unique<Worker>();
    w->rank = rank;
    w->join = join;
    w->plan = plan_;
    for (uint32_t sh = 0; sh < shards_; ++sh) {
      Part p;
      p.codec = make_compressor(plan_[sh].spec, plan_[sh].dim);
      ClientOptions o;
      o.job = cfgs_[sh].job;
      o.rank = rank;
      o.world = sc_.world;
      o.population = cfgs_[sh].population;
      o.join_round = join;
      if (shards_ > 1) o.shard = plan_[sh].id;
      o.heartbeat = cfgs_[sh].heartbeat;
      o.timeout = 60s;
      o.log = [this, rank](const std::string& s) {
        note("worker " + std::to_string(rank) + ": " + s);
      };
      // A federated job's first clients all hold the initial model (one's Init counts).
      const bool initialises = federated() ? join == 0 : rank == 0;
      const std::span<const float> init =
          initialises ? std::span<const float>(init_).subspan(plan_[sh].id.begin, plan_[sh].dim)
                      : std::span<const float>();
      p.session = std::make_unique<Session>(o, *p.codec, init);
      p.alive.dead_after = o.dead_after;
      p.alive.backoff_max = o.backoff_max;
      for (size_t i = 0; i < servers_.size(); ++i)
        if (servers_[i]->shard == sh) p.endpoints.push_back(int(i));
      w->parts.push_back(std::move(p));
    }
    workers_.push_back(std::move(w));
  }

  // ---- connections
  int open(bool from_server, int client, int part, int server) {
    Conn c;
    c.from_server = from_server;
    c.client = client;
    c.part = part;
    c.server = server;
    c.incarnation = servers_[server]->incarnation;
    c.id = net_.open(from_server ? client : node_of_worker(client), server);
    conns_.push_back(c);
    return c.id;
  }
  void close(int id) { net_.close(id); }
  void send(int id, bool up, Frames f) { net_.send(id, up, std::move(f)); }
  Clock::time_point paused_until(int node) const { return net_.paused_until(node); }

  // ---- servers
  void start_server(int i, bool restart) {
    Server& s = *servers_[i];
    const JobConfig& cfg = cfgs_[s.shard];
    ++s.incarnation;
    s.peers.clear();
    s.writing.reset();
    Hooks h;
    h.log = [this, i](const std::string& line) { note(servers_[i]->name + ": " + line); };
    h.round = [this, i](const RoundMetrics& m) { accepted(i, m); };
    if (cfg.checkpoint_every) h.checkpoint = [this, i](Checkpoint c, bool) { write(i, encode(c)); };
    s.engine = std::make_unique<Engine>(cfg, h);
    if (restart && s.disk) {
      try {
        s.engine->restore(decode_checkpoint(*s.disk, s.name + "'s checkpoint"));
        note(s.name + " resumed at round " + std::to_string(s.engine->round()));
      } catch (const WireError& e) {
        // As sketchsgd-server does: it refuses to start on a corrupt checkpoint.
        refusal_ = "its checkpoint is corrupt";
        stop(i, std::string("refused to start: ") + e.what(), true);
        return;
      }
    }
    ReplicaOptions ro;
    ro.backup = s.backup;
    s.replica = std::make_unique<Replica>(*s.engine, ro, h.log);
    s.state = SState::Up;
    s.alive.heartbeat = cfg.heartbeat;
    s.alive.dead_after = cfg.dead_after;
    s.alive.backoff_max = 5000ms;
    s.alive.heard(now_);
    s.answered = false;
    if (s.backup) {
      s.up = open(true, i, 0, s.primary);
      up_send(i, s.replica->follow());
    }
    tick_server(i, s.incarnation);
  }

  void up_send(int i, Frames f) {
    Server& s = *servers_[i];
    s.last_up_send = now_;
    send(s.up, true, std::move(f));
  }

  void write(int i, Bytes b) {
    // The writer's thread: the file lands a moment later (atomically), unless the server dies
    // first.
    Server& s = *servers_[i];
    s.writing = std::move(b);
    const uint32_t inc = s.incarnation;
    at(now_ + std::chrono::milliseconds(1 + rng_() % 20), [this, i, inc] {
      Server& x = *servers_[i];
      if (x.incarnation == inc && x.state == SState::Up && x.writing) {
        x.disk = std::move(x.writing);
        x.writing.reset();
      }
    });
  }

  void stop(int i, const std::string& why, bool clear_error) {
    Server& s = *servers_[i];
    s.state = SState::Stopped;
    s.exit = why;
    if (clear_error) server_errors_ = true;
    note(s.name + " stopped: " + why);
    // What it sent still goes out (the socket's linger); nothing more is read.
    net_.drop(i, false);
  }

  void crash(int i) {
    Server& s = *servers_[i];
    if (s.state != SState::Up) return;
    fault("kill -9 " + s.name + " at round " + std::to_string(s.engine->round()));
    s.state = SState::Down;
    if (s.writing && rng_() % 4 == 0) {
      // Torn: what a disk without an atomic rename could leave.
      Bytes torn(s.writing->begin(), s.writing->begin() + long(rng_() % s.writing->size()));
      s.disk = std::move(torn);
      fault(s.name + "'s checkpoint write torn");
    }
    s.writing.reset();
    net_.drop(i, true);
    if (s.up >= 0) close(s.up);
    s.replica.reset();
    s.engine.reset();
  }

  void route(int i, std::vector<Outgoing>& out) {
    Server& s = *servers_[i];
    for (auto& o : out) {
      const auto it = s.peers.find(o.peer);
      if (it != s.peers.end()) send(it->second, false, std::move(o.frames));
    }
    out.clear();
  }

  void after_server(int i, std::vector<Outgoing>& out, std::vector<Frames>& up) {
    Server& s = *servers_[i];
    route(i, out);
    for (auto& f : up)
      if (s.up >= 0) up_send(i, std::move(f));
    up.clear();
    if (s.replica && s.replica->deposed()) stop(i, "deposed: " + *s.replica->deposed(), false);
  }

  void to_server(int id, const Frames& f) {
    Conn& c = conns_[id];
    Server& s = *servers_[c.server];
    if (s.state != SState::Up) return;
    if (c.incarnation != s.incarnation) {  // ZeroMQ connects again: a new identity
      c.incarnation = s.incarnation;
      ++c.gen;
    }
    s.peers[c.peer()] = id;
    std::vector<Outgoing> out;
    std::vector<Frames> up;
    Envelope e{};
    if (is_heartbeat(f, cfgs_[s.shard].job, &e))  // the I/O thread echoes heartbeats itself
      send(id, false,
           {Frame::own(encode(Envelope{Type::Heartbeat, e.job, 0, e.rank, 0, e.session}))});
    try {
      s.replica->handle(c.peer(), f, now_, out, up);
    } catch (const std::exception& ex) {
      throw Violation(s.name + ": internal error handling a message: " + ex.what());
    }
    after_server(c.server, out, up);
  }

  void tick_server(int i, uint32_t inc) {
    Server& s = *servers_[i];
    if (s.state != SState::Up || s.incarnation != inc) return;
    const JobConfig& cfg = cfgs_[s.shard];
    const auto tick = std::clamp(cfg.heartbeat / 4, Millis(5), Millis(100));
    auto next = now_ + tick;
    if (paused_until(i) > now_) {
      at(paused_until(i), [this, i, inc] { tick_server(i, inc); });
      return;
    }
    std::vector<Outgoing> out;
    std::vector<Frames> up;
    s.replica->tick(now_, out);
    if (s.backup && s.up >= 0) {
      if (s.answered && s.alive.heartbeat_due(now_, s.last_up_send))
        up.push_back({Frame::own(encode(Envelope{Type::Heartbeat, cfg.job, 0, 0, 0, 0}))});
      if (s.alive.silent(now_)) {
        note(s.name + ": primary silent: connecting again");
        close(s.up);
        s.up = open(true, i, 0, s.primary);
        s.alive.reconnected(now_);
        s.answered = false;
        up.push_back(s.replica->reconnected());
      }
    }
    after_server(i, out, up);
    if (s.state != SState::Up) return;
    if (s.replica->done(now_)) {
      s.replica->bye(out);
      route(i, out);
      stop(i, s.engine->finished() ? "finished" : "stopped: " + s.replica->why(), false);
      return;
    }
    if (const auto d = s.replica->deadline(); d && *d > now_) next = std::min(next, *d);
    at(next, [this, i, inc] { tick_server(i, inc); });
  }

  void from_primary(int id, const Frames& f) {
    Conn& c = conns_[id];
    Server& s = *servers_[c.client];
    if (s.state != SState::Up || s.up != id) return;
    s.alive.heard(now_);
    s.answered = true;
    std::vector<Frames> up;
    std::vector<Outgoing> out;
    try {
      s.replica->upstream(f, now_, up);
    } catch (const ConfigMismatch& e) {
      refusal_ = "its primary refused it";
      stop(c.client, std::string("refused by its primary: ") + e.what(), true);
      return;
    } catch (const std::exception& e) {
      throw Violation(s.name + ": internal error on its primary's message: " + e.what());
    }
    after_server(c.client, out, up);
  }

  /// A round ended on server i (Hooks::round: the model is that after it).
  void accepted(int i, const RoundMetrics& m) {
    Server& s = *servers_[i];
    const uint64_t ep = s.engine->epoch();
    auto& who = acceptor_[{s.shard, ep, m.round}];
    if (who && *who != i && !rollback_ok())
      throw Violation("round " + std::to_string(m.round) + " of epoch " + std::to_string(ep) +
                      " accepted by both " + servers_[*who]->name + " and " + s.name);
    who = i;
    last_[s.shard] = std::max(last_[s.shard], std::make_pair(ep, m.round + 1));
    committed_[{s.shard, m.round + 1}].insert(hash_of(s.engine->model()));
    if (complete_.count({s.shard, m.round})) rerun_.insert({s.shard, m.round});
    // Whole: every worker's push (and answer) in it, as in the fault-free run.
    // (As the latest epoch ended it: a deposed primary that ends it late, when it wakes from a
    // pause, serves nobody its outcome.)
    const bool whole = !m.aborted && m.reason.empty() && m.contributors == sc_.world;
    auto [at, fresh] = complete_.try_emplace({s.shard, m.round}, ep, whole);
    if (!fresh && ep >= at->second.first) at->second = {ep, whole};
    primary_hash_[{s.shard, m.round + 1}] = hash_of(s.engine->model(), s.engine->codec_state());
    note(s.name + " ended round " + std::to_string(m.round) + (m.aborted ? " (aborted)" : "") +
         " with " + std::to_string(m.contributors) + " contributors");
  }
  bool rollback_ok() const { return sc_.kind == Kind::Restart || federated(); }

  // ---- workers
  void start_worker(int w) {
    Worker& x = *workers_[w];
    x.state = WState::Joining;
    x.progress_at = now_;
    for (size_t p = 0; p < x.parts.size(); ++p) {
      Part& pt = x.parts[p];
      pt.conn = open(false, w, int(p), pt.endpoints[pt.current]);
      pt.alive.heartbeat = pt.session->heartbeat();
      pt.alive.heard(now_);
      Session::Outbox out;
      pt.session->hello(out);
      flush(w, int(p), out);
    }
    tick_worker(w);
  }

  void flush(int w, int p, Session::Outbox& out) {
    Part& pt = workers_[w]->parts[p];
    for (auto& f : out) {
      send(pt.conn, true, std::move(f));
      pt.last_send = now_;
    }
    out.clear();
    pt.alive.heartbeat = pt.session->heartbeat();
    if (pt.session->take_elsewhere()) pt.elsewhere = true;
  }

  void fail(int w, const std::string& why) {
    Worker& x = *workers_[w];
    if (x.state == WState::Done || x.state == WState::Failed) return;
    x.state = WState::Failed;
    x.exit = why;
    note("worker " + std::to_string(w) + " failed: " + why);
    for (auto& p : x.parts) close(p.conn);
  }

  void to_client(int id, const Frames& f) {
    Conn& c = conns_[id];
    if (c.from_server) return from_primary(id, f);
    Worker& x = *workers_[c.client];
    Part& pt = x.parts[c.part];
    if (pt.conn != id || x.state == WState::Done || x.state == WState::Failed || pt.finished)
      return;
    pt.alive.heard(now_);
    if (is_heartbeat(f, cfgs_[c.part].job)) return;  // the link's, not the session's
    Session::Outbox out;
    StepResult res;
    try {
      // As the Client: registration traffic first, every message through handle() once joined.
      if (!pt.joined)
        pt.session->handle_registration(f, now_, out);
      else
        (void)pt.session->handle(f, now_, out, res);
      pt.joined |= pt.session->synced();
      if (sc_.sabotage == Scenario::Sabotage::Corrupt && !sabotaged_ && c.client == 0 &&
          pt.joined && !async()) {
        // An update applied twice: the same Update again, as if for the next round.
        Envelope e{};
        try {
          e = decode_envelope(f[0].bytes(), f.size() - 1);
        } catch (const Error&) {
        }
        if (e.type == Type::Update && e.round + 1 == pt.session->round()) {
          Frames again = f;
          ++e.round;
          again[0] = Frame::own(encode(e));
          (void)pt.session->handle(again, now_, out, res);
          sabotaged_ = true;
        }
      }
    } catch (const JobFinished& e) {
      pt.finished = true;
      note("worker " + std::to_string(c.client) + ": " + e.what());
    } catch (const Error& e) {
      flush(c.client, c.part, out);
      return fail(c.client, e.what());
    }
    if (res.outcome == StepResult::Outcome::Updated)
      seen_version_[c.part] = std::max(seen_version_[c.part], res.version);
    flush(c.client, c.part, out);
    step(c.client);
  }

  bool async() const { return sc_.kind == Kind::Async; }
  bool federated() const { return sc_.kind == Kind::Federated; }
  /// The push after a worker's last: the job's rounds, or a federated client's one.
  uint64_t last_push(const Worker& x) const { return federated() ? x.join + 1 : sc_.rounds; }

  /// The training loop's next move: a push when every shard lets it, goodbye when done.
  void step(int w) {
    Worker& x = *workers_[w];
    if (x.state != WState::Joining && x.state != WState::Working) return;
    bool synced = true, done = true, free = true;
    for (auto& p : x.parts) {
      synced &= p.session->synced() || p.finished;
      if (async())
        done &= p.finished || (p.session->next_push() >= sc_.rounds && p.session->settled());
      else
        done &= p.finished || p.session->round() >= last_push(x);
      free &= !p.finished && !p.session->must_wait();
    }
    if (!synced) return;
    if (x.state == WState::Joining) {
      x.state = WState::Working;
      x.progress_at = now_;
    }
    if (done) {
      for (size_t p = 0; p < x.parts.size(); ++p) {
        Session::Outbox out;
        if (!x.parts[p].finished && x.parts[p].session->registered()) x.parts[p].session->bye(out);
        flush(w, int(p), out);
      }
      x.state = WState::Done;
      note("worker " + std::to_string(w) + " done");
      return;
    }
    if (!free || x.computing || x.parts[0].session->next_push() >= last_push(x)) return;
    // The gradient takes a while to compute; the push goes out when it is ready.
    x.computing = true;
    at(now_ + std::chrono::milliseconds(5 + rng_() % 25), [this, w] {
      Worker& y = *workers_[w];
      y.computing = false;
      if (y.state != WState::Working) return;
      for (auto& p : y.parts)
        if (p.finished || p.session->must_wait()) return step(w);
      const auto params = y.full();
      const auto g = test::synthetic_grad(params, y.rank, y.parts[0].session->next_push(), 11);
      for (size_t p = 0; p < y.parts.size(); ++p) {
        Session::Outbox out;
        StepResult res;
        y.parts[p].session->push(
            std::span<const float>(g).subspan(y.plan[p].id.begin, y.plan[p].dim), out, res);
        flush(w, int(p), out);
      }
      note("worker " + std::to_string(w) + " pushed " +
           std::to_string(y.parts[0].session->next_push() - 1));
      step(w);
    });
  }

  void tick_worker(int w) {
    Worker& x = *workers_[w];
    if (x.state == WState::Done || x.state == WState::Failed) return;
    const auto poll = std::max(Millis(5), std::min(Millis(50), cfgs_[0].heartbeat / 4));
    if (paused_until(node_of_worker(w)) > now_) {
      at(paused_until(node_of_worker(w)), [this, w] { tick_worker(w); });
      return;
    }
    for (size_t p = 0; p < x.parts.size(); ++p) {
      Part& pt = x.parts[p];
      if (pt.finished) continue;
      Session::Outbox out;
      pt.session->tick(now_, out);
      flush(w, int(p), out);
      if (pt.session->session() != 0 && pt.alive.heartbeat_due(now_, pt.last_send)) {
        Session::Outbox hb{{Frame::own(encode(Envelope{
            Type::Heartbeat, cfgs_[p].job, 0, pt.session->rank(), 0, pt.session->session()}))}};
        flush(w, int(p), hb);
      }
      const bool sent_on = std::exchange(pt.elsewhere, false) && pt.endpoints.size() > 1;
      if (sent_on || pt.alive.silent(now_)) {
        close(pt.conn);
        pt.current = (pt.current + 1) % pt.endpoints.size();
        pt.conn = open(false, w, int(p), pt.endpoints[pt.current]);
        pt.alive.reconnected(now_);
        note("worker " + std::to_string(w) + ": " + (sent_on ? "sent on" : "server silent") +
             ": reconnecting to " + servers_[pt.endpoints[pt.current]]->name);
        pt.session->hello(out);
        flush(w, int(p), out);
      }
    }
    if (now_ - x.progress_at > x.parts[0].session->options().timeout)
      return fail(w, "timeout: no progress for " +
                         std::to_string(x.parts[0].session->options().timeout.count()) + " ms");
    step(w);
    at(now_ + poll, [this, w] { tick_worker(w); });
  }

  // ---- faults
  void schedule_faults(uint64_t seed) {
    // Drawn from a generator of their own, so leaving one out changes no other.
    std::mt19937_64 rng(seed ^ 0xD1B54A32D192ED03ull);
    const int nodes = int(servers_.size() + workers_.size());
    std::set<int> crashed_shards;
    for (uint32_t k = 0; k < sc_.faults; ++k) {
      const auto t = now_ + std::chrono::milliseconds(rng() % 800);
      const auto d = std::chrono::milliseconds(50 + rng() % 1500);
      const uint64_t what = rng() % 4, pick = rng();
      if (k < 64 && (sc_.skip >> k) & 1) continue;
      switch (what) {
        case 0: {  // one node cut off from the rest, or some servers from everything else
          std::set<int> side;
          if (pick % 3 == 0) {
            for (size_t i = 0; i < servers_.size(); ++i)
              if ((pick >> (8 + i)) & 1) side.insert(int(i));
          } else {
            side.insert(int((pick >> 8) % nodes));
          }
          at(t, [this, side, d] {
            std::string who;
            for (int n : side) who += " " + node_name(n);
            fault("partition {" + who + " } for " + std::to_string(d.count()) + " ms");
            net_.partition(side, d);
          });
          break;
        }
        case 1: {  // SIGSTOP, SIGCONT later
          const int n = int((pick >> 8) % nodes);
          at(t, [this, n, d] {
            fault("SIGSTOP " + node_name(n) + " for " + std::to_string(d.count()) + " ms");
            net_.pause(n, now_ + d);
          });
          break;
        }
        default: {  // kill -9 of a server: a replicated one stays down, a lone one restarts
          const int i = int((pick >> 8) % servers_.size());
          if (replicated_ && crashed_shards.count(int(servers_[i]->shard))) break;
          crashed_shards.insert(int(servers_[i]->shard));
          at(t, [this, i, d] {
            crash(i);
            if (!replicated_)
              at(now_ + d, [this, i] {
                if (servers_[i]->state != SState::Down) return;
                fault("restart " + servers_[i]->name);
                start_server(i, true);
              });
          });
          break;
        }
      }
    }
  }
  std::string node_name(int n) const {
    return n < int(servers_.size()) ? servers_[n]->name
                                    : "worker " + std::to_string(n - int(servers_.size()));
  }

  // ---- invariants
  /// Every worker is done or failed, and every server has stopped, or six minutes later is
  /// still serving with its reason logged (a primary cut off while its backup finished the job,
  /// that backup then killed, waits for its workers: nobody is left to tell it), and its backup
  /// with it. A backup still following a primary that is gone stops by itself (Replica::done).
  bool all_done() {
    for (const auto& w : workers_)
      if (w->state != WState::Done && w->state != WState::Failed) return false;
    if (!workers_done_at_) workers_done_at_ = now_;
    const bool late = now_ - *workers_done_at_ > std::chrono::minutes(6);
    for (const auto& s : servers_)
      if (s->state == SState::Up) {
        if (late && s->replica->following() && servers_[s->primary]->state != SState::Up)
          throw Violation(s->name +
                          " still follows a gone primary six minutes after the workers "
                          "ended");
        if (!late) return false;
      }
    return true;
  }

  void sabotage() {
    if (sc_.sabotage == Scenario::Sabotage::None || sabotaged_) return;
    Part& p = workers_[0]->parts[0];
    if (sc_.sabotage == Scenario::Sabotage::Stall && p.session->next_push() >= 2) {
      net_.pause(node_of_worker(0), now_ + std::chrono::hours(24));
      sabotaged_ = true;
    }
  }

  /// After every event.
  void check() {
    sabotage();
    for (size_t i = 0; i < servers_.size(); ++i) {
      Server& s = *servers_[i];
      if (s.state != SState::Up) continue;
      s.max_epoch = std::max(s.max_epoch, s.engine->epoch());
      if (!s.engine->has_model()) continue;
      // A backup following holds only what its primary committed, bit for bit.
      if (s.replica->following()) {
        const Server& p = *servers_[s.primary];
        if (p.state == SState::Up && p.engine->round() < s.engine->round())
          throw Violation(s.name + " at round " + std::to_string(s.engine->round()) +
                          " is ahead of its primary at " + std::to_string(p.engine->round()));
        const uint64_t r = s.engine->round();
        const auto it = primary_hash_.find({s.shard, r});
        if (r > 0 && !async() && it != primary_hash_.end() &&
            it->second != hash_of(s.engine->model(), s.engine->codec_state()))
          throw Violation(s.name + " holds round " + std::to_string(r) +
                          " other than its primary committed it (model or codec state)");
      }
    }
    for (size_t w = 0; w < workers_.size(); ++w) {
      Worker& x = *workers_[w];
      for (size_t p = 0; p < x.parts.size(); ++p) {
        Part& pt = x.parts[p];
        if (!pt.session->synced() || pt.session->round() == pt.seen_round) continue;
        const uint64_t before = pt.seen_round, r = pt.session->round();
        pt.seen_round = r;
        if (before != UINT64_MAX && r < before && !rollback_ok())
          throw Violation("worker " + std::to_string(w) + " went back from round " +
                          std::to_string(before) + " to " + std::to_string(r));
        if (before != UINT64_MAX && r > before) x.progress_at = now_;
        if (async() || r == 0) continue;
        // What it holds after round r − 1 is what some server had then: no update lost,
        // applied twice, or made up.
        const auto it = committed_.find({uint32_t(p), r});
        if (it == committed_.end() || !it->second.count(hash_of(pt.session->params())))
          throw Violation("worker " + std::to_string(w) + " holds at round " + std::to_string(r) +
                          " a model no server had then");
      }
    }
  }

  void final_checks() {
    // Allowed: a clear error where a server refused to go on (a torn checkpoint, both replicas
    // of a shard killed), and the workers' timeouts it causes.
    std::string no_server;
    for (uint32_t sh = 0; sh < shards_ && no_server.empty(); ++sh) no_server = unservable(sh);
    // And a worker cut off when the job ended: its servers finished and stopped (they do not
    // wait for the goodbye of a worker they count as dead), it times out.
    const bool ended = std::all_of(servers_.begin(), servers_.end(),
                                   [](const auto& s) { return s->state != SState::Up; }) &&
                       std::any_of(servers_.begin(), servers_.end(), [](const auto& s) {
                         return s->exit == "finished" && s->engine && s->engine->finished();
                       });
    // And a split said so: a backup took over on Hellos that had waited (in a partition, in a
    // paused server) while their workers went back to a primary going on alone; the rounds it
    // released are refused loudly, not undone.
    const bool split = std::any_of(workers_.begin(), workers_.end(), [](const auto& w) {
      return w->exit.find("the job's state is split") != std::string::npos;
    });
    // And a federated client whose round closed without it (late, or cut off): it is told so.
    const auto passed_over = [&](const Worker& x) {
      const auto it = complete_.find({0, x.join});
      return federated() && it != complete_.end() && !it->second.second;
    };
    for (size_t w = 0; w < workers_.size(); ++w) {
      const Worker& x = *workers_[w];
      if (x.state == WState::Failed &&
          !(server_errors_ || !no_server.empty() || ended || split || passed_over(x)))
        throw Violation("worker " + std::to_string(w) + " failed: " + x.exit);
    }
    const bool passed = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
      return w->state == WState::Failed && passed_over(*w);
    });
    cause_ = server_errors_       ? "a server refused to start: " + refusal_
             : !no_server.empty() ? no_server
             : passed             ? "a client's round closed without it (late or cut off)"
             : ended              ? "the job ended while a worker was cut off"
                                  : "";
    for (size_t w = 0; w < workers_.size(); ++w) {
      const Worker& x = *workers_[w];
      if (x.state != WState::Done) continue;
      for (size_t p = 0; p < x.parts.size(); ++p) {
        const Part& pt = x.parts[p];
        const uint64_t r = async() ? pt.session->next_push() : pt.session->round();
        // (A federated client cut off after its push learns the job ended, not its round's
        // outcome: nothing of it is lost, and it keeps no state.)
        if (r < last_push(x) && !passed_over(x) && !(federated() && pt.finished))
          throw Violation("worker " + std::to_string(w) + " was told the job had finished at " +
                          std::to_string(r) + " of " + std::to_string(last_push(x)));
      }
      // Those that ended together (every worker; a federated round's clients that ran it) agree.
      const auto ran = [&](const Worker& y) {
        return y.state == WState::Done && y.parts[0].session->round() >= last_push(y);
      };
      // Passed over, or its round ran again after a restart from an older checkpoint (the
      // clients that had left hold the lost outcome: a rollback, as the workers of a restarted
      // server resynchronise to it).
      if (!ran(x) || (federated() && rerun_.count({0, x.join}))) continue;
      size_t first = 0;
      while (federated() && (workers_[first]->join != x.join || !ran(*workers_[first]))) ++first;
      if (!async() && x.full() != workers_[first]->full() && ran(*workers_[first]))
        throw Violation("workers " + std::to_string(first) + " and " + std::to_string(w) +
                        " end with different models");
      if (reference_ && whole() && (!federated() || x.join + 1 == sc_.rounds) &&
          x.full() != *reference_) {
        const auto v = x.full();
        const size_t at =
            size_t(std::mismatch(v.begin(), v.end(), reference_->begin()).first - v.begin());
        throw Violation("worker " + std::to_string(w) +
                        " ends with another model than the fault-free run (first at parameter " +
                        std::to_string(at) + " of " + std::to_string(v.size()) + ")");
      }
    }
    if (async()) {
      // The version the latest epoch reached: the pushes its server applied, each once.
      const uint64_t most = last_[0].second;
      const bool all = std::all_of(workers_.begin(), workers_.end(),
                                   [](const auto& w) { return w->state == WState::Done; });
      if (all && most != sc_.rounds * sc_.world)
        throw Violation("the asynchronous job applied " + std::to_string(most) + " pushes of " +
                        std::to_string(sc_.rounds * sc_.world));
    }
  }
  /// Every round's last outcome had all of its workers (the answers of a worker that died
  /// after its push are left out, whatever the policy).
  bool whole() const {
    return std::all_of(complete_.begin(), complete_.end(),
                       [](const auto& c) { return c.second.second; });
  }
  /// Why no server of the shard can serve every worker (empty: one can). One that can is up,
  /// holds the state (a backup that never got it does not), every round the workers have
  /// applied (a backup its primary went on without does not: it does not take over) and the
  /// latest epoch (a primary whose backup took over and was then killed sends the workers that
  /// registered there on); a backup still following takes over only once every worker has come
  /// (one that left the job holds it back), unless the job's last round is done there.
  std::string unservable(uint32_t shard) const {
    uint64_t held = 0, epoch = 0;
    std::set<uint32_t> left;
    for (const auto& w : workers_) {
      held = std::max(held, w->parts[shard].session->round());
      if (w->state == WState::Done || w->state == WState::Failed) left.insert(w->rank);
    }
    if (async()) held = seen_version_.count(shard) ? seen_version_.at(shard) : 0;
    for (const auto& o : servers_)
      if (o->shard == shard) epoch = std::max(epoch, o->max_epoch);
    // The epoch a worker promised a backup that probed it (Session::promised): that backup may
    // have taken over counting the answer, so no older server may serve the worker.
    uint64_t promised = 0;
    for (const auto& w : workers_)
      promised = std::max(promised, w->parts[shard].session->promised().value_or(0));
    std::string why;
    for (const auto& o : servers_) {
      if (o->shard != shard) continue;
      std::string w;
      if (o->state == SState::Down)
        w = "killed";
      else if (o->state == SState::Stopped && federated() && o->exit == "finished")
        return "";  // every round ran: its clients were served, or passed over (said so)
      else if (o->state == SState::Stopped)
        w = o->exit.substr(0, o->exit.find(':'));
      else if (o->engine->epoch() < epoch)
        w = "of an epoch before its backup's takeover";
      else if (o->engine->epoch() < promised && !o->replica->following())
        w = "of an epoch before the one its workers promised a probing backup";
      else if (o->engine->round() < held && !federated())  // a federated one runs it again
        w = "behind the workers";
      else if (o->replica->following() && !o->replica->backup()->synced())
        w = "without the primary's state";
      else if (o->replica->following() && !o->engine->finished() &&
               std::any_of(left.begin(), left.end(),
                           [&](uint32_t r) { return !o->replica->backup()->left().count(r); }))
        w = "waiting for every worker to take over, one has left unannounced";
      else
        return "";
      why += (why.empty() ? "" : ", ") + o->name + " " + w;
    }
    return why;
  }

  std::string states() const {
    std::ostringstream o;
    for (const auto& s : servers_)
      o << s->name << " "
        << (s->state == SState::Up     ? "up"
            : s->state == SState::Down ? "down"
                                       : "stopped")
        << (s->engine ? " round " + std::to_string(s->engine->round()) : std::string())
        << (s->replica && s->replica->following() ? " following" : "")
        << (s->exit.empty() ? "" : " (" + s->exit + ")") << "; ";
    for (const auto& w : workers_) {
      o << "worker " << w->rank << " state " << int(w->state);
      for (const auto& p : w->parts)
        o << " round " << p.session->round() << " next push " << p.session->next_push()
          << (p.session->synced() ? "" : " unsynced");
      o << (w->exit.empty() ? "" : " (" + w->exit + ")") << "; ";
    }
    return o.str();
  }

  Scenario sc_;
  std::mt19937_64 rng_;
  bool keep_;
  uint32_t shards_ = 1;
  bool replicated_ = true;
  std::vector<ShardPlan> plan_;
  std::vector<float> init_;
  std::vector<JobConfig> cfgs_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Conn> conns_;  // by the network's numbers

  Clockwork clock_;
  Network net_{clock_, rng_, sc_.duplicates,
               [this](int id, bool up, Frames f) { up ? to_server(id, f) : to_client(id, f); }};
  Clock::time_point start_ = clock_.now();
  Clock::time_point now_ = start_;
  uint64_t events_ = 0;
  uint32_t faults_ = 0;
  std::vector<std::string> trace_;
  bool server_errors_ = false;
  bool sabotaged_ = false;
  std::string refusal_;  // why a server refused to start
  std::string cause_;    // why the workers could not finish
  std::optional<Clock::time_point> workers_done_at_;

  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, std::optional<int>> acceptor_;
  std::map<std::pair<uint32_t, uint64_t>, std::set<uint64_t>> committed_;
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> primary_hash_;
  // per (shard, round): the epoch that ended it last, and whether every worker's push was in it
  std::map<std::pair<uint32_t, uint64_t>, std::pair<uint64_t, bool>> complete_;
  std::set<std::pair<uint32_t, uint64_t>>
      rerun_;  // rounds a restart from an older checkpoint ran again
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> last_;  // per shard: the latest (epoch, round)
  std::map<uint32_t, uint64_t> seen_version_;  // per shard: the latest version a worker applied
  std::optional<std::vector<float>> reference_;
};

/// The fault-free run's final model, per scenario (its rounds wait for every worker: the model
/// does not depend on timing).
std::vector<float> reference(const Scenario& s) {
  static std::mutex mu;
  static std::map<std::string, std::vector<float>> cache;
  std::lock_guard lock(mu);
  const std::string key = std::string(to_string(s.kind)) + "|" + s.spec + "|" +
                          std::to_string(s.world) + "|" + std::to_string(s.dim) + "|" +
                          std::to_string(s.rounds);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Scenario clean = s;
  clean.sabotage = Scenario::Sabotage::None;
  clean.duplicates = 0;
  World w(clean, 0, false, false);
  const Report r = w.go();
  if (!r.ok) throw Error("sim: the fault-free run failed: " + r.violation);
  return cache[key] = w.final_model();
}

}  // namespace

const std::vector<std::string>& codecs(Kind k) {
  // Bounded staleness, asynchronous and federated jobs take one-round codecs; a sharded PowerSGD
  // needs a tensor for each shard.
  static const std::vector<std::string> one_round = {"dense", "topk:k=30",
                                                     "sketch:k=20,cols=200,fetch=1"};
  static const std::vector<std::string> every = {
      "dense", "topk:k=30", "sketch:k=20,cols=200,fetch=1", "sketch:k=20,cols=200,p2=2",
      "powersgd:rank=2,layout=15x20"};
  static const std::vector<std::string> sharded = {
      "dense", "topk:k=30", "sketch:k=20,cols=200,fetch=1", "sketch:k=20,cols=200,p2=2",
      "powersgd:rank=2,layout=15x10+15x10"};
  // A federated round's clients are new (no codec state of their own).
  return k == Kind::Stale || k == Kind::Async || k == Kind::Federated ? one_round
         : k == Kind::Sharded                                         ? sharded
                                                                      : every;
}

Scenario draw(uint64_t seed, std::optional<Kind> kind) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 7);
  Scenario s;
  s.kind = kKinds[rng() % std::size(kKinds)];
  if (kind) s.kind = *kind;
  const auto& specs = codecs(s.kind);
  s.spec = specs[rng() % specs.size()];
  s.faults = 1 + uint32_t(rng() % 6);
  return s;
}

Report shrink(Scenario& s, uint64_t seed) {
  const Report first = run(s, seed, false);
  if (first.ok) return first;
  const auto head = [](const std::string& v) { return v.substr(0, v.find_first_of("0123456789")); };
  for (uint32_t k = 0; k < s.faults && k < 64; ++k) {
    Scenario t = s;
    t.skip |= uint64_t(1) << k;
    const Report r = run(t, seed, false);
    if (!r.ok && head(r.violation) == head(first.violation)) s = t;
  }
  return run(s, seed, true);
}

Report run(const Scenario& s, uint64_t seed, bool keep_trace) {
  World w(s, seed, keep_trace, true);
  if (s.kind == Kind::Rounds || s.kind == Kind::Sharded ||
      (s.kind == Kind::Restart && s.spec == "dense") || s.kind == Kind::Federated)
    w.expect(reference(s));
  return w.go();
}

}  // namespace sketchsgd::ps::sim
