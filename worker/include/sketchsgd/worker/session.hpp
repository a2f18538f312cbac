// The worker's side of the protocol, free of sockets and threads: what to send, what each server
// message means, and the round state (the model copy, the round, unanswered pushes). The Client
// (client.hpp) runs it over an I/O thread; tests drive it against the server's Engine with a fake
// clock, as the Engine itself is tested.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/ps/frame.hpp>
#include <sketchsgd/ps/outer.hpp>
#include <sketchsgd/ps/protocol.hpp>

namespace sketchsgd::ps {

struct ClientOptions {
  /// The server's endpoint, or a sharded job's servers separated by commas (shard i at place i;
  /// ps/shards.hpp): the Client then pushes each its part of every gradient. A replicated
  /// server is its primary and backup separated by '|' ("tcp://a:5555|tcp://b:5555"): when the
  /// one it talks to falls silent, the client goes on to the next.
  std::string server = "tcp://127.0.0.1:5555";
  uint64_t job = 1;
  uint32_t rank = 0;   ///< the worker's rank, or a federated client's id
  uint32_t world = 1;  ///< workers, or a federated job's clients per round
  /// A federated job's population (0: a job of `world` fixed workers). The client registers for
  /// round `join_round` (the server refuses it unless it was sampled then), uses the slot the
  /// server gives it as its rank, and is done once that round has ended. It may register while
  /// the round before runs (the server takes check-ins one round ahead): it gets that round's
  /// model at once and its update when its own round opens, and the Client's constructor
  /// returns then. Any client holding
  /// initial parameters may initialise a server that has no model.
  uint32_t population = 0;
  uint64_t join_round = 0;
  /// The part of the model this Session's server holds (the Client sets it for each shard of a
  /// sharded job; the codec then covers that range). Default: the whole model.
  ShardId shard;
  std::chrono::milliseconds heartbeat{1000};  ///< replaced by the server's value on registration
  uint32_t dead_after = 3;                    ///< silent intervals before the server counts as gone
  std::chrono::milliseconds timeout{120000};  ///< longest wait for registration or one round
  std::chrono::milliseconds backoff_max{4000};
  /// Asynchronous jobs (the server says so when it welcomes the worker): fetch the server's model
  /// after every fetch_every pushes (Downpour's n_fetch, counted in pushes), and after a push the
  /// server refused as too old. 0: only when Client::fetch() asks.
  uint32_t fetch_every = 1;
  /// Asynchronous jobs: what each of this worker's pushes counts for (HelloInfo::weight: the
  /// steps or tokens a push represents, relative to the job's nominal push); its step is
  /// lr · weight / world. Round jobs refuse anything but 1.
  float weight = 1.0f;
  /// Share one ZeroMQ context (its I/O thread) with every other Client of this process that sets
  /// this, instead of a context each: for many clients in one process (a simulated federated
  /// population, a benchmark's workers), where a context each costs two more threads to start
  /// and stop a client. The shared context lives until the process ends.
  bool shared_io = false;
  std::function<void(const std::string&)> log;  ///< default: stderr, prefixed with the rank
  /// CURVE (all three Z85 keys, or none): the server's public key and this worker's key pair.
  std::string curve_server_key, curve_public, curve_secret;
};

struct StepResult {
  enum class Outcome : uint8_t {
    Updated,   ///< the round's update was applied to params()
    Aborted,   ///< the server ended the round without an update; params() unchanged
    Resynced,  ///< the server was elsewhere (restart): params() and round() now follow it
    Pending,   ///< bounded staleness: pushed, no update arrived yet (params() may lag)
  };
  Outcome outcome = Outcome::Pending;  ///< of the last round settled during this call
  uint64_t round = 0;                  ///< the round this step pushed
  float lr = 0;
  uint32_t contributors = 0;
  uint64_t bytes_up = 0;    ///< gradient (+ answer) bytes sent
  uint64_t bytes_down = 0;  ///< update (+ query) bytes received; asynchronous: + fetched models
  std::chrono::steady_clock::time_point
      pushed_at{};  ///< when the encoded push was handed to the socket
  /// Asynchronous jobs: how many other workers' updates the server had applied since this
  /// worker's fetch when its push arrived, and the server's version after it.
  uint64_t age = 0;
  uint64_t version = 0;
  bool fetched = false;  ///< a model arrived during the call (params() replaced)
};

class Session {
 public:
  using Clock = std::chrono::steady_clock;
  using Outbox = std::vector<Frames>;

  /// Rank 0 keeps initial_params (length dim, finite) until the server has a model; other ranks
  /// ignore them. Parameters live where the codec does. Throws InvalidArgument, NonFiniteError.
  Session(ClientOptions opts, Compressor& codec, std::span<const float> initial_params);

