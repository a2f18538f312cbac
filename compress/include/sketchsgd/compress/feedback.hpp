// Worker-side state shared by every codec that wants it: momentum and error feedback, one mechanism
// (as BytePS's decorators) instead of a copy per codec.
//   absorb(g):   u = ρ·u + g (momentum)   then   e = e + u (error feedback)   → vector to compress
//   after sending: the codec removes what was sent from e (subtract or mask), so e keeps the
//   residual.
// The state lives on the codec's Device; on a GPU the fused update is one kernel.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <sketchsgd/core/bytes.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/scratch.hpp>

namespace sketchsgd {

class Feedback {
 public:
  Feedback(uint64_t dim, float momentum, bool error_feedback, const Device& device = Device::cpu());

  /// Folds g into the state and returns the vector to compress (g itself when stateless).
  std::span<const float> absorb(std::span<const float> g);
  /// Takes back the last absorb(g) (an encode that failed after it), up to float rounding.
  void undo(std::span<const float> g);
  /// The error accumulator (empty when error feedback is off).
  std::span<float> error() { return error_.span(); }
  /// The momentum accumulator (empty without momentum) and its factor ρ, for codecs that fuse
  /// absorb() into a pass of their own.
  std::span<float> momentum() { return momentum_.span(); }
  float rho() const { return rho_; }
  bool has_error() const { return !error_.empty(); }
  /// Whether there is any state (momentum or error feedback) to save.
  bool stateful() const { return !momentum_.empty() || !error_.empty(); }
  /// Zeroes momentum and error at these coordinates (host indices): what was sent or applied
  /// leaves the state (momentum factor masking + error reset).
  void mask(std::span<const uint32_t> indices);

  /// Momentum and error as self-checking bytes (shape + values + CRC-32C), and back: load()
  /// validates everything (WireError: another shape, corrupt, non-finite) before changing state.
  Bytes save() const;
  void load(std::span<const uint8_t> bytes);

 private:
  Device device_;
  float rho_;
  Buffer<float> momentum_;
  Buffer<float> error_;
  Scratch ops_;
};

}  // namespace sketchsgd
