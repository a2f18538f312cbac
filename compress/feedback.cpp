#include "feedback.hpp"

#include "../kernels/cpu.hpp"

namespace sketchsgd {

Feedback::Feedback(uint64_t dim, float momentum, bool error_feedback) : rho_(momentum) {
  if (momentum > 0.0f) momentum_.assign(dim, 0.0f);
  if (error_feedback) error_.assign(dim, 0.0f);
}

std::span<const float> Feedback::absorb(std::span<const float> g) {
  namespace k = kernels::cpu;
  if (!momentum_.empty() && !error_.empty()) {
    k::momentum_accumulate(momentum_.data(), error_.data(), g.data(), g.size(), rho_);
    return error_;
  }
  if (!momentum_.empty()) {
    k::scale(momentum_.data(), momentum_.size(), rho_);
    k::axpy(momentum_.data(), g.data(), g.size(), 1.0f);
    return momentum_;
  }
  if (!error_.empty()) {
    k::axpy(error_.data(), g.data(), g.size(), 1.0f);
    return error_;
  }
  return g;
}

void Feedback::mask(std::span<const uint32_t> indices) {
  if (!momentum_.empty()) kernels::cpu::zero_at(momentum_.data(), indices.data(), indices.size());
  if (!error_.empty()) kernels::cpu::zero_at(error_.data(), indices.data(), indices.size());
}

}  // namespace sketchsgd
