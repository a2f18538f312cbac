// Dense updates, and the server side shared by gathered codecs whose server averages the workers'
// dequantised vectors (TernGrad, EF-signSGD): subclasses decode one message into sum(); the
// Update is sum / W, dense.
#pragma once

#include <vector>

#include <sketchsgd/compress/compressor.hpp>

namespace sketchsgd {

class MeanAggregator : public Aggregator {
 public:
  using Aggregator::Aggregator;

 protected:
  /// The running sum, zeroed and sized dim on first use in a phase.
  std::vector<float>& sum();
  Message reduce(const Header& phase, uint32_t contributors) override;
  void clear() override;

 private:
  std::vector<float> sum_;
  bool dirty_ = false;
};

/// Payload of a dense Update: dim floats.
inline uint64_t dense_bytes(uint64_t dim) {
  return dim * sizeof(float);
}
/// A dense Update message of the phase's round holding these (host) values.
Message dense_update(const Header& phase, std::span<const float> values);
/// Reads a dense Update into step, in the device's memory (validated before step is written).
void read_dense_update(ByteReader& r, std::span<float> step, const Device& device = Device::cpu());

}  // namespace sketchsgd
