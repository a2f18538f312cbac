#include <sketchsgd/ps/outer.hpp>

#include <cmath>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/ops.hpp>

namespace sketchsgd::ps {

void OuterOptions::validate() const {
  SKETCHSGD_REQUIRE(std::isfinite(momentum) && momentum >= 0.0f && momentum < 1.0f, InvalidArgument,
                    "outer momentum must lie in [0, 1), got ", momentum);
  SKETCHSGD_REQUIRE(!nesterov || momentum > 0.0f, InvalidArgument,
                    "Nesterov needs an outer momentum > 0");
}

OuterStep::OuterStep(OuterOptions o, uint64_t dim, const Device& d) : o_(o), dev_(d) {
  o_.validate();
  if (o_.stateful()) {
    m_ = Buffer<float>(size_t(dim), d);
    step_ = Buffer<float>(size_t(dim), d);
  }
}

void OuterStep::apply(Compressor& codec, std::span<const uint8_t> update, std::span<float> params,
                      float lr) {
  if (!o_.stateful()) return codec.apply_step(update, params, lr);
  SKETCHSGD_REQUIRE(params.size() == m_.size(), InvalidArgument, "outer step: ", params.size(),
                    " parameters for a buffer of ", m_.size());
  codec.apply(update, step_.span());  // validates before it writes
  // m = μ·m + step; then Nesterov's look-ahead step + μ·m, or the heavy ball m. Two passes of
  // the library's own vector operations, so a worker on a GPU and the server on the host run
  // the same per-element arithmetic.
  ops::scale(dev_, m_.span(), o_.momentum);
  ops::axpy(dev_, m_.span(), step_.span(), 1.0f);
  if (o_.nesterov) {
    ops::axpy(dev_, params, step_.span(), -lr);
    ops::axpy(dev_, params, m_.span(), -lr * o_.momentum);
  } else {
    ops::axpy(dev_, params, m_.span(), -lr);
  }
}

void OuterStep::load(std::span<const float> m) {
  if (m.empty()) {
    m_.zero();
    return;
  }
  SKETCHSGD_REQUIRE(o_.stateful(), InvalidArgument,
                    "outer step: a momentum buffer for a job without outer momentum");
  SKETCHSGD_REQUIRE(m.size() == m_.size(), WireError, "outer momentum of ", m.size(),
                    " values for ", m_.size(), " parameters");
  for (size_t i = 0; i < m.size(); ++i)
    SKETCHSGD_REQUIRE(std::isfinite(m[i]), WireError, "outer momentum: non-finite value at ", i);
  m_.upload(m);
}

}  // namespace sketchsgd::ps
