#include <sketchsgd/compress/feedback.hpp>

#include <cstring>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>

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

void Feedback::undo(std::span<const float> g) {
  if (!error_.empty())
    ops::axpy(device_, error_.span(), momentum_.empty() ? g : momentum_.span(), -1.0f);
  if (!momentum_.empty()) {
    ops::axpy(device_, momentum_.span(), g, -1.0f);
    ops::scale(device_, momentum_.span(), 1.0f / rho_);
  }
}

namespace {
constexpr uint32_t kStateMagic = 0x42454653;  // "SFEB"
}

Bytes Feedback::save() const {
  Bytes out;
  ByteWriter w(out);
  w.put(kStateMagic);
  w.put(uint64_t(momentum_.size()));
  w.put(uint64_t(error_.size()));
  for (const auto* b : {&momentum_, &error_}) {
    const std::vector<float> v = b->to_vector();
    w.put_array(std::span<const float>(v));
  }
  seal(out);
  return out;
}

void Feedback::load(std::span<const uint8_t> bytes) {
  ByteReader r(unseal(bytes, "feedback state"), "feedback state");
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == kStateMagic, WireError, "not a feedback state");
  const auto nm = r.get<uint64_t>();
  const auto ne = r.get<uint64_t>();
  SKETCHSGD_REQUIRE(nm == momentum_.size() && ne == error_.size(), WireError,
                    "feedback state of momentum ", nm, " and error ", ne, " values for one of ",
                    momentum_.size(), " and ", error_.size());
  std::vector<float> m(nm), e(ne);
  r.get_array(std::span<float>(m));
  r.get_array(std::span<float>(e));
  r.expect_end();
  for (const auto* v : {&m, &e})
    SKETCHSGD_REQUIRE(kernels::cpu::find_nonfinite(v->data(), v->size()) == kernels::kNone,
                      WireError, "feedback state holds a non-finite value");
  if (nm) momentum_.upload(m);
  if (ne) error_.upload(e);
}

void Feedback::mask(std::span<const uint32_t> indices) {
  ops::zero_at(device_, ops_, momentum_.span(), error_.span(), indices);
}

}  // namespace sketchsgd
