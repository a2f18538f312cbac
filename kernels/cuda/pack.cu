// CUDA bit packing, formats identical to the CPU's: 32 signs per word (one thread per word, wide
// loads), four 2-bit ternary codes per byte (one thread per 16 codes, one 32-bit store).
// TernGrad draws from Philox keyed exactly as on the CPU.
#include <cub/device/device_scan.cuh>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "launch.cuh"

namespace sketchsgd::kernels::cuda {
namespace {

/// Loads x[j0 … j0 + N) (N a multiple of 4) into v, as float4 when x is 16-byte aligned and the
/// run is whole; positions at or past n read as 0. Each thread owning N contiguous elements keeps
/// N/4 wide loads in flight, which a warp-per-32-elements ballot loop does not.
template <int N>
__device__ __forceinline__ void load_run(const float* x, uint64_t j0, uint64_t n, bool aligned,
                                         float (&v)[N]) {
  if (aligned && j0 + N <= n) {
    const float4* p = reinterpret_cast<const float4*>(x + j0);
#pragma unroll
    for (int q = 0; q < N / 4; ++q) {
      const float4 f = __ldg(p + q);
      v[4 * q] = f.x;
      v[4 * q + 1] = f.y;
      v[4 * q + 2] = f.z;
      v[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int q = 0; q < N; ++q) v[q] = j0 + q < n ? x[j0 + q] : 0.0f;
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

/// One thread per 32-bit word: 32 signs.
__global__ void pack_signs_kernel(const float* x, uint64_t n, uint32_t* words, bool aligned) {
  const uint64_t nw = (n + 31) / 32;
  for (uint64_t w = thread_index(); w < nw; w += grid_stride()) {
    float v[32];
    load_run(x, w * 32, n, aligned, v);
    uint32_t bits = 0;
#pragma unroll
    for (int b = 0; b < 32; ++b) bits |= elem::sign_bit(v[b]) << b;  // padding reads 0: bit clear
    words[w] = bits;
  }
}

/// Per-element decoding with 32-bit index arithmetic (d < 2^32): 64-bit division is slow here.
__global__ void unpack_signs_kernel(const uint32_t* words, uint32_t n, uint32_t chunk,
                                    const float* scales, float* out, bool accumulate) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    const uint32_t j = uint32_t(i);
    const uint32_t bit = (__ldg(words + j / 32) >> (j % 32)) & 1u;
    const float s = scales ? scales[j / chunk] : 1.0f;
    const float v = s * elem::sign_value(bit);
    out[j] = accumulate ? out[j] + v : v;
  }
}

__global__ void count_negative_kernel(const uint32_t* words, uint32_t n, uint32_t* neg) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    const uint32_t j = uint32_t(i);
    neg[j] += (__ldg(words + j / 32) >> (j % 32)) & 1u;
  }
}

/// Stores the 16 codes of one thread (4 bytes) at byte offset b; the last word may be partial.
__device__ __forceinline__ void store_word(uint8_t* codes, uint64_t b, uint64_t nb, uint32_t word) {
  if (b + 4 <= nb && (reinterpret_cast<uintptr_t>(codes + b) & 3u) == 0) {
    *reinterpret_cast<uint32_t*>(codes + b) = word;
  } else {
    for (uint32_t q = 0; q < 4; ++q)
      if (b + q < nb) codes[b + q] = uint8_t(word >> (8 * q));
  }
}

/// One thread per 16 elements (4 output bytes, 4 Philox blocks: the CPU draws one block per
/// byte and uses word j % 4 for element j).
__global__ void ternarize_kernel(const float* x, uint32_t n, uint32_t chunk, const float* scales,
                                 uint64_t seed, uint64_t stream_id, uint8_t* codes, bool aligned) {
  const uint64_t nt = (uint64_t(n) + 15) / 16, nb = (uint64_t(n) + 3) / 4;
  for (uint64_t t = thread_index(); t < nt; t += grid_stride()) {
    float v[16];
    const uint32_t j0 = uint32_t(t * 16);
    load_run(x, j0, n, aligned, v);
    uint32_t c = j0 / chunk;
    uint64_t next = uint64_t(c + 1) * chunk;  // first element of the next chunk
    float inv = 0.0f;
    {
      const float s = scales[c];
      inv = s > 0.0f ? 1.0f / s : 0.0f;
    }
    uint32_t word = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint64_t byte = t * 4 + q;
      const elem::Philox4 r =
          elem::philox4x32_10(uint32_t(byte), uint32_t(byte >> 32), uint32_t(stream_id),
                              uint32_t(stream_id >> 32), uint32_t(seed), uint32_t(seed >> 32));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t j = j0 + 4 * q + e;
        if (j >= n) break;
        if (j == next) {  // chunks may be shorter than 16: move on
          c = j / chunk;
          next = uint64_t(c + 1) * chunk;
          const float s = scales[c];
          inv = s > 0.0f ? 1.0f / s : 0.0f;
        }
        word |= elem::ternary_round(v[4 * q + e], inv, elem::uniform01(r.v[e]))
                << (2 * (4 * q + e));
      }
    }
    store_word(codes, t * 4, nb, word);
  }
}

