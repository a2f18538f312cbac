#include <sketchsgd/server/replication.hpp>

#include <algorithm>
#include <random>

#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/checkpoint.hpp>
#include <sketchsgd/server/replies.hpp>

namespace sketchsgd::ps {
namespace {

/// Why a backup of this description cannot follow the engine's job (empty: it can).
std::string mismatch(const JobConfig& cfg, const HelloInfo& h) {
  if (cfg.population() != 0)
    return "replication needs a job of fixed workers (this one is federated)";
  if (h.world != cfg.world || h.population != cfg.population())
    return "backup of world " + std::to_string(h.world) + ", the job has " +
           std::to_string(cfg.world);
  if (h.dim != cfg.dim || !(h.shard == cfg.shard))
    return "backup of " + h.shard.describe(h.dim) + ", this server is " +
           cfg.shard.describe(cfg.dim);
  if (h.spec != cfg.spec)
    return "backup of codec '" + h.spec + "', the job runs '" + cfg.spec + "'";
  return {};
}

/// Room for worker messages that arrive while a round waits for the backup: a few per worker
/// (its next push, a pull); heartbeats are never deferred.
size_t deferred_room(const JobConfig& cfg) {
  return 4 * size_t(cfg.world) + 64;
}

}  // namespace

Primary::Primary(Engine& engine, Log log) : engine_(engine), log_(std::move(log)) {
  // Unguessable by a peer that was never sent this server's state: the token in a Deposed notice
  // is what proves the sender was this server's backup.
  std::random_device rd;
  while (token_ == 0) token_ = uint64_t(rd()) << 32 | rd();
  engine_.observe([this](uint64_t round, const Frames& outcome) {
    if (!backup_) return;  // nobody to tell: no copies of the state
    const Envelope le = decode_envelope(outcome[0].bytes(), outcome.size() - 1);
    CommitInfo c;
    c.epoch = engine_.epoch();
    c.outcome = le.type;
    if (le.type == Type::Update) c.info = decode_update_info(outcome[1].bytes());
    c.codec_state = engine_.codec_state();
    commits_.push_back(Outgoing{*backup_,
                                {envelope(Type::Commit, engine_.config().job, round),
                                 Frame::own(encode(c)), outcome.back()}});
  });
}

Primary::~Primary() {
  engine_.observe({});
}

void Primary::handle(const PeerId& peer, const Frames& frames, Clock::time_point now,
                     std::vector<Outgoing>& out, std::string_view user) {
  std::optional<Envelope> e;
  try {
    if (!frames.empty()) e = decode_envelope(frames[0].bytes(), frames.size() - 1);
  } catch (const Error&) {
    // the engine refuses or drops what it cannot read
  }
  const bool replication = e && e->job == engine_.config().job &&
                           (e->type == Type::Follow || e->type == Type::Ack ||
                            e->type == Type::Deposed || (backup_ && peer == *backup_));
  if (replication) return on_backup(peer, *e, frames, now, out, user);
  if (awaiting_ && !(e && e->type == Type::Heartbeat)) {
    // Handled once the round is acknowledged: a re-sent push would get the held outcome.
    defer(peer, frames, user);
    return;
  }
  pass(peer, frames, now, out, user);
}

void Primary::defer(const PeerId& peer, const Frames& frames, std::string_view user) {
  // Room is bounded per connection and in all; what must go is a flooding connection's own
  // oldest, then a stranger's (a peer with no registration), and a worker's last of all, so a
  // flood of strangers' messages costs no worker its Pull or push.
  const JobConfig& cfg = engine_.config();
  const auto of = [&](const PeerId& p) {
    return std::find_if(deferred_.begin(), deferred_.end(),
                        [&](const Deferred& d) { return d.peer == p; });
  };
  std::optional<std::deque<Deferred>::iterator> victim;
  const size_t mine = size_t(std::count_if(deferred_.begin(), deferred_.end(),
                                           [&](const Deferred& d) { return d.peer == peer; }));
  if (mine >= 8 + size_t(cfg.staleness())) {
    victim = of(peer);
  } else if (deferred_.size() >= deferred_room(cfg)) {
    const auto stranger = std::find_if(deferred_.begin(), deferred_.end(),
                                       [&](const Deferred& d) { return !engine_.knows(d.peer); });
    victim = stranger != deferred_.end() ? stranger : deferred_.begin();
  }
  if (victim) {
    deferred_.erase(*victim);
    if (dropped_++ % 1000 == 0)
      log_("too many messages while the backup acknowledges: dropped (" + std::to_string(dropped_) +
           " so far)");
  }
  deferred_.push_back(Deferred{peer, frames, std::string(user)});
}

void Primary::pass(const PeerId& peer, const Frames& frames, Clock::time_point now,
                   std::vector<Outgoing>& out, std::string_view user) {
  const uint64_t round = engine_.round();
  const bool model = engine_.has_model();
  const size_t left = backup_ ? engine_.departed().size() : 0;
  std::vector<Outgoing> staged;
  engine_.handle(peer, frames, now, staged, user);
  replicate(round, model, staged, now, out);
  if (backup_ && engine_.departed().size() > left) {
    // A worker said goodbye: its backup must not wait for it to take over.
    const auto d = engine_.departed();
    for (uint32_t r : d)
      out.push_back(Outgoing{*backup_, {envelope(Type::Left, engine_.config().job, 0, r)}});
  }
}

void Primary::tick(Clock::time_point now, std::vector<Outgoing>& out) {
  const JobConfig& cfg = engine_.config();
  if (backup_ && resync_ && now - last_sync_ >= cfg.heartbeat) {
    resync_ = false;
    resync(now, out);
  }
  if (backup_ && now - backup_seen_ > cfg.heartbeat * cfg.dead_after)
    lose_backup("silent for " +
                    std::to_string(std::chrono::duration_cast<Millis>(now - backup_seen_).count()) +
                    " ms",
                now, out);
  if (backup_ && awaiting_ && now - awaiting_since_ > cfg.deadline)
    lose_backup("round " + std::to_string(*awaiting_ - 1) + " not acknowledged within the " +
                    std::to_string(cfg.deadline.count()) + " ms deadline",
                now, out);
  if (awaiting_) return;  // the engine's deadlines wait for the acknowledgement too
  const uint64_t round = engine_.round();
  const bool model = engine_.has_model();
  std::vector<Outgoing> staged;
  engine_.tick(now, staged);
  replicate(round, model, staged, now, out);
}

void Primary::bye(std::vector<Outgoing>& out) const {
  if (backup_)
    out.push_back(Outgoing{*backup_, {envelope(Type::Bye, engine_.config().job, engine_.round())}});
}

void Primary::replicate(uint64_t round_before, bool model_before, std::vector<Outgoing>& staged,
                        Clock::time_point now, std::vector<Outgoing>& out) {
  const bool changed = engine_.round() != round_before || engine_.has_model() != model_before;
  if (!backup_ || !changed) {
    for (auto& o : staged) out.push_back(std::move(o));
    return;
  }
  for (auto& o : staged) held_.push_back(std::move(o));
  if (model_before && engine_.round() == round_before + commits_.size()) {
    // Rounds ended (one, or several with bounded staleness): their outcomes, which the backup
    // applies in order as the workers do.
    for (auto& c : commits_) out.push_back(std::move(c));
    commits_.clear();
    awaiting_ = engine_.round();
    awaiting_since_ = now;
    return;
  }
  commits_.clear();
  sync(now, out);  // the model arrived (rank 0's Init): the whole state
}

ReplicaInfo Primary::replica_info() const {
  ReplicaInfo r{engine_.epoch(), token_, {}, engine_.next_pushes(), engine_.departed()};
  for (const Frame& f : engine_.last_outcome())
    r.outcome.emplace_back(f.bytes().begin(), f.bytes().end());
  return r;
}

void Primary::sync(Clock::time_point now, std::vector<Outgoing>& out) {
  last_sync_ = now;
  if (!engine_.has_model()) return;  // nothing to hold yet: synced when rank 0's Init comes
  if (!stated_) {
    // A backup that followed before the model has had nothing to answer (it sends heartbeats
    // once answered): its silence counts from here, not from its Follow (a chaos soak's backup
    // was lost the moment the model came, with a strike, and kept out for the cool-down).
    stated_ = true;
    backup_seen_ = std::max(backup_seen_, now);
  }
  out.push_back(
      Outgoing{*backup_,
               {envelope(Type::Sync, engine_.config().job, engine_.round()),
                Frame::own(encode(replica_info())), Frame::own(encode(engine_.checkpoint()))}});
  awaiting_ = engine_.round();
  awaiting_since_ = now;
}

void Primary::resync(Clock::time_point now, std::vector<Outgoing>& out) {
  // A Sync covers whatever was not acknowledged yet, but the held round's deadline runs on from
  // when it was first held: a backup asking again and again holds it no longer.
  const auto since = awaiting_ ? awaiting_since_ : now;
  awaiting_.reset();
  sync(now, out);
  if (!awaiting_) return release(now, out);
  awaiting_since_ = since;
}

void Primary::on_backup(const PeerId& peer, const Envelope& e, const Frames& frames,
                        Clock::time_point now, std::vector<Outgoing>& out, std::string_view user) {
  const uint64_t job = engine_.config().job;
  try {
    if (e.type == Type::Follow) {
      const HelloInfo h = decode_hello(frames[1].bytes());
      std::string why = mismatch(engine_.config(), h);
      if (engine_.config().authenticated && user != kServerUser)
        why = "only the job's server key may follow (this connection is rank " + std::string(user) +
              "'s)";
      if (!why.empty()) {
        log_("refused a backup: " + why);
        out.push_back(Outgoing{peer,
                               {envelope(Type::Refuse, job, engine_.round()),
                                Frame::own(encode(RefuseInfo{false, Type::Follow, why}))}});
        return;
      }
      const JobConfig& cfg = engine_.config();
      if (h.epoch > engine_.epoch()) {
        // A server of a later epoch took over somewhere; it follows no server of an earlier one.
        // Its word deposes nothing (a Follow carries no evidence): only a Deposed notice does.
        why = "this server is at epoch " + std::to_string(engine_.epoch()) +
              ", the follower at epoch " + std::to_string(h.epoch) +
              ": a server of a later epoch follows none of an earlier one";
        log_("refused a backup: " + why);
        out.push_back(Outgoing{peer,
                               {envelope(Type::Refuse, job, engine_.round()),
                                Frame::own(encode(RefuseInfo{false, Type::Follow, why}))}});
        return;
      }
      // A Follow with this server's token is its own backup's (the token went to it alone, in a
      // Sync), which numbers its connections: a later one replaces the backup's connection at
      // once, cool-down or not (the backup connected again, and what its old connection still
      // delivered may have been taken first: a chaos soak's primary answered a Follow the kernel
      // had held on the old one, refused the new one's and lost the job when it died in the
      // cool-down); an earlier one is stale. Without the token (a first Follow, a restarted
      // backup, a stranger) the rules below apply.
      const bool ours = e.session != 0 && e.session == token_;
      if (ours && e.rank < backup_connection_) {
        if (ignored_follows_++ % 1000 == 0)
          log_("a Follow of the backup's earlier connection: not answered (" +
               std::to_string(ignored_follows_) + " so far)");
        return;
      }
      // Once an Ack between such passes: a peer that took the role when none was live holds the
      // token too, and unacknowledged rounds held for a deadline each stay bounded by the
      // cool-down.
      const bool newer =
          ours && rejoin_ && e.rank > backup_connection_ && (!backup_ || *backup_ != peer);
      if (ours) backup_connection_ = std::max(backup_connection_, e.rank);
      if (newer && (backup_ || now < follow_after_)) rejoin_ = false;  // the pass is used
      if (newer && backup_) {
        log_("the backup follows again on a new connection at round " +
             std::to_string(engine_.round()));
        acked_ = false;
        stated_ = false;
        backup_ = peer;
        backup_seen_ = now;
        resync(now, out);
        return;
      }
      if (!newer && (!backup_ || *backup_ != peer) && now < follow_after_) {
        // The last backup was lost before it acknowledged anything (a stray or hostile peer
        // that held a round until the deadline): the next may follow after a cool-down that
        // doubles with each such loss, so a flood of them costs a bounded share of the rounds.
        if (ignored_follows_++ % 1000 == 0)
          log_(
              "a Follow during the cool-down after a backup that never acknowledged: not "
              "answered (" +
              std::to_string(ignored_follows_) + " so far)");
        return;
      }
      if (backup_ && *backup_ != peer && now - backup_seen_ <= cfg.heartbeat * cfg.dead_after) {
        // A live backup holds the role: another connection's Follow (a flood, a second backup)
        // is not answered, so it costs no state sent. A backup that restarted on a new
        // connection is taken once the old one has fallen silent (it follows again then).
        if (ignored_follows_++ % 1000 == 0)
          log_("a Follow from another connection while the backup is live: not answered (" +
               std::to_string(ignored_follows_) + " so far)");
        return;
      }
      if (backup_ && *backup_ == peer && now - last_sync_ < cfg.heartbeat) {
        // The backup asks for the whole state again within an interval: sent at the next tick
        // an interval on, so a flood of Follows costs one Sync an interval.
        backup_seen_ = now;
        resync_ = true;
        return;
      }
      log_(std::string(!backup_           ? "a backup follows"
                       : *backup_ != peer ? "a new backup replaces the last"
                                          : "the backup asks for the whole state again") +
           " at round " + std::to_string(engine_.round()));
      if (backup_ != peer) acked_ = stated_ = false;
      backup_ = peer;
      backup_seen_ = now;
      resync(now, out);
      return;
    }
    if (e.type == Type::Deposed) {
      // From any connection (a backup that took over while cut off comes back on a new one), but
      // only with this server's token: the evidence of its own backup's takeover.
      SKETCHSGD_REQUIRE(frames.size() == 2, ProtocolError, "a Deposed notice of ", frames.size(),
                        " frames");
      const DeposedInfo d = decode_deposed(frames[1].bytes());
      SKETCHSGD_REQUIRE(!engine_.config().authenticated || user == kServerUser, ProtocolError,
                        "a Deposed notice from rank ", user, "'s key");
      SKETCHSGD_REQUIRE(d.token == token_, ProtocolError,
                        "a Deposed notice without this server's token (not its backup's word)");
      deposed_ = d.reason;
      return;
    }
    if (!backup_ || peer != *backup_) return;  // an Ack of a backup since replaced
    backup_seen_ = now;
    switch (e.type) {
      case Type::Ack:
        if (awaiting_ && e.round == *awaiting_) {
          acked_ = rejoin_ = true;
          strikes_ = 0;
          release(now, out);
        }
        break;
      case Type::Heartbeat:
        break;  // liveness; the transport echoes it
      default:
        throw ProtocolError(std::string(to_string(e.type)) + " from the backup");
    }
  } catch (const Error& ex) {
    log_(std::string("dropped a message of the backup: ") + ex.what());
  }
}

void Primary::release(Clock::time_point now, std::vector<Outgoing>& out) {
  awaiting_.reset();
  for (auto& o : held_) out.push_back(std::move(o));
  held_.clear();
  while (!awaiting_ && !deferred_.empty()) {
    Deferred d = std::move(deferred_.front());
    deferred_.pop_front();
    pass(d.peer, d.frames, now, out, d.user);
  }
}

void Primary::lose_backup(const std::string& why, Clock::time_point now,
                          std::vector<Outgoing>& out) {
  log_("backup lost (" + why + "): serving without a replica");
  if (!acked_ && awaiting_) {
    // It held a round and acknowledged nothing (a backup that followed before the model and fell
    // silent with nothing asked of it costs no strike: it follows again when it reconnects).
    const JobConfig& cfg = engine_.config();
    strikes_ = std::min(strikes_ + 1, 10u);
    follow_after_ = now + std::max(cfg.deadline, cfg.heartbeat * cfg.dead_after) * (1 << strikes_);
  }
  backup_.reset();
  if (awaiting_) release(now, out);
}

}  // namespace sketchsgd::ps
