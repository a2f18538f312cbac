// libFuzzer target: arbitrary bytes through every decoding entry point of every codec and the
// sketch deserialiser. Anything but success or a sketchsgd::Error is a finding.
//   cmake --preset fuzz && cmake --build --preset fuzz && build/fuzz/tests/fuzz/decode_fuzz -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "../../compress/registry.hpp"
#include "../../kernels/error.hpp"
#include "../../sketch/count_sketch.hpp"

namespace {

constexpr uint64_t kDim = 300;
const char* const kSpecs[] = {"dense", "topk:k=20,global=1", "terngrad:chunk=50", "signsgd",
                              "signsgd:ef=1,chunk=64", "sketch:rows=3,cols=40,k=10,p2=2"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  static std::vector<std::unique_ptr<sketchsgd::Compressor>> codecs = [] {
    std::vector<std::unique_ptr<sketchsgd::Compressor>> v;
    for (const char* s : kSpecs) v.push_back(sketchsgd::make_compressor(s, kDim));
    return v;
  }();
  std::vector<float> step(kDim);
  for (auto& c : codecs) {
    auto agg = c->make_aggregator(2);
    try { agg->add(bytes); } catch (const sketchsgd::Error&) {}
    try { c->apply(bytes, step); } catch (const sketchsgd::Error&) {}
    try { c->answer(bytes, 0); } catch (const sketchsgd::Error&) {}
  }
  try { sketchsgd::CountSketch::deserialize(bytes); } catch (const sketchsgd::Error&) {}
  return 0;
}
