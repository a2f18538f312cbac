// The worker side of the parameter server: what a training loop calls.
//
//   sketchsgd::ps::Client client(opts, sketchsgd::make_compressor(spec, dim), initial_params);
//   for (...) {
//     compute grad at client.params();
//     auto r = client.step(grad);   // encode, push, (answer), receive and apply the update
//   }
//
// The client keeps its own copy of the parameters and applies every update exactly as the server
// does, so all workers and the server hold bit-identical models. The round logic is a Session
// (session.hpp); an I/O thread (ps/io_thread.hpp) owns the ZeroMQ socket: it shows liveness while
// the caller computes, notices a silent server, reconnects with backoff, and the client then
// registers again and resynchronises by pulling the model.
#pragma once

#include <memory>
#include <span>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/worker/session.hpp>

namespace sketchsgd::ps {

struct Received;

class Client {
 public:
  /// Connects, registers and pulls the model. Rank 0 initialises the server's model with
  /// initial_params when the server has none; every other rank ignores initial_params (may be
  /// empty). Parameters and gradients live where the codec does (codec->device(): device memory
  /// for a GPU codec); the wire carries host bytes. Throws ConfigMismatch with the server's reason
  /// when registration is refused, JobFinished when the server's job has already ended, and
  /// TimeoutError when the server does not answer within opts.timeout.
  Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
         std::span<const float> initial_params);
  ~Client();  ///< says goodbye; never blocks longer than the socket linger
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Pushes this gradient (length dim, finite) for the next round, then applies updates until at
  /// most `staleness` pushes are unanswered (the server's setting; 0: wait for this round's
  /// update). Throws JobFinished at once when the server's job ended before this round.
  StepResult step(std::span<const float> grad);

  /// Waits for the outcome of every unanswered push (the end of training with staleness > 0).
  StepResult sync();

  /// The model, in the codec's device memory.
  std::span<const float> params() const { return session_->params(); }
  /// The round whose update comes next: params() hold every update before it.
  uint64_t round() const { return session_->round(); }
  /// The round the next step() pushes (round() + unanswered pushes).
  uint64_t next_push() const { return session_->next_push(); }
  uint32_t staleness() const { return session_->staleness(); }
  Compressor& codec() { return *codec_; }
  /// The rank this registration uses (a federated client's slot in its round).
  uint32_t rank() const { return session_->rank(); }

 private:
  struct Link;
  /// Sends what the session queued.
  void flush(Session::Outbox& out);
  /// The next event of the link (a server message, or the news that the socket was replaced),
  /// running the session's timers meanwhile; false when the deadline passed first.
  bool next(std::chrono::steady_clock::time_point deadline, Received& ev);
  /// Hands an event to the session; true when the step must return (resynchronised).
  bool dispatch(Received& ev, StepResult& res);
  [[noreturn]] void timeout(const std::string& what) const;

  std::unique_ptr<Compressor> codec_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<Link> link_;
};

}  // namespace sketchsgd::ps
