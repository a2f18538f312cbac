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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../compress/compressor.hpp"

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
  };
  Outcome outcome = Outcome::Updated;
  uint64_t round = 0;  ///< the round this step belonged to
  float lr = 0;
  uint32_t contributors = 0;
  uint64_t bytes_up = 0;    ///< gradient (+ answer) bytes sent
  uint64_t bytes_down = 0;  ///< update (+ query) bytes received
};

class Client {
 public:
  /// Connects, registers and pulls the model. Rank 0 initialises the server's model with
  /// initial_params when the server has none; every other rank ignores initial_params (may be
  /// empty). Throws ConfigMismatch with the server's reason when registration is refused, and
  /// TimeoutError when the server does not answer within opts.timeout.
  Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
         std::span<const float> initial_params);
  ~Client();  ///< says goodbye; never blocks longer than the socket linger
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// One synchronous round with this gradient (length dim, finite).
  StepResult step(std::span<const float> grad);

  std::span<const float> params() const { return params_; }
  /// The next round this worker will push.
  uint64_t round() const { return round_; }
  Compressor& codec() { return *codec_; }
  uint32_t rank() const { return opts_.rank; }

 private:
  struct Link;
  struct Event;
  void hello();
  Event wait(std::chrono::steady_clock::time_point deadline, const char* what);
  /// Handles registration traffic; returns true when the event was consumed.
  bool handle_control(const Event& e);

  ClientOptions opts_;
  std::unique_ptr<Compressor> codec_;
  std::vector<float> params_;
  std::vector<float> init_;  // rank 0's initial parameters, kept until the server has a model
  std::vector<float> step_;
  uint64_t round_ = 0;
  bool registered_ = false;
  bool synced_ = false;  // a Model has arrived since the last registration
  bool model_changed_round_ = false;
  std::unique_ptr<Link> link_;
};

}  // namespace sketchsgd::ps
