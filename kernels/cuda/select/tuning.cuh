// Top-k selection: the tuning of the radix select (digit widths, tile shape, buffer sizes), apart
// from the kernels (agent.cuh) and the host-side driver (dispatch.cuh), as CUB keeps its policies.
#pragma once

#include <cstdint>

namespace sketchsgd::kernels::cuda::select {

inline constexpr int kLevels = 3;
inline constexpr int kBins = 2048;
__host__ __device__ constexpr int shift_of(int level) {
  return level == 0 ? 20 : (level == 1 ? 9 : 0);
}
__host__ __device__ constexpr uint32_t digits_of(int level) {
  return level == 2 ? 0x1FFu : 0x7FFu;
}

inline constexpr int kPer = 8;  // elements per thread per tile
inline constexpr unsigned kTieBlocks = 1024;

}  // namespace sketchsgd::kernels::cuda::select
