// GPU tests: run where a CUDA device is present, skip with a visible reason elsewhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "../kernels/cuda.hpp"

namespace sketchsgd {
namespace {

TEST(Cuda, PrecomputedHashesMatchCpuBitForBit) {
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  kernels::SketchLayout s{1000003, 5, 500000, 12345, nullptr};
  std::vector<uint32_t> cpu(s.rows * s.dim), gpu(s.rows * s.dim);
  kernels::cpu::precompute_hashes(s, cpu.data());
  uint32_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, gpu.size() * 4), cudaSuccess);
  kernels::cuda::precompute_hashes(s, d);
  ASSERT_EQ(cudaMemcpy(gpu.data(), d, gpu.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  EXPECT_EQ(cpu, gpu);
}

}  // namespace
}  // namespace sketchsgd
