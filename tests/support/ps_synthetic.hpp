// A deterministic training problem for parameter-server tests: worker w's gradient at round t is
// (params − target_w) plus seeded noise, so runs are reproducible and the mean of the targets is
// the optimum.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace sketchsgd::test {

inline std::vector<float> synthetic_grad(std::span<const float> params, uint32_t rank,
                                         uint64_t round, uint64_t seed) {
  std::mt19937_64 target(seed * 1000003 + rank);
  std::mt19937_64 noise(seed * 7919 + rank * 104729 + round * 15485863);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> g(params.size());
  for (size_t j = 0; j < g.size(); ++j) {
    const float t = n(target) * (j % 97 == 0 ? 5.0f : 0.2f);  // a few heavy coordinates
    g[j] = (params[j] - t) + 0.05f * n(noise);
  }
  return g;
}

inline std::vector<float> initial_params(size_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  std::normal_distribution<float> n(0.0f, 0.1f);
  std::vector<float> p(dim);
  for (auto& x : p) x = n(rng);
  return p;
}

}  // namespace sketchsgd::test
