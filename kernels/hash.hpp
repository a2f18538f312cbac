// Count-sketch hashing shared bit for bit by CPU and CUDA code.
//
// Family: Dietzfelbinger's strongly universal multiply-shift,  v = ((a·j + b) mod 2^64) >> 32,
// with a, b uniform 64-bit words per row and j < 2^32. It is 2-independent (pairwise independent):
// for j ≠ j', (v(j), v(j')) is uniform over [2^32]^2. From one v we take
//   sign   = bit 31 of v            (+1 when 0, −1 when 1),
//   bucket = ((v mod 2^31) · c) >> 31  (Lemire's multiply-high range reduction),
// so bucket and sign come from disjoint bits and are independent of each other and pairwise
// independent across coordinates. The range reduction makes bucket sizes differ by at most one
// preimage: the probability of a bucket deviates from 1/c by less than c / 2^31 relative
// (< 0.03 % at c = 500,000). One 64-bit multiply-add per (row, coordinate), no tables, no std::.
#pragma once

#include <cstdint>

#include "hd.hpp"

namespace sketchsgd::hash {

inline constexpr uint32_t kSignBit = 0x80000000u;
inline constexpr uint32_t kMaxCols = 0x80000000u;  // buckets are 31-bit

struct RowHash {
  uint64_t a;
  uint64_t b;
};

/// SplitMix64 finaliser: expands one seed into well-mixed words.
SKETCHSGD_HD constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The hash parameters of one sketch row, derived from the sketch's seed alone.
SKETCHSGD_HD constexpr RowHash row_hash(uint64_t seed, uint32_t row) {
  const uint64_t base = splitmix64(seed) ^ (0xD1B54A32D192ED03ull * (uint64_t(row) + 1));
  return RowHash{splitmix64(base), splitmix64(base + 0x632BE59BD9B4E019ull)};
}

/// The 32-bit pairwise-independent value of coordinate j in a row.
SKETCHSGD_HD constexpr uint32_t mix(RowHash h, uint32_t j) {
  return uint32_t((h.a * uint64_t(j) + h.b) >> 32);
}

/// Packs bucket and sign into one word: bucket in bits 0..30, sign in bit 31 (1 = negative).
SKETCHSGD_HD constexpr uint32_t pack(uint32_t v, uint32_t cols) {
  const uint32_t bucket = uint32_t((uint64_t(v & ~kSignBit) * cols) >> 31);
  return bucket | (v & kSignBit);
}

SKETCHSGD_HD constexpr uint32_t bucket_of(uint32_t packed) { return packed & ~kSignBit; }

/// Applies the packed sign to x without a branch or a multiply: flips the float's sign bit.
SKETCHSGD_HD float apply_sign(uint32_t packed, float x) {
  return bits_float(float_bits(x) ^ (packed & kSignBit));
}

/// Bucket and sign of coordinate j in the row whose hash is h, packed.
SKETCHSGD_HD constexpr uint32_t locate(RowHash h, uint32_t j, uint32_t cols) {
  return pack(mix(h, j), cols);
}

}  // namespace sketchsgd::hash
