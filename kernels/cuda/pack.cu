// CUDA bit packing: one warp ballot packs 32 signs into a word; ternary codes come from two
// ballots (the two bit planes) rearranged so the bytes match the CPU format (four 2-bit codes per
// byte, code j at bits 2·(j % 4)). TernGrad draws from Philox keyed exactly as on the CPU.
#include "../cuda.hpp"
#include "../elementwise.hpp"
#include "launch.cuh"

namespace sketchsgd::kernels::cuda {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;

/// Warp w of the grid handles word w (32 elements) per iteration; the lane owns element lane.
__global__ void pack_signs_kernel(const float* x, uint64_t n, uint32_t* words) {
  const uint64_t nw = (n + 31) / 32;
  const uint32_t lane = threadIdx.x & 31u;
  for (uint64_t w = thread_index() / 32; w < nw; w += grid_stride() / 32) {
    const uint64_t j = w * 32 + lane;
    const uint32_t bits = __ballot_sync(kFull, j < n && elem::sign_bit(x[j]));
    if (lane == 0) words[w] = bits;
  }
}

__global__ void unpack_signs_kernel(const uint32_t* words, uint64_t n, uint64_t chunk,
                                    const float* scales, float* out, bool accumulate) {
  for (uint64_t j = thread_index(); j < n; j += grid_stride()) {
    const uint32_t bit = (__ldg(words + j / 32) >> (j % 32)) & 1u;
    const float s = scales ? scales[j / chunk] : 1.0f;
    const float v = s * elem::sign_value(bit);
    out[j] = accumulate ? out[j] + v : v;
  }
}

__global__ void count_negative_kernel(const uint32_t* words, uint64_t n, uint32_t* neg) {
  for (uint64_t j = thread_index(); j < n; j += grid_stride())
    neg[j] += (__ldg(words + j / 32) >> (j % 32)) & 1u;
}

/// Spreads the low 16 bits of x to the even bit positions (bit i → bit 2i).
__device__ __forceinline__ uint32_t spread(uint32_t x) {
  x &= 0xFFFFu;
  x = (x | (x << 8)) & 0x00FF00FFu;
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  x = (x | (x << 2)) & 0x33333333u;
  x = (x | (x << 1)) & 0x55555555u;
  return x;
}

/// Lane j of the warp holds code c (2 bits) of element w·32 + j; lanes 0..7 write the 8 bytes of
/// the 32 codes as two 32-bit words (lanes 0 and 1).
__device__ __forceinline__ void store_codes(uint32_t code, uint64_t w, uint64_t n, uint8_t* codes) {
  const uint32_t lo = __ballot_sync(kFull, code & 1u), hi = __ballot_sync(kFull, code & 2u);
  const uint32_t lane = threadIdx.x & 31u;
  if (lane < 2) {
    const uint32_t l = lo >> (16 * lane), h = hi >> (16 * lane);
    const uint32_t word = spread(l) | (spread(h) << 1);  // 16 codes, code i at bits 2i, 2i+1
    const uint64_t byte0 = w * 8 + lane * 4, nb = (n + 3) / 4;
    for (uint32_t b = 0; b < 4; ++b)
      if (byte0 + b < nb) codes[byte0 + b] = uint8_t(word >> (8 * b));
  }
}

__global__ void ternarize_kernel(const float* x, uint64_t n, uint64_t chunk, const float* scales,
                                 uint64_t seed, uint64_t stream_id, uint8_t* codes) {
  const uint64_t nw = (n + 31) / 32;
  const uint32_t lane = threadIdx.x & 31u;
  for (uint64_t w = thread_index() / 32; w < nw; w += grid_stride() / 32) {
    const uint64_t j = w * 32 + lane;
    uint32_t code = 0;
    if (j < n) {
      // The CPU draws one Philox block per output byte (four codes) and uses word j % 4.
      const uint64_t byte = j / 4;
      const elem::Philox4 r = elem::philox4x32_10(uint32_t(byte), uint32_t(byte >> 32),
                                                  uint32_t(stream_id), uint32_t(stream_id >> 32),
                                                  uint32_t(seed), uint32_t(seed >> 32));
      const float s = scales[j / chunk];
      const float inv = s > 0.0f ? 1.0f / s : 0.0f;
      const uint32_t q = uint32_t(j % 4);  // selects in registers (a dynamic index would spill)
      const uint32_t bits = q == 0 ? r.v[0] : (q == 1 ? r.v[1] : (q == 2 ? r.v[2] : r.v[3]));
      code = elem::ternary_round(x[j], inv, elem::uniform01(bits));
    }
    store_codes(code, w, n, codes);
  }
}

__global__ void pack_ternary_kernel(const float* x, uint64_t n, uint8_t* codes) {
  const uint64_t nw = (n + 31) / 32;
  const uint32_t lane = threadIdx.x & 31u;
  for (uint64_t w = thread_index() / 32; w < nw; w += grid_stride() / 32) {
    const uint64_t j = w * 32 + lane;
    store_codes(j < n ? elem::ternary_code(x[j]) : 0u, w, n, codes);
  }
}

__global__ void ternary_check_kernel(const uint8_t* codes, uint64_t n, unsigned long long* first_bad) {
  const uint64_t nb = (n + 3) / 4;
  for (uint64_t byte = thread_index(); byte < nb; byte += grid_stride()) {
    const uint32_t c = codes[byte];
    const uint32_t hi = c & 0xAAu, lo = c & 0x55u;
    const uint64_t left = n - byte * 4, m = left < 4 ? left : 4;
    const uint32_t pad = m < 4 ? (c >> (2 * m)) : 0u;
    if (((hi >> 1) & lo) || pad) atomicMin(first_bad, (unsigned long long)(byte * 4));
  }
}

__global__ void unpack_ternary_kernel(const uint8_t* codes, uint64_t n, uint64_t chunk,
                                      const float* scales, float weight, float* out, bool accumulate,
                                      const unsigned long long* first_bad) {
  if (*first_bad != ~0ull) return;  // corrupt codes: write nothing
  for (uint64_t j = thread_index(); j < n; j += grid_stride()) {
    const uint32_t c = (codes[j / 4] >> (2 * (j % 4))) & 3u;
    const float s = scales ? scales[j / chunk] : 1.0f;
    const float v = weight * s * elem::ternary_value(c);
    out[j] = accumulate ? out[j] + v : v;
  }
}

unsigned warp_grid(uint64_t n) { return grid_for((n + 31) / 32 * 32); }

}  // namespace

