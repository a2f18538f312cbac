#include <sketchsgd/ps/outer.hpp>

#include <cmath>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/ops.hpp>

namespace sketchsgd::ps {
namespace {

/// bᵗ by squaring: IEEE multiplications only, so every holder (any libm) gets the same bits.
double power(double b, uint64_t t) {
  double r = 1.0;
  for (; t; t >>= 1, b *= b)
    if (t & 1) r *= b;
  return r;
}

}  // namespace

OuterKind parse_outer_kind(std::string_view s) {
  if (s == "sgd") return OuterKind::Sgd;
  if (s == "adagrad") return OuterKind::Adagrad;
  if (s == "adam") return OuterKind::Adam;
  throw InvalidArgument("optimizer must be sgd, adagrad or adam, got '" + std::string(s) + "'");
}

std::string_view to_string(OuterKind k) {
  switch (k) {
    case OuterKind::Sgd:
      return "sgd";
    case OuterKind::Adagrad:
      return "adagrad";
    case OuterKind::Adam:
      return "adam";
  }
  return "unknown";
}

void OuterOptions::validate() const {
  SKETCHSGD_REQUIRE(kind == OuterKind::Sgd || kind == OuterKind::Adagrad || kind == OuterKind::Adam,
                    InvalidArgument, "optimizer kind ", int(kind));
  SKETCHSGD_REQUIRE(std::isfinite(momentum) && momentum >= 0.0f && momentum < 1.0f, InvalidArgument,
                    "outer momentum must lie in [0, 1), got ", momentum);
  SKETCHSGD_REQUIRE(!nesterov || momentum > 0.0f, InvalidArgument,
                    "Nesterov needs an outer momentum > 0");
  SKETCHSGD_REQUIRE(kind == OuterKind::Sgd || momentum == 0.0f, InvalidArgument,
                    "momentum is SGD's; ", to_string(kind), " keeps its own moments");
  SKETCHSGD_REQUIRE(std::isfinite(eps) && eps > 0.0f, InvalidArgument, "epsilon must be > 0, got ",
                    eps);
  for (const float b : {beta1, beta2})
    SKETCHSGD_REQUIRE(std::isfinite(b) && b >= 0.0f && b < 1.0f, InvalidArgument,
                      "Adam's betas must lie in [0, 1), got ", b);
}

size_t OuterOptions::buffers() const {
  switch (kind) {
    case OuterKind::Sgd:
      return momentum > 0.0f ? 1 : 0;
    case OuterKind::Adagrad:
      return 1;
    case OuterKind::Adam:
      return 2;
  }
  return 0;
}

OuterStep::OuterStep(OuterOptions o, uint64_t dim, const Device& d) : o_(o), dev_(d), dim_(dim) {
  o_.validate();
  if (o_.kind == OuterKind::Adam || (o_.kind == OuterKind::Sgd && o_.stateful()))
    m_ = Buffer<float>(size_t(dim), d);
  if (o_.kind != OuterKind::Sgd) v_ = Buffer<float>(size_t(dim), d);
  if (o_.stateful()) step_ = Buffer<float>(size_t(dim), d);
}

void OuterStep::apply(Compressor& codec, std::span<const uint8_t> update, std::span<float> params,
                      float lr) {
  if (!o_.stateful()) return codec.apply_step(update, params, lr);
  SKETCHSGD_REQUIRE(params.size() == dim_, InvalidArgument, "outer step: ", params.size(),
                    " parameters for a state of ", dim_);
  codec.apply(update, step_.span());  // validates before it writes
  switch (o_.kind) {
    case OuterKind::Sgd:
      // m = μ·m + step; then Nesterov's look-ahead step + μ·m, or the heavy ball m. Two passes
      // of the library's own vector operations, so a worker on a GPU and the server on the host
      // run the same per-element arithmetic.
      ops::scale(dev_, m_.span(), o_.momentum);
      ops::axpy(dev_, m_.span(), step_.span(), 1.0f);
      if (o_.nesterov) {
        ops::axpy(dev_, params, step_.span(), -lr);
        ops::axpy(dev_, params, m_.span(), -lr * o_.momentum);
      } else {
        ops::axpy(dev_, params, m_.span(), -lr);
      }
      break;
    case OuterKind::Adagrad:
      ops::adagrad(dev_, params, v_.span(), step_.span(), lr, o_.eps);
      break;
    case OuterKind::Adam: {
      ++t_;
      const float c1 = float(1.0 / (1.0 - power(o_.beta1, t_)));
      const float c2 = float(1.0 / (1.0 - power(o_.beta2, t_)));
      ops::adam(dev_, params, m_.span(), v_.span(), step_.span(), lr, o_.beta1, o_.beta2, c1, c2,
                o_.eps);
      break;
    }
  }
}

std::vector<float> OuterStep::save() const {
  std::vector<float> out = m_.to_vector();
  const std::vector<float> v = v_.to_vector();
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

void OuterStep::load(std::span<const float> state, uint64_t steps) {
  if (state.empty()) {
    if (m_.size()) m_.zero();
    if (v_.size()) v_.zero();
    t_ = steps;
    return;
  }
  SKETCHSGD_REQUIRE(o_.stateful(), InvalidArgument,
                    "outer step: optimizer state for a job without one (plain SGD)");
  SKETCHSGD_REQUIRE(state.size() == o_.buffers() * dim_, WireError, "optimizer state of ",
                    state.size(), " values, ", to_string(o_.kind), " keeps ", o_.buffers(), " × ",
                    dim_);
  for (size_t i = 0; i < state.size(); ++i)
    SKETCHSGD_REQUIRE(std::isfinite(state[i]), WireError, "optimizer state: non-finite value at ",
                      i);
  size_t at = 0;
  if (m_.size()) {
    m_.upload(state.subspan(0, dim_));
    at = dim_;
  }
  if (v_.size()) v_.upload(state.subspan(at, dim_));
  t_ = steps;
}

}  // namespace sketchsgd::ps
