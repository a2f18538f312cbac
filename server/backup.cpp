#include <sketchsgd/server/replication.hpp>

#include <algorithm>

#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/checkpoint.hpp>
#include <sketchsgd/server/replies.hpp>

namespace sketchsgd::ps {

Backup::Backup(Engine& engine, Log log) : engine_(engine), log_(std::move(log)) {}

Frames Backup::reply(Type t, uint64_t round, Frames payload) const {
  Frames f{envelope(t, engine_.config().job, round)};
  for (auto& p : payload) f.push_back(std::move(p));
  return f;
}

Frames Backup::follow() const {
  const JobConfig& c = engine_.config();
  ShardId shard = c.shard;
  if (shard.model_dim == 0) shard.model_dim = c.dim;
  const HelloInfo h{c.world, c.dim, c.spec, c.population(), shard, engine_.epoch()};
  // The envelope names this connection and carries the primary's token once a Sync brought it.
  return {
      Frame::own(encode(Envelope{Type::Follow, c.job, engine_.round(), connection_, 0, token_})),
      Frame::own(encode(h))};
}

void Backup::handle(const Frames& frames, std::vector<Frames>& replies) {
  try {
    apply(frames, replies);
  } catch (const ConfigMismatch&) {
    throw;
  } catch (const Error& e) {
    // Whatever this state missed or could not take, a whole one replaces it: the primary holds
    // its round until then.
    log_(std::string("a message of the primary failed (") + e.what() + "): asking for its state");
    replies.push_back(follow());
  }
}

void Backup::apply(const Frames& frames, std::vector<Frames>& replies) {
  const Envelope e = decode_envelope(frames.at(0).bytes(), frames.size() - 1);
  SKETCHSGD_REQUIRE(e.job == engine_.config().job, ProtocolError, "message of job ", e.job);
  if (promoted_ && (e.type == Type::Sync || e.type == Type::Commit)) {
    replies.push_back(notice());
    return;
  }
  switch (e.type) {
    case Type::Sync: {
      const ReplicaInfo info = decode_replica_info(frames[1].bytes());
      const Checkpoint c = decode_checkpoint(frames[2].bytes(), "the primary's state");
      for (uint32_t r : info.left)
        SKETCHSGD_REQUIRE(r < engine_.config().world, WireError, "sync: rank ", r, " left");
      engine_.restore(c);  // checks job, codec, dim and shard
      engine_.resume(info.outcome, info.pushes);
      left_ = std::set<uint32_t>(info.left.begin(), info.left.end());
      engine_.set_epoch(info.epoch);
      token_ = info.token;
      if (!synced_) log_("holds the primary's state at round " + std::to_string(c.round));
      synced_ = true;
      replies.push_back(reply(Type::Ack, engine_.round()));
      return;
    }
    case Type::Commit: {
      SKETCHSGD_REQUIRE(synced_, ProtocolError, "commit before the state");
      const CommitInfo c = decode_commit_info(frames[1].bytes());
      engine_.follow(e.round, c, frames[2].bytes());
      replies.push_back(reply(Type::Ack, engine_.round()));
      return;
    }
    case Type::Refuse: {
      const RefuseInfo r = decode_refuse(frames[1].bytes());
      if (r.refused == Type::Follow && !r.retry)
        throw ConfigMismatch("the primary refuses this backup: " + r.reason);
      // The primary does not know this link as its backup (it dropped it, or restarted): the
      // state here may be behind, so it cannot take over until a Sync has come.
      if (synced_) log_("the primary no longer counts on this backup: following again");
      synced_ = false;
      replies.push_back(follow());
      return;
    }
    case Type::Bye:
      primary_done_ = true;
      return;
    case Type::Left:
      if (e.rank < engine_.config().world) left_.insert(e.rank);
      return;
    case Type::Heartbeat:
      return;
    default:
      throw ProtocolError(std::string(to_string(e.type)) + " from the primary");
  }
}

namespace {
/// A worker's Hello (or its answer to a probe, which carries the same) this job would accept
/// (its id, world, rank range, dim, shard and codec).
bool acceptable(const JobConfig& cfg, const Frames& frames) {
  try {
    const Envelope e = decode_envelope(frames.at(0).bytes(), frames.size() - 1);
    if ((e.type != Type::Hello && e.type != Type::Present) || e.job != cfg.job) return false;
    HelloInfo h = decode_hello(frames.at(1).bytes());
    if (h.shard.model_dim == 0) h.shard.model_dim = h.dim;  // a whole model's, as a Hello says
    ShardId mine = cfg.shard;
    if (mine.model_dim == 0) mine.model_dim = cfg.dim;
    return e.rank < cfg.world && h.world == cfg.world && h.population == 0 && h.dim == cfg.dim &&
           h.shard == mine && h.spec == cfg.spec;
  } catch (const Error&) {
    return false;
  }
}

/// SplitMix64's finaliser: nonces no peer can guess from the ones before.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Millis Backup::hold() const {
  const JobConfig& cfg = engine_.config();
  return 2 * std::chrono::duration_cast<Millis>(cfg.heartbeat * cfg.dead_after);
}

Backup::Verdict Backup::consider(const Frames& frames, Clock::time_point now) {
  const JobConfig& cfg = engine_.config();
  if (!synced_ || !acceptable(cfg, frames)) return Verdict::Ignore;
  if (behind(frames)) return Verdict::Behind;
  const auto window = cfg.heartbeat * cfg.dead_after;
  const Envelope e = decode_envelope(frames[0].bytes(), frames.size() - 1);
  if (now - heard_ < window) {
    // No probe went out since the primary was last heard (heard() voided those before): a worker
    // that claims the epoch this backup would take over as waits for nothing.
    const bool waits =
        e.type == Type::Hello && decode_hello(frames[1].bytes()).epoch > engine_.epoch();
    return waits ? Verdict::Release : Verdict::Ignore;
  }
  // No round can be past this backup's once the job's last is done here: the first will do.
  if (engine_.finished()) return Verdict::TakeOver;
  if (e.type == Type::Hello) return Verdict::Probe;
  const auto asked = asked_.find(e.rank);
  if (asked == asked_.end() || asked->second.nonce != e.session || now - asked->second.at > window)
    return Verdict::Ignore;  // answers no probe of now (a late, replayed or forged one)
  came_[e.rank] = asked->second.at;
  asked_.erase(asked);
  std::erase_if(came_, [&](const auto& c) { return now - c.second > hold(); });
  // Every worker might hold a round this backup lacks (but one that said goodbye has nothing
  // this backup was not sent).
  size_t covered = 0;
  for (uint32_t r = 0; r < cfg.world; ++r) covered += came_.count(r) || left_.count(r);
  if (covered < cfg.world) {
    log_("rank " + std::to_string(e.rank) +
         " answered while the primary is silent: " + std::to_string(covered) + " of " +
         std::to_string(cfg.world) + " workers (those that left counted)");
    return Verdict::Ignore;
  }
  return Verdict::TakeOver;
}

Frames Backup::probe(const Frames& hello, Clock::time_point now) {
  const Envelope h = decode_envelope(hello.at(0).bytes(), hello.size() - 1);
  const uint64_t nonce = mix(token_ ^ mix(++probes_)) | 1;  // never 0 (no session)
  asked_[h.rank] = Asked{nonce, now};
  const ProbeInfo p{engine_.epoch() + 1, 0};
  return {Frame::own(encode(
              Envelope{Type::Probe, engine_.config().job, engine_.round(), h.rank, 0, nonce})),
          Frame::own(encode(p))};
}

Frames Backup::release(const Frames& hello) const {
  const Envelope h = decode_envelope(hello.at(0).bytes(), hello.size() - 1);
  const ProbeInfo p{engine_.epoch() + 1, 1};
  return {Frame::own(
              encode(Envelope{Type::Probe, engine_.config().job, engine_.round(), h.rank, 0, 0})),
          Frame::own(encode(p))};
}

bool Backup::everyone_here() const {
  const uint32_t world = engine_.config().world;
  uint32_t n = 0;
  for (uint32_t r = 0; r < world; ++r) n += engine_.registered(r) || left_.count(r);
  return n == world;
}

void Backup::heard(Clock::time_point now) {
  heard_ = now;
  came_.clear();
  asked_.clear();
}

bool Backup::behind(const Frames& hello) const {
  try {
    const Envelope e = decode_envelope(hello.at(0).bytes(), hello.size() - 1);
    if (e.type != Type::Hello && e.type != Type::Present) return false;
    // An asynchronous worker's Hello names its pushes answered: more than this server applied
    // of it means some were applied where this backup never saw them (none known: a rank that
    // registered after the last Sync and had no push committed here since).
    if (engine_.config().async()) return e.round > engine_.next_push(e.rank).value_or(0);
    return e.round > engine_.round();
  } catch (const Error&) {
    return false;
  }
}

Frames Backup::unsync() {
  synced_ = false;
  return follow();
}

Frames Backup::refusal(const Frames& hello) const {
  const Envelope e = decode_envelope(hello.at(0).bytes(), hello.size() - 1);
  RefuseInfo r;
  r.retry = !promoted_;
  r.elsewhere = !promoted_;
  r.reason = promoted_ ? "this server took over from its primary at round " +
                             std::to_string(engine_.round()) + " but the worker holds round " +
                             std::to_string(e.round) +
                             ": the primary went on without its backup and the job's state is "
                             "split (resume it from the primary's checkpoint)"
                       : "this backup holds round " + std::to_string(engine_.round()) +
                             ", the worker " + std::to_string(e.round) +
                             ": its primary went on without it, and only the primary holds "
                             "those rounds";
  return {Frame::own(
              encode(Envelope{Type::Refuse, engine_.config().job, engine_.round(), e.rank, 0, 0})),
          Frame::own(encode(r))};
}

Frames Backup::notice() const {
  const DeposedInfo d{token_, "the backup took over at round " + std::to_string(engine_.round()) +
                                  " as epoch " + std::to_string(engine_.epoch())};
  return reply(Type::Deposed, engine_.round(), {Frame::own(encode(d))});
}

Frames Backup::reconnected() {
  ++connection_;
  return promoted_ ? notice() : follow();
}

Frames Backup::promote() {
  SKETCHSGD_REQUIRE(synced_, ProtocolError,
                    "a backup without the primary's state cannot take over");
  promoted_ = true;
  engine_.set_epoch(engine_.epoch() + 1);
  log_("took over from the primary at round " + std::to_string(engine_.round()) + " as epoch " +
       std::to_string(engine_.epoch()));
  return notice();
}

}  // namespace sketchsgd::ps
