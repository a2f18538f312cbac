// Test helpers: deterministic random vectors and planted heavy hitters.
#pragma once

#include <cctype>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace sketchsgd::test {

/// A codec-parametrised test's name: the spec's letters and digits, everything else '_'.
template <class Info>
std::string spec_name(const Info& info) {
  std::string name;
  for (char c : std::string(info.param)) name += std::isalnum(uint8_t(c)) ? c : '_';
  return name;
}

inline std::vector<float> gaussian(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// One gaussian vector per worker.
inline std::vector<std::vector<float>> grads(uint32_t world, size_t dim, uint64_t seed) {
  std::vector<std::vector<float>> g;
  for (uint32_t w = 0; w < world; ++w) g.push_back(gaussian(dim, seed * 100 + w));
  return g;
}

/// Gaussian noise plus `heavy` coordinates of magnitude `mag` with alternating signs at random
/// distinct positions (returned sorted).
inline std::vector<uint32_t> plant(std::vector<float>& v, size_t heavy, float mag, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> pos;
  std::vector<bool> used(v.size(), false);
  while (pos.size() < heavy) {
    const uint32_t j = uint32_t(rng() % v.size());
    if (used[j]) continue;
    used[j] = true;
    v[j] = (pos.size() % 2 ? -mag : mag) * (1.0f + float(pos.size()) / float(heavy));
    pos.push_back(j);
  }
  std::sort(pos.begin(), pos.end());
  return pos;
}

}  // namespace sketchsgd::test
