#include <sketchsgd/worker/local_steps.hpp>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/ops.hpp>

namespace sketchsgd::ps {

void LocalOptions::validate() const {
  SKETCHSGD_REQUIRE(push_every >= 1, InvalidArgument, "push_every (n_push) must be ≥ 1");
  SKETCHSGD_REQUIRE(fetch_every >= 1, InvalidArgument, "fetch_every (n_fetch) must be ≥ 1");
}

LocalSteps::LocalSteps(Client& client, LocalOptions o)
    : client_(client), o_(o), dev_(client.codec().device()) {
  o_.validate();
  const size_t dim = client.codec().dim();
  since_fetch_ = Buffer<float>(dim, dev_);
  carried_ = Buffer<float>(dim, dev_);
  delta_ = Buffer<float>(dim, dev_);
}

void LocalSteps::start(std::span<float> params) {
  SKETCHSGD_REQUIRE(params.size() == since_fetch_.size(), InvalidArgument,
                    "local steps: ", params.size(), " parameters for a model of ",
                    since_fetch_.size());
  ops::copy(dev_, params, client_.params());
  ops::copy(dev_, since_fetch_.span(), client_.params());
  carried_.zero();
}

std::optional<StepResult> LocalSteps::after_step(std::span<float> params) {
  SKETCHSGD_REQUIRE(params.size() == since_fetch_.size(), InvalidArgument,
                    "local steps: ", params.size(), " parameters for a model of ",
                    since_fetch_.size());
  const uint64_t step = steps_ + 1;
  std::optional<StepResult> pushed;
  if (step % o_.push_every == 0) {
    // Δ = (what was carried over a fetch) + (θ at the last fetch − θ now).
    ops::copy(dev_, delta_.span(), carried_.span());
    ops::axpy(dev_, delta_.span(), since_fetch_.span(), 1.0f);
    ops::axpy(dev_, delta_.span(), params, -1.0f);
    pushed = client_.step(delta_.span());  // validates (finite) before it sends or counts
    carried_.zero();
    ops::copy(dev_, since_fetch_.span(), params);
    if (pushed->outcome == StepResult::Outcome::Resynced) {
      steps_ = step;
      start(params);
      return pushed;
    }
  }
  if (step % o_.fetch_every == 0) {
    // An asynchronous job's client holds the server's model only once it has fetched it (with
    // this push, at its own ClientOptions::fetch_every, or now).
    if (client_.async() && !(pushed && pushed->fetched)) client_.fetch();
    // What this worker changed since the last fetch and has not pushed stays counted.
    ops::axpy(dev_, carried_.span(), since_fetch_.span(), 1.0f);
    ops::axpy(dev_, carried_.span(), params, -1.0f);
    ops::copy(dev_, params, client_.params());
    ops::copy(dev_, since_fetch_.span(), params);
  }
  steps_ = step;
  return pushed;
}

}  // namespace sketchsgd::ps
