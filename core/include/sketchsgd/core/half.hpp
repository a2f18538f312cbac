// 16-bit floats for compact wire formats: IEEE half (fp16) and bfloat16, converted with
// round-to-nearest-even exactly as hardware and PyTorch's .half() / .bfloat16() do, in plain
// integer arithmetic so host and device agree bit for bit. Values beyond fp16's range become ±Inf
// (callers check finiteness, as for any decoded value).
#pragma once

#include <cstdint>

#include <sketchsgd/core/hd.hpp>

namespace sketchsgd {

SKETCHSGD_HD uint16_t half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return uint16_t(sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // ≥ 65520 rounds to Inf
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    if (a < 0x33000000u) return uint16_t(sign);           // ≤ 2^-25 rounds to 0
    const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value in units of 2^-24 is m >> shift
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = (a - 0x38000000u) >> 13;  // exponent rebiased 127 → 15
  const uint32_t rem = a & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return uint16_t(sign | h);
}

SKETCHSGD_HD float half_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) return bits_float(sign | float_bits(float(m) * 0x1p-24f));  // exact
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

SKETCHSGD_HD uint16_t bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

SKETCHSGD_HD float bf16_float(uint16_t b) {
  return bits_float(uint32_t(b) << 16);
}

}  // namespace sketchsgd