__global__ void pack_ternary_kernel(const float* x, uint64_t n, uint8_t* codes, bool aligned) {
  const uint64_t nt = (n + 15) / 16, nb = (n + 3) / 4;
  for (uint64_t t = thread_index(); t < nt; t += grid_stride()) {
    float v[16];
    load_run(x, t * 16, n, aligned, v);
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) word |= elem::ternary_code(v[e]) << (2 * e);  // padding: code 0
    store_word(codes, t * 4, nb, word);
  }
}

__global__ void ternary_check_kernel(const uint8_t* codes, uint64_t n,
                                     unsigned long long* first_bad) {
  const uint64_t nb = (n + 3) / 4;
  for (uint64_t byte = thread_index(); byte < nb; byte += grid_stride()) {
    const uint32_t c = codes[byte];
    const uint32_t hi = c & 0xAAu, lo = c & 0x55u;
    const uint64_t left = n - byte * 4, m = left < 4 ? left : 4;
    const uint32_t pad = m < 4 ? (c >> (2 * m)) : 0u;
    if (((hi >> 1) & lo) || pad) atomicMin(first_bad, (unsigned long long)(byte * 4));
  }
}

__global__ void unpack_ternary_kernel(const uint8_t* codes, uint32_t n, uint32_t chunk,
                                      const float* scales, float weight, float* out,
                                      bool accumulate, const unsigned long long* first_bad) {
  if (*first_bad != ~0ull) return;  // corrupt codes: write nothing
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    const uint32_t j = uint32_t(i);
    const uint32_t c = (codes[j / 4] >> (2 * (j % 4))) & 3u;
    const float s = scales ? scales[j / chunk] : 1.0f;
    const float v = weight * s * elem::ternary_value(c);
    out[j] = accumulate ? out[j] + v : v;
  }
}

/// Delta coding, pass 1: each index's varint length.
__global__ void varint_sizes_kernel(const uint32_t* idx, uint64_t n, uint32_t* sizes) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride())
    sizes[i] = elem::varint_bytes(elem::index_gap(idx, i));
}

/// Pass 2: each varint at its offset (the exclusive scan of the lengths).
__global__ void varint_write_kernel(const uint32_t* idx, uint64_t n, const uint32_t* at,
                                    uint8_t* out) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride())
    elem::put_varint(out + at[i], elem::index_gap(idx, i));
}

/// Sizes must fit the 32-bit index arithmetic of the kernels (dim < 2^32 everywhere).
void check_size(size_t n, size_t chunk) {
  SKETCHSGD_REQUIRE(n < (uint64_t(1) << 32) && chunk > 0 && chunk < (uint64_t(1) << 32),
                    InvalidArgument, "packing: n = ", n, " and chunk = ", chunk,
                    " must be below 2^32 (chunk > 0)");
}

}  // namespace

