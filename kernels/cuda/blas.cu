// Dense matrix products on the GPU through cuBLAS, row-major like cpu::gemm: a row-major product
// C = op(A)·op(B) is the column-major product Cᵀ = op(B)ᵀ·op(A)ᵀ, so the operands swap places.
#include <cublas_v2.h>

#include <map>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cuda.hpp>

namespace sketchsgd::kernels::cuda {
namespace {

void check(cublasStatus_t status, const char* what) {
  SKETCHSGD_REQUIRE(status == CUBLAS_STATUS_SUCCESS, CudaError, "cuBLAS ", what, " failed: ",
                    cublasGetStatusString(status));
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

}  // namespace

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
