// Helpers of the GPU tests: device buffers that poison what they allocate, fresh seeds (printed
// with any failure), bit-for-bit comparison of floats, and the visible skip without a GPU.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/cuda.hpp>

namespace sketchsgd::test {

namespace cu = kernels::cuda;

#define REQUIRE_GPU() \
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine"

/// Device copy of a host vector; poisoned (0xFF bytes: NaN floats) when made from a size alone.
template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0xFF, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline uint64_t fresh_seed() {
  static std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

inline std::vector<uint8_t> same_bits(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

#define EXPECT_BITS_EQ(a, b) EXPECT_TRUE(same_bits(a) == same_bits(b))

template <class T>
std::span<const T> cspan(Dev<T>& d, size_t n) {
  return {d.get(), n};
}

}  // namespace sketchsgd::test

// What every GPU test file uses, by its short names.
namespace sketchsgd {
namespace cu = kernels::cuda;
namespace cpu = kernels::cpu;
using test::cspan;
using test::Dev;
using test::fresh_seed;
using test::same_bits;
}  // namespace sketchsgd
