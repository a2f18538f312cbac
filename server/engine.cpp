#include <sketchsgd/server/engine.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::ps {
namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string ranks_text(const std::vector<uint32_t>& r) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < r.size(); ++i) os << (i ? "," : "") << r[i];
  os << ']';
  return os.str();
}

/// Whether a pushed message names this rank and round (the aggregator validates the whole
/// message, checksum included, right after).
bool from(std::span<const uint8_t> m, uint32_t rank, uint64_t round) {
  const Origin o = peek_origin(m);
  return o.sender == rank && o.round == round;
}

}  // namespace

Policy parse_policy(std::string_view s) {
  if (s == "wait") return Policy::Wait;
  if (s == "quorum") return Policy::Quorum;
  if (s == "abort") return Policy::Abort;
  throw InvalidArgument("policy must be wait, quorum or abort, got '" + std::string(s) + "'");
}

std::string_view to_string(Policy p) {
  switch (p) {
    case Policy::Wait:
      return "wait";
    case Policy::Quorum:
      return "quorum";
    case Policy::Abort:
      return "abort";
  }
  return "unknown";
}

void JobConfig::validate() const {
  SKETCHSGD_REQUIRE(world >= 1 && world <= 65536, InvalidArgument,
                    "world size must be in [1, 65536], got ", world);
  SKETCHSGD_REQUIRE(dim >= 1, InvalidArgument, "dim must be ≥ 1");
  SKETCHSGD_REQUIRE(std::isfinite(lr), InvalidArgument, "learning rate must be finite, got ", lr);
  SKETCHSGD_REQUIRE(min_workers <= world, InvalidArgument, "min_workers ", min_workers,
                    " exceeds the world size ", world);
  SKETCHSGD_REQUIRE(deadline.count() >= 1, InvalidArgument, "deadline must be ≥ 1 ms");
  SKETCHSGD_REQUIRE(heartbeat.count() >= 1, InvalidArgument, "heartbeat must be ≥ 1 ms");
  SKETCHSGD_REQUIRE(dead_after >= 1, InvalidArgument, "dead_after must be ≥ 1");
  SKETCHSGD_REQUIRE(staleness <= 64, InvalidArgument, "staleness must be ≤ 64 rounds, got ",
                    staleness);
  SKETCHSGD_REQUIRE(population == 0 || population >= world, InvalidArgument, "population ",
                    population, " is smaller than the ", world, " clients sampled per round");
  SKETCHSGD_REQUIRE(population == 0 || staleness == 0, InvalidArgument,
                    "a federated job's clients leave after their round: no bounded staleness");
  SKETCHSGD_REQUIRE(shard.count >= 1 && shard.index < shard.count, InvalidArgument, "shard ",
                    shard.index, " of ", shard.count);
  SKETCHSGD_REQUIRE(shard.model_dim == 0 ||
                        (shard.begin <= shard.model_dim && dim <= shard.model_dim - shard.begin),
                    InvalidArgument, shard.describe(dim), ": the range leaves the model");
  SKETCHSGD_REQUIRE(
      shard.count > 1 || (shard.begin == 0 && (shard.model_dim == 0 || shard.model_dim == dim)),
      InvalidArgument, "one server holds the whole model: ", shard.describe(dim));
  SKETCHSGD_REQUIRE(!async || (population == 0 && staleness == 0 && policy == Policy::Wait),
                    InvalidArgument,
                    "an asynchronous job has no rounds: no federated population, bounded "
                    "staleness or round policy");
  SKETCHSGD_REQUIRE(async || max_age == 0, InvalidArgument,
                    "max_age bounds the pushes of asynchronous jobs only");
  outer.validate();
}

Engine::Engine(JobConfig cfg, Hooks hooks)
    : cfg_(std::move(cfg)), hooks_(std::move(hooks)), rng_(std::random_device{}()) {
  // Session tokens differ across restarts: a capture of an earlier server's traffic is refused.
  rng_.seed((uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^
            uint64_t(Clock::now().time_since_epoch().count()));
  cfg_.validate();
  if (cfg_.min_workers == 0) cfg_.min_workers = cfg_.world;
  if (cfg_.shard.model_dim == 0) cfg_.shard.model_dim = cfg_.dim;
  codec_ = make_compressor(cfg_.spec, cfg_.dim);
  cfg_.spec = codec_->spec();
  SKETCHSGD_REQUIRE(cfg_.staleness == 0 || !codec_->two_rounds(), InvalidArgument,
                    "bounded staleness needs a one-round codec: ", cfg_.spec,
                    " queries worker state that has moved on");
  SKETCHSGD_REQUIRE(!cfg_.async || !codec_->two_rounds(), InvalidArgument,
                    "an asynchronous job needs a one-round codec: ", cfg_.spec,
                    " queries its workers in a second round");
  agg_ = make_aggregator();
  outer_ = std::make_unique<OuterStep>(cfg_.outer, cfg_.dim, Device::cpu());
  roster_ = Roster(cfg_.world, cfg_.population, cfg_.sample_seed);
  pending_pull_.assign(cfg_.world, false);
  reset_round();
}

std::unique_ptr<Aggregator> Engine::make_aggregator() const {
  // The aggregator keeps only the codec's identity and limits: one made by a codec on the chosen
  // device runs there, while codec_ (host) applies updates to the host model.
  if (cfg_.device == codec_->device()) return codec_->make_aggregator(cfg_.world);
  return make_compressor(cfg_.spec, cfg_.dim, cfg_.device)->make_aggregator(cfg_.world);
}

uint64_t Engine::max_frame_bytes() const {
  return ps::max_frame_bytes(*codec_);
}

uint32_t Engine::live_workers() const {
  return roster_.live();
}

uint32_t Engine::awaited_workers() const {
  uint32_t n = 0;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    const Worker& w = roster_[r];
    const bool last = !federated() && !cfg_.async && r < last_pushed_.size() && last_pushed_[r];
    n += w.registered && !w.left && (w.alive || last);
  }
  return n;
}

