// Whole-codec benchmarks: a worker's encode (state update + compression) and the server's
// aggregation of W = 4 messages into an update, for every codec, with d as the axis.
#include <memory>

#include <sketchsgd/compress/registry.hpp>
#include "common.hpp"

namespace sketchsgd::bench {
namespace {

std::string spec_for(const std::string& name, size_t d) {
  if (name == "sketch")
    return "sketch:rows=5,cols=" + std::to_string(cols_for(d)) + ",k=" + std::to_string(k_for(d));
  if (name == "topk") return "topk:k=" + std::to_string(k_for(d));
  return name;
}

void BM_Encode(benchmark::State& s, const std::string& name) {
  const size_t d = size_t(s.range(0));
  auto codec = make_compressor(spec_for(name, d), d);
  const auto g = gradient(d);
  uint64_t round = 0;
  for (auto _ : s) benchmark::DoNotOptimize(codec->encode(g, round++, 0));
  report(s, d, 4 * d);
  s.counters["ratio"] = codec->compression_ratio();
}

void BM_Aggregate(benchmark::State& s, const std::string& name) {
  const size_t d = size_t(s.range(0));
  const uint32_t world = 4;
  auto codec = make_compressor(spec_for(name, d), d);
  std::vector<Message> msgs;
  for (uint32_t w = 0; w < world; ++w) msgs.push_back(codec->encode(gradient(d, w + 1), 0, w));
  auto agg = codec->make_aggregator(world);
  for (auto _ : s) {
    for (const auto& m : msgs) agg->add(m);
    benchmark::DoNotOptimize(agg->finish());
  }
  report(s, size_t(world) * d, world * msgs[0].size());
}

#define SKETCHSGD_CODEC_BENCH(name)                                      \
  BENCHMARK_CAPTURE(BM_Encode, name, std::string(#name))->Apply(d_axis); \
  BENCHMARK_CAPTURE(BM_Aggregate, name, std::string(#name))->Apply(d_axis)

SKETCHSGD_CODEC_BENCH(dense);
SKETCHSGD_CODEC_BENCH(topk);
SKETCHSGD_CODEC_BENCH(terngrad);
SKETCHSGD_CODEC_BENCH(signsgd);
SKETCHSGD_CODEC_BENCH(sketch);

}  // namespace
}  // namespace sketchsgd::bench
