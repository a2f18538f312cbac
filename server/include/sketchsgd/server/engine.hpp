// The parameter server's round logic, free of sockets and threads: handle() one incoming message,
// tick() the clock, collect what to send. The ZeroMQ server (server.hpp) feeds it; tests drive it
// directly with a fake clock.
//
// A round: every registered worker Pushes its Gradient message; the codec's aggregator merges them
// in compressed form (sketch tables summed, sparse lists merged); for two-round codecs the server
// Queries the contributors and sums their Answers; then the Update goes to every live worker, the
// server applies it to its own copy of the model (w −= lr · step, or the outer step with
// momentum: ps/outer.hpp), and the round number advances.
//
// An asynchronous job (DistBelief's Downpour) has no rounds: each push is decoded and applied as
// it arrives, and only its pusher gets the update (its codec's error feedback needs it); workers
// fetch the model when they choose. The version (round()) counts the updates applied. A push's
// age is the number of other workers' updates applied since its pusher fetched the model it
// computed on; its step is lr · weight / world (the weight its pusher declared: the steps or
// tokens a push represents, 1 by default), divided by (1 + age) unless age_scaled is off, and a
// push older than max_age is refused (Abort: nothing applied, the worker keeps its error feedback
// and fetches). The envelope of a Push and of its Update carries the worker's own push number, so a
// push sent again after a lost reply is answered again, never applied twice.
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
#include <sketchsgd/server/checkpoint.hpp>
#include <sketchsgd/server/roster.hpp>

namespace sketchsgd::ps {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

/// What happens when a round's deadline passes before every worker has pushed.
enum class Policy : uint8_t {
  Wait,    ///< keep waiting for all W (logged every deadline)
  Quorum,  ///< close with the workers that pushed, if at least min_workers did
  Abort,   ///< end the round without an update; workers move on to the next round
};
Policy parse_policy(std::string_view s);
std::string_view to_string(Policy p);

struct JobConfig {
  uint64_t job = 1;
  uint32_t world = 1;
  uint64_t dim = 0;
  std::string spec =
      "sketch";  ///< any spec make_compressor accepts; workers must send its canonical form
  float lr = 0.1f;
  /// The step every holder of the model applies to an update: w −= lr · step, or with momentum
  /// the outer step of a local-SGD job (workers push pseudo-gradients; ps/outer.hpp).
  OuterOptions outer;
  Policy policy = Policy::Wait;
  uint32_t min_workers = 0;  ///< quorum size (0: world)
  Millis deadline{30000};    ///< per phase, from its first message
  Millis heartbeat{1000};
  uint32_t dead_after = 3;  ///< missed heartbeat intervals before a worker counts as dead
  /// Rounds between the snapshots handed to Hooks::checkpoint (0: none).
  uint64_t checkpoint_every = 0;
  uint64_t max_rounds = 0;  ///< the job ends after this round (0: never)
  /// Bounded staleness (the parameter-server paper's bounded delay): a worker may push up to this
  /// many rounds ahead of the last update it received. 0: synchronous. Not with two-round codecs.
  uint32_t staleness = 0;
  bool authenticated = false;  ///< CURVE: a Hello's rank must be the one its key is bound to
  /// Asynchronous (see the top of this file): no rounds, no policy, one-round codecs only.
  bool async = false;
  /// Asynchronous jobs: a push older than this many updates of other workers is refused (0: any
  /// age is applied).
  uint32_t max_age = 0;
  /// Asynchronous jobs: a push's step divided by (1 + its age) (staleness-aware SGD).
  bool age_scaled = true;
  /// A federated (cross-device) job: `population` clients, `world` of them sampled each round
  /// (sample_clients(population, world, sample_seed, round)). A sampled client registers for its
  /// round under its id, gets the slot of its place in the sample as its rank, pushes and
  /// leaves; every slot is free again once the round has ended. A slot whose client has not
  /// come counts as live until the deadline; unless the policy is wait, a round short of its
  /// quorum at the deadline, or without any push or live client a deadline after it was first
  /// seen so, is aborted (its clients are not coming back: the next round's would wait behind it
  /// for ever). A client of the
  /// next round may check in while this one runs: it is welcomed then, takes its slot and gets the
  /// model the moment its round opens, so its connection and registration are off the round's path.
  /// 0: `world` fixed workers.
  uint32_t population = 0;
  uint64_t sample_seed = 1;
  /// A sharded job's part (ps/shards.hpp): dim and spec are then the shard's range and its
  /// share of the codec; workers must name the same shard. Default: the whole model.
  ShardId shard;
  /// Where the aggregator sums and decodes (a GPU: the sketch unsketch runs there). The server's
  /// model copy stays on the host.
  Device device = Device::cpu();

