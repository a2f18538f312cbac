// Per-element logic shared by the CPU and CUDA kernels: median over rows, Philox random numbers,
// 1-bit sign, 2-bit ternary and QSGD codes, Gram-Schmidt's pivot. Everything here is __host__
// __device__ and free of std::.
#pragma once

#include <cmath>
#include <cstdint>

#include <sketchsgd/core/hd.hpp>

namespace sketchsgd::elem {

inline constexpr int kMaxRows =
    32;  // largest r a sketch may have (median buffers live in registers)

/// The median of n sorted values: the middle one, or for even n the mean of the two middle ones.
SKETCHSGD_HD float median_of_sorted(const float* v, int n) {
  const int mid = n / 2;
  return (n & 1) ? v[mid] : 0.5f * v[mid - 1] + 0.5f * v[mid];
}

/// Compare-exchange without a branch (min/max instructions): the sorting network below has a
/// fixed shape, so nothing mispredicts and the CPU kernels run it across many coordinates at once.
SKETCHSGD_HD void compare_exchange(float& a, float& b) {
  const float lo = a < b ? a : b, hi = a < b ? b : a;
  a = lo;
  b = hi;
}

/// Median of v[0..n), reordering v. For even n it is the mean of the two middle values
/// (not the lower median the reference code takes). n ≤ kMaxRows: a fixed insertion network.
SKETCHSGD_HD float median_inplace(float* v, int n) {
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0; --j) compare_exchange(v[j - 1], v[j]);
  return median_of_sorted(v, n);
}

/// Philox4x32-10 (Salmon et al., SC'11), the counter-based generator cuRAND also uses: four
/// independent 32-bit words per (key, counter), so CPU and GPU draw identical streams.
struct Philox4 {
  uint32_t v[4];
};

