// libFuzzer target: arbitrary bytes through every decoding entry point of every codec, the sketch
// deserialiser and (when built) the parameter-server protocol decoders. Each input also goes in a
// second time with its header's payload length and CRC-32C made valid, so the fuzzer reaches the
// payload decoders instead of stopping at the checksum. Anything but success or a
// sketchsgd::Error is a finding.
//   cmake --preset fuzz && cmake --build --preset fuzz && build/fuzz/tests/fuzz/decode_fuzz
//   -max_total_time=60
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#if SKETCHSGD_FUZZ_PS
#include <sketchsgd/ps/protocol.hpp>
#endif

namespace {

constexpr uint64_t kDim = 300;
// Every registered codec's examples, over a layout of kDim values where a codec takes one: a new
// codec is fuzzed once it registers its examples.
const sketchsgd::Layout kLayout = sketchsgd::Layout::parse("10x25+50");

// The input with a consistent payload length (bytes 32..39) and CRC-32C (bytes 40..43).
std::vector<uint8_t> sealed(std::span<const uint8_t> in) {
  std::vector<uint8_t> b(in.begin(), in.end());
  if (b.size() < sketchsgd::kHeaderBytes) return b;
  const uint64_t len = b.size() - sketchsgd::kHeaderBytes;
  std::memcpy(b.data() + 32, &len, 8);
  const std::span<const uint8_t> all(b);
  const uint32_t crc =
      sketchsgd::crc32c(all.subspan(sketchsgd::kHeaderBytes), sketchsgd::crc32c(all.first(40)));
  std::memcpy(b.data() + 40, &crc, 4);
  return b;
}

void decode_everything(std::span<const uint8_t> bytes);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> raw(data, size);
  decode_everything(raw);
  const auto fixed = sealed(raw);
  decode_everything(fixed);
#if SKETCHSGD_FUZZ_PS
  using namespace sketchsgd::ps;
  try {
    decode_envelope(raw.first(std::min<size_t>(size, kEnvelopeBytes)), size % 3);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_hello(raw);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_welcome(raw);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_refuse(raw);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_update_info(raw);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_text(raw);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_commit_info(raw);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_replica_info(raw);
  } catch (const sketchsgd::Error&) {
  }
  try {
    decode_probe(raw);
  } catch (const sketchsgd::Error&) {
  }
#endif
  return 0;
}

namespace {
void decode_everything(std::span<const uint8_t> bytes) {
  static std::vector<std::unique_ptr<sketchsgd::Compressor>> codecs = [] {
    std::vector<std::unique_ptr<sketchsgd::Compressor>> v;
    for (const auto& s : sketchsgd::example_specs(kLayout))
      v.push_back(sketchsgd::make_compressor(s, kDim));
    return v;
  }();
  std::vector<float> step(kDim);
  for (auto& c : codecs) {
    auto agg = c->make_aggregator(2);
    try {
      agg->add(bytes);
    } catch (const sketchsgd::Error&) {
    }
    try {
      c->apply(bytes, step);
    } catch (const sketchsgd::Error&) {
    }
    try {
      c->answer(bytes, 0);
    } catch (const sketchsgd::Error&) {
    }
  }
  try {
    sketchsgd::CountSketch::deserialize(bytes);
  } catch (const sketchsgd::Error&) {
  }
}
}  // namespace