  void validate() const;
};

struct RoundMetrics {
  uint64_t round = 0;
  bool aborted = false;
  std::string reason;                ///< why it closed early or aborted
  double latency_ms = 0;             ///< first push → update sent
  double merge_ms = 0;               ///< time spent merging and reducing
  uint32_t contributors = 0;         ///< gradients in the update
  std::vector<uint64_t> bytes_up;    ///< per rank, this round (gradient + answer messages)
  uint64_t bytes_down_each = 0;      ///< update (+ query) bytes sent to each worker
  uint64_t dense_bytes = 0;          ///< what one dense fp32 gradient would cost
  std::vector<uint32_t> stragglers;  ///< live workers not in the update
  std::vector<uint32_t> dead;        ///< registered workers counted as dead
  /// Asynchronous jobs: the push's pusher and age (the update's contributors is 1).
  uint32_t pusher = 0;
  uint64_t age = 0;
};

struct Hooks {
  std::function<void(const std::string&)> log = [](const std::string&) {};
  std::function<void(const RoundMetrics&)> round = [](const RoundMetrics&) {};
  /// A snapshot of the model and the server state, every checkpoint_every rounds and after the
  /// last (last = true: the job is done once it is stored). The caller stores it (the server
  /// writes it on a thread of its own); unset: no snapshots are taken.
  std::function<void(Checkpoint, bool last)> checkpoint;
};

class Engine {
 public:
  Engine(JobConfig cfg, Hooks hooks = {});

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
  Checkpoint checkpoint() const;

  // ---- replication (server/replication.hpp): a backup holds the primary's state round by round
  /// The outcome of round() − 1 as sent to the workers (envelope, then its payload frames);
  /// empty before the first round ends.
  const Frames& last_outcome() const { return last_outcome_; }
  /// The aggregator's state across rounds (FetchSGD's sketches; empty for most codecs).
  Bytes codec_state() const;
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

  uint64_t round() const { return round_; }
  bool has_model() const { return !model_.empty(); }
  std::span<const float> model() const { return model_; }
  /// max_rounds reached.
  bool finished() const { return cfg_.max_rounds && round_ >= cfg_.max_rounds; }
  uint64_t rejected() const { return rejected_; }
  /// Messages refused for carrying another registration's session token (counted in rejected()).
  uint64_t replays() const { return replays_; }
  /// Requests answered with Finished (the job had ended).
  uint64_t late_requests() const { return late_; }
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
    if (!cfg_.async || rank >= cfg_.world || !roster_[rank].numbered) return std::nullopt;
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

  void on_hello(const PeerId& peer, const Envelope& e, const Frames& f, Clock::time_point now,
                std::vector<Outgoing>& out, std::string_view user);
  void refuse_other_version(const PeerId& peer, const Frames& frames, std::vector<Outgoing>& out);
  void on_init(uint32_t rank, uint64_t round, const Frames& f, std::vector<Outgoing>& out);
  /// A checkpoint of the state now (`now`), or at a round's end where checkpoint_every says.
  void save(bool now);
  void on_pull(uint32_t rank, std::vector<Outgoing>& out);
  void on_push(uint32_t rank, const Envelope& e, const Frames& f, Clock::time_point now,
               std::vector<Outgoing>& out);
  /// An asynchronous job's push: refused, or applied at once and answered to its pusher alone.
  void on_async_push(uint32_t rank, const Envelope& e, std::span<const uint8_t> msg,
                     std::vector<Outgoing>& out);
  /// Sends rank its last push's reply (kept in Worker::ack) with a fresh envelope.
  void send_ack(uint32_t rank, std::vector<Outgoing>& out) const;
  void on_answer(uint32_t rank, const Envelope& e, const Frames& f, Clock::time_point now,
                 std::vector<Outgoing>& out);

