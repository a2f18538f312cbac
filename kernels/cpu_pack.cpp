// CPU bit packing: 1-bit signs (32 per word) and 2-bit ternary codes (4 per byte).
#include <algorithm>
#include <cmath>
#include <cstring>

#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "detail/wide.hpp"

namespace sketchsgd::kernels::cpu {
namespace {
constexpr size_t kParallel = 1 << 14;  // words or bytes
}

void pack_signs(const float* x, size_t n, uint32_t* words) {
  const size_t nw = (n + 31) / 32;
#pragma omp parallel for schedule(static) if (nw > kParallel)
  for (size_t w = 0; w < nw; ++w) {
    const size_t lo = w * 32, m = std::min<size_t>(32, n - lo);
    uint32_t bits = 0;
    for (size_t b = 0; b < m; ++b) bits |= elem::sign_bit(x[lo + b]) << b;
    words[w] = bits;
  }
}

void unpack_signs(const uint32_t* words, size_t n, size_t chunk, const float* scales, float* out,
                  bool accumulate) {
  const size_t nw = (n + 31) / 32;
#pragma omp parallel for schedule(static) if (nw > kParallel)
  for (size_t w = 0; w < nw; ++w) {
    const size_t lo = w * 32, m = std::min<size_t>(32, n - lo);
    const uint32_t bits = words[w];
    for (size_t b = 0; b < m; ++b) {
      const size_t j = lo + b;
      const float s = scales ? scales[j / chunk] : 1.0f;
      const float v = s * elem::sign_value((bits >> b) & 1u);
      out[j] = accumulate ? out[j] + v : v;
    }
  }
}

namespace {
/// A whole word's 32 counts: a fixed trip count, so the compiler vectorises it (bit b of every
/// lane tested against a constant mask); the bit-at-a-time loop's speed depended on where the
/// linker put it.
SKETCHSGD_WIDE void count_word(uint32_t bits, uint32_t* __restrict neg) {
  for (uint32_t b = 0; b < 32; ++b) neg[b] += (bits & (1u << b)) != 0 ? 1u : 0u;
}
}  // namespace

void count_negative(const uint32_t* words, size_t n, uint32_t* neg) {
  const size_t nw = (n + 31) / 32;
#pragma omp parallel for schedule(static) if (nw > kParallel)
  for (size_t w = 0; w < nw; ++w) {
    const size_t lo = w * 32, m = std::min<size_t>(32, n - lo);
    const uint32_t bits = words[w];
    if (m == 32) {
      count_word(bits, neg + lo);
      continue;
    }
    for (size_t b = 0; b < m; ++b) neg[lo + b] += (bits >> b) & 1u;
  }
}

bool sign_padding_clear(const uint32_t* words, size_t n) {
  const size_t used = n % 32;
  return used == 0 || (words[n / 32] >> used) == 0;
}

void ternarize(const float* x, size_t n, size_t chunk, const float* scales, uint64_t seed,
               uint64_t stream, uint8_t* codes) {
  const size_t nb = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (nb > kParallel)
  for (size_t byte = 0; byte < nb; ++byte) {
    const elem::Philox4 r =
        elem::philox4x32_10(uint32_t(byte), uint32_t(uint64_t(byte) >> 32), uint32_t(stream),
                            uint32_t(stream >> 32), uint32_t(seed), uint32_t(seed >> 32));
    const size_t lo = byte * 4, m = std::min<size_t>(4, n - lo);
    uint32_t out = 0;
    for (size_t b = 0; b < m; ++b) {
      const size_t j = lo + b;
      const float s = scales[j / chunk];
      const float inv = s > 0.0f ? 1.0f / s : 0.0f;
      out |= elem::ternary_round(x[j], inv, elem::uniform01(r.v[b])) << (2 * b);
    }
    codes[byte] = uint8_t(out);
  }
}

void pack_ternary(const float* x, size_t n, uint8_t* codes) {
  const size_t nb = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (nb > kParallel)
  for (size_t byte = 0; byte < nb; ++byte) {
    const size_t lo = byte * 4, m = std::min<size_t>(4, n - lo);
    uint32_t out = 0;
    for (size_t b = 0; b < m; ++b) out |= elem::ternary_code(x[lo + b]) << (2 * b);
    codes[byte] = uint8_t(out);
  }
}

size_t unpack_ternary(const uint8_t* codes, size_t n, size_t chunk, const float* scales,
                      float weight, float* out, bool accumulate) {
  const size_t nb = (n + 3) / 4;
  // Validate first so that a corrupt message changes nothing: code 3 anywhere, or padding set.
  size_t bad = kNone;
#pragma omp parallel for schedule(static) reduction(min : bad) if (nb > kParallel)
  for (size_t byte = 0; byte < nb; ++byte) {
    const uint32_t c = codes[byte];
    const uint32_t hi = c & 0xAAu, lo = c & 0x55u;  // code 3 = both bits of a pair set
    const size_t m = std::min<size_t>(4, n - byte * 4);
    const uint32_t pad = m < 4 ? (c >> (2 * m)) : 0u;
    if (((hi >> 1) & lo) || pad) bad = std::min(bad, byte * 4);
  }
  if (bad != kNone) return bad;
#pragma omp parallel for schedule(static) if (nb > kParallel)
  for (size_t byte = 0; byte < nb; ++byte) {
    const size_t lo = byte * 4, m = std::min<size_t>(4, n - lo);
    const uint32_t c = codes[byte];
    for (size_t b = 0; b < m; ++b) {
      const size_t j = lo + b;
      const float s = scales ? scales[j / chunk] : 1.0f;
      const float v = weight * s * elem::ternary_value((c >> (2 * b)) & 3u);
      out[j] = accumulate ? out[j] + v : v;
    }
  }
  return kNone;
}

void chunk_norms(const float* x, size_t n, size_t chunk, bool l2, float* norms) {
  const size_t nc = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > kParallel)
  for (size_t c = 0; c < nc; ++c) {
    const size_t lo = c * chunk, hi = std::min(n, lo + chunk);
    double acc = 0.0;
    for (size_t j = lo; j < hi; ++j) {
      const double a = x[j] < 0.0f ? -double(x[j]) : double(x[j]);
      acc = l2 ? acc + a * a : std::max(acc, a);
    }
    norms[c] = float(l2 ? std::sqrt(acc) : acc);
  }
}

