// CUDA kernels over dense and sparse float vectors: the fused momentum + error-feedback update,
// axpy, rounding to 16-bit floats, chunk statistics, finiteness, gathers and scatters. Memory-bound
// grid-stride loops.
#include <cub/block/block_reduce.cuh>

#include <algorithm>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/half.hpp>
#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "launch.cuh"

namespace sketchsgd::kernels::cuda {
namespace {

__global__ void find_nonfinite_kernel(const float* x, uint64_t n, unsigned long long* first) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride())
    if (!is_finite(x[i])) atomicMin(first, (unsigned long long)i);
}

__global__ void axpy_kernel(float* y, const float* x, uint64_t n, float a) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) y[i] += a * x[i];
}

__global__ void round_half_kernel(float* x, uint64_t n, bool bf16, unsigned long long* first) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    const float v = bf16 ? bf16_float(bf16_bits(x[i])) : half_float(half_bits(x[i]));
    x[i] = v;
    if (!is_finite(v)) atomicMin(first, (unsigned long long)i);
  }
}

__global__ void scale_kernel(float* y, const float* x, uint64_t n, float a) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) y[i] = a * x[i];
}

struct PieceList {
  Piece at[kMaxPieces];
};

/// Piece blockIdx.y: dst = a · src (a = 1: the values themselves, NaN payloads too).
__global__ void scale_pieces_kernel(PieceList list, float a) {
  const Piece p = list.at[blockIdx.y];
  for (uint64_t i = thread_index(); i < p.n; i += grid_stride())
    p.dst[i] = a == 1.0f ? p.src[i] : a * p.src[i];
}

__global__ void momentum_kernel(float* u, float* v, const float* g, uint64_t n, float rho) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    const float m = rho * u[i] + g[i];
    u[i] = m;
    v[i] += m;
  }
}

__global__ void adagrad_kernel(float* w, float* v, const float* s, uint64_t n, float lr,
                               float eps) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride())
    if (s[i] != 0.0f) elem::adagrad(w[i], v[i], s[i], lr, eps);  // as the CPU: exact, and sparse
}

__global__ void adam_kernel(float* w, float* m, float* v, const float* s, uint64_t n, float lr,
                            float b1, float b2, float c1, float c2, float eps) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride())
    elem::adam(w[i], m[i], v[i], s[i], lr, b1, b2, c1, c2, eps);
}

struct Moments {
  double sum, sq, abs_sum;
  float abs_max;
};

struct AddMoments {
  __device__ Moments operator()(const Moments& a, const Moments& b) const {
    return {a.sum + b.sum, a.sq + b.sq, a.abs_sum + b.abs_sum, fmaxf(a.abs_max, b.abs_max)};
  }
};

/// One block per chunk: the same double accumulation and formulas as cpu::chunk_stats.
/// One block per chunk at a time; blocks stride over the chunks (there may be more than a grid).
__global__ void chunk_stats_kernel(const float* x, uint64_t n, uint64_t chunk, ChunkStats* out) {
  using Reduce = cub::BlockReduce<Moments, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint64_t chunks = (n + chunk - 1) / chunk;
  for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const uint64_t lo = c * chunk, hi = min(n, lo + chunk);
    Moments m{0.0, 0.0, 0.0, 0.0f};
    for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const double v = x[i];
      m.sum += v;
      m.sq += v * v;
      m.abs_sum += fabs(v);
      m.abs_max = fmaxf(m.abs_max, fabsf(x[i]));
    }
    const Moments t = Reduce(temp).Reduce(m, AddMoments{});
    if (threadIdx.x == 0) {
      const double cnt = double(hi - lo), mean = t.sum / cnt;
      out[c] = ChunkStats{t.abs_max, float(t.abs_sum / cnt),
                          float(sqrt(fmax(0.0, t.sq / cnt - mean * mean)))};
    }
    __syncthreads();  // temp is reused by the next chunk's reduction
  }
}

__global__ void gather_kernel(const float* x, const uint32_t* idx, uint64_t n, float* out) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) out[i] = x[idx[i]];
}

__global__ void scatter_kernel(float* y, const uint32_t* idx, const float* val, uint64_t n) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) y[idx[i]] = val ? val[i] : 0.0f;
}

__global__ void scatter_axpy_kernel(float* y, const uint32_t* idx, const float* val, uint64_t n,
                                    float a) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) y[idx[i]] += a * val[i];
}

