#include <sketchsgd/compress/feedback.hpp>

#include "ops.hpp"

namespace sketchsgd {

Feedback::Feedback(uint64_t dim, float momentum, bool error_feedback, const Device& device)
    : device_(device), rho_(momentum) {
  if (momentum > 0.0f) momentum_ = Buffer<float>(dim, device);
  if (error_feedback) error_ = Buffer<float>(dim, device);
}

std::span<const float> Feedback::absorb(std::span<const float> g) {
  if (!momentum_.empty() && !error_.empty()) {
    ops::momentum_accumulate(device_, momentum_.span(), error_.span(), g, rho_);
    return error_.span();
  }
  if (!momentum_.empty()) {
    ops::scale(device_, momentum_.span(), rho_);
    ops::axpy(device_, momentum_.span(), g, 1.0f);
    return momentum_.span();
  }
  if (!error_.empty()) {
    ops::axpy(device_, error_.span(), g, 1.0f);
    return error_.span();
  }
  return g;
}

void Feedback::mask(std::span<const uint32_t> indices) {
  ops::zero_at(device_, ops_, momentum_.span(), error_.span(), indices);
}

}  // namespace sketchsgd
