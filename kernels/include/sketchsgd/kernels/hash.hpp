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
//
// Blocked hashing (the default): coordinates are cut into blocks of B (a power of two); block b
// of row i lands on a window of B consecutive columns starting at o_i(b) (mod c), position t of
// the block at column (o_i(b) + (t XOR k_i(b))) mod c, with its own sign. One pairwise
// independent word w_i(b) = mix(window hash of row i, b) per (row, block) gives both the start
// (from bits 2..31, Lemire-reduced; a multiple of 4 when 4 divides c, so windows are 16-byte
// aligned for vector access) and the lane key k (bits 0..1, < min(4, B)). Signs come from a
// separate 32-bit multiply-add-shift hash of the coordinate (sign_bit). Why every pair still
// collides with probability ≤ 1/c: two coordinates of one block never collide (B ≤ c; t ↦ t XOR k
// is a bijection); for two of different blocks the words are pairwise independent, so with
// unaligned starts the start difference is uniform (1/c), and with aligned ones the low two bits
// must agree (the keys' XOR is uniform: 1/4) and the start difference must hit one multiple of 4
// (4/c): 1/c again. Signs stay pairwise independent across coordinates and independent of the
// buckets, which is all the count sketch's unbiasedness and variance bound use (ARCHITECTURE.md,
// Hashing).
#pragma once

#include <cstdint>

#include <sketchsgd/core/hd.hpp>

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

SKETCHSGD_HD constexpr uint32_t bucket_of(uint32_t packed) {
  return packed & ~kSignBit;
}

/// Applies the packed sign to x without a branch or a multiply: flips the float's sign bit.
SKETCHSGD_HD float apply_sign(uint32_t packed, float x) {
  return bits_float(float_bits(x) ^ (packed & kSignBit));
}

/// Bucket and sign of coordinate j in the row whose hash is h, packed.
SKETCHSGD_HD constexpr uint32_t locate(RowHash h, uint32_t j, uint32_t cols) {
  return pack(mix(h, j), cols);
}

// ---- blocked hashing ------------------------------------------------------------------------

/// The shape of blocked windows, the same for every row of a sketch.
struct Blocked {
  uint32_t shift = 0;    ///< log2 of the block size B (≤ log2 c)
  uint32_t lanes = 0;    ///< lane-key mask: min(4, B) − 1
  bool aligned = false;  ///< 4 divides c: window starts are multiples of 4
  SKETCHSGD_HD constexpr uint32_t size() const { return 1u << shift; }
};

/// The window shape for blocks of `block` (a power of two) in `cols` columns: the block shrinks to
/// the largest power of two ≤ cols when cols < block, so a window never overlaps itself.
SKETCHSGD_HD constexpr Blocked blocked_shape(uint32_t block, uint32_t cols) {
  uint32_t shift = 0;
  while ((2u << shift) <= block && (2ull << shift) <= cols) ++shift;
  const uint32_t b = 1u << shift;
  return Blocked{shift, (b < 4 ? b : 4) - 1, cols % 4 == 0};
}

/// Hash parameters of row i's window words and signs: independent of each other and of row_hash.
SKETCHSGD_HD constexpr RowHash window_hash(uint64_t seed, uint32_t row) {
  return row_hash(seed ^ 0x5851F42D4C957F2Dull, row + 64);
}
SKETCHSGD_HD constexpr RowHash sign_hash(uint64_t seed, uint32_t row) {
  return row_hash(seed ^ 0x14057B7EF767814Full, row + 128);
}

/// The word of block b in a row (precomputed per sketch: rows × ⌈dim / B⌉ words).
SKETCHSGD_HD constexpr uint32_t window_word(RowHash h, uint64_t block) {
  return mix(h, uint32_t(block));
}

/// First column of the window whose word is w.
SKETCHSGD_HD constexpr uint32_t window_start(uint32_t w, uint32_t cols, bool aligned) {
  const uint64_t v = w >> 2;  // 30 bits; bits 0..1 are the lane key
  return aligned ? uint32_t((v * (cols >> 2)) >> 30) << 2 : uint32_t((v * cols) >> 30);
}

/// The column of position t (< B) of the block whose word is w.
SKETCHSGD_HD constexpr uint32_t window_column(uint32_t w, uint32_t t, uint32_t cols, Blocked b) {
  const uint32_t col = window_start(w, cols, b.aligned) + (t ^ (w & b.lanes));
  return col >= cols ? col - cols : col;
}

/// The sign bit (bit 31; 1 = negative) of coordinate j: multiply-add-shift in 32-bit arithmetic,
/// ((a·j + b) mod 2^32) >> 31, strongly universal for 32-bit keys and one output bit
/// (Dietzfelbinger; w̄ = 32 ≥ w + l − 1), so signs are pairwise independent. A 32-bit multiply
/// vectorises on any x86-64 vector unit, where a 64-bit one does not.
SKETCHSGD_HD constexpr uint32_t sign_word(RowHash sh, uint32_t j) {
  return uint32_t(sh.a) * j + uint32_t(sh.b);
}
SKETCHSGD_HD constexpr uint32_t sign_bit(RowHash sh, uint32_t j) {
  return sign_word(sh, j) & kSignBit;
}

/// Bucket and sign of coordinate j, packed like locate(), given its block's word w.
SKETCHSGD_HD constexpr uint32_t locate_blocked(uint32_t w, RowHash sh, uint32_t j, uint32_t cols,
                                               Blocked b) {
  return window_column(w, j & (b.size() - 1), cols, b) | sign_bit(sh, j);
}

}  // namespace sketchsgd::hash