void pack_signs(const float* x, size_t n, uint32_t* words, Stream stream) {
  if (n == 0) return;
  pack_signs_kernel<<<grid_for(n, 32), kThreads, 0, stream>>>(x, n, words, aligned16(x));
  SKETCHSGD_LAUNCH_CHECK();
}

void unpack_signs(const uint32_t* words, size_t n, size_t chunk, const float* scales, float* out,
                  bool accumulate, Stream stream) {
  if (n == 0) return;
  check_size(n, chunk);
  unpack_signs_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(words, n, chunk, scales, out,
                                                               accumulate);
  SKETCHSGD_LAUNCH_CHECK();
}

void count_negative(const uint32_t* words, size_t n, uint32_t* neg, Stream stream) {
  if (n == 0) return;
  check_size(n, 1);
  count_negative_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(words, n, neg);
  SKETCHSGD_LAUNCH_CHECK();
}

void ternarize(const float* x, size_t n, size_t chunk, const float* scales, uint64_t seed,
               uint64_t stream_id, uint8_t* codes, Stream stream) {
  if (n == 0) return;
  check_size(n, chunk);
  ternarize_kernel<<<grid_for(n, 16), kThreads, 0, stream>>>(
      x, uint32_t(n), uint32_t(chunk), scales, seed, stream_id, codes, aligned16(x));
  SKETCHSGD_LAUNCH_CHECK();
}

size_t delta_encode(const uint32_t* idx, size_t n, uint8_t* out, Workspace& ws, Stream stream) {
  if (n == 0) return 0;
  SKETCHSGD_REQUIRE(n < (uint64_t(1) << 29), InvalidArgument, "delta_encode: ", n,
                    " indices (the offsets are 32-bit: at most 2^29 of up to 5 bytes)");
  size_t temp = 0;
  SKETCHSGD_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp, (uint32_t*)nullptr,
                                                     (uint32_t*)nullptr, int64_t(n + 1)));
  // sizes[0 … n) then a 0, scanned into at[0 … n]: at[n] is the total.
  const size_t words = (2 * (n + 1) * sizeof(uint32_t) + 255) / 256 * 256;
  char* base = static_cast<char*>(ws.get(words + temp, stream));
  auto* sizes = reinterpret_cast<uint32_t*>(base);
  uint32_t* at = sizes + n + 1;
  SKETCHSGD_CUDA_CHECK(cudaMemsetAsync(sizes + n, 0, sizeof(uint32_t), stream));
  varint_sizes_kernel<<<grid_for(n), kThreads, 0, stream>>>(idx, n, sizes);
  SKETCHSGD_LAUNCH_CHECK();
  SKETCHSGD_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(base + words, temp, sizes, at, int64_t(n + 1), stream));
  varint_write_kernel<<<grid_for(n), kThreads, 0, stream>>>(idx, n, at, out);
  SKETCHSGD_LAUNCH_CHECK();
  SKETCHSGD_CUDA_CHECK(
      cudaMemcpyAsync(ws.host(), at + n, sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
  SKETCHSGD_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *static_cast<const uint32_t*>(ws.host());
}

void pack_ternary(const float* x, size_t n, uint8_t* codes, Stream stream) {
  if (n == 0) return;
  pack_ternary_kernel<<<grid_for(n, 16), kThreads, 0, stream>>>(x, n, codes, aligned16(x));
  SKETCHSGD_LAUNCH_CHECK();
}

void unpack_ternary(const uint8_t* codes, size_t n, size_t chunk, const float* scales, float weight,
                    float* out, bool accumulate, unsigned long long* first_bad, Stream stream) {
  if (n == 0) return;
  check_size(n, chunk);
  ternary_check_kernel<<<grid_for(n / 4 + 1, 4), kThreads, 0, stream>>>(codes, n, first_bad);
  SKETCHSGD_LAUNCH_CHECK();
  unpack_ternary_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(codes, n, chunk, scales, weight,
                                                                 out, accumulate, first_bad);
  SKETCHSGD_LAUNCH_CHECK();
}

}  // namespace sketchsgd::kernels::cuda
