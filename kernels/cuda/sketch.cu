// CUDA count-sketch kernels. Hashes come from hash.hpp and medians from elementwise.hpp, the same
// code the CPU kernels run, so buckets and signs are bit-identical and estimates from one table
// agree exactly. Accumulation uses fire-and-forget atomic adds (RED) into the L2-resident table.
#include <cub/block/block_reduce.cuh>
#include <cuda/ptx>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include <sketchsgd/kernels/hash.hpp>
#include <sketchsgd/kernels/window_order.hpp>
#include "launch.cuh"
#include "select/dispatch.cuh"

namespace sketchsgd::kernels::cuda {
namespace {

/// Hash parameters by value (kernel parameter space: no device allocation, no copy). Random
/// hashing: row[i] are the bucket hashes (or packed holds them); blocked: row[i] are the sign
/// hashes and windows the (row, block) words.
struct Hashes {
  hash::RowHash row[elem::kMaxRows];
  const uint32_t* packed;
  const uint32_t* windows;
  uint64_t dim;
  uint64_t blocks;  // per row (blocked)
  uint32_t rows;
  uint32_t cols;
  hash::Blocked b;

  explicit Hashes(const SketchLayout& s)
      : packed(s.packed), windows(s.windows), dim(s.dim), rows(s.rows), cols(s.cols) {
    b = s.block ? hash::blocked_shape(s.block, s.cols) : hash::Blocked{};
    blocks = s.block ? (s.dim + b.size() - 1) >> b.shift : 0;
    for (uint32_t i = 0; i < elem::kMaxRows; ++i)
      row[i] = s.block ? hash::sign_hash(s.seed, i) : hash::row_hash(s.seed, i);
  }
  __device__ __forceinline__ uint32_t at(uint32_t i, uint64_t j) const {
    if (windows)
      return hash::locate_blocked(__ldg(windows + i * blocks + (j >> b.shift)), row[i], uint32_t(j),
                                  cols, b);
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

/// x[i] is coordinate offset + i and reported as index base + i.
__global__ void accumulate_kernel(Hashes h, float* table, const float* x, uint64_t n,
                                  uint64_t offset, float scale, uint64_t base,
                                  unsigned long long* first_bad) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    if (!is_finite(v)) {
      atomicMin(first_bad, (unsigned long long)(base + i));
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

__global__ void windows_kernel(hash::RowHash h, uint64_t blocks, uint32_t* out) {
  for (uint64_t b = thread_index(); b < blocks; b += grid_stride())
    out[b] = hash::window_word(h, b);
}

/// The 4-vector whose lane l is v's lane l XOR key: lane l of a window group holds position
/// l XOR key. Selects, not a runtime-indexed array (which would live in local memory).
__device__ __forceinline__ float4 permute_lanes(float4 v, uint32_t key) {
  switch (key) {
    case 1:
      return make_float4(v.y, v.x, v.w, v.z);
    case 2:
      return make_float4(v.z, v.w, v.x, v.y);
    case 3:
      return make_float4(v.w, v.z, v.y, v.x);
    default:
      return v;
  }
}

/// Row r's share of the group of 4 coordinates at j (values v, aligned windows): the signed,
/// scaled values in the window's lane order and the column of the group's first lane.
struct GroupShare {
  float4 value;
  uint32_t col;
};
/// The signed, scaled values of the group of 4 at j, in the lane order of a window whose word is w.
/// Signs as hash::sign_bit: the words of j + 1 … j + 3 are the word of j plus multiples of a.
__device__ __forceinline__ float4 group_values(hash::RowHash sh, uint32_t w, uint32_t j, float4 v,
                                               float scale) {
  const uint32_t a = uint32_t(sh.a), s0 = hash::sign_word(sh, j);
  const float4 sv = make_float4(hash::apply_sign(s0 & hash::kSignBit, scale * v.x),
                                hash::apply_sign((s0 + a) & hash::kSignBit, scale * v.y),
                                hash::apply_sign((s0 + 2 * a) & hash::kSignBit, scale * v.z),
                                hash::apply_sign((s0 + 3 * a) & hash::kSignBit, scale * v.w));
  return permute_lanes(sv, w & 3u);
}
__device__ __forceinline__ GroupShare group_share(const Hashes& h, uint32_t r, uint64_t j, float4 v,
                                                  float scale) {
  const uint32_t w = __ldg(h.windows + r * h.blocks + (j >> h.b.shift));
  uint32_t col = hash::window_start(w, h.cols, true) + (uint32_t(j) & (h.b.size() - 1));
  if (col >= h.cols) col -= h.cols;
  return {group_values(h.row[r], w, uint32_t(j), v, scale), col};
}

/// table[col … col + 3] += value: one vector atomic (sm_90), else four.
__device__ __forceinline__ void add_group(float* dst, float4 d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), d);
#else
  atomicAdd(dst, d.x);
  atomicAdd(dst + 1, d.y);
  atomicAdd(dst + 2, d.z);
  atomicAdd(dst + 3, d.w);
#endif
}

/// The group of 4 at x4[g], or zeros with its first non-finite index (relative to x, from
/// `base`) min-ed into *first_bad: a bad group is skipped whole, as the rollback pass skips it.
__device__ __forceinline__ bool finite_group(float4 v, uint64_t i, unsigned long long* first_bad) {
  if (is_finite(v.x) && is_finite(v.y) && is_finite(v.z) && is_finite(v.w)) return true;
  i += !is_finite(v.x) ? 0 : !is_finite(v.y) ? 1 : !is_finite(v.z) ? 2 : 3;
  atomicMin(first_bad, (unsigned long long)i);
  return false;
}
__device__ __forceinline__ bool load_group(const float4* x4, uint64_t g, uint64_t base,
                                           unsigned long long* first_bad, float4& v) {
  v = x4[g];
  if (finite_group(v, base + 4 * g, first_bad)) return true;
  v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  return false;
}

/// Blocked accumulate, aligned windows: one thread per group of 4 coordinates (one block, one
/// 16-byte column group per row). One 16-byte load of x, then per row one vector atomic add
/// (sm_90) of the signed values in the window's lane order. A group holding a non-finite value
/// is skipped whole and its first bad index reported (the rollback pass skips the same groups);
/// x is the caller's slice from position base.
__global__ void accumulate_groups_kernel(Hashes h, float* table, const float* x, uint64_t groups,
                                         uint64_t offset, uint64_t base, float scale,
                                         unsigned long long* first_bad) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (uint64_t g = thread_index(); g < groups; g += grid_stride()) {
    float4 v;
    if (!load_group(x4, g, base, first_bad, v)) continue;
    for (uint32_t r = 0; r < h.rows; ++r) {
      const GroupShare s = group_share(h, r, offset + 4 * g, v, scale);
      add_group(table + uint64_t(r) * h.cols + s.col, s.value);
    }
  }
}

/// Coordinates per tile of accumulate_tiles_kernel: a group of 4 per thread.
constexpr uint32_t kTile = 4 * kThreads;
/// Rows the tiles kernel stages in shared memory (4 KiB each); more take the groups kernel.
constexpr uint32_t kTileRows = 8;

/// Blocked accumulate by tiles (sm_90): the tile's signed values go into shared memory row by
/// row, in the windows' column order, and one thread has the TMA unit add each row's contiguous
/// runs to the table (cp.reduce.async.bulk .add.f32): a few bulk reductions of up to 4 KiB per
/// (row, tile) where the groups kernel issues a 16-byte atomic per (row, group), the L2's limit
/// there. A run is a whole window (blocks shorter than the tile) or the tile's part of one, split
/// in two where the window wraps past the last column. Tiles start on a run boundary (the
/// caller's split). Before sm_90 each thread adds its groups as the groups kernel does.
__global__ void __launch_bounds__(kThreads)
    accumulate_tiles_kernel(Hashes h, float* table, const float* x, uint64_t tiles, uint64_t offset,
                            uint64_t base, float scale, unsigned long long* first_bad) {
  extern __shared__ __align__(128) float4 stage[];  // rows × kTile floats
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const uint32_t run = min(h.b.size(), kTile);  // floats per window run
  for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const uint64_t g = tile * (kTile / 4) + threadIdx.x;
    float4 v;
    load_group(x4, g, base, first_bad, v);
    const uint64_t j = offset + 4 * g;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (uint32_t r = 0; r < h.rows; ++r)
      stage[r * (kTile / 4) + threadIdx.x] = group_share(h, r, j, v, scale).value;
    ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // visible to the TMA unit
    __syncthreads();
    if (threadIdx.x == 0) {
      const float* staged = reinterpret_cast<const float*>(stage);
      const uint64_t j0 = offset + tile * kTile;
      for (uint32_t r = 0; r < h.rows; ++r)
        for (uint32_t p = 0; p < kTile; p += run) {
          const uint32_t col = group_share(h, r, j0 + p, make_float4(0, 0, 0, 0), 0.0f).col;
          const uint32_t first = min(run, h.cols - col);  // up to the last column
          float* row = table + uint64_t(r) * h.cols;
          const float* src = staged + r * kTile + p;
          ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared,
                                            ::cuda::ptx::op_add, row + col, src, first * 4u);
          if (first < run)
            ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared,
                                              ::cuda::ptx::op_add, row, src + first,
                                              (run - first) * 4u);
        }
      ::cuda::ptx::cp_async_bulk_commit_group();
      ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>());  // stage reusable
    }
    __syncthreads();
