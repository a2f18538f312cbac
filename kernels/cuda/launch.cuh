// Launch geometry shared by the CUDA kernels: grid-stride loops over at most a few waves of
// blocks, and a checked launch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.cuh"

namespace sketchsgd::kernels::cuda {

inline constexpr int kThreads = 256;

/// Blocks for n work items of per_thread elements each: enough to fill the GPU several times
/// over, few enough that grid-stride loops amortise the block start-up.
inline unsigned grid_for(uint64_t n, unsigned per_thread = 1) {
  const uint64_t items = (n + per_thread - 1) / per_thread;
  return unsigned(std::clamp<uint64_t>((items + kThreads - 1) / kThreads, 1, 132 * 16));
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
