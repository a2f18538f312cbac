// Dense matrices on the GPU: products through cuBLAS, row-major like cpu::gemm (a row-major
// product C = op(A)·op(B) is the column-major product Cᵀ = op(B)ᵀ·op(A)ᵀ, so the operands swap
// places), and the orthonormalisation of low-rank factors.
#include <cublas_v2.h>

#include <algorithm>
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
/// between threads is the reductions. Used where R is wanted, and where CholeskyQR2 cannot go
/// (a zero or dependent column, a rank past kCholMax).
__global__ void __launch_bounds__(kOrthoThreads)
    orthonormalize_kernel(float* base, const Factor* factors, float* rr_base,
                          const uint32_t* only) {
  __shared__ double part[kChunk][kOrthoWarps];
  __shared__ double dot[kChunk];
  if (only != nullptr && only[blockIdx.x] == 0) return;  // CholeskyQR2 did this one
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

// CholeskyQR2 (Fukaya et al. 2014): A = Q·R with R from the Cholesky factor of the Gram matrix
// AᵀA, twice (the second pass restores the orthogonality the first loses with cond(A)²). Three
// kernels a pass over every factor at once: Gram partials per tile of rows, Cholesky per factor
// (summing the partials in a fixed order, so every rank gets the same bits), and rows solved
// against R. Its two reductions are spread over the whole GPU, where Gram-Schmidt's r sequential
// reductions sit in one block per factor. A factor whose pivot is tiny (a zero or dependent
// column) or whose rank exceeds kCholMax is flagged and left to Gram-Schmidt afterwards.
constexpr uint64_t kCholMax = 64;       // ranks CholeskyQR2 takes (R in shared memory as double)
constexpr uint64_t kTileFloats = 4096;  // a Gram tile: rows × rank floats in shared memory
constexpr double kTinyPivot = 1e-10;    // a pivot under this share of its column's norm²
constexpr uint64_t kSmallRank = 8;      // Gram-Schmidt is faster up to here

__host__ __device__ inline uint64_t tile_rows(uint64_t rank) {
  return rank >= kTileFloats ? 1 : kTileFloats / rank;
}
__host__ __device__ inline uint64_t tiles_of(const Factor& f) {
  return (f.rows + tile_rows(f.rank) - 1) / tile_rows(f.rank);
}

/// The factor, tile and Gram-partial offset of this block (blocks enumerate every factor's
/// tiles in order); false past the last.
__device__ bool locate(const Factor* factors, uint64_t count, uint64_t block, uint64_t& fi,
                       uint64_t& tile, uint64_t& part_at) {
  uint64_t first = 0, at = 0;
  for (fi = 0; fi < count; ++fi) {
    const uint64_t t = tiles_of(factors[fi]), rr = factors[fi].rank * factors[fi].rank;
    if (block < first + t) {
      tile = block - first;
      part_at = at + tile * rr;
      return true;
    }
    first += t;
    at += t * rr;
  }
  return false;
}

/// part[...] = the upper triangle of A_tileᵀ·A_tile in double.
__global__ void __launch_bounds__(kOrthoThreads)
    gram_kernel(const float* base, const Factor* factors, uint64_t count, double* part) {
  __shared__ float sh[kTileFloats];
  uint64_t fi, tile, at;
  if (!locate(factors, count, blockIdx.x, fi, tile, at)) return;
  const Factor f = factors[fi];
  const uint64_t r = f.rank, first = tile * tile_rows(r);
  const uint64_t rows = min(tile_rows(r), f.rows - first);
  const float* a = base + f.at + first * r;  // the tile's rows are contiguous
  for (uint64_t e = threadIdx.x; e < rows * r; e += blockDim.x) sh[e] = a[e];
  __syncthreads();
  for (uint64_t e = threadIdx.x; e < r * r; e += blockDim.x) {
    const uint64_t i = e / r, l = e % r;
    if (l < i) continue;
    double sum = 0.0;
    for (uint64_t j = 0; j < rows; ++j) sum += double(sh[j * r + i]) * sh[j * r + l];
    part[at + e] = sum;
  }
}

/// Per factor: G = Σ partials, then G = RᵀR (R upper, in place, double) into rmat at Σ rank² of
/// the factors before; flag |= the factor could not be done (a tiny pivot, or rank > kCholMax).
__global__ void __launch_bounds__(kOrthoThreads)
    cholesky_kernel(const Factor* factors, const double* part, double* rmat, uint32_t* flag,
                    bool first_pass) {
  __shared__ double g[kCholMax * kCholMax];
  __shared__ double diag[kCholMax];
  __shared__ bool bad;
  uint64_t part_at = 0, r_at = 0;
  for (uint64_t i = 0; i < blockIdx.x; ++i) {
    part_at += tiles_of(factors[i]) * factors[i].rank * factors[i].rank;
    r_at += factors[i].rank * factors[i].rank;
  }
  const Factor f = factors[blockIdx.x];
  const uint64_t r = f.rank, tiles = tiles_of(f);
  if (r > kCholMax) {
    if (threadIdx.x == 0) flag[blockIdx.x] = 1;
    return;
  }
  for (uint64_t e = threadIdx.x; e < r * r; e += blockDim.x) {
    const uint64_t i = e / r, l = e % r;
    double sum = 0.0;
    if (l >= i)
      for (uint64_t t = 0; t < tiles; ++t) sum += part[part_at + t * r * r + e];
    g[e] = sum;
    if (l == i) diag[i] = sum;
  }
  if (threadIdx.x == 0) bad = false;
  __syncthreads();
  for (uint64_t k = 0; k < r; ++k) {
    if (threadIdx.x == 0) {
      const double d = g[k * r + k];
      if (!(d > kTinyPivot * diag[k]) || !isfinite(d))
        bad = true;
      else
        g[k * r + k] = sqrt(d);
    }
    __syncthreads();
    if (bad) break;
    for (uint64_t j = k + 1 + threadIdx.x; j < r; j += blockDim.x) g[k * r + j] /= g[k * r + k];
    __syncthreads();
    const uint64_t m = r - k - 1;
    for (uint64_t e = threadIdx.x; e < m * m; e += blockDim.x) {
      const uint64_t i = k + 1 + e / m, j = k + 1 + e % m;
      if (j >= i) g[i * r + j] -= g[k * r + i] * g[k * r + j];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) flag[blockIdx.x] = (first_pass ? 0u : flag[blockIdx.x]) | uint32_t(bad);
  if (bad) return;
  for (uint64_t e = threadIdx.x; e < r * r; e += blockDim.x) rmat[r_at + e] = g[e];
}

/// Each row a of a factor not flagged becomes x with x·R = a (forward substitution, double).
__global__ void __launch_bounds__(kOrthoThreads)
    solve_kernel(float* base, const Factor* factors, uint64_t count, const double* rmat,
                 const uint32_t* flag) {
  __shared__ double rs[kCholMax * kCholMax];
  uint64_t fi, tile, unused;
  if (!locate(factors, count, blockIdx.x, fi, tile, unused) || flag[fi] != 0) return;
  const Factor f = factors[fi];
  const uint64_t r = f.rank;
  uint64_t r_at = 0;
  for (uint64_t i = 0; i < fi; ++i) r_at += factors[i].rank * factors[i].rank;
  for (uint64_t e = threadIdx.x; e < r * r; e += blockDim.x) rs[e] = rmat[r_at + e];
  __syncthreads();
  const uint64_t first = tile * tile_rows(r), rows = min(tile_rows(r), f.rows - first);
  for (uint64_t j = threadIdx.x; j < rows; j += blockDim.x) {
    float* a = base + f.at + (first + j) * r;
    double x[kCholMax];
    for (uint64_t l = 0; l < r; ++l) {
      double v = a[l];
      for (uint64_t k = 0; k < l; ++k) v -= x[k] * rs[k * r + l];
      x[l] = v / rs[l * r + l];
    }
    for (uint64_t l = 0; l < r; ++l) a[l] = float(x[l]);
  }
}

}  // namespace

void orthonormalize(float* base, std::span<const Factor> host, const Factor* factors, float* rr,
                    Workspace& ws, Stream stream) {
  const size_t count = host.size();
  if (count == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  uint64_t max_rank = 0;
  for (const auto& f : host) max_rank = std::max(max_rank, f.rank);
  // R as Gram-Schmidt gives it, for the callers that need it; and up to rank kSmallRank
  // Gram-Schmidt's one launch beats CholeskyQR2's seven, while past it Gram-Schmidt's r
  // reductions in sequence inside one block lose (BM_Orthonormalize; docs/BENCHMARKS.md).
  if (rr != nullptr || max_rank <= kSmallRank) {
    orthonormalize_kernel<<<unsigned(count), kOrthoThreads, 0, st>>>(base, factors, rr, nullptr);
    SKETCHSGD_LAUNCH_CHECK();
    return;
  }
  uint64_t tiles = 0, parts = 0, rs = 0;
  for (const auto& f : host) {
    tiles += tiles_of(f);
    parts += tiles_of(f) * f.rank * f.rank;
    rs += f.rank * f.rank;
  }
  // Workspace: Gram partials, R blocks (double), then a flag per factor.
  auto* part = static_cast<double*>(ws.get((parts + rs) * sizeof(double) + count * 4, stream));
  double* rmat = part + parts;
  auto* flag = reinterpret_cast<uint32_t*>(rmat + rs);
  for (int pass = 0; pass < 2; ++pass) {
    gram_kernel<<<unsigned(tiles), kOrthoThreads, 0, st>>>(base, factors, count, part);
    SKETCHSGD_LAUNCH_CHECK();
    cholesky_kernel<<<unsigned(count), kOrthoThreads, 0, st>>>(factors, part, rmat, flag,
                                                               pass == 0);
    SKETCHSGD_LAUNCH_CHECK();
    solve_kernel<<<unsigned(tiles), kOrthoThreads, 0, st>>>(base, factors, count, rmat, flag);
    SKETCHSGD_LAUNCH_CHECK();
  }
  orthonormalize_kernel<<<unsigned(count), kOrthoThreads, 0, st>>>(base, factors, nullptr, flag);
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
