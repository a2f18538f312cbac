#include <sketchsgd/server/admission.hpp>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {

using Worker = Roster::Worker;

Admission::Admission(const JobConfig& cfg, Roster& roster, const ModelStore& store,
                     Replies& replies, std::function<void(const std::string&)> log)
    : cfg_(cfg), roster_(roster), store_(store), replies_(replies), log_(std::move(log)) {
  // Session tokens differ across restarts: a capture of an earlier server's traffic is refused.
  rng_.seed((uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^
            uint64_t(Clock::now().time_since_epoch().count()));
}

std::optional<uint32_t> Admission::hello(const PeerId& peer, const Envelope& e, const Frames& f,
                                         Clock::time_point now, uint64_t epoch,
                                         std::string_view user, std::vector<Outgoing>& out) {
  const HelloInfo h = decode_hello(f[1].bytes());
  auto mismatch = [&](const std::string& why) -> std::optional<uint32_t> {
    replies_.refuse(peer, e, false, why, out);
    return std::nullopt;
  };
  if (cfg_.authenticated && user != std::to_string(e.rank))
    return mismatch("this worker's key is bound to rank " +
                    (user.empty() ? std::string("none") : std::string(user)) + ", not rank " +
                    std::to_string(e.rank));
  if (h.world != cfg_.world)
    return mismatch("world size " + std::to_string(h.world) + ", the job has " +
                    std::to_string(cfg_.world) + (federated() ? " clients a round" : " workers"));
  if (h.population != cfg_.population())
    return mismatch("population " + std::to_string(h.population) + ", the job has " +
                    (federated() ? std::to_string(cfg_.population()) + " clients"
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
  if (h.weight != 1.0f && !cfg_.async())
    return mismatch("weight " + std::to_string(h.weight) +
                    ": a round job averages its pushes alike (weights are for --mode async)");
  if (h.epoch > epoch) {
    // The worker registered with a server of a later epoch: perhaps a backup took over from this
    // one, perhaps the field is forged. A worker's word is hearsay, so it deposes nothing (only
    // the backup's Deposed, with the token of this server's Sync, does: replication.hpp); the
    // worker is sent on to the replica that serves it.
    const std::string why = "this server is at epoch " + std::to_string(epoch) +
                            ", the worker registered with epoch " + std::to_string(h.epoch) +
                            " elsewhere: another replica serves the job";
    replies_.refuse(peer, e, true, why, out, true);
    return std::nullopt;
  }
  uint32_t rank = e.rank;
  bool ahead = false;
  if (federated()) {
    const auto slot = slot_of(peer, e, out);
    if (!slot) return std::nullopt;
    rank = slot->index;
    ahead = slot->ahead;
  }
  // One connection, one registration (a client checked in ahead is not yet any rank).
  const auto held = roster_.rank_of(peer);
  if (held && (ahead || *held != rank))
    return mismatch("this connection is already rank " + std::to_string(*held) + " of round " +
                    std::to_string(store_.round()));
  const auto waits = roster_.waiting_slot(peer);
  if (waits && (!ahead || *waits != rank))
    return mismatch("this connection is already slot " + std::to_string(*waits) + " of round " +
                    std::to_string(store_.round() + 1));

  const Worker& before = ahead ? roster_.waiting(rank) : roster_[rank];
  if (before.registered && before.peer != peer) {
    if (before.alive && now - before.last_seen < cfg_.heartbeat * cfg_.dead_after) {
      replies_.refuse(peer, e, true,
                      "rank " + std::to_string(rank) + " is held by a live connection", out);
      return std::nullopt;
    }
    log_("rank " + std::to_string(rank) + " re-registered on a new connection");
  } else if (!before.registered && !federated()) {
    log_("rank " + std::to_string(rank) + " registered");
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
  if (cfg_.async() && !w.numbered) {
    // Its Hello names the push it is at: a server that knows nothing of it (a new or restored
    // one) takes it at its word; one that does keeps its own count, so a push it has applied
    // already is answered again rather than applied twice.
    w.numbered = true;
    w.next_push = e.round;
    w.base = store_.round();
    w.own = 0;
    w.ack.clear();
  }
  WelcomeInfo info{uint8_t(store_.has_model()), uint32_t(cfg_.heartbeat.count()), cfg_.staleness()};
  info.epoch = epoch;
  info.async = uint8_t(cfg_.async());
  with_outer(info, cfg_.outer);
  out.push_back(
      Outgoing{peer,
               {envelope(Type::Welcome, cfg_.job, store_.round() + ahead, rank, w.session),
                Frame::own(encode(info))}});
  // A federated client comes for the model: it follows the Welcome (a round trip saved a client).
  // Checked in ahead, it is this round's model, which the round's outcome brings up to date when
  // the client's round opens, so the download is off that round's path.
  if (federated() && !ahead) return rank;
  if (ahead && store_.has_model()) {
    Frames fr = store_.model_frames();
    fr[0] = envelope(Type::Model, cfg_.job, store_.round(), rank, w.session);
    out.push_back(Outgoing{peer, std::move(fr)});
    w.behind = true;
  }
  return std::nullopt;
}

void Admission::waiting(uint32_t slot, const Envelope& e, Clock::time_point now) {
  Worker& w = roster_.waiting(slot);
  SKETCHSGD_REQUIRE(e.rank == slot, ProtocolError, "connection of slot ", slot, " of round ",
                    store_.round() + 1, " sent a message as rank ", e.rank);
  if (e.session != w.session) {
    if (e.type == Type::Heartbeat) return;
    return replies_.replay("slot " + std::to_string(slot) + " of round " +
                           std::to_string(store_.round() + 1) +
                           ": session token of another registration");
  }
  w.last_seen = now;
  w.alive = true;
  if (e.type == Type::Heartbeat) return;
  if (e.type == Type::Bye) {  // it will not come after all: its slot may be taken again
    log_("client in slot " + std::to_string(slot) + " of round " +
         std::to_string(store_.round() + 1) + " left before its round");
    roster_.leave_waiting(slot);
    return;
  }
  throw ProtocolError(std::string(to_string(e.type)) + " from slot " + std::to_string(slot) +
                      " of round " + std::to_string(store_.round() + 1) +
                      " before its round opened");
}

std::optional<Admission::Slot> Admission::slot_of(const PeerId& peer, const Envelope& e,
                                                  std::vector<Outgoing>& out) {
  const std::string client = "client " + std::to_string(e.rank);
  const std::string at = " (the job is at round " + std::to_string(store_.round()) + ")";
  if (e.rank >= cfg_.population()) {
    replies_.refuse(
        peer, e, false,
        client + " outside the population [0, " + std::to_string(cfg_.population()) + ")", out);
  } else if (store_.finished()) {
    replies_.finished(peer, e, out);
  } else if (e.round < store_.round()) {
    replies_.refuse(peer, e, false,
                    client + " came for round " + std::to_string(e.round) + ", which is over" + at,
                    out);
  } else if (cfg_.max_rounds && e.round >= cfg_.max_rounds) {
    replies_.finished(peer, e, out,
                      "job " + std::to_string(cfg_.job) + " ends before round " +
                          std::to_string(e.round) + " (its last is " +
                          std::to_string(cfg_.max_rounds - 1) + ")");
  } else if (e.round > store_.round() + 1) {
    replies_.refuse(peer, e, true, "round " + std::to_string(e.round) + " is not open yet" + at,
                    out);
  } else {
    const bool ahead = e.round > store_.round();
    if (const auto slot = roster_.slot_of(e.rank, ahead)) return Slot{*slot, ahead};
    replies_.refuse(peer, e, false, client + " is not sampled in round " + std::to_string(e.round),
                    out);
  }
  return std::nullopt;
}

}  // namespace sketchsgd::ps