#else
    for (uint32_t r = 0; r < h.rows; ++r) {
      const GroupShare s = group_share(h, r, j, v, scale);
      add_group(table + uint64_t(r) * h.cols + s.col, s.value);
    }
#endif
  }
}

/// What the column path's CTAs share: the grouping by window and the slice x holds.
struct Columns {
  const uint32_t* order;
  OrderShape o;
  uint32_t tile_shift;
  uint32_t lo, hi;          // x holds coordinates lo … hi − 1, whole groups of 4 (dim < 2^32)
  uint64_t chunk0, chunk1;  // the slice's chunks: chunk0 … chunk1 − 1
};

/// Blocks whose values a thread loads before adding the first of them.
constexpr uint32_t kAhead = 4;

/// Blocked accumulate by columns (window_order.hpp): a CTA per (row, tile) adds every block whose
/// window starts in the tile into a region of T + B floats in shared memory, walking its blocks in
/// gradient order, then adds the region to the table once (TMA bulk reductions on sm_90): r · c ·
/// (1 + B/T) reductions in all instead of one per (row, value). Every value is read r times (the
/// CTAs walk the gradient at about the same pace, windows being uniform, so part of it comes from
/// L2). Thread t owns the region's groups of 4 at t, t + kThreads, …: each listed block gives it
/// the groups that land there, so the adds need no atomics and no barriers. A group holding a
/// non-finite value is skipped whole and reported, as the other paths do. kWhole: B ≥ 4 · kThreads,
/// every thread has a group in every block (else threads check that theirs is inside the block).
template <bool kWhole>
__global__ void __launch_bounds__(kThreads)
    accumulate_columns_kernel(Hashes h, Columns c, float* table, const float* x, float scale,
                              unsigned long long* first_bad) {
  extern __shared__ __align__(128) float4 region[];  // c.o.region / 4 groups
  // A batch of the item's blocks: first coordinate, window word, the region's groups before it.
  __shared__ uint4 listed[kThreads];
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const uint32_t groups = c.o.region / 4;
  const uint32_t per_block = h.b.size() / 4;  // groups of a block
  // A thread's share of a block: 2^sub_shift groups (B > 4 · kThreads), else at most one.
  const uint32_t sub_shift = h.b.shift > 10 ? h.b.shift - 10 : 0, sub_mask = (1u << sub_shift) - 1;
  static_assert(kThreads == 256, "sub_shift: a block of 2^10 coordinates is a group a thread");
  const uint32_t len = c.hi - c.lo;
  for (uint64_t item = blockIdx.x; item < uint64_t(h.rows) * c.o.tiles; item += gridDim.x) {
    const uint32_t r = uint32_t(item / c.o.tiles), tile = uint32_t(item % c.o.tiles);
    const uint32_t* row = c.order + r * c.o.per_row;
    const uint32_t* first = row + c.o.blocks + uint64_t(tile) * c.o.chunks;
    const uint32_t begin = __ldg(first + c.chunk0), end = __ldg(first + c.chunk1);
    if (begin == end) continue;  // uniform in the CTA
    const uint32_t tile_col = tile << c.tile_shift;
    const hash::RowHash sh = h.row[r];
    for (uint32_t i = threadIdx.x; i < groups; i += kThreads)
      region[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (uint32_t at = begin; at < end; at += kThreads) {
      const uint32_t n = min(uint32_t(kThreads), end - at);
      __syncthreads();  // the last batch's list read (before the first: the last flush issued)
      if (threadIdx.x < n) {
        const uint32_t blk = __ldg(row + at + threadIdx.x);
        const uint32_t w = __ldg(h.windows + r * h.blocks + blk);
        listed[threadIdx.x] = make_uint4(blk << h.b.shift, w,
                                         (hash::window_start(w, h.cols, true) - tile_col) >> 2, 0);
      }
      __syncthreads();
      const uint32_t units = n << sub_shift;  // (block, a thread's share of it)
      for (uint32_t u0 = 0; u0 < units; u0 += kAhead) {
        float4 v[kAhead];
        uint32_t dst[kAhead], w[kAhead], j[kAhead];
#pragma unroll
        for (uint32_t m = 0; m < kAhead; ++m) {
          const uint32_t u = min(u0 + m, units - 1);
          const uint4 e = listed[u >> sub_shift];
          const uint32_t g = ((threadIdx.x - e.z) & (kThreads - 1)) + (u & sub_mask) * kThreads;
          j[m] = e.x + 4 * g;
          w[m] = e.y;
          const bool in = u0 + m < units && j[m] - c.lo < len && (kWhole || g < per_block);
          dst[m] = in ? e.z + g : ~0u;
          v[m] = in ? __ldg(x4 + ((j[m] - c.lo) >> 2)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (uint32_t m = 0; m < kAhead; ++m) {
          if (dst[m] == ~0u || !finite_group(v[m], j[m] - c.lo, first_bad)) continue;
          const float4 s = group_values(sh, w[m], j[m], v[m], scale);
          float4& a = region[dst[m]];
          a = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
        }
      }
    }
    __syncthreads();
    float* dst_row = table + uint64_t(r) * h.cols;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // visible to the TMA unit
    __syncthreads();
    if (threadIdx.x == 0) {
      const float* src = reinterpret_cast<const float*>(region);
      for (uint32_t p = 0; p < c.o.region;) {
        const RegionPiece piece = region_piece(tile_col, p, c.o.region, h.cols, 1024);
        ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared,
                                          ::cuda::ptx::op_add, dst_row + piece.col, src + p,
                                          piece.len * 4u);
        p += piece.len;
      }
      ::cuda::ptx::cp_async_bulk_commit_group();
      ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>());  // region reusable
    }
#else
    for (uint32_t i = threadIdx.x; i < groups; i += kThreads)
      add_group(dst_row + region_piece(tile_col, 4 * i, c.o.region, h.cols, 4).col, region[i]);
#endif
    __syncthreads();  // the region read before the next item zeroes it
  }
}

/// Blocked estimates, aligned windows: one thread per group of 4 coordinates. Per row one window
/// word, one 16-byte load of the group's columns, lanes put back in position order, signs from
/// one hash and three adds; then four medians. R rows, known at compile time (registers).
template <int R>
__global__ void estimate_groups_kernel(Hashes h, const float* table, uint64_t groups, float* out) {
  const uint32_t mask = h.b.size() - 1;
  for (uint64_t g = thread_index(); g < groups; g += grid_stride()) {
    const uint64_t j = 4 * g;
    const uint64_t block = j >> h.b.shift;
    const uint32_t t = uint32_t(j) & mask;
    float v0[R], v1[R], v2[R], v3[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const uint32_t w = __ldg(h.windows + i * h.blocks + block);
      uint32_t col = hash::window_start(w, h.cols, true) + t;
      if (col >= h.cols) col -= h.cols;
      const float4 q = permute_lanes(
          __ldg(reinterpret_cast<const float4*>(table + uint64_t(i) * h.cols + col)), w & 3u);
      const uint32_t a = uint32_t(h.row[i].a), s0 = hash::sign_word(h.row[i], uint32_t(j));
      v0[i] = hash::apply_sign(s0 & hash::kSignBit, q.x);
      v1[i] = hash::apply_sign((s0 + a) & hash::kSignBit, q.y);
      v2[i] = hash::apply_sign((s0 + 2 * a) & hash::kSignBit, q.z);
      v3[i] = hash::apply_sign((s0 + 3 * a) & hash::kSignBit, q.w);
    }
    reinterpret_cast<float4*>(out)[g] =
        make_float4(elem::median_inplace(v0, R), elem::median_inplace(v1, R),
                    elem::median_inplace(v2, R), elem::median_inplace(v3, R));
  }
}

/// Writes every estimate: the grouped kernel where windows are aligned and R is a common row
/// count (the tail of fewer than 4 coordinates, and every other case, one thread per estimate).
/// Returns false when out is not 16-byte aligned or the shape has no grouped path.
bool estimate_all_grouped(const SketchLayout& s, const float* table, float* out, Stream stream) {
  const Hashes h(s);
  if (!s.block || !h.b.aligned || h.b.lanes != 3 || reinterpret_cast<uintptr_t>(out) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(table) % 16 != 0 || (s.rows != 1 && s.rows != 3 && s.rows != 5))
    return false;
  const uint64_t groups = s.dim / 4;
  if (groups) {
    const unsigned grid = grid_for(groups, 2);
    if (s.rows == 1)
      estimate_groups_kernel<1><<<grid, kThreads, 0, stream>>>(h, table, groups, out);
    else if (s.rows == 3)
      estimate_groups_kernel<3><<<grid, kThreads, 0, stream>>>(h, table, groups, out);
    else
      estimate_groups_kernel<5><<<grid, kThreads, 0, stream>>>(h, table, groups, out);
    SKETCHSGD_LAUNCH_CHECK();
  }
  return true;
}

template <class E>
__global__ void estimate_kernel(E est, const uint32_t* idx, uint64_t n, float* out) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) out[i] = est(idx[i]);
}

