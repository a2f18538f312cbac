// Device discovery and the hash precompute kernel (the same hash.hpp code as the CPU path).
#include "../cuda.hpp"
#include "../hash.hpp"
#include "check.cuh"

namespace sketchsgd::kernels::cuda {
namespace {

__global__ void precompute_kernel(hash::RowHash h, uint64_t dim, uint32_t cols, uint32_t* out) {
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < dim;
       j += uint64_t(gridDim.x) * blockDim.x)
    out[j] = hash::locate(h, uint32_t(j), cols);
}

}  // namespace

int device_count() {
  int n = 0;
  // No driver or no device is not an error here: the caller asks whether it can use a GPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void precompute_hashes(const SketchLayout& s, uint32_t* packed) {
  const int threads = 256;
  const unsigned blocks = unsigned(std::min<uint64_t>((s.dim + threads - 1) / threads, 65535));
  for (uint32_t row = 0; row < s.rows; ++row) {
    precompute_kernel<<<blocks, threads>>>(hash::row_hash(s.seed, row), s.dim, s.cols,
                                           packed + uint64_t(row) * s.dim);
    SKETCHSGD_CUDA_CHECK(cudaGetLastError());
  }
  SKETCHSGD_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace sketchsgd::kernels::cuda
