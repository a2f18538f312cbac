// The simulated job's nodes: servers and backups, workers and their connections; a run's loop.
#include "sim/world.hpp"

namespace sketchsgd::ps::sim {

World::World(const Scenario& s, uint64_t seed, bool keep_trace, bool faults)
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
        c.mode = SyncMode{{Policy::Quorum, s.world - 1}};
        break;
      case Kind::Stale:
        c.mode = SyncMode{.staleness = 1};
        break;
      case Kind::Async:
        c.mode = AsyncMode{};
        c.max_rounds = s.rounds * s.world;
        break;
      case Kind::Restart:
        c.checkpoint_every = 1;
        break;
      case Kind::Federated:
        c.mode = FederatedMode{{Policy::Quorum, s.world - 1}, 3 * s.world};
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
           sample_clients(cfgs_[0].population(), s.world, cfgs_[0].sample_seed(), round))
        add_worker(id, round);
  else
    for (uint32_t r = 0; r < s.world; ++r) add_worker(r);
  if (faults) schedule_faults(seed);
}

Report World::go() {
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
  rep.failed_workers = uint32_t(std::count_if(
      workers_.begin(), workers_.end(), [](const auto& w) { return w->state == WState::Failed; }));
  rep.sim_seconds = ms(now_ - start_) / 1000;
  if (!rep.finished) rep.ended_by = cause_;
  return rep;
}

std::vector<float> World::final_model() const {
  return workers_.empty() ? std::vector<float>{} : workers_.back()->full();
}

void World::note(const std::string& s) {
  if (keep_) trace_.push_back(std::to_string(int64_t(ms(now_ - start_))) + " ms: " + s);
}

void World::fault(const std::string& s) {
  ++faults_;
  trace_.push_back(std::to_string(int64_t(ms(now_ - start_))) + " ms: FAULT " + s);
}

void World::add_server(uint32_t shard, bool backup) {
  auto s = std::make_unique<Server>();
  s->shard = shard;
  s->backup = backup;
  s->name = std::string(backup ? "backup" : "primary") +
            (shards_ > 1 ? std::to_string(shard) : std::string());
  if (!replicated_) s->name = "server";
  if (backup) s->primary = int(servers_.size()) - 1;
  servers_.push_back(std::move(s));
}

void World::add_worker(uint32_t rank, uint64_t join) {
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
    o.population = cfgs_[sh].population();
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

int World::open(bool from_server, int client, int part, int server) {
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

void World::start_server(int i, bool restart) {
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

void World::up_send(int i, Frames f) {
  Server& s = *servers_[i];
  s.last_up_send = now_;
  send(s.up, true, std::move(f));
}

void World::write(int i, Bytes b) {
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

void World::stop(int i, const std::string& why, bool clear_error) {
  Server& s = *servers_[i];
  s.state = SState::Stopped;
  s.exit = why;
  if (clear_error) server_errors_ = true;
  note(s.name + " stopped: " + why);
  // What it sent still goes out (the socket's linger); nothing more is read.
  net_.drop(i, false);
}

void World::crash(int i) {
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

void World::route(int i, std::vector<Outgoing>& out) {
  Server& s = *servers_[i];
  for (auto& o : out) {
    const auto it = s.peers.find(o.peer);
    if (it != s.peers.end()) send(it->second, false, std::move(o.frames));
  }
  out.clear();
}

void World::after_server(int i, std::vector<Outgoing>& out, std::vector<Frames>& up) {
  Server& s = *servers_[i];
  route(i, out);
  for (auto& f : up)
    if (s.up >= 0) up_send(i, std::move(f));
  up.clear();
  if (s.replica && s.replica->deposed()) stop(i, "deposed: " + *s.replica->deposed(), false);
}

void World::to_server(int id, const Frames& f) {
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

void World::tick_server(int i, uint32_t inc) {
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

void World::from_primary(int id, const Frames& f) {
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

void World::accepted(int i, const RoundMetrics& m) {
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

void World::start_worker(int w) {
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

void World::flush(int w, int p, Session::Outbox& out) {
  Part& pt = workers_[w]->parts[p];
  for (auto& f : out) {
    send(pt.conn, true, std::move(f));
    pt.last_send = now_;
  }
  out.clear();
  pt.alive.heartbeat = pt.session->heartbeat();
  if (pt.session->take_elsewhere()) pt.elsewhere = true;
}

void World::fail(int w, const std::string& why) {
  Worker& x = *workers_[w];
  if (x.state == WState::Done || x.state == WState::Failed) return;
  x.state = WState::Failed;
  x.exit = why;
  note("worker " + std::to_string(w) + " failed: " + why);
  for (auto& p : x.parts) close(p.conn);
}

void World::to_client(int id, const Frames& f) {
  Conn& c = conns_[id];
  if (c.from_server) return from_primary(id, f);
  Worker& x = *workers_[c.client];
  Part& pt = x.parts[c.part];
  if (pt.conn != id || x.state == WState::Done || x.state == WState::Failed || pt.finished) return;
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
    if (sc_.sabotage == Scenario::Sabotage::Corrupt && !sabotaged_ && c.client == 0 && pt.joined &&
        !async()) {
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

void World::step(int w) {
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
      y.parts[p].session->push(std::span<const float>(g).subspan(y.plan[p].id.begin, y.plan[p].dim),
                               out, res);
      flush(w, int(p), out);
    }
    note("worker " + std::to_string(w) + " pushed " +
         std::to_string(y.parts[0].session->next_push() - 1));
    step(w);
  });
}

void World::tick_worker(int w) {
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

}  // namespace sketchsgd::ps::sim