// Four values a Philox draw and 4·bits bits a group: with bits 2, 4 or 8 a group fills whole
// bytes, so groups are packed and checked independently.
void qsgd_pack(const float* x, size_t n, size_t chunk, const float* norms, uint32_t bits,
               uint64_t seed, uint64_t stream, uint8_t* codes) {
  const uint32_t sign = 1u << (bits - 1), levels = sign - 1u;
  const size_t ng = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (ng > kParallel)
  for (size_t g = 0; g < ng; ++g) {
    const elem::Philox4 r =
        elem::philox4x32_10(uint32_t(g), uint32_t(uint64_t(g) >> 32), uint32_t(stream),
                            uint32_t(stream >> 32), uint32_t(seed), uint32_t(seed >> 32));
    const size_t lo = g * 4, m = std::min<size_t>(4, n - lo);
    uint32_t out = 0;
    for (size_t b = 0; b < m; ++b) {
      const size_t j = lo + b;
      const float norm = norms[j / chunk];
      const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
      out |= elem::qsgd_code(x[j], inv, levels, sign, elem::uniform01(r.v[b])) << (bits * b);
    }
    const size_t nbytes = (m * bits + 7) / 8;
    for (size_t k = 0; k < nbytes; ++k) codes[g * bits / 2 + k] = uint8_t(out >> (8 * k));
  }
}

size_t qsgd_unpack(const uint8_t* codes, size_t n, size_t chunk, const float* norms, uint32_t bits,
                   float weight, float* out, bool accumulate) {
  const uint32_t sign = 1u << (bits - 1), levels = sign - 1u, mask = (1u << bits) - 1u;
  const size_t ng = (n + 3) / 4;
  auto group = [&](size_t g, size_t m) {  // the group's codes and its padding bits
    uint32_t word = 0;
    const size_t nbytes = (m * bits + 7) / 8;
    for (size_t k = 0; k < nbytes; ++k) word |= uint32_t(codes[g * bits / 2 + k]) << (8 * k);
    return word;
  };
  // Validate first so that a corrupt message changes nothing.
  size_t bad = kNone;
#pragma omp parallel for schedule(static) reduction(min : bad) if (ng > kParallel)
  for (size_t g = 0; g < ng; ++g) {
    const size_t m = std::min<size_t>(4, n - g * 4);
    const uint32_t word = group(g, m);
    const uint64_t used = uint64_t(m) * bits;
    if (used < 32 && (uint64_t(word) >> used) != 0) bad = std::min(bad, g * 4);
    for (size_t b = 0; b < m; ++b)
      if (!elem::qsgd_valid((word >> (bits * b)) & mask, levels, sign))
        bad = std::min(bad, g * 4 + b);
  }
  if (bad != kNone) return bad;
#pragma omp parallel for schedule(static) if (ng > kParallel)
  for (size_t g = 0; g < ng; ++g) {
    const size_t lo = g * 4, m = std::min<size_t>(4, n - lo);
    const uint32_t word = group(g, m);
    for (size_t b = 0; b < m; ++b) {
      const size_t j = lo + b;
      const float v = weight * elem::qsgd_value((word >> (bits * b)) & mask,
                                                norms[j / chunk] / float(levels), sign);
      out[j] = accumulate ? out[j] + v : v;
    }
  }
  return kNone;
}

size_t delta_bytes(const uint32_t* idx, size_t n) {
  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) bytes += elem::varint_bytes(elem::index_gap(idx, i));
  return bytes;
}

void delta_encode(const uint32_t* idx, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t gap = elem::index_gap(idx, i);
    elem::put_varint(out, gap);
    out += elem::varint_bytes(gap);
  }
}

void level_pack(const float* x, size_t n, float scale, uint32_t bits, uint8_t* codes, float* q) {
  const uint32_t levels = 1u << (bits - 1), sign = levels, per = 8 / bits;
  std::memset(codes, 0, (n * bits + 7) / 8);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t c = elem::level_code(x[i], scale, levels, sign);
    codes[i / per] |= uint8_t(c << (bits * (i % per)));
    if (q) q[i] = elem::level_value(c, scale, levels, sign);
  }
}

void level_unpack(const uint8_t* codes, size_t n, float scale, uint32_t bits, float weight,
                  float* out) {
  const uint32_t levels = 1u << (bits - 1), sign = levels, per = 8 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  for (size_t i = 0; i < n; ++i)
    out[i] = weight *
             elem::level_value((codes[i / per] >> (bits * (i % per))) & mask, scale, levels, sign);
}

}  // namespace sketchsgd::kernels::cpu
