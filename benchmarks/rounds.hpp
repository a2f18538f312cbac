// Shared by the parameter-server benchmarks (bench_ps, bench_churn): milliseconds, medians and
// the synthetic gradient every worker pushes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace sketchsgd::bench {

using Clock = std::chrono::steady_clock;

inline double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// xorshift: fast, gradient-like noise with rare heavy coordinates.
inline std::vector<float> xorshift_gradient(uint64_t d) {
  std::vector<float> g(d);
  uint64_t x = 88172645463325252ull;
  for (auto& v : g) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = float(int64_t(x % 2001) - 1000) * 1e-3f * ((x >> 40) % 997 == 0 ? 50.0f : 1.0f);
  }
  return g;
}

}  // namespace sketchsgd::bench