void pack_signs(const float* x, size_t n, uint32_t* words, Stream stream) {
  if (n == 0) return;
  pack_signs_kernel<<<warp_grid(n), kThreads, 0, stream>>>(x, n, words);
  SKETCHSGD_LAUNCH_CHECK();
}

void unpack_signs(const uint32_t* words, size_t n, size_t chunk, const float* scales, float* out,
                  bool accumulate, Stream stream) {
  if (n == 0) return;
  unpack_signs_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(words, n, chunk, scales, out, accumulate);
  SKETCHSGD_LAUNCH_CHECK();
}

void count_negative(const uint32_t* words, size_t n, uint32_t* neg, Stream stream) {
  if (n == 0) return;
  count_negative_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(words, n, neg);
  SKETCHSGD_LAUNCH_CHECK();
}

void ternarize(const float* x, size_t n, size_t chunk, const float* scales, uint64_t seed,
               uint64_t stream_id, uint8_t* codes, Stream stream) {
  if (n == 0) return;
  ternarize_kernel<<<warp_grid(n), kThreads, 0, stream>>>(x, n, chunk, scales, seed, stream_id, codes);
  SKETCHSGD_LAUNCH_CHECK();
}

void pack_ternary(const float* x, size_t n, uint8_t* codes, Stream stream) {
  if (n == 0) return;
  pack_ternary_kernel<<<warp_grid(n), kThreads, 0, stream>>>(x, n, codes);
  SKETCHSGD_LAUNCH_CHECK();
}

void unpack_ternary(const uint8_t* codes, size_t n, size_t chunk, const float* scales, float weight,
                    float* out, bool accumulate, unsigned long long* first_bad, Stream stream) {
  if (n == 0) return;
  ternary_check_kernel<<<grid_for(n / 4 + 1, 4), kThreads, 0, stream>>>(codes, n, first_bad);
  SKETCHSGD_LAUNCH_CHECK();
  unpack_ternary_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(codes, n, chunk, scales, weight, out,
                                                                accumulate, first_bad);
  SKETCHSGD_LAUNCH_CHECK();
}

}  // namespace sketchsgd::kernels::cuda
