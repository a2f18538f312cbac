#include "mean_aggregator.hpp"

#include <algorithm>

#include <sketchsgd/kernels/cpu.hpp>
#include "codec_info.hpp"
#include "payload.hpp"

namespace sketchsgd {

std::vector<float>& MeanAggregator::sum() {
  if (sum_.size() != info_.dim) sum_.assign(info_.dim, 0.0f);
  dirty_ = true;
  return sum_;
}

Message MeanAggregator::reduce(const Header& phase, uint32_t contributors) {
  auto& s = sum();
  kernels::cpu::scale(s.data(), s.size(), 1.0f / float(contributors));
  return dense_update(phase, s);
}

Message dense_update(const Header& phase, std::span<const float> values) {
  Header h = phase;
  h.kind = MessageKind::Update;
  return Message::build(h, dense_bytes(values.size()), [&](ByteWriter& w) { w.put_array(values); });
}

void MeanAggregator::clear() {
  if (dirty_) std::fill(sum_.begin(), sum_.end(), 0.0f);
  dirty_ = false;
}

void read_dense_update(ByteReader& r, std::span<float> step, const Device& device) {
  const auto v = payload::read_floats(r, step.size(), "update value");
  r.expect_end();
  detail::copy_bytes(step.data(), v.data(), v.size() * sizeof(float), device);
}

}  // namespace sketchsgd
