// Local steps between pushes: Downpour SGD's n_push and n_fetch (DistBelief) on our parameter
// server. The training loop steps its own copy of the model with its own optimizer and calls
// after_step() after each step; every push_every steps the change since the last push (the
// accumulated, pseudo-gradient Δ = θ_before − θ_now) goes through the codec (with its error
// feedback) as one round's push, and every fetch_every steps the model is replaced by the
// server's. With a server whose outer step has Nesterov momentum and push_every = fetch_every = H
// this is DiLoCo over the parameter server; with both at 1 and lr 1, plain model averaging. With
// an asynchronous server (--mode async) each worker's pseudo-gradient is applied as it arrives
// (asynchronous DiLoCo), and a fetch asks the server for its model.
//
//   ps::Client client(opts, make_compressor(spec, dim), params);
//   ps::LocalSteps local(client, {.push_every = 16, .fetch_every = 16});
//   local.start(params);                 // θ = the server's model
//   for (...) { local optimizer step on params; local.after_step(params); }
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include <sketchsgd/core/device.hpp>
#include <sketchsgd/worker/client.hpp>

namespace sketchsgd::ps {

struct LocalOptions {
  uint32_t push_every = 1;   ///< n_push: local steps between pushes (≥ 1)
  uint32_t fetch_every = 1;  ///< n_fetch: local steps between fetches of the server's model (≥ 1)
  /// Throws InvalidArgument for a knob of 0.
  void validate() const;
};

class LocalSteps {
 public:
  /// Uses client's codec (its device holds every vector passed here).
  LocalSteps(Client& client, LocalOptions o);

  /// Writes the server's model into params and starts counting from it. Call first, and after
  /// a step whose push came back Resynced.
  void start(std::span<float> params);
  /// After one local step on params (length dim, the codec's memory, finite): pushes the change
  /// since the last push when due (the Client's step: encode, push, wait for the round within
  /// the server's staleness) and fetches when due (params = the server's model). Returns the
  /// push's result on steps that pushed. Throws what Client::step throws; a NaN or Inf in the
  /// change is refused (NonFiniteError) before anything is sent, and nothing is lost: the
  /// change stays counted for the next push.
  std::optional<StepResult> after_step(std::span<float> params);

  uint64_t steps() const { return steps_; }
  const LocalOptions& options() const { return o_; }

 private:
  Client& client_;
  LocalOptions o_;
  Device dev_;
  uint64_t steps_ = 0;
  Buffer<float> since_fetch_;  // the model as of the last fetch (or push)
  Buffer<float> carried_;      // change made before the last fetch, not pushed yet
  Buffer<float> delta_;        // the change pushed
};

}  // namespace sketchsgd::ps