__global__ void check_indices_kernel(const uint32_t* idx, uint64_t n, uint64_t limit,
                                     unsigned long long* first) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride())
    if (idx[i] >= limit) atomicMin(first, (unsigned long long)i);
}

}  // namespace

void check_indices(const uint32_t* idx, size_t n, uint64_t limit, unsigned long long* first,
                   Stream stream) {
  if (n == 0) return;
  check_indices_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(idx, n, limit, first);
  SKETCHSGD_LAUNCH_CHECK();
}

void find_nonfinite(const float* x, size_t n, unsigned long long* first, Stream stream) {
  if (n == 0) return;
  find_nonfinite_kernel<<<grid_for(n, 8), kThreads, 0, stream>>>(x, n, first);
  SKETCHSGD_LAUNCH_CHECK();
}

void axpy(float* y, const float* x, size_t n, float a, Stream stream) {
  if (n == 0) return;
  axpy_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(y, x, n, a);
  SKETCHSGD_LAUNCH_CHECK();
}

void round_half(float* x, size_t n, bool bf16, unsigned long long* first, Stream stream) {
  if (n == 0) return;
  round_half_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(x, n, bf16, first);
  SKETCHSGD_LAUNCH_CHECK();
}

void scale(float* y, const float* x, size_t n, float a, Stream stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(y, x, n, a);
  SKETCHSGD_LAUNCH_CHECK();
}

void scale_pieces(std::span<const Piece> pieces, float a, Stream stream) {
  SKETCHSGD_REQUIRE(pieces.size() <= kMaxPieces, InvalidArgument, "scale_pieces: ", pieces.size(),
                    " pieces, at most ", kMaxPieces, " a launch");
  PieceList list{};
  uint64_t longest = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    list.at[i] = pieces[i];
    longest = std::max(longest, pieces[i].n);
  }
  if (longest == 0) return;
  const dim3 grid(grid_for(longest, 4), unsigned(pieces.size()));
  scale_pieces_kernel<<<grid, kThreads, 0, stream>>>(list, a);
  SKETCHSGD_LAUNCH_CHECK();
}

void momentum_accumulate(float* u, float* v, const float* g, size_t n, float rho, Stream stream) {
  if (n == 0) return;
  momentum_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(u, v, g, n, rho);
  SKETCHSGD_LAUNCH_CHECK();
}

void adagrad(float* w, float* v, const float* s, size_t n, float lr, float eps, Stream stream) {
  if (n == 0) return;
  adagrad_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(w, v, s, n, lr, eps);
  SKETCHSGD_LAUNCH_CHECK();
}

void adam(float* w, float* m, float* v, const float* s, size_t n, float lr, float b1, float b2,
          float c1, float c2, float eps, Stream stream) {
  if (n == 0) return;
  adam_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(w, m, v, s, n, lr, b1, b2, c1, c2, eps);
  SKETCHSGD_LAUNCH_CHECK();
}

void chunk_stats(const float* x, size_t n, size_t chunk, ChunkStats* out, Stream stream) {
  if (n == 0) return;
  const uint64_t chunks = (n + chunk - 1) / chunk;
  chunk_stats_kernel<<<unsigned(std::min<uint64_t>(chunks, 1u << 20)), kThreads, 0, stream>>>(
      x, n, chunk, out);
  SKETCHSGD_LAUNCH_CHECK();
}

void gather(const float* x, const uint32_t* idx, size_t n, float* out, Stream stream) {
  if (n == 0) return;
  gather_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, idx, n, out);
  SKETCHSGD_LAUNCH_CHECK();
}

void scatter(float* y, const uint32_t* idx, const float* val, size_t n, Stream stream) {
  if (n == 0) return;
  scatter_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, idx, val, n);
  SKETCHSGD_LAUNCH_CHECK();
}

void zero_at(float* y, const uint32_t* idx, size_t n, Stream stream) {
  scatter(y, idx, nullptr, n, stream);
}

void scatter_axpy(float* y, const uint32_t* idx, const float* val, size_t n, float a,
                  Stream stream) {
  if (n == 0) return;
  scatter_axpy_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, idx, val, n, a);
  SKETCHSGD_LAUNCH_CHECK();
}

}  // namespace sketchsgd::kernels::cuda