void Engine::restore(const Checkpoint& c) {
  SKETCHSGD_REQUIRE(c.job == cfg_.job, ConfigMismatch, "checkpoint of job ", c.job,
                    ", server runs job ", cfg_.job);
  // Compared in today's canonical form: a checkpoint written by an older version names the same
  // codec in older words (e.g. hashing=0 for hashing=random).
  std::string spec = c.spec;
  try {
    spec = make_compressor(c.spec, cfg_.dim)->spec();
  } catch (const Error&) {
  }
  SKETCHSGD_REQUIRE(spec == cfg_.spec, ConfigMismatch, "checkpoint of codec ", c.spec,
                    ", server runs ", cfg_.spec);
  SKETCHSGD_REQUIRE(c.params.size() == cfg_.dim, ConfigMismatch, "checkpoint of dim ",
                    c.params.size(), ", server runs dim ", cfg_.dim);
  // An older checkpoint names no shard: it held a whole model.
  const ShardId shard = c.shard.model_dim ? c.shard : ShardId{0, 1, 0, c.params.size()};
  SKETCHSGD_REQUIRE(shard == cfg_.shard, ConfigMismatch, "checkpoint of ",
                    shard.describe(c.params.size()), ", server is ", cfg_.shard.describe(cfg_.dim));
  // Another optimizer's state is a mismatch; a state of a wrong length, corruption (load's).
  const size_t vectors = c.outer.size() / std::max<size_t>(cfg_.dim, 1);
  SKETCHSGD_REQUIRE(c.outer.size() % std::max<size_t>(cfg_.dim, 1) != 0 || vectors == 0 ||
                        vectors == cfg_.outer.buffers(),
                    ConfigMismatch, "checkpoint with ", vectors,
                    " optimizer state vectors, the server's ", to_string(cfg_.outer.kind),
                    " keeps ", cfg_.outer.buffers());
  SKETCHSGD_REQUIRE(c.outer.empty() || cfg_.outer.stateful(), ConfigMismatch,
                    "checkpoint with optimizer state, the server runs plain SGD");
  auto agg = make_aggregator();  // on the configured device, as at start
  agg->load_state(c.codec_state);
  outer_->load(c.outer, c.outer_steps);  // validates; empty (an older checkpoint): zero
  agg_ = std::move(agg);
  model_ = c.params;
  snapshot_ = Frame();
  round_ = c.round;
  roster_.forget_waiting();  // check-ins were for the round the server was at
  // Asynchronous jobs: the pushes numbered by an earlier state may be lost; each worker's next
  // Hello says where it is.
  for (Worker& w : roster_.workers()) w.numbered = false;
  early_.clear();
  last_outcome_.clear();
  reset_round();
}

std::vector<uint64_t> Engine::next_pushes() const {
  std::vector<uint64_t> v;
  if (!cfg_.async) return v;
  for (uint32_t r = 0; r < cfg_.world; ++r) v.push_back(next_push(r).value_or(kUnknownPush));
  return v;
}

void Engine::resume(const std::vector<Bytes>& outcome, const std::vector<uint64_t>& pushes) {
  Frames f;
  if (!outcome.empty()) {
    const Envelope e = decode_envelope(outcome[0], outcome.size() - 1);
    SKETCHSGD_REQUIRE((e.type == Type::Update || e.type == Type::Abort) && round_ > 0 &&
                          e.round == round_ - 1 && e.job == cfg_.job,
                      WireError, "resume: an outcome (", to_string(e.type), " of round ", e.round,
                      ") that is not round ", round_, " - 1's");
    for (const Bytes& b : outcome) f.push_back(Frame::own(b));
  }
  SKETCHSGD_REQUIRE(pushes.empty() || (cfg_.async && pushes.size() == cfg_.world), WireError,
                    "resume: ", pushes.size(), " push numbers for a job of ", cfg_.world,
                    cfg_.async ? " workers" : " workers in rounds");
  last_outcome_ = std::move(f);
  for (uint32_t r = 0; r < pushes.size(); ++r) {
    if (pushes[r] == kUnknownPush) continue;
    roster_[r].numbered = true;
    roster_[r].next_push = pushes[r];
  }
}

Checkpoint Engine::checkpoint() const {
  return Checkpoint{cfg_.job,           round_,         cfg_.spec,  model_,
                    agg_->save_state(), outer_->save(), cfg_.shard, outer_->steps()};
}

void Engine::start_phase(MessageKind kind) {
  phase_ = kind;
  held_.assign(cfg_.world, Frame());
  cursor_ = 0;
}

void Engine::absorb_in_order(bool closing) {
  const bool gradient = phase_ == MessageKind::Gradient;
  auto& got = gradient ? pushed_ : answered_;
  SKETCHSGD_ASSERT(held_.size() == cfg_.world && cursor_ <= cfg_.world, "held ", held_.size(),
                   ", cursor ", cursor_, ", world ", cfg_.world);
  for (; cursor_ < cfg_.world; ++cursor_) {
    const uint32_t r = cursor_;
    if (held_[r].size() == 0) {
      const bool expected = gradient || pushed_[r];
      if (expected && !closing) return;
      continue;
    }
    const auto t0 = Clock::now();
    try {
      agg_->add(held_[r].bytes());
    } catch (const Error& e) {
      got[r] = false;  // a corrupt message does not count as a contribution
      drop(roster_[r].peer, "rank " + std::to_string(r) + ": " + e.what());
    }
    merge_ms_ += ms_between(t0, Clock::now());
    held_[r] = Frame();
  }
}

void Engine::reset_round() {
  if (std::find(pushed_.begin(), pushed_.end(), true) != pushed_.end()) last_pushed_ = pushed_;
  pushed_.assign(cfg_.world, false);
  answered_.assign(cfg_.world, false);
  query_ = Frame();
  start_phase(MessageKind::Gradient);
  round_start_.reset();
  metrics_ = RoundMetrics{};
  metrics_.bytes_up.assign(cfg_.world, 0);
  metrics_.dense_bytes = cfg_.dim * 4 + kHeaderBytes;
  merge_ms_ = 0;
  if (federated()) roster_.sample(round_);
}

void Engine::seat_waiting(std::vector<Outgoing>& out) {
  for (const auto& [r, behind] : roster_.seat_waiting()) {
    if (behind)
      resend_outcome(r, round_ - 1, out);  // as a fixed worker gets it
    else
      on_pull(r, out);
  }
}

