// CUDA count-sketch kernels. Hashes come from hash.hpp and medians from elementwise.hpp, the same
// code the CPU kernels run, so buckets and signs are bit-identical and estimates from one table
// agree exactly. Accumulation uses fire-and-forget atomic adds (RED) into the L2-resident table.
#include <cub/block/block_reduce.cuh>

#include "../cuda.hpp"
#include "../elementwise.hpp"
#include "../error.hpp"
#include "../hash.hpp"
#include "launch.cuh"
#include "select.cuh"

namespace sketchsgd::kernels::cuda {
namespace {

/// Row hash parameters by value (kernel parameter space: no device allocation, no copy).
struct Hashes {
  hash::RowHash row[elem::kMaxRows];
  const uint32_t* packed;
  uint64_t dim;
  uint32_t rows;
  uint32_t cols;

  explicit Hashes(const SketchLayout& s)
      : packed(s.packed), dim(s.dim), rows(s.rows), cols(s.cols) {
    for (uint32_t i = 0; i < elem::kMaxRows; ++i) row[i] = hash::row_hash(s.seed, i);
  }
  __device__ __forceinline__ uint32_t at(uint32_t i, uint64_t j) const {
    return packed ? __ldg(packed + i * dim + j) : hash::locate(row[i], uint32_t(j), cols);
  }
};

/// The estimate of coordinate j: median over rows of sign · table[bucket]. R is the row count
/// when known at compile time (the median network then stays in registers), 0 otherwise.
template <int R>
struct Estimator {
  Hashes h;
  const float* table;
  __device__ __forceinline__ float operator()(uint32_t j) const {
    constexpr int kCap = R > 0 ? R : elem::kMaxRows;
    const int rows = R > 0 ? R : int(h.rows);
    float v[kCap];
#pragma unroll
    for (int i = 0; i < kCap; ++i)
      if (i < rows) {
        const uint32_t p = h.at(uint32_t(i), j);
        v[i] = hash::apply_sign(p, __ldg(table + uint64_t(i) * h.cols + hash::bucket_of(p)));
      }
    return elem::median_inplace(v, rows);
  }
};

/// Calls f(Estimator<R>) with R fixed for the common row counts.
template <class F>
void with_estimator(const SketchLayout& s, const float* table, F&& f) {
  const Hashes h(s);
  switch (s.rows) {
    case 1:
      return f(Estimator<1>{h, table});
    case 3:
      return f(Estimator<3>{h, table});
    case 5:
      return f(Estimator<5>{h, table});
    default:
      return f(Estimator<0>{h, table});
  }
}

__global__ void precompute_kernel(hash::RowHash h, uint64_t dim, uint32_t cols, uint32_t* out) {
  for (uint64_t j = thread_index(); j < dim; j += grid_stride())
    out[j] = hash::locate(h, uint32_t(j), cols);
}

__global__ void accumulate_kernel(Hashes h, float* table, const float* x, uint64_t n,
                                  uint64_t offset, float scale, unsigned long long* first_bad) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    if (!is_finite(v)) {
      atomicMin(first_bad, (unsigned long long)i);
      continue;
    }
    const float sv = scale * v;
    const uint64_t j = offset + i;
    for (uint32_t r = 0; r < h.rows; ++r) {
      const uint32_t p = h.at(r, j);
      atomicAdd(table + uint64_t(r) * h.cols + hash::bucket_of(p), hash::apply_sign(p, sv));
    }
  }
}

template <class E>
__global__ void estimate_kernel(E est, const uint32_t* idx, uint64_t n, float* out) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) out[i] = est(idx[i]);
}

template <class E>
__global__ void estimate_all_kernel(E est, uint64_t dim, float* out) {
  for (uint64_t j = thread_index(); j < dim; j += grid_stride()) out[j] = est(uint32_t(j));
}

__global__ void zero_buckets_kernel(Hashes h, float* table, const uint32_t* idx, uint64_t n) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride())
    for (uint32_t r = 0; r < h.rows; ++r)
      table[uint64_t(r) * h.cols + hash::bucket_of(h.at(r, idx[i]))] = 0.0f;
}