  /// Registers (again): a Hello. Called first, and by the owner after a reconnect.
  void hello(Outbox& out);
  /// A message from the server. Returns true when a step must return at once (the server was
  /// elsewhere and the model was resynchronised). Throws ConfigMismatch when registration is
  /// refused for good, JobFinished when the job has ended, WireError / NonFiniteError for a bad
  /// model. Messages of another session or rank are dropped (logged).
  bool handle(const Frames& frames, Clock::time_point now, Outbox& out, StepResult& res);
  /// A message before the model arrived: only registration traffic counts, the rest is logged.
  void handle_registration(const Frames& frames, Clock::time_point now, Outbox& out);
  /// Timed work (a Hello retried after a transient refusal); next_tick() says when.
  void tick(Clock::time_point now, Outbox& out);
  std::optional<Clock::time_point> next_tick() const { return hello_at_; }
  /// The server said another replica serves the job (a later epoch registered there): the
  /// link should try its next endpoint. True once per such refusal.
  bool take_elsewhere() { return std::exchange(elsewhere_, false); }
  /// The epoch this worker promised a backup to wait for (it answered its probe), if it did and
  /// has neither registered there nor been released: servers of an older epoch refuse it.
  std::optional<uint64_t> promised() const {
    return promise_ ? std::optional<uint64_t>(promise_->epoch) : std::nullopt;
  }
  /// Encodes grad (length dim, finite) and queues the push of round next_push().
  void push(std::span<const float> grad, Outbox& out, StepResult& res);
  /// Leaving cleanly (when registered).
  void bye(Outbox& out) const;

  /// Asks for the server's model (an asynchronous job's fetch; a round job's model is current).
  void fetch(Outbox& out);
  /// Pushes that must be answered before the next step returns (staleness exceeded), or, in an
  /// asynchronous job, any push or fetch without its reply.
  bool must_wait() const {
    return async_ ? next_push_ > round_ || fetching_ : next_push_ - round_ > staleness_;
  }
  /// Every push answered and no fetch outstanding.
  bool settled() const { return round_ >= next_push_ && !fetching_; }
  /// The server runs an asynchronous job (known from its Welcome).
  bool async() const { return async_; }
  bool synced() const { return synced_; }
  bool registered() const { return registered_; }
  std::span<const float> params() const { return params_.span(); }
  uint64_t round() const { return round_; }
  uint64_t next_push() const { return next_push_; }
  uint32_t staleness() const { return staleness_; }
  /// The current registration's token (0 until a Welcome).
  uint64_t session() const { return session_; }
  /// The liveness interval the server asked for (the option's value before registration).
  std::chrono::milliseconds heartbeat() const { return heartbeat_; }
  const ClientOptions& options() const { return opts_; }
  /// The rank this registration uses: the option's, or a federated client's slot.
  uint32_t rank() const { return slot_; }

 private:
  struct Parsed;
  std::optional<Parsed> parse(const Frames& frames) const;
  bool control(const Parsed& m, Clock::time_point now, Outbox& out);
  /// Applies an Update's step to params(); returns the update's bytes.
  uint64_t apply_update(const Parsed& m);
  Frame envelope(Type t, uint64_t round) const;
  HelloInfo hello_info() const;
  /// Answering a backup's Probe, the worker promised to register with no server of an epoch
  /// before `epoch`, until it registers with one of `epoch` or later or the backup releases it.
  struct Promise {
    uint64_t epoch = 0;
  };

  ClientOptions opts_;
  Compressor& codec_;
  Buffer<float> params_;              // on the codec's device
  std::unique_ptr<OuterStep> outer_;  // applies every update; the job's, from its Welcome
  std::vector<float> init_;  // rank 0's initial parameters (host), until the server has a model
  uint32_t slot_;  // the rank used on the wire (a federated client's slot from its Welcome)
  uint64_t round_ = 0;
  uint64_t next_push_ = 0;
  uint32_t staleness_ = 0;
  uint64_t session_ = 0;  // the token of the current registration
  uint64_t epoch_ = 0;    // the highest server epoch registered with (replicated servers)
  std::chrono::milliseconds heartbeat_;
  std::deque<std::pair<uint64_t, Frame>> pending_;  // pushes without an outcome yet
  // A federated client's codec state before its pending push: a push the server lost and the
  // client computes again must not carry the first one's error feedback as well.
  std::optional<Bytes> before_push_;
  uint64_t resent_ = 0;                        // bytes of pushes sent again with the last Welcome
  bool resent_before_model_ = false;           // they went before the Pull: the Model needs none
  std::optional<Clock::time_point> hello_at_;  // a Hello to send again then
  std::optional<Promise> promise_;
  bool registered_ = false;
  bool elsewhere_ = false;  // a refusal sent us to the next replica (take_elsewhere())
  bool synced_ = false;     // a Model of the current round has arrived since the last registration
  // A federated client checked in ahead holds the model of the round before its own; that
  // round's outcome brings it up to date.
  bool behind_ = false;
  bool model_changed_round_ = false;
  bool async_ = false;
  bool fetching_ = false;     // a Pull without its Model yet
  uint64_t since_fetch_ = 0;  // pushes since the last fetch (asynchronous jobs)
};

}  // namespace sketchsgd::ps