// ---- sending
// --------------------------------------------------------------------------------------

void Engine::send(uint32_t rank, Frames frames, std::vector<Outgoing>& out) const {
  out.push_back(Outgoing{roster_[rank].peer, std::move(frames)});
}

namespace {
Frame envelope(Type t, uint64_t job, uint64_t round, uint32_t rank, uint64_t session) {
  return Frame::own(encode(Envelope{t, job, round, rank, 0, session}));
}
}  // namespace

Frame Engine::to(uint32_t rank, Type t, uint64_t round) const {
  return envelope(t, cfg_.job, round, rank, roster_[rank].session);
}

void Engine::finished_reply(const PeerId& peer, const Envelope& e, std::vector<Outgoing>& out,
                            std::string why) {
  ++late_;
  if (why.empty())
    why = "job " + std::to_string(cfg_.job) + " finished at round " + std::to_string(round_) +
          " (its last round)";
  out.push_back(Outgoing{peer,
                         {envelope(Type::Finished, cfg_.job, round_, e.rank, e.session),
                          Frame::own(encode_text(why))}});
}

void Engine::refuse(const PeerId& peer, const Envelope& e, bool retry, const std::string& why,
                    std::vector<Outgoing>& out) {
  hooks_.log("refused " + std::string(to_string(e.type)) + " from rank " + std::to_string(e.rank) +
             ": " + why);
  ++rejected_;
  out.push_back(Outgoing{peer,
                         {envelope(Type::Refuse, cfg_.job, round_, e.rank, e.session),
                          Frame::own(encode(RefuseInfo{retry, e.type, why.substr(0, kMaxText)}))}});
}

void Engine::drop(const PeerId&, const std::string& why) {
  ++rejected_;
  hooks_.log("dropped message: " + why);
}

Frames Engine::model_frames() const {
  // One copy per model version, shared by every Pull until the model changes.
  if (snapshot_.size() == 0) {
    // The parameters, the optimizer's state (none for plain SGD), Adam's step count.
    const std::vector<float> m = outer_->save();
    const bool steps = cfg_.outer.kind == OuterKind::Adam;
    Bytes b((model_.size() + m.size()) * 4 + (steps ? 8 : 0));
    std::memcpy(b.data(), model_.data(), model_.size() * 4);
    if (!m.empty()) std::memcpy(b.data() + model_.size() * 4, m.data(), m.size() * 4);
    if (steps) {
      const uint64_t t = outer_->steps();
      std::memcpy(b.data() + (model_.size() + m.size()) * 4, &t, 8);
    }
    snapshot_ = Frame::own(std::move(b));
  }
  return {Frame(), snapshot_};
}

// ---- receiving
// ------------------------------------------------------------------------------------

void Engine::handle(const PeerId& peer, const Frames& frames, Clock::time_point now,
                    std::vector<Outgoing>& out, std::string_view user) {
  try {
    SKETCHSGD_REQUIRE(!frames.empty(), WireError, "message without frames");
    refuse_other_version(peer, frames, out);
    const Envelope e = decode_envelope(frames[0].bytes(), frames.size() - 1);
    if (e.job != cfg_.job) {
      if (e.type == Type::Hello)
        refuse(peer, e, false,
               "job id " + std::to_string(e.job) + ", server runs job " + std::to_string(cfg_.job),
               out);
      else
        drop(peer, "job id " + std::to_string(e.job) + " is not this job's");
      return;
    }
    if (e.type == Type::Hello) {
      // Also after the last round: a late worker may still pull the final model; its first push
      // is answered Finished.
      on_hello(peer, e, frames, now, out, user);
      return;
    }
    const auto held = roster_.rank_of(peer);
    if (!held) {
      if (const auto slot = roster_.waiting_slot(peer)) return on_waiting(*slot, e, now);
      if (e.type == Type::Bye) return;
      if (finished() && e.type == Type::Push) return finished_reply(peer, e, out);
      // A worker whose server restarted learns here that it must register again.
      refuse(peer, e, true, "not registered (send hello first)", out);
      return;
    }
    const uint32_t rank = *held;
    SKETCHSGD_REQUIRE(e.rank == rank, ProtocolError, "connection of rank ", rank,
                      " sent a message as rank ", e.rank);
    Worker& w = roster_[rank];
    if (e.session != w.session) {
      // Only this registration's token counts: a capture replayed from this connection after a
      // re-registration, or traffic of an older registration, changes nothing. (A heartbeat sent
      // while a re-registration crossed it is no replay: ignored, not counted.)
      if (e.type == Type::Heartbeat) return;
      ++replays_;
      drop(peer, "rank " + std::to_string(rank) + ": session token of another registration");
      return;
    }
    w.last_seen = now;
    if (!w.alive) {
      w.alive = true;
      hooks_.log("rank " + std::to_string(rank) + " is alive again");
    }
    switch (e.type) {
      case Type::Init:
        on_init(rank, e.round, frames, out);
        break;
      case Type::Pull:
        on_pull(rank, out);
        break;
      case Type::Push:
        on_push(rank, e, frames, now, out);
        break;
      case Type::Answer:
        on_answer(rank, e, frames, now, out);
        break;
      case Type::Heartbeat:
        break;  // liveness noted above; the transport echoes it
      case Type::Bye:
        w.alive = false;
        w.left = true;
        hooks_.log("rank " + std::to_string(rank) + " left");
        break;
      default:
        throw ProtocolError(std::string(to_string(e.type)) + " is a server-to-worker message");
    }
    progress(now, out);
  } catch (const Error& ex) {
    drop(peer, ex.what());
  }
}

void Engine::refuse_other_version(const PeerId& peer, const Frames& frames,
                                  std::vector<Outgoing>& out) {
  // A Hello of another protocol version gets a reason (in this version's format, which keeps the
  // magic and the version field where they are) instead of silence.
  const auto hello = peek_foreign_hello(frames[0].bytes());
  if (!hello) return;
  Envelope e{Type::Hello, cfg_.job, 0, hello->rank, 0};
  refuse(peer, e, false,
         "protocol version " + std::to_string(hello->version) + ", this server speaks " +
             std::to_string(kProtocolVersion),
         out);
}