SKETCHSGD_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                   uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = uint32_t(p1);
    c2 = n2;
    c3 = uint32_t(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

/// Uniform float in [0, 1) from 24 random bits.
SKETCHSGD_HD float uniform01(uint32_t bits) {
  return float(bits >> 8) * (1.0f / 16777216.0f);
}

// ---- 1-bit signs: bit set = negative. sign(0) = +1 (documented in docs/ARCHITECTURE.md). ----
SKETCHSGD_HD uint32_t sign_bit(float x) {
  return x < 0.0f ? 1u : 0u;
}
SKETCHSGD_HD float sign_value(uint32_t bit) {
  return bit ? -1.0f : 1.0f;
}

// ---- 2-bit ternary codes, four per byte: 0 → 0, 1 → +1, 2 → −1, 3 is invalid on the wire. ----
inline constexpr uint32_t kTernZero = 0, kTernPlus = 1, kTernMinus = 2, kTernInvalid = 3;

SKETCHSGD_HD uint32_t ternary_code(float x) {
  return x > 0.0f ? kTernPlus : (x < 0.0f ? kTernMinus : kTernZero);
}

SKETCHSGD_HD float ternary_value(uint32_t code) {
  return code == kTernPlus ? 1.0f : (code == kTernMinus ? -1.0f : 0.0f);
}

/// TernGrad's unbiased stochastic rounding of g to {−s, 0, +s}: keeps sign(g) with probability
/// min(|g| / s, 1), so E[code·s] = g when |g| ≤ s (values beyond ±s saturate: the clipping).
SKETCHSGD_HD uint32_t ternary_round(float g, float inv_scale, float u01) {
  const float p = (g < 0.0f ? -g : g) * inv_scale;
  return u01 < p ? (g < 0.0f ? kTernMinus : kTernPlus) : kTernZero;
}

// ---- QSGD (Alistarh et al. 2017): a b-bit code per value, the top bit its sign, the rest its
// level l of s = 2^(b−1) − 1; the value is sign · norm · l / s. ----

/// The code of x given 1/norm: |x|·s/norm rounded down or up to a level with the probability
/// that makes it unbiased (u01 uniform in [0, 1)). Level 0 carries no sign, so each value has one
/// code.
SKETCHSGD_HD uint32_t qsgd_code(float x, float inv_norm, uint32_t levels, uint32_t sign_bit,
                                float u01) {
  const float a = (x < 0.0f ? -x : x) * inv_norm * float(levels);
  const float floor_a = float(uint32_t(a));  // a ≥ 0: truncation is the floor
  uint32_t l = uint32_t(floor_a) + (u01 < a - floor_a ? 1u : 0u);
  l = l > levels ? levels : l;  // |x|·(1/norm) may round a hair above 1
  return l == 0 ? 0u : (x < 0.0f ? (l | sign_bit) : l);
}
/// Whether a code is one qsgd_code can write (level ≤ s, no signed zero).
SKETCHSGD_HD bool qsgd_valid(uint32_t code, uint32_t levels, uint32_t sign_bit) {
  const uint32_t l = code & (sign_bit - 1u);
  return l <= levels && (l != 0 || code == 0);
}
/// The value of a valid code: ± norm_over_levels · level.
SKETCHSGD_HD float qsgd_value(uint32_t code, float norm_over_levels, uint32_t sign_bit) {
  const float v = norm_over_levels * float(code & (sign_bit - 1u));
  return (code & sign_bit) ? -v : v;
}

/// Level codes of values already selected as large (SparseLoCo's b-bit values): a sign bit and a
/// magnitude level m in [0, L), L = levels = 2^(bits−1), for |x| ≈ scale · (m + 1) / L, rounded to
/// the nearest level (|x| ≤ scale: the chunk's largest selected magnitude). No zero level: a
/// selected value is never sent as nothing.
SKETCHSGD_HD uint32_t level_code(float x, float scale, uint32_t levels, uint32_t sign_bit) {
  const float a = scale > 0.0f ? (x < 0.0f ? -x : x) / scale * float(levels) : 0.0f;
  uint32_t m = uint32_t(a + 0.5f);  // a ≥ 0: the nearest level
  m = m < 1u ? 1u : (m > levels ? levels : m);
  return (m - 1u) | (x < 0.0f ? sign_bit : 0u);
}
/// The value of a level code: ± scale · (m + 1) / L.
SKETCHSGD_HD float level_value(uint32_t code, float scale, uint32_t levels, uint32_t sign_bit) {
  const float v = scale * float((code & (sign_bit - 1u)) + 1u) / float(levels);
  return (code & sign_bit) ? -v : v;
}

/// Gram-Schmidt's pivot for a column of squared norm norm2 (accumulated in double): 1/|a| as a
/// float, or 0 when the column has vanished (zero, or too small or large for a finite, non-zero
/// float inverse); the column then becomes zero rather than NaN.
SKETCHSGD_HD float gram_schmidt_inverse(double norm2) {
  const double norm = sqrt(norm2);
  const float inv = float(1.0 / norm);
  return norm > 0.0 && is_finite(inv) && inv != 0.0f ? inv : 0.0f;
}

/// Delta-coded sparse indices (strictly increasing): entry i carries the gap idx[i] − idx[i−1] − 1
/// (idx[0] itself first) as a little-endian base-128 varint of 1-5 bytes, the high bit of a byte
/// saying that another follows.
SKETCHSGD_HD uint32_t index_gap(const uint32_t* idx, uint64_t i) {
  return i == 0 ? idx[0] : idx[i] - idx[i - 1] - 1;
}
SKETCHSGD_HD uint32_t varint_bytes(uint32_t v) {
  return 1u + (v >= (1u << 7)) + (v >= (1u << 14)) + (v >= (1u << 21)) + (v >= (1u << 28));
}
SKETCHSGD_HD void put_varint(uint8_t* out, uint32_t v) {
  for (; v >= 0x80u; v >>= 7) *out++ = uint8_t(0x80u | (v & 0x7Fu));
  *out = uint8_t(v);
}

// ---- Adaptive steps every holder of the model applies (ps/outer.hpp), operation by operation
// the same on the CPU and the GPU (no fused multiply-add: see CMakeLists.txt). ----

/// Adagrad: v += s²; w −= lr · s / (√v + ε).
SKETCHSGD_HD void adagrad(float& w, float& v, float s, float lr, float eps) {
  v = v + s * s;
  w = w - lr * (s / (sqrtf(v) + eps));
}

/// Adam with the bias corrections c1 = 1 / (1 − β1ᵗ), c2 = 1 / (1 − β2ᵗ) of this step:
/// m = β1·m + (1 − β1)·s; v = β2·v + (1 − β2)·s²; w −= lr · (m·c1) / (√(v·c2) + ε).
SKETCHSGD_HD void adam(float& w, float& m, float& v, float s, float lr, float b1, float b2,
                       float c1, float c2, float eps) {
  m = b1 * m + (1.0f - b1) * s;
  v = b2 * v + (1.0f - b2) * (s * s);
  w = w - lr * ((m * c1) / (sqrtf(v * c2) + eps));
}

}  // namespace sketchsgd::elem