/// Row sums of squares in double: grid (blocks, rows).
__global__ void row_squares_kernel(const float* table, uint32_t cols, double* sums) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const float* t = table + uint64_t(blockIdx.y) * cols;
  double acc = 0.0;
  for (uint64_t c = thread_index(); c < cols; c += grid_stride())
    acc += double(t[c]) * double(t[c]);
  const double total = Reduce(temp).Sum(acc);
  if (threadIdx.x == 0) atomicAdd(sums + blockIdx.y, total);
}

__global__ void l2_finish_kernel(const double* sums, uint32_t rows, double* out) {
  float v[elem::kMaxRows];
  for (uint32_t i = 0; i < rows; ++i) v[i] = float(sums[i]);
  *out = sqrt(double(elem::median_inplace(v, int(rows))));
}

}  // namespace

void precompute_hashes(const SketchLayout& s, uint32_t* packed, Stream stream) {
  for (uint32_t row = 0; row < s.rows; ++row) {
    precompute_kernel<<<grid_for(s.dim, 4), kThreads, 0, stream>>>(
        hash::row_hash(s.seed, row), s.dim, s.cols, packed + uint64_t(row) * s.dim);
    SKETCHSGD_LAUNCH_CHECK();
  }
}

void accumulate(const SketchLayout& s, float* table, const float* x, size_t n, uint64_t offset,
                float scale, unsigned long long* first_bad, Stream stream) {
  if (n == 0) return;
  accumulate_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(Hashes(s), table, x, n, offset, scale,
                                                             first_bad);
  SKETCHSGD_LAUNCH_CHECK();
}

void estimate(const SketchLayout& s, const float* table, const uint32_t* idx, size_t n, float* out,
              Stream stream) {
  if (n == 0) return;
  with_estimator(s, table, [&](auto est) {
    estimate_kernel<<<grid_for(n), kThreads, 0, stream>>>(est, idx, n, out);
  });
  SKETCHSGD_LAUNCH_CHECK();
}

void estimate_all(const SketchLayout& s, const float* table, float* out, Stream stream) {
  with_estimator(s, table, [&](auto est) {
    estimate_all_kernel<<<grid_for(s.dim, 2), kThreads, 0, stream>>>(est, s.dim, out);
  });
  SKETCHSGD_LAUNCH_CHECK();
}

void estimate_topk(const SketchLayout& s, const float* table, size_t k, uint32_t* idx, float* val,
                   Workspace& ws, Stream stream) {
  SKETCHSGD_REQUIRE(k <= s.dim, InvalidArgument, "estimate_topk: k = ", k,
                    " exceeds dim = ", s.dim);
  // Estimates cost r gathers and a median each: compute them once (d floats of workspace).
  with_estimator(s, table,
                 [&](auto est) { select::topk(est, s.dim, k, idx, val, ws, stream, true); });
}

void zero_buckets(const SketchLayout& s, float* table, const uint32_t* idx, size_t n,
                  Stream stream) {
  if (n == 0) return;
  zero_buckets_kernel<<<grid_for(n), kThreads, 0, stream>>>(Hashes(s), table, idx, n);
  SKETCHSGD_LAUNCH_CHECK();
}

void l2_estimate(const SketchLayout& s, const float* table, double* out, Workspace& ws,
                 Stream stream) {
  auto* sums = static_cast<double*>(ws.get(s.rows * sizeof(double), stream));
  SKETCHSGD_CUDA_CHECK(cudaMemsetAsync(sums, 0, s.rows * sizeof(double), stream));
  const dim3 grid(std::min(grid_for(s.cols, 8), 256u), s.rows);
  row_squares_kernel<<<grid, kThreads, 0, stream>>>(table, s.cols, sums);
  SKETCHSGD_LAUNCH_CHECK();
  l2_finish_kernel<<<1, 1, 0, stream>>>(sums, s.rows, out);
  SKETCHSGD_LAUNCH_CHECK();
}

void topk(const float* x, size_t n, size_t k, uint32_t* idx, float* val, Workspace& ws,
          Stream stream) {
  SKETCHSGD_REQUIRE(k <= n, InvalidArgument, "topk: k = ", k, " exceeds n = ", n);
  SKETCHSGD_REQUIRE(n < (uint64_t(1) << 32), InvalidArgument, "topk: n = ", n,
                    " needs 32-bit indices");
  select::topk(select::Values{x}, n, k, idx, val, ws, stream, false);
}

}  // namespace sketchsgd::kernels::cuda