void Engine::on_hello(const PeerId& peer, const Envelope& e, const Frames& f, Clock::time_point now,
                      std::vector<Outgoing>& out, std::string_view user) {
  const HelloInfo h = decode_hello(f[1].bytes());
  auto mismatch = [&](const std::string& why) { refuse(peer, e, false, why, out); };
  if (cfg_.authenticated && user != std::to_string(e.rank))
    return mismatch("this worker's key is bound to rank " +
                    (user.empty() ? std::string("none") : std::string(user)) + ", not rank " +
                    std::to_string(e.rank));
  if (h.world != cfg_.world)
    return mismatch("world size " + std::to_string(h.world) + ", the job has " +
                    std::to_string(cfg_.world) + (federated() ? " clients a round" : " workers"));
  if (h.population != cfg_.population)
    return mismatch("population " + std::to_string(h.population) + ", the job has " +
                    (federated() ? std::to_string(cfg_.population) + " clients"
                                 : std::string("fixed workers (population 0)")));
  if (!federated() && e.rank >= cfg_.world)
    return mismatch("rank " + std::to_string(e.rank) + " outside [0, " +
                    std::to_string(cfg_.world) + ")");
  ShardId shard = h.shard;
  if (shard.model_dim == 0) shard.model_dim = h.dim;  // a whole model's
  const auto other_shard = [&] {
    return mismatch(shard.describe(h.dim) + ", this server is " + cfg_.shard.describe(cfg_.dim));
  };
  if (shard.count != cfg_.shard.count || shard.index != cfg_.shard.index) return other_shard();
  if (h.dim != cfg_.dim)
    return mismatch("dim " + std::to_string(h.dim) + ", the job has dim " +
                    std::to_string(cfg_.dim));
  if (shard != cfg_.shard) return other_shard();
  if (h.spec != cfg_.spec)
    return mismatch("codec '" + h.spec + "', the job runs '" + cfg_.spec + "'");
  if (h.weight != 1.0f && !cfg_.async)
    return mismatch("weight " + std::to_string(h.weight) +
                    ": a round job averages its pushes alike (weights are for --mode async)");
  if (h.epoch > epoch_) {
    // The worker registered with a server of a later epoch: perhaps a backup took over from this
    // one, perhaps the field is forged. A worker's word is hearsay, so it deposes nothing (only
    // the backup's Deposed, with the token of this server's Sync, does: replication.hpp); the
    // worker is sent on to the replica that serves it.
    const std::string why = "this server is at epoch " + std::to_string(epoch_) +
                            ", the worker registered with epoch " + std::to_string(h.epoch) +
                            " elsewhere: another replica serves the job";
    hooks_.log("refused Hello from rank " + std::to_string(e.rank) + ": " + why);
    ++rejected_;
    RefuseInfo r{true, Type::Hello, why};
    r.elsewhere = true;
    out.push_back(Outgoing{
        peer,
        {envelope(Type::Refuse, cfg_.job, round_, e.rank, e.session), Frame::own(encode(r))}});
    return;
  }
  uint32_t rank = e.rank;
  bool ahead = false;
  if (federated()) {
    const auto slot = slot_of(peer, e, out);
    if (!slot) return;
    rank = slot->index;
    ahead = slot->ahead;
  }
  // One connection, one registration (a client checked in ahead is not yet any rank).
  const auto held = roster_.rank_of(peer);
  if (held && (ahead || *held != rank))
    return mismatch("this connection is already rank " + std::to_string(*held) + " of round " +
                    std::to_string(round_));
  const auto waits = roster_.waiting_slot(peer);
  if (waits && (!ahead || *waits != rank))
    return mismatch("this connection is already slot " + std::to_string(*waits) + " of round " +
                    std::to_string(round_ + 1));

  const Worker& before = ahead ? roster_.waiting(rank) : roster_[rank];
  if (before.registered && before.peer != peer) {
    if (before.alive && now - before.last_seen < cfg_.heartbeat * cfg_.dead_after)
      return refuse(peer, e, true, "rank " + std::to_string(rank) + " is held by a live connection",
                    out);
    hooks_.log("rank " + std::to_string(rank) + " re-registered on a new connection");
  } else if (!before.registered && !federated()) {
    hooks_.log("rank " + std::to_string(rank) + " registered");
  }
  Worker& w = roster_.hold(peer, rank, ahead);
  w.session = 0;
  while (w.session == 0) w.session = rng_();  // 0 marks "no registration" in a Hello
  w.registered = true;
  w.left = false;
  w.alive = true;
  w.last_seen = now;
  w.behind = false;
  w.weight = h.weight;
  if (cfg_.async && !w.numbered) {
    // Its Hello names the push it is at: a server that knows nothing of it (a new or restored
    // one) takes it at its word; one that does keeps its own count, so a push it has applied
    // already is answered again rather than applied twice.
    w.numbered = true;
    w.next_push = e.round;
    w.base = round_;
    w.own = 0;
    w.ack.clear();
  }
  WelcomeInfo info{uint8_t(has_model()), uint32_t(cfg_.heartbeat.count()), cfg_.staleness};
  info.epoch = epoch_;
  info.async = uint8_t(cfg_.async);
  with_outer(info, cfg_.outer);
  out.push_back(Outgoing{peer,
                         {envelope(Type::Welcome, cfg_.job, round_ + ahead, rank, w.session),
                          Frame::own(encode(info))}});
  // A federated client comes for the model: it follows the Welcome (a round trip saved a client).
  // Checked in ahead, it is this round's model, which the round's outcome brings up to date when
  // the client's round opens, so the download is off that round's path.
  if (federated() && !ahead) on_pull(rank, out);
  if (ahead && has_model()) {
    Frames fr = model_frames();
    fr[0] = envelope(Type::Model, cfg_.job, round_, rank, w.session);
    out.push_back(Outgoing{peer, std::move(fr)});
    w.behind = true;
  }
}

