// The parameter server's job logic, free of sockets and threads: handle() one incoming message,
// tick() the clock, collect what to send. The ZeroMQ server (server.hpp) feeds it; tests and the
// simulator drive it directly with a fake clock.
//
// The Engine routes; each concern has a part of its own:
//   admission.hpp     who may register (Hello checks, federated slots, session tokens)
//   roster.hpp        who holds which rank, and what the server knows of each
//   model_store.hpp   the model, the optimizer and codec state, the round, checkpoints: commit()
//   rounds.hpp        a job in rounds (policy, quorum, bounded staleness, two-round codecs)
//   async_pushes.hpp  an asynchronous job (each push applied as it comes)
//   replies.hpp       what the server sends, and the counts of what it refused
// The Engine itself serves what every job shares: Init (rank 0's model), Pull, Heartbeat, Bye,
// the liveness clock, a backup's follow() and a restore.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/ps/frame.hpp>
#include <sketchsgd/ps/outer.hpp>
#include <sketchsgd/ps/protocol.hpp>
#include <sketchsgd/server/admission.hpp>
#include <sketchsgd/server/checkpoint.hpp>
#include <sketchsgd/server/hooks.hpp>
#include <sketchsgd/server/job_config.hpp>
#include <sketchsgd/server/model_store.hpp>
#include <sketchsgd/server/push_handle.hpp>
#include <sketchsgd/server/replies.hpp>
#include <sketchsgd/server/roster.hpp>

namespace sketchsgd::ps {

class Engine {
 public:
  Engine(JobConfig cfg, Hooks hooks = {});
  Engine(const Engine&) = delete;  // its parts hold references to each other
  Engine& operator=(const Engine&) = delete;

  /// One incoming message (envelope + payload frames) from a peer. Never throws for bad input:
  /// malformed or unexpected traffic is logged, counted and dropped (or refused with a reason).
  /// user: the connection's authenticated identity (the rank its CURVE key is bound to).
  void handle(const PeerId& peer, const Frames& frames, Clock::time_point now,
              std::vector<Outgoing>& out, std::string_view user = {});
  /// Liveness and deadlines.
  void tick(Clock::time_point now, std::vector<Outgoing>& out);
  /// When the running phase's deadline passes (nothing while no phase runs, or in asynchronous
  /// jobs): the caller ticks then, so a quorum round closes on time.
  std::optional<Clock::time_point> deadline() const;

  /// Resume from a checkpoint (job and spec must match). The next round is c.round.
  void restore(const Checkpoint& c);
  Checkpoint checkpoint() const { return store_.checkpoint(); }

  // ---- replication (server/replication.hpp): a backup holds the primary's state round by round
  /// The outcome of round() − 1 as sent to the workers (envelope, then its payload frames);
  /// empty before the first round ends.
  const Frames& last_outcome() const { return store_.last_outcome(); }
  /// The aggregator's state across rounds (FetchSGD's sketches; empty for most codecs).
  Bytes codec_state() const { return store_.codec_state(); }
  /// Ends round `round` (= round()) as the primary did: its update applied with the same outer
  /// step, its aggregator state taken over. Throws (changing nothing) on a round out of turn or a
  /// bad update.
  void follow(uint64_t round, const CommitInfo& c, std::span<const uint8_t> payload);
  /// Called as each round ends (its number and outcome as last_outcome() then holds it), the
  /// aggregator's state already that after the round: a primary's commits, one per round even
  /// when one message ends several (bounded staleness).
  void observe(std::function<void(uint64_t round, const Frames& outcome)> ended) {
    ended_ = std::move(ended);
  }
  /// Asynchronous jobs: each rank's next push number (kUnknownPush where none is known); empty
  /// in round jobs. With last_outcome() what a backup needs beyond checkpoint() (ReplicaInfo).
  std::vector<uint64_t> next_pushes() const;
  /// After restore(): the last round's outcome (as last_outcome() held it on the primary) and
  /// the push numbers, so that a worker that missed the outcome gets it and a push sent again
  /// is answered, not applied twice. Throws WireError (changing nothing) for an outcome that is
  /// not round() − 1's Update or Abort, or push numbers of another world.
  void resume(const std::vector<Bytes>& outcome, const std::vector<uint64_t>& pushes);
  /// One more each time a backup takes over. A worker of a later epoch is refused and sent on
  /// (RefuseInfo::elsewhere); what deposes a server is its backup's word (Primary).
  uint64_t epoch() const { return epoch_; }
  void set_epoch(uint64_t e) { epoch_ = e; }

