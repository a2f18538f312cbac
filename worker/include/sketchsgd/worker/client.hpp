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
//
// A sharded job (ps/shards.hpp) names its S servers in opts.server, separated by commas: the
// client then runs one Session and link per shard, each with the codec of its range (its share of
// the job codec's budget), sends every shard its part of each gradient before waiting for any
// (the shards' rounds run at once on their links; the codecs' work stays on the caller's thread)
// and assembles the parameters from the shards' ranges. The shards keep their own rounds.
#pragma once

#include <exception>
#include <memory>
#include <span>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/core/scratch.hpp>
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
  /// TimeoutError when the server does not answer within opts.timeout. With shards every server
  /// is registered with (in shard order) before the constructor returns; codec is then the job's:
  /// its spec, dim and device (each shard encodes with a codec of its own range).
  Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
         std::span<const float> initial_params);
  ~Client();  ///< says goodbye; never blocks longer than the socket linger
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Pushes this gradient (length dim, finite) for the next round, then applies updates until at
  /// most `staleness` pushes are unanswered (the server's setting; 0: wait for this round's
  /// update). Throws JobFinished at once when the server's job ended before this round.
  ///
  /// With shards every part goes out before any round is waited for, and the result sums the
  /// bytes; its outcome is the
  /// most eventful of the shards' (Resynced, then Aborted, then Pending, then Updated) and its
  /// round the lowest pushed. A NaN or Inf is refused before any shard is sent anything. A shard
  /// whose job has finished is left out of later steps (its range stays as it was); JobFinished
  /// comes once every shard's has. When a shard fails (TimeoutError: down past the deadline) the
  /// others' rounds still complete, then its error is thrown.
  StepResult step(std::span<const float> grad);

  /// Waits for the outcome of every unanswered push (the end of training with staleness > 0).
  StepResult sync();

  /// An asynchronous job's fetch (Downpour's n_fetch when the caller chooses it, beside
  /// ClientOptions::fetch_every): params() become the server's model, with every update
  /// applied so far. In a round job params() are always the model of the last round: it waits
  /// for nothing new.
  StepResult fetch();
  /// The server runs an asynchronous job: step() returns once its push is applied (or refused as
  /// too old), without waiting for other workers; params() are the last fetched model plus this
  /// worker's own updates since.
  bool async() const;

  /// The model, in the codec's device memory.
  std::span<const float> params() const;
  /// The round whose update comes next: params() hold every update before it (with shards: the
  /// lowest of the shards' rounds).
  uint64_t round() const;
  /// The round the next step() pushes (round() + unanswered pushes; with shards the lowest).
  uint64_t next_push() const;
  uint32_t staleness() const;
  Compressor& codec() { return *codec_; }
  /// The rank this registration uses (a federated client's slot in its round).
  uint32_t rank() const;
  /// Servers the model is spread over (1: one server).
  size_t shards() const { return shards_.size(); }
  /// Shard i's round (its servers keep their own).
  uint64_t shard_round(size_t i) const;

 private:
  struct Shard;
  /// Runs f(shard, its result) on every shard, in shard order, skipping those finished or
  /// already failed in this call; records failures in errors.
  template <class F>
  void each(std::vector<StepResult>& res, std::vector<std::exception_ptr>& errors, F&& f);
  /// The first recorded failure, unless it is a JobFinished while other shards still run.
  void rethrow(const std::vector<std::exception_ptr>& errors) const;
  /// Which shards still take part in steps (their jobs have not finished).
  std::vector<bool> live() const;
  /// Copies the shards' parameters into params_ (S > 1).
  void assemble();

  std::unique_ptr<Compressor> codec_;
  std::vector<std::unique_ptr<Shard>> shards_;
  Buffer<float> params_;  // S > 1: the shards' ranges side by side
  Scratch scratch_;       // S > 1: the finiteness check of a whole gradient
};

}  // namespace sketchsgd::ps