template <class E>
__global__ void estimate_all_kernel(E est, uint64_t first, uint64_t dim, float* out) {
  for (uint64_t j = first + thread_index(); j < dim; j += grid_stride()) out[j] = est(uint32_t(j));
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

void precompute_windows(const SketchLayout& s, uint32_t* words, Stream stream) {
  const Hashes h(s);
  for (uint32_t row = 0; row < s.rows; ++row) {
    windows_kernel<<<grid_for(h.blocks), kThreads, 0, stream>>>(
        hash::window_hash(s.seed, row), h.blocks, words + uint64_t(row) * h.blocks);
    SKETCHSGD_LAUNCH_CHECK();
  }
}

void accumulate(const SketchLayout& s, float* table, const float* x, size_t n, uint64_t offset,
                float scale, unsigned long long* first_bad, Stream stream) {
  if (n == 0) return;
  const Hashes h(s);
  // Whole 16-byte groups of aligned windows take the vector path; a slice that starts off a group
  // boundary or an unaligned x, tiny blocks and unaligned windows take one thread per coordinate.
  const bool groups = s.block && h.b.aligned && h.b.lanes == 3 && offset % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(table) % 16 == 0;
  const size_t head = groups ? n / 4 * 4 : 0;
  if (head && s.rows >= 2 && s.order.words && order_fits(s.block, s.cols, s.order) &&
      head >= 8ull * s.cols) {
    // By columns: each tile's flush is then spread over at least 8 values a column. One row reads
    // the gradient once either way, and there the tiles measured faster (BENCHMARKS.md).
    Columns c{};
    c.order = s.order.words;
    c.o = order_shape(s.dim, s.cols, h.b, s.order);
    c.tile_shift = s.order.tile_shift;
    c.lo = uint32_t(offset);
    c.hi = uint32_t(offset + head);
    c.chunk0 = (offset >> h.b.shift) >> c.o.chunk_blocks;
    c.chunk1 = (((offset + head - 1) >> h.b.shift) >> c.o.chunk_blocks) + 1;
    const uint64_t items = uint64_t(s.rows) * c.o.tiles;
    const unsigned grid = unsigned(std::min<uint64_t>(items, uint64_t(sm_count()) * 64));
    const size_t smem = c.o.region * sizeof(float);
    if (h.b.size() >= 4 * kThreads)
      accumulate_columns_kernel<true>
          <<<grid, kThreads, smem, stream>>>(h, c, table, x, scale, first_bad);
    else
      accumulate_columns_kernel<false>
          <<<grid, kThreads, smem, stream>>>(h, c, table, x, scale, first_bad);
    SKETCHSGD_LAUNCH_CHECK();
  } else if (head) {
    // Whole tiles from the first run boundary, groups before and after them.
    const uint32_t run = std::min<uint32_t>(h.b.size(), kTile);
    const size_t lead = std::min<size_t>(head, (run - offset % run) % run);
    const uint64_t tiles = s.rows <= kTileRows ? (head - lead) / kTile : 0;
    const size_t tail = lead + tiles * kTile;
    if (lead)
      accumulate_groups_kernel<<<grid_for(lead / 4, 2), kThreads, 0, stream>>>(
          h, table, x, lead / 4, offset, 0, scale, first_bad);
    if (tiles) {
      const size_t smem = size_t(s.rows) * kTile * sizeof(float);
      const unsigned grid = unsigned(std::min<uint64_t>(tiles, uint64_t(sm_count()) * 8));
      accumulate_tiles_kernel<<<grid, kThreads, smem, stream>>>(
          h, table, x + lead, tiles, offset + lead, lead, scale, first_bad);
      SKETCHSGD_LAUNCH_CHECK();
    }
    if (tail < head)
      accumulate_groups_kernel<<<grid_for((head - tail) / 4, 2), kThreads, 0, stream>>>(
          h, table, x + tail, (head - tail) / 4, offset + tail, tail, scale, first_bad);
    SKETCHSGD_LAUNCH_CHECK();
  }
  if (head < n) {
    accumulate_kernel<<<grid_for(n - head, 4), kThreads, 0, stream>>>(
        h, table, x + head, n - head, offset + head, scale, head, first_bad);
    SKETCHSGD_LAUNCH_CHECK();
  }
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
  const uint64_t first = estimate_all_grouped(s, table, out, stream) ? s.dim / 4 * 4 : 0;
  if (first == s.dim) return;
  with_estimator(s, table, [&](auto est) {
    estimate_all_kernel<<<grid_for(s.dim - first, 2), kThreads, 0, stream>>>(est, first, s.dim,
                                                                             out);
  });
  SKETCHSGD_LAUNCH_CHECK();
}

void estimate_topk(const SketchLayout& s, const float* table, size_t k, uint32_t* idx, float* val,
                   Workspace& ws, Stream stream, Order order) {
  SKETCHSGD_REQUIRE(k <= s.dim, InvalidArgument, "estimate_topk: k = ", k,
                    " exceeds dim = ", s.dim);
  // Random buckets: an estimate costs r scattered gathers and a median, so compute them once
  // (d floats of workspace). Blocked windows: neighbouring coordinates read neighbouring columns
  // (coalesced), so each selection pass recomputes them instead of writing and reading d floats.
  const Hashes h(s);
  if (s.block && h.b.aligned && h.b.lanes == 3 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
      (s.rows == 1 || s.rows == 3 || s.rows == 5)) {
    // Blocked, aligned: every estimate written once by the grouped kernel (16-byte loads, signs
    // and window words shared by 4 coordinates), then the selection reads floats.
    select::topk_filled([&](float* out, Stream st) { estimate_all(s, table, out, st); }, s.dim, k,
                        idx, val, ws, stream, order);
    return;
  }
  with_estimator(s, table, [&](auto est) {
    select::topk(est, s.dim, k, idx, val, ws, stream, s.block == 0, order);
  });
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
          Stream stream, Order order) {
  SKETCHSGD_REQUIRE(k <= n, InvalidArgument, "topk: k = ", k, " exceeds n = ", n);
  SKETCHSGD_REQUIRE(n < (uint64_t(1) << 32), InvalidArgument, "topk: n = ", n,
                    " needs 32-bit indices");
  select::topk(select::Values{x}, n, k, idx, val, ws, stream, false, order);
}

}  // namespace sketchsgd::kernels::cuda
