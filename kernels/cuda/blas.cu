// Dense matrices on the GPU: products through cuBLAS, row-major like cpu::gemm (a row-major
// product C = op(A)·op(B) is the column-major product Cᵀ = op(B)ᵀ·op(A)ᵀ, so the operands swap
// places), and the orthonormalisation of low-rank factors.
#include <cublas_v2.h>

#include <map>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "launch.cuh"

namespace sketchsgd::kernels::cuda {
namespace {

void check(cublasStatus_t status, const char* what) {
  SKETCHSGD_REQUIRE(status == CUBLAS_STATUS_SUCCESS, CudaError, "cuBLAS ", what,
                    " failed: ", cublasGetStatusString(status));
}

/// One handle per (thread, device): a handle belongs to the device current when it was made,
/// and handles are not safe to share between threads without locking.
cublasHandle_t handle() {
  struct Handles {
    std::map<int, cublasHandle_t> by_device;
    ~Handles() {
      for (auto& [d, h] : by_device) cublasDestroy(h);
    }
  };
  thread_local Handles handles;
  const int device = gpu::current_device();
  auto it = handles.by_device.find(device);
  if (it == handles.by_device.end()) {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    // Bit-reproducible results across runs and ranks: no atomics-based reductions.
    check(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
    it = handles.by_device.emplace(device, h).first;
  }
  return it->second;
}

constexpr int kOrthoThreads = 256, kOrthoWarps = kOrthoThreads / 32;
constexpr int kChunk = 8;  // dot products reduced together

/// Sums v[0..kChunk) over the block into out (shared); every thread calls it.
__device__ void block_sum(double (&v)[kChunk], double (*part)[kOrthoWarps], double* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int c = 0; c < kChunk; ++c) {
    double x = v[c];
    for (int o = 16; o > 0; o /= 2) x += __shfl_down_sync(0xFFFFFFFFu, x, o);
    if (lane == 0) part[c][warp] = x;
  }
  __syncthreads();
  if (threadIdx.x < kChunk) {
    double x = 0.0;
    for (int w = 0; w < kOrthoWarps; ++w) x += part[threadIdx.x][w];
    out[threadIdx.x] = x;
  }
  __syncthreads();
}

/// One block per factor: modified Gram-Schmidt as cpu::orthonormalize's row-wise form does it
/// (column i's dot products with itself and the later columns in double, the later columns
/// projected, column i scaled). Each thread owns rows j ≡ threadIdx.x, so the only exchange
/// between threads is the reductions. The factors are small (a few hundred kB): one launch for
/// all of them costs less than the launches a cuBLAS CholeskyQR would take per factor.
__global__ void __launch_bounds__(kOrthoThreads)
    orthonormalize_kernel(float* base, const Factor* factors, float* rr_base) {
  __shared__ double part[kChunk][kOrthoWarps];
  __shared__ double dot[kChunk];
  const Factor f = factors[blockIdx.x];
  float* a = base + f.at;
  const uint64_t n = f.rows, r = f.rank;
  float* rr = rr_base != nullptr ? rr_base + f.r_at : nullptr;
  if (rr != nullptr)
    for (uint64_t e = threadIdx.x; e < r * r; e += blockDim.x) rr[e] = 0.0f;
  for (uint64_t i = 0; i < r; ++i) {
    double norm2 = 0.0;
    float inv = 0.0f;
    for (uint64_t c = i; c < r; c += kChunk) {  // columns c … c + kChunk − 1
      double v[kChunk] = {};
      for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float* row = a + j * r;
        const double x = row[i];
#pragma unroll
        for (int l = 0; l < kChunk; ++l)
          if (c + l < r) v[l] += x * row[c + l];
      }
      block_sum(v, part, dot);
      if (c == i) {
        norm2 = dot[0];
        inv = elem::gram_schmidt_inverse(norm2);
        if (inv == 0.0f) break;
      }
      const double norm = sqrt(norm2);
      if (rr != nullptr && threadIdx.x < kChunk && c + threadIdx.x < r)
        rr[i * r + c + threadIdx.x] = float(dot[threadIdx.x] / norm);
      float coef[kChunk];
#pragma unroll
      for (int l = 0; l < kChunk; ++l) coef[l] = float(dot[l] / norm2);
      for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float* row = a + j * r;
        const float x = row[i];
#pragma unroll
        for (int l = 0; l < kChunk; ++l)
          if (c + l > i && c + l < r) row[c + l] -= coef[l] * x;
      }
      __syncthreads();  // dot[] is rewritten by the next chunk's sum
    }
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) a[j * r + i] *= inv;  // 0: vanished
    __syncthreads();
  }
}

}  // namespace

void orthonormalize(float* base, const Factor* factors, size_t count, float* rr, Stream stream) {
  if (count == 0) return;
  orthonormalize_kernel<<<unsigned(count), kOrthoThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      base, factors, rr);
  SKETCHSGD_LAUNCH_CHECK();
}

void gemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha, const float* a,
          size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc, Stream stream) {
  if (m == 0 || n == 0) return;
  cublasHandle_t h = handle();
  check(cublasSetStream(h, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  check(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                    int(n), int(m), int(k), &alpha, b, int(ldb), a, int(lda), &beta, c, int(ldc)),
        "sgemm");
}

}  // namespace sketchsgd::kernels::cuda
