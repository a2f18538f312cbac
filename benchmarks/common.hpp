// Shared by the benchmarks: gradient-like vectors and the d axis.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

namespace sketchsgd::bench {

/// Gaussian noise plus 0.1 % heavy coordinates, as real gradients after error accumulation.
inline std::vector<float> gradient(size_t n, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  for (size_t i = 0; i < n / 1000; ++i) v[rng() % n] = 50.0f * nd(rng);
  return v;
}

/// Sketch shape scaled from the paper's CIFAR-10 setting (d = 6.5M, c = 500,000, k = 50,000).
inline uint32_t cols_for(size_t d) {
  return uint32_t(std::max<size_t>(1024, d / 13));
}
inline size_t k_for(size_t d) {
  return std::max<size_t>(16, d / 130);
}

inline void d_axis(benchmark::internal::Benchmark* b) {
  b->ArgName("d")
      ->RangeMultiplier(4)
      ->Range(1 << 20, 1 << 26)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

inline void report(benchmark::State& s, size_t coords, size_t bytes) {
  s.SetItemsProcessed(int64_t(s.iterations()) * int64_t(coords));
  s.SetBytesProcessed(int64_t(s.iterations()) * int64_t(bytes));
}

}  // namespace sketchsgd::bench