void Engine::on_waiting(uint32_t slot, const Envelope& e, Clock::time_point now) {
  Worker& w = roster_.waiting(slot);
  SKETCHSGD_REQUIRE(e.rank == slot, ProtocolError, "connection of slot ", slot, " of round ",
                    round_ + 1, " sent a message as rank ", e.rank);
  if (e.session != w.session) {
    if (e.type == Type::Heartbeat) return;
    ++replays_;
    return drop(w.peer, "slot " + std::to_string(slot) + " of round " + std::to_string(round_ + 1) +
                            ": session token of another registration");
  }
  w.last_seen = now;
  w.alive = true;
  if (e.type == Type::Heartbeat) return;
  if (e.type == Type::Bye) {  // it will not come after all: its slot may be taken again
    hooks_.log("client in slot " + std::to_string(slot) + " of round " +
               std::to_string(round_ + 1) + " left before its round");
    roster_.leave_waiting(slot);
    return;
  }
  throw ProtocolError(std::string(to_string(e.type)) + " from slot " + std::to_string(slot) +
                      " of round " + std::to_string(round_ + 1) + " before its round opened");
}

std::optional<Engine::Slot> Engine::slot_of(const PeerId& peer, const Envelope& e,
                                            std::vector<Outgoing>& out) {
  const std::string client = "client " + std::to_string(e.rank);
  const std::string at = " (the job is at round " + std::to_string(round_) + ")";
  if (e.rank >= cfg_.population) {
    refuse(peer, e, false,
           client + " outside the population [0, " + std::to_string(cfg_.population) + ")", out);
  } else if (finished()) {
    finished_reply(peer, e, out);
  } else if (e.round < round_) {
    refuse(peer, e, false,
           client + " came for round " + std::to_string(e.round) + ", which is over" + at, out);
  } else if (cfg_.max_rounds && e.round >= cfg_.max_rounds) {
    finished_reply(peer, e, out,
                   "job " + std::to_string(cfg_.job) + " ends before round " +
                       std::to_string(e.round) + " (its last is " +
                       std::to_string(cfg_.max_rounds - 1) + ")");
  } else if (e.round > round_ + 1) {
    refuse(peer, e, true, "round " + std::to_string(e.round) + " is not open yet" + at, out);
  } else {
    const bool ahead = e.round > round_;
    if (const auto slot = roster_.slot_of(e.rank, ahead)) return Slot{*slot, ahead};
    refuse(peer, e, false, client + " is not sampled in round " + std::to_string(e.round), out);
  }
  return std::nullopt;
}

void Engine::save(bool now) {
  if (hooks_.checkpoint && cfg_.checkpoint_every &&
      (now || round_ % cfg_.checkpoint_every == 0 || finished()))
    hooks_.checkpoint(checkpoint(), finished());
}

void Engine::on_init(uint32_t rank, uint64_t round, const Frames& f, std::vector<Outgoing>& out) {
  SKETCHSGD_REQUIRE(rank == 0 || federated(), ProtocolError, "init from rank ", rank,
                    " (only rank 0 initialises)");
  if (has_model())
    return;  // a second init (rank 0 restarted before the first pull) changes nothing
  const auto b = f[1].bytes();
  SKETCHSGD_REQUIRE(b.size() == cfg_.dim * 4, WireError, "init of ", b.size(), " bytes for dim ",
                    cfg_.dim);
  std::vector<float> p(cfg_.dim);
  std::memcpy(p.data(), b.data(), b.size());
  const size_t bad = kernels::cpu::find_nonfinite(p.data(), p.size());
  SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, "init: non-finite parameter at ", bad);
  model_ = std::move(p);
  snapshot_ = Frame();
  // A server restarted without a checkpoint gets rank 0's current model: the job goes on from
  // rank 0's round, not from round 0 again (which would run the rounds before it twice).
  // (An asynchronous worker's round counts its own pushes; a federated client's is its round.)
  if (!cfg_.async && !federated() && round > round_ && early_.empty()) {
    round_ = cfg_.max_rounds ? std::min(round, cfg_.max_rounds) : round;
    hooks_.log("model initialised by rank 0 at its round " + std::to_string(round_) + " (" +
               std::to_string(cfg_.dim) + " parameters)");
  } else {
    hooks_.log("model initialised by rank 0 (" + std::to_string(cfg_.dim) + " parameters)");
  }
  // The initial model is checkpointed as a round's end is: a server killed before its first
  // round ended restarts with it rather than wait for an Init (a federated job's next clients
  // hold none).
  save(true);
  for (uint32_t r = 0; r < cfg_.world; ++r)
    if (pending_pull_[r]) on_pull(r, out);
}

void Engine::on_pull(uint32_t rank, std::vector<Outgoing>& out) {
  if (!has_model()) {
    pending_pull_[rank] = true;
    return;
  }
  pending_pull_[rank] = false;
  Frames fr = model_frames();
  if (cfg_.async) {
    // Its pushes from now on are computed on this version (its own updates counted apart).
    Worker& w = roster_[rank];
    w.base = round_;
    w.own = 0;
    fr[0] = to(rank, Type::Model, w.next_push);
  } else {
    fr[0] = to(rank, Type::Model, round_);
  }
  send(rank, std::move(fr), out);
}

