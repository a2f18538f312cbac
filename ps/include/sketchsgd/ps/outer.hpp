// The optimizer every holder of the model applies to a round's update: the server to its copy,
// each worker to its own, in the same order with the same arithmetic, so they stay bit-identical.
// Plain SGD is today's w −= lr · step (Compressor::apply_step, sparse updates in O(k)); with
// momentum it is the outer step of local-SGD jobs (DiLoCo: Nesterov SGD on the mean
// pseudo-gradient); Adagrad and Adam are DistBelief's server-side adaptive steps (Downpour with
// Adagrad), per coordinate. Their state (momentum, squared sums, moments, Adam's step count) is
// dense and part of the model's: the server sends it with the model and keeps it in checkpoints.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/core/device.hpp>

namespace sketchsgd::ps {

enum class OuterKind : uint8_t {
  Sgd = 0,      ///< w −= lr · step, with optional (Nesterov) momentum
  Adagrad = 1,  ///< v += step²; w −= lr · step / (√v + ε)
  Adam = 2,     ///< Kingma & Ba with bias correction; β1, β2, ε
};
OuterKind parse_outer_kind(std::string_view s);
std::string_view to_string(OuterKind k);

struct OuterOptions {
  float momentum = 0.0f;  ///< SGD: μ in [0, 1); 0: plain w −= lr · step
  bool nesterov = false;  ///< with momentum: w −= lr · (step + μ·m) rather than lr · m
  OuterKind kind = OuterKind::Sgd;
  float eps = 1e-8f;     ///< Adagrad, Adam: added to the root in the denominator, > 0
  float beta1 = 0.9f;    ///< Adam: in [0, 1)
  float beta2 = 0.999f;  ///< Adam: in [0, 1)
  /// Throws InvalidArgument for μ outside [0, 1), Nesterov without momentum, momentum with an
  /// adaptive kind, ε ≤ 0 or β outside [0, 1).
  void validate() const;
  bool stateful() const { return kind != OuterKind::Sgd || momentum > 0.0f; }
  /// Dense state vectors of the model's length: SGD 0 or 1 (momentum), Adagrad 1, Adam 2.
  size_t buffers() const;
  bool operator==(const OuterOptions&) const = default;
};

class OuterStep {
 public:
  /// The state (zero) lives on d, where the parameters passed to apply() live.
  OuterStep(OuterOptions o, uint64_t dim, const Device& d);

  /// Decodes the update with codec (its state change included: Compressor::apply) and steps
  /// params. Plain SGD: exactly codec.apply_step(update, params, lr). Momentum: m = μ·m + step,
  /// then params −= lr · (step + μ·m) (Nesterov) or lr · m. Adagrad and Adam: elem::adagrad,
  /// elem::adam at every coordinate. Corrupt bytes change nothing (neither params nor state).
  void apply(Compressor& codec, std::span<const uint8_t> update, std::span<float> params, float lr);

  const OuterOptions& options() const { return o_; }
  /// The first state vector (SGD's momentum), on the device; empty without state.
  std::span<const float> buffer() const { return m_.size() ? m_.span() : v_.span(); }
  /// Host copy of the state: its buffers() vectors one after the other (empty without state).
  std::vector<float> save() const;
  /// Steps taken (Adam's bias correction counts them; 0 for the others).
  uint64_t steps() const { return t_; }
  /// Takes a state back (host floats: buffers() · dim of them, finite; empty: zero) and the steps
  /// taken. Throws WireError for a wrong length or a non-finite value, InvalidArgument for state
  /// given to a stateless step.
  void load(std::span<const float> state, uint64_t steps = 0);

 private:
  OuterOptions o_;
  Device dev_;
  uint64_t dim_;
  Buffer<float> m_;     // SGD's momentum, Adam's first moment (empty otherwise)
  Buffer<float> v_;     // Adagrad's squared sum, Adam's second moment (empty otherwise)
  Buffer<float> step_;  // the decoded step (empty without state)
  uint64_t t_ = 0;
};

}  // namespace sketchsgd::ps