  uint64_t round() const { return store_.round(); }
  bool has_model() const { return store_.has_model(); }
  std::span<const float> model() const { return store_.model(); }
  /// max_rounds reached.
  bool finished() const { return store_.finished(); }
  uint64_t rejected() const { return replies_.rejected(); }
  /// Messages refused for carrying another registration's session token (counted in rejected()).
  uint64_t replays() const { return replies_.replays(); }
  /// Requests answered with Finished (the job had ended).
  uint64_t late_requests() const { return replies_.late(); }
  uint32_t live_workers() const;
  /// Workers a finished job's server still waits for (for their Bye): the live ones and, in a
  /// job of fixed workers, those that pushed the last round and have not said Bye. Such a worker
  /// declared dead at the job's very end (its connection lost, the process paused) is coming
  /// back for the last update; one silent since before the last round is not waited for.
  uint32_t awaited_workers() const;
  /// Ranks that said Bye and have not registered since (a job of fixed workers).
  std::vector<uint32_t> departed() const {
    std::vector<uint32_t> v;
    if (!federated())
      for (uint32_t r = 0; r < cfg_.world; ++r)
        if (roster_[r].left) v.push_back(r);
    return v;
  }
  /// The rank holds a registration (live or not).
  bool registered(uint32_t rank) const { return rank < cfg_.world && roster_[rank].registered; }
  /// Asynchronous jobs: the push number this server expects next of rank, where it knows it
  /// (from a push it applied or followed); nothing before then, or in round jobs.
  std::optional<uint64_t> next_push(uint32_t rank) const {
    if (!cfg_.async() || rank >= cfg_.world || !roster_[rank].numbered) return std::nullopt;
    return roster_[rank].next_push;
  }
  /// The peer holds a registration (a rank, or a federated client's slot of the next round).
  bool knows(const PeerId& peer) const {
    return roster_.rank_of(peer).has_value() || roster_.waiting_slot(peer).has_value();
  }
  const JobConfig& config() const { return cfg_; }
  /// Largest frame a valid message of this job can carry (for ZMQ_MAXMSGSIZE).
  uint64_t max_frame_bytes() const;

 private:
  using Worker = Roster::Worker;

  void refuse_other_version(const PeerId& peer, const Frames& frames, std::vector<Outgoing>& out);
  void on_init(uint32_t rank, uint64_t round, const Frames& f, std::vector<Outgoing>& out);
  void on_pull(uint32_t rank, std::vector<Outgoing>& out);
  /// Ends the store's round (the handle has sent its outcome): observers told, a federated
  /// round's clients released and the next round's seated.
  void commit(Frames outcome, std::vector<Outgoing>& out);

  bool federated() const { return cfg_.federated(); }
  /// A federated round has opened: the clients checked in for it take their slots and get the
  /// round before's outcome (or the model, if they came before there was one).
  void seat_waiting(std::vector<Outgoing>& out);

  JobConfig cfg_;
  Hooks hooks_;
  ModelStore store_;
  Roster roster_;
  Replies replies_;
  Admission admission_;
  std::unique_ptr<PushHandle> handle_;  // Rounds or AsyncPushes
  uint64_t epoch_ = 0;
  std::function<void(uint64_t, const Frames&)> ended_;

  std::vector<bool> pending_pull_;  // ranks that asked for the model before it existed
};

}  // namespace sketchsgd::ps