void Engine::on_push(uint32_t rank, const Envelope& e, const Frames& f, Clock::time_point now,
                     std::vector<Outgoing>& out) {
  SKETCHSGD_REQUIRE(has_model(), ProtocolError, "push from rank ", rank,
                    " before the model exists");
  if (cfg_.async) return on_async_push(rank, e, f[1].bytes(), out);
  if (e.round < round_) {
    // Idempotent: a worker that missed the outcome of the previous round gets it again; older
    // pushes are ignored.
    if (e.round + 1 == round_ && !last_outcome_.empty()) {
      resend_outcome(rank, e.round, out);
    } else {
      on_pull(rank, out);  // further behind (outcomes lost): resynchronise with the model
    }
    hooks_.log("stale push of round " + std::to_string(e.round) + " from rank " +
               std::to_string(rank) + " (now at " + std::to_string(round_) + ")");
    return;
  }
  if (finished()) return finished_reply(roster_[rank].peer, e, out);
  if (e.round > round_ && e.round <= round_ + cfg_.staleness) {
    const auto msg = f[1].bytes();
    SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "push of rank ", rank, " round ",
                      e.round, " carries a message with another sender or round");
    auto& slot = early_[e.round];
    slot.resize(cfg_.world);
    SKETCHSGD_REQUIRE(slot[rank].size() == 0, ProtocolError, "duplicate push from rank ", rank,
                      " for round ", e.round);
    slot[rank] = f[1];  // merged when its round starts
    return;
  }
  if (e.round > round_) {
    // Only after a server restart from an older checkpoint: resynchronise the worker.
    hooks_.log("rank " + std::to_string(rank) + " pushed round " + std::to_string(e.round) +
               " ahead of the server's " + std::to_string(round_) + ": sending the model");
    on_pull(rank, out);
    return;
  }
  if (phase_ == MessageKind::Answer && pushed_[rank] && !answered_[rank]) {
    // A queried rank that pushes its round again has registered again: the Query went to its
    // old connection and was lost (or its Answer was). It is asked again (an answer changes no
    // state of the worker's codec, so a second one is harmless); else the round would wait for
    // an answer that never comes (a chaos soak's stalled two-round jobs).
    send(rank, {to(rank, Type::Query, round_), query_}, out);
    return;
  }
  SKETCHSGD_REQUIRE(phase_ == MessageKind::Gradient, ProtocolError, "late push from rank ", rank,
                    ": round ", round_, " is in its second phase");
  const auto msg = f[1].bytes();
  SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "push of rank ", rank, " round ",
                    e.round, " carries a message with another sender or round");
  SKETCHSGD_REQUIRE(!pushed_[rank], ProtocolError, "duplicate push from rank ", rank, " in round ",
                    e.round);
  // Ranks below the cursor are merged or skipped already (e.g. a corrupt push was dropped).
  SKETCHSGD_REQUIRE(rank >= cursor_, ProtocolError, "push from rank ", rank, " in round ", e.round,
                    " arrived after its turn to merge");
  if (!round_start_) round_start_ = now;
  if (std::none_of(pushed_.begin(), pushed_.end(), [](bool b) { return b; })) phase_start_ = now;
  pushed_[rank] = true;
  held_[rank] = f[1];
  metrics_.bytes_up[rank] += msg.size();
  absorb_in_order(false);
}

void Engine::send_ack(uint32_t rank, std::vector<Outgoing>& out) const {
  const Worker& w = roster_[rank];
  Frames fr = w.ack;
  fr[0] = to(rank, decode_envelope(fr[0].bytes(), fr.size() - 1).type, w.next_push - 1);
  send(rank, std::move(fr), out);
}

void Engine::on_async_push(uint32_t rank, const Envelope& e, std::span<const uint8_t> msg,
                           std::vector<Outgoing>& out) {
  Worker& w = roster_[rank];
  if (e.round < w.next_push) {
    // Sent again after a reconnect: its reply was lost (the last push), or the worker has moved
    // on since (an older one). Applied once either way.
    if (e.round + 1 == w.next_push && !w.ack.empty()) send_ack(rank, out);
    hooks_.log("rank " + std::to_string(rank) + " sent push #" + std::to_string(e.round) +
               " again (next expected #" + std::to_string(w.next_push) + ")");
    return;
  }
  if (finished()) return finished_reply(w.peer, e, out);
  if (e.round > w.next_push)
    return refuse(w.peer, e, true,
                  "push #" + std::to_string(e.round) + " of rank " + std::to_string(rank) +
                      " comes before #" + std::to_string(w.next_push) +
                      " (register again and fetch the model)",
                  out);
  SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "push #", e.round, " of rank ", rank,
                    " carries a message with another sender or push number");
  const uint64_t age = round_ - w.base - w.own;
  metrics_ = RoundMetrics{};
  metrics_.round = round_;
  metrics_.bytes_up.assign(cfg_.world, 0);
  metrics_.bytes_up[rank] = msg.size();
  metrics_.dense_bytes = cfg_.dim * 4 + kHeaderBytes;
  metrics_.pusher = rank;
  metrics_.age = age;
  w.next_push = e.round + 1;
  auto refuse_push = [&](const std::string& why) {
    // Nothing applied: the worker's codec keeps the push in its error feedback.
    hooks_.log("rank " + std::to_string(rank) + " push #" + std::to_string(e.round) +
               " not applied: " + why);
    ++rejected_;
    w.ack = {Frame(), Frame::own(encode_text(why.substr(0, kMaxText)))};
    w.ack[0] = to(rank, Type::Abort, e.round);
    send_ack(rank, out);
  };
  if (cfg_.max_age && age > cfg_.max_age)
    return refuse_push("it is " + std::to_string(age) + " updates old (the bound is " +
                       std::to_string(cfg_.max_age) + "): fetch the model");
  const auto t0 = Clock::now();
  Message m;
  try {
    agg_->add(msg);
    m = agg_->finish();
  } catch (const Error& ex) {
    agg_->abandon();
    return refuse_push(std::string("decode failed: ") + ex.what());
  }
  const Frame payload = Frame::own(std::move(m).release());
  const float lr =
      cfg_.lr * w.weight / float(cfg_.world) / (cfg_.age_scaled ? float(1 + age) : 1.0f);
  try {
    outer_->apply(*codec_, payload.bytes(), model_, lr);  // validates before it writes
  } catch (const Error& ex) {
    return refuse_push(std::string("update rejected: ") + ex.what());
  }
  snapshot_ = Frame();
  ++w.own;
  const UpdateInfo info{lr,   1,      round_ + 1, uint32_t(std::min<uint64_t>(age, UINT32_MAX)),
                        rank, e.round};
  const Frame info_frame = Frame::own(encode(info));
  last_outcome_ = {envelope(Type::Update, cfg_.job, round_, 0, 0), info_frame, payload};
  if (ended_) ended_(round_, last_outcome_);
  w.ack = {to(rank, Type::Update, e.round), info_frame, payload};
  send_ack(rank, out);
  metrics_.contributors = 1;
  metrics_.merge_ms = ms_between(t0, Clock::now());
  metrics_.bytes_down_each = payload.size();
  hooks_.round(metrics_);
  ++round_;
  save(false);
  reset_round();
}

