// The worker side of the parameter server: what a training loop calls.
//
//   sketchsgd::ps::Client client(opts, sketchsgd::make_compressor(spec, dim), initial_params);
//   for (...) {
//     compute grad at client.params();
//     auto r = client.step(grad);   // encode, push, (answer), receive and apply the update
//   }
//
// The client keeps its own copy of the parameters and applies every update exactly as the server
// does, so all workers and the server hold bit-identical models. A background thread owns the
// ZeroMQ socket: it shows liveness while the caller computes, notices a silent server, reconnects
// with backoff, and the client then registers again and resynchronises by pulling the model.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../compress/compressor.hpp"
#include "../server/frame.hpp"

namespace sketchsgd::ps {

struct ClientOptions {
  std::string server = "tcp://127.0.0.1:5555";
  uint64_t job = 1;
  uint32_t rank = 0;
  uint32_t world = 1;
  std::chrono::milliseconds heartbeat{1000};  ///< replaced by the server's value on registration
  uint32_t dead_after = 3;                    ///< silent intervals before the server counts as gone
  std::chrono::milliseconds timeout{120000};  ///< longest wait for registration or one round
  std::chrono::milliseconds backoff_max{4000};
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
  uint64_t bytes_down = 0;  ///< update (+ query) bytes received
  std::chrono::steady_clock::time_point
      pushed_at{};  ///< when the encoded push was handed to the socket
};

class Client {
 public:
  /// Connects, registers and pulls the model. Rank 0 initialises the server's model with
  /// initial_params when the server has none; every other rank ignores initial_params (may be
  /// empty). Parameters and gradients live where the codec does (codec->device(): device memory
  /// for a GPU codec); the wire carries host bytes. Throws ConfigMismatch with the server's reason
  /// when registration is refused, and TimeoutError when the server does not answer within
  /// opts.timeout.
  Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
         std::span<const float> initial_params);
  ~Client();  ///< says goodbye; never blocks longer than the socket linger
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Pushes this gradient (length dim, finite) for the next round, then applies updates until at
  /// most `staleness` pushes are unanswered (the server's setting; 0: wait for this round's
  /// update).
  StepResult step(std::span<const float> grad);

  /// Waits for the outcome of every unanswered push (the end of training with staleness > 0).
  StepResult sync();

  /// The model, in the codec's device memory.
  std::span<const float> params() const { return params_.span(); }
  /// The round whose update comes next: params() hold every update before it.
  uint64_t round() const { return round_; }
  /// The round the next step() pushes (round() + unanswered pushes).
  uint64_t next_push() const { return next_push_; }
  uint32_t staleness() const { return staleness_; }
  Compressor& codec() { return *codec_; }
  uint32_t rank() const { return opts_.rank; }

 private:
  struct Link;
  struct Event;
  void hello();
  Event wait(std::chrono::steady_clock::time_point deadline, const char* what);
  /// Applies one event to the round state; true when the step must return (resynchronised).
  bool settle(const Event& e, StepResult& res);
  /// Handles registration traffic; returns true when the event was consumed.
  bool handle_control(const Event& e);

  ClientOptions opts_;
  std::unique_ptr<Compressor> codec_;
  Buffer<float> params_;  // on the codec's device
  std::vector<float>
      init_;  // rank 0's initial parameters (host), kept until the server has a model
  uint64_t round_ = 0;
  uint64_t next_push_ = 0;
  uint32_t staleness_ = 0;
  std::deque<std::pair<uint64_t, Frame>> pending_;  // pushes without an outcome yet
  bool registered_ = false;
  bool synced_ = false;  // a Model has arrived since the last registration
  bool model_changed_round_ = false;
  std::unique_ptr<Link> link_;
};

}  // namespace sketchsgd::ps
