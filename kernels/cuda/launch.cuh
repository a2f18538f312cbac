// Launch geometry shared by the CUDA kernels: grid-stride loops over at most a few waves of
// blocks, and a checked launch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include <sketchsgd/core/gpu.hpp>

namespace sketchsgd::kernels::cuda {

inline constexpr int kThreads = 256;

/// Multiprocessors of the current device, read once per device.
inline unsigned sm_count() {
  static std::array<std::atomic<int>, 64> cache{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= int(cache.size())) return 132;
  int v = cache[size_t(dev)].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      v = 132;  // a launch on a broken device fails on its own, with its own error
    cache[size_t(dev)].store(v, std::memory_order_relaxed);
  }
  return unsigned(v);
}

/// Blocks for n work items of per_thread elements each: enough to fill the GPU several times
/// over (16 blocks of 256 threads per multiprocessor), few enough that grid-stride loops amortise
/// the block start-up.
inline unsigned grid_for(uint64_t n, unsigned per_thread = 1) {
  const uint64_t items = (n + per_thread - 1) / per_thread;
  return unsigned(
      std::clamp<uint64_t>((items + kThreads - 1) / kThreads, 1, uint64_t(sm_count()) * 16));
}

/// Grid-stride index helpers (64-bit: d may exceed 2^31).
__device__ __forceinline__ uint64_t thread_index() {
  return blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ uint64_t grid_stride() {
  return uint64_t(gridDim.x) * blockDim.x;
}

/// Checks the launch that just happened (configuration errors surface here; faults surface at the
/// next synchronising call, which is checked too).
#define SKETCHSGD_LAUNCH_CHECK() SKETCHSGD_CUDA_CHECK(cudaGetLastError())

}  // namespace sketchsgd::kernels::cuda
