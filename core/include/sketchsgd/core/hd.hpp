// Marks functions callable from both host and CUDA device code, and bit casts usable in both.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SKETCHSGD_HD __host__ __device__ __forceinline__
#else
#define SKETCHSGD_HD inline
#endif

namespace sketchsgd {

SKETCHSGD_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return __builtin_bit_cast(uint32_t, x);
#endif
}

SKETCHSGD_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

/// True for every float but NaN and ±Inf: exponent bits not all ones.
SKETCHSGD_HD bool is_finite(float x) {
  return (float_bits(x) & 0x7F800000u) != 0x7F800000u;
}

}  // namespace sketchsgd