void Engine::on_answer(uint32_t rank, const Envelope& e, const Frames& f, Clock::time_point,
                       std::vector<Outgoing>&) {
  if (e.round < round_) return;  // answer of a round that already closed: nothing to do
  SKETCHSGD_REQUIRE(e.round == round_ && phase_ == MessageKind::Answer, ProtocolError,
                    "answer of round ", e.round, " from rank ", rank,
                    " while no query of that round is open");
  SKETCHSGD_REQUIRE(pushed_[rank], ProtocolError, "answer from rank ", rank,
                    " which was not queried");
  const auto msg = f[1].bytes();
  SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "answer of rank ", rank,
                    " carries a message with another sender or round");
  SKETCHSGD_REQUIRE(!answered_[rank], ProtocolError, "duplicate answer from rank ", rank);
  SKETCHSGD_REQUIRE(rank >= cursor_, ProtocolError, "answer from rank ", rank,
                    " arrived after its turn to merge");
  answered_[rank] = true;
  held_[rank] = f[1];
  metrics_.bytes_up[rank] += msg.size();
  absorb_in_order(false);
}

// ---- rounds
// ---------------------------------------------------------------------------------------

void Engine::progress(Clock::time_point now, std::vector<Outgoing>& out) {
  for (uint32_t n = 0; n <= cfg_.staleness && progress_once(now, out); ++n) {
  }
}

void Engine::replay_held(Clock::time_point now) {
  const auto it = early_.find(round_);
  if (it == early_.end()) return;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    if (it->second[r].size() == 0) continue;
    if (!round_start_) round_start_ = phase_start_ = now;
    pushed_[r] = true;
    metrics_.bytes_up[r] += it->second[r].size();
    held_[r] = std::move(it->second[r]);
  }
  early_.erase(early_.begin(), std::next(it));
  absorb_in_order(false);
}

bool Engine::progress_once(Clock::time_point now, std::vector<Outgoing>& out) {
  const uint64_t before = round_;
  const MessageKind phase = phase_;
  if (!has_model() || finished()) return false;
  const bool gradient = phase_ == MessageKind::Gradient;
  const auto& got = gradient ? pushed_ : answered_;
  const uint32_t count = uint32_t(std::count(got.begin(), got.end(), true));
  const bool late = now - phase_start_ >= cfg_.deadline;
  if (count == 0) {
    if (gradient) {
      // No deadline before the first push, except in a federated round that no live client holds
      // a slot of: its clients come for it alone, and after a restart from an older checkpoint
      // they may all have been and gone. (A registered client may train for longer than a
      // deadline: the round's counts from its first push.) Counted from when the round was first
      // seen so; aborted a deadline later.
      if (!federated() || cfg_.policy == Policy::Wait) return false;
      if (roster_.live() > 0) {
        empty_since_.reset();
        return false;
      }
      if (!empty_since_ || empty_since_->first != round_) empty_since_.emplace(round_, now);
      if (now - empty_since_->second < cfg_.deadline) return false;
      abort_round(now, out, "no client of the round pushed or stayed live for a deadline");
      return true;
    }
    // A second phase nobody can answer any more (the queried workers died or were dropped).
    bool live = false;
    for (uint32_t r = 0; r < cfg_.world; ++r)
      live |= pushed_[r] && roster_[r].registered && roster_[r].alive;
    if (live && now - phase_start_ < cfg_.deadline) return false;
    abort_round(now, out, "no answer to the query arrived");
    return true;
  }
  bool all = true, live_all = true;
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    const bool expected = gradient || pushed_[r];
    if (!expected || got[r]) continue;
    all = false;
    missing.push_back(r);
    // Still to come: a live worker, or a federated client that has not registered yet (one
    // that registered and then fell silent or left is gone, like a dead worker).
    const Worker& w = roster_[r];
    if (federated() ? !(w.registered && !w.alive) : w.registered && w.alive) live_all = false;
  }
  if (all) {
    close_phase(now, out, "");
    return round_ != before || phase_ != phase;
  }
  if (!gradient) {
    // The answers of dead workers never come, whatever the policy.
    if (live_all || late) close_phase(now, out, "no answer from " + ranks_text(missing));
    return round_ != before;
  }
  switch (cfg_.policy) {
    case Policy::Quorum:
      if (count >= cfg_.min_workers && (live_all || late)) {
        close_phase(now, out,
                    "quorum of " + std::to_string(count) + ", missing " + ranks_text(missing));
        return round_ != before || phase_ != phase;
      }
      // A federated round's clients come for it alone: those missing at the deadline are not
      // coming back (the next round's are sampled already, and would wait for ever behind it).
      if (federated() && late) {
        abort_round(now, out,
                    "deadline passed with " + std::to_string(count) + " of " +
                        std::to_string(cfg_.world) + " pushes, short of the quorum of " +
                        std::to_string(cfg_.min_workers) + ", missing " + ranks_text(missing));
        return true;
      }
      break;
    case Policy::Abort:
      if (late) {
        abort_round(now, out,
                    "deadline passed with " + std::to_string(count) + " of " +
                        std::to_string(cfg_.world) + " pushes, missing " + ranks_text(missing));
        return true;
      }
      break;
    case Policy::Wait:
      break;
  }
  if (late && now - last_wait_log_ >= cfg_.deadline) {
    last_wait_log_ = now;
    hooks_.log("round " + std::to_string(round_) + " past its deadline, waiting for " +
               ranks_text(missing));
  }
  return false;
}

