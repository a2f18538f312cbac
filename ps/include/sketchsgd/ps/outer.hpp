// The optimizer every holder of the model applies to a round's update: the server to its copy,
// each worker to its own, in the same order with the same arithmetic, so they stay bit-identical.
// Without momentum it is today's w −= lr · step (Compressor::apply_step, sparse updates in
// O(k)); with momentum it is the outer step of local-SGD jobs (DiLoCo: Nesterov SGD on the mean
// pseudo-gradient). The momentum buffer is dense and part of the model's state: the server sends
// it with the model and keeps it in checkpoints.
#pragma once

#include <cstdint>
#include <span>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/core/device.hpp>

namespace sketchsgd::ps {

struct OuterOptions {
  float momentum = 0.0f;  ///< μ in [0, 1); 0: plain w −= lr · step
  bool nesterov = false;  ///< with momentum: w −= lr · (step + μ·m) rather than lr · m
  /// Throws InvalidArgument for μ outside [0, 1) or Nesterov without momentum.
  void validate() const;
  bool stateful() const { return momentum > 0.0f; }
};

class OuterStep {
 public:
  /// The momentum buffer (zero) lives on d, where the parameters passed to apply() live.
  OuterStep(OuterOptions o, uint64_t dim, const Device& d);

  /// Decodes the update with codec (its state change included: Compressor::apply) and steps
  /// params. Without momentum: exactly codec.apply_step(update, params, lr). With momentum:
  /// m = μ·m + step, then params −= lr · (step + μ·m) (Nesterov) or lr · m. Corrupt bytes change
  /// nothing (neither params nor the buffer).
  void apply(Compressor& codec, std::span<const uint8_t> update, std::span<float> params, float lr);

  const OuterOptions& options() const { return o_; }
  /// The momentum buffer (empty without momentum), on the device.
  std::span<const float> buffer() const { return m_.span(); }
  /// Host copy of the buffer (empty without momentum).
  std::vector<float> save() const { return m_.to_vector(); }
  /// Takes a buffer back (host floats, dim of them, finite); empty: zero. Throws WireError for
  /// a wrong length or a non-finite value, InvalidArgument for a buffer without momentum.
  void load(std::span<const float> m);

 private:
  OuterOptions o_;
  Device dev_;
  Buffer<float> m_;     // momentum (empty without)
  Buffer<float> step_;  // the decoded step (empty without momentum)
};

}  // namespace sketchsgd::ps