  /// Closes phases while the policy allows (several rounds when early pushes were held).
  void progress(Clock::time_point now, std::vector<Outgoing>& out);
  /// Closes the current phase when the policy allows; true when it did.
  bool progress_once(Clock::time_point now, std::vector<Outgoing>& out);
  /// Starts the next round with the pushes held for it (bounded staleness).
  void replay_held(Clock::time_point now);
  void close_phase(Clock::time_point now, std::vector<Outgoing>& out, std::string reason);
  void abort_round(Clock::time_point now, std::vector<Outgoing>& out, std::string reason);
  /// Sends the round's outcome (Update or Abort + payload frames) to every registered worker,
  /// keeps it for re-sending, and moves to the next round.
  void end_round(Type outcome, Frames payload, Clock::time_point now, std::vector<Outgoing>& out);
  void finish_round(std::vector<Outgoing>& out);
  /// The last round's outcome (Update or Abort), again, to a rank.
  void resend_outcome(uint32_t rank, uint64_t round, std::vector<Outgoing>& out) const;
  /// Merges held messages in rank order, so the float sums (and so the model) do not depend on
  /// arrival order: up to the first expected rank still missing, or all of them when closing.
  void absorb_in_order(bool closing);
  void start_phase(MessageKind kind);
  void reset_round();

  bool federated() const { return cfg_.population != 0; }
  /// A federated Hello's slot: the client's place in the sample of this round, or of the next
  /// (ahead: it checks in while this round runs), or nothing with a refusal sent.
  struct Slot {
    uint32_t index;
    bool ahead;
  };
  std::optional<Slot> slot_of(const PeerId& peer, const Envelope& e, std::vector<Outgoing>& out);
  /// Traffic of a client checked in for the next round: heartbeats and Bye, nothing else.
  void on_waiting(uint32_t slot, const Envelope& e, Clock::time_point now);
  /// A federated round has opened: the clients checked in for it take their slots and get the
  /// round before's outcome (or the model, if they came before there was one).
  void seat_waiting(std::vector<Outgoing>& out);
  /// An aggregator on the job's device (the CPU, or a GPU for --device cuda).
  std::unique_ptr<Aggregator> make_aggregator() const;
  void send(uint32_t rank, Frames frames, std::vector<Outgoing>& out) const;
  /// An envelope to a registered rank, with its session token.
  Frame to(uint32_t rank, Type t, uint64_t round) const;
  /// "The job finished at round N", to a request that came after the last round (or for a round
  /// past it: `why` says so).
  void finished_reply(const PeerId& peer, const Envelope& e, std::vector<Outgoing>& out,
                      std::string why = {});
  void refuse(const PeerId& peer, const Envelope& e, bool retry, const std::string& why,
              std::vector<Outgoing>& out);
  Frames model_frames() const;
  void drop(const PeerId& peer, const std::string& why);

  JobConfig cfg_;
  Hooks hooks_;
  std::unique_ptr<Compressor> codec_;  // the server's own: applies updates to model_, never encodes
  std::unique_ptr<Aggregator> agg_;
  std::unique_ptr<Aggregator> spare_;  // a backup's: where a commit's state is checked first
  std::vector<float> model_;
  std::unique_ptr<OuterStep> outer_;  // on the host, beside model_
  uint64_t round_ = 0;
  uint64_t epoch_ = 0;
  std::function<void(uint64_t, const Frames&)> ended_;

  Roster roster_;
  std::vector<bool> pending_pull_;  // ranks that asked for the model before it existed

  // current round
  std::vector<bool> pushed_;       // gradient phase contributors
  std::vector<bool> answered_;     // answer phase contributors
  std::vector<bool> last_pushed_;  // the last round's contributors (awaited_workers)
  std::vector<Frame> held_;        // messages of this phase waiting for their turn to merge
  Frame query_;                    // the second phase's Query, asked again of a rank that lost it
  uint32_t cursor_ = 0;            // ranks below it are merged (or skipped)
  MessageKind phase_ = MessageKind::Gradient;
  std::optional<Clock::time_point> round_start_;
  std::optional<std::pair<uint64_t, Clock::time_point>> empty_since_;  // a federated round's
  Clock::time_point phase_start_{};
  Clock::time_point last_wait_log_{};
  RoundMetrics metrics_;
  double merge_ms_ = 0;

  std::map<uint64_t, std::vector<Frame>> early_;  // pushes of rounds ahead, by round then rank
  Frames last_outcome_;     // Update or Abort of round_ − 1, re-sent to a worker that missed it
  mutable Frame snapshot_;  // the model's bytes for Pulls, until the model changes
  uint64_t rejected_ = 0;
  uint64_t replays_ = 0;
  uint64_t late_ = 0;
  std::mt19937_64 rng_;  // session tokens
};

}  // namespace sketchsgd::ps