void Engine::close_phase(Clock::time_point now, std::vector<Outgoing>& out, std::string reason) {
  absorb_in_order(true);
  const uint32_t count = agg_->count();
  if (count == 0)  // every held message was corrupt, and nobody will send it again
    return abort_round(now, out, "every message of the phase was invalid");
  const auto t0 = Clock::now();
  Message m;
  try {
    m = agg_->finish();
  } catch (const Error& e) {  // e.g. the sum overflowed to ±Inf: skip the round, keep serving
    return abort_round(now, out, std::string("reduce failed: ") + e.what());
  }
  merge_ms_ += ms_between(t0, Clock::now());
  if (!reason.empty()) metrics_.reason += (metrics_.reason.empty() ? "" : "; ") + reason;
  const Frame payload = Frame::own(std::move(m).release());

  if (agg_->expecting() == MessageKind::Answer) {
    start_phase(MessageKind::Answer);
    phase_start_ = now;
    query_ = payload;
    metrics_.contributors = count;
    metrics_.bytes_down_each += payload.size();
    for (uint32_t r = 0; r < cfg_.world; ++r)
      if (pushed_[r]) send(r, {to(r, Type::Query, round_), payload}, out);
    return;
  }
  if (phase_ == MessageKind::Gradient) metrics_.contributors = count;

  const UpdateInfo info{cfg_.lr, metrics_.contributors};
  try {
    outer_->apply(*codec_, payload.bytes(), model_, cfg_.lr);  // validates before it writes
  } catch (const Error& e) {
    return abort_round(now, out, std::string("update rejected: ") + e.what());
  }
  snapshot_ = Frame();
  metrics_.bytes_down_each += payload.size();
  end_round(Type::Update, {Frame::own(encode(info)), payload}, now, out);
}

void Engine::end_round(Type outcome, Frames payload, Clock::time_point now,
                       std::vector<Outgoing>& out) {
  last_outcome_ = {envelope(outcome, cfg_.job, round_, 0, 0)};
  last_outcome_.insert(last_outcome_.end(), payload.begin(), payload.end());
  if (ended_) ended_(round_, last_outcome_);
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    if (!roster_[r].registered) continue;  // "dead" ones too: they may only be slow
    Frames fr = last_outcome_;
    fr[0] = to(r, outcome, round_);
    send(r, std::move(fr), out);
  }
  metrics_.latency_ms = round_start_ ? ms_between(*round_start_, now) : 0;
  finish_round(out);
  replay_held(now);
}

void Engine::resend_outcome(uint32_t rank, uint64_t round, std::vector<Outgoing>& out) const {
  Frames fr = last_outcome_;
  fr[0] = to(rank, decode_envelope(fr[0].bytes(), fr.size() - 1).type, round);
  send(rank, std::move(fr), out);
}

void Engine::abort_round(Clock::time_point now, std::vector<Outgoing>& out, std::string reason) {
  hooks_.log("round " + std::to_string(round_) + " aborted: " + reason);
  agg_->abandon();  // drop the partial merge, keep state across rounds (FetchSGD)
  metrics_.aborted = true;
  metrics_.reason = reason;
  end_round(Type::Abort, {Frame::own(encode_text(reason.substr(0, kMaxText)))}, now, out);
}

void Engine::finish_round(std::vector<Outgoing>& out) {
  metrics_.round = round_;
  metrics_.merge_ms = merge_ms_;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    const Worker& w = roster_[r];
    if (w.registered && w.alive && !pushed_[r]) metrics_.stragglers.push_back(r);
    if (!w.registered || !w.alive) metrics_.dead.push_back(r);
  }
  if (!metrics_.aborted && !metrics_.stragglers.empty())
    hooks_.log("round " + std::to_string(round_) + " closed without " +
               ranks_text(metrics_.stragglers) + (metrics_.reason.empty() ? "" : ": ") +
               metrics_.reason);
  hooks_.round(metrics_);
  if (federated()) {  // its clients leave: every slot waits for the next sample
    roster_.release();
    pending_pull_.assign(cfg_.world, false);
  }
  ++round_;
  save(false);
  reset_round();
  if (federated() && !finished()) seat_waiting(out);
}

Bytes Engine::codec_state() const {
  return agg_->save_state();
}

void Engine::follow(uint64_t round, const CommitInfo& c, std::span<const uint8_t> payload) {
  SKETCHSGD_REQUIRE(has_model(), ProtocolError, "commit of round ", round, " before any state");
  SKETCHSGD_REQUIRE(round == round_, ProtocolError, "commit of round ", round, " at round ",
                    round_);
  // Everything is checked before anything changes, so a bad commit leaves the state whole: the
  // state goes into a spare aggregator (made once: FetchSGD's is not cheap to make each round),
  // which becomes the current one only once the update has applied.
  if (!spare_) spare_ = make_aggregator();
  spare_->load_state(c.codec_state);
  Frames outcome{envelope(c.outcome, cfg_.job, round_, 0, 0)};
  if (c.outcome == Type::Update) {
    outer_->apply(*codec_, payload, model_, c.info.lr);  // validates before it writes
    snapshot_ = Frame();
    outcome.push_back(Frame::own(encode(c.info)));
  }
  outcome.push_back(Frame::own(Bytes(payload.begin(), payload.end())));
  if (cfg_.async && c.outcome == Type::Update && c.info.pusher < cfg_.world) {
    // Which push this was: sent again to this server after a failover, it is answered, not
    // applied twice.
    Worker& w = roster_[c.info.pusher];
    w.numbered = true;
    w.next_push = c.info.push + 1;
    ++w.own;
    w.ack = {envelope(Type::Update, cfg_.job, c.info.push, c.info.pusher, 0), outcome[1],
             outcome[2]};
  }
  std::swap(agg_, spare_);
  last_outcome_ = std::move(outcome);
  ++round_;
  save(false);
  reset_round();
}

std::optional<Clock::time_point> Engine::deadline() const {
  if (cfg_.async || !has_model() || finished() || cfg_.policy == Policy::Wait) return std::nullopt;
  const bool running = phase_ == MessageKind::Answer ||
                       std::any_of(pushed_.begin(), pushed_.end(), [](bool b) { return b; });
  if (!running) return std::nullopt;
  return phase_start_ + cfg_.deadline;
}

void Engine::tick(Clock::time_point now, std::vector<Outgoing>& out) {
  const auto limit = cfg_.heartbeat * cfg_.dead_after;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    Worker& w = roster_[r];
    if (w.registered && w.alive && now - w.last_seen > limit) {
      w.alive = false;
      hooks_.log("rank " + std::to_string(r) + " is dead: silent for " +
                 std::to_string(int64_t(ms_between(w.last_seen, now))) + " ms");
    }
  }
  progress(now, out);
}

}  // namespace sketchsgd::ps
