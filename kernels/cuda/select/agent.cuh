// Top-k selection, device side: the state shared by the passes, the value sources and the
// kernels (histogram, choose, filter, ties, ordering). The host-side driver is dispatch.cuh.
#pragma once

#include <cub/block/block_scan.cuh>

#include "../launch.cuh"
#include "tuning.cuh"

namespace sketchsgd::kernels::cuda::select {

struct State {
  uint32_t prefix[kLevels + 1];  // key bits fixed before level l (prefix[3]: the threshold key)
  uint32_t mask[kLevels + 1];
  uint32_t bucket[kLevels];     // chosen digit of level l
  uint32_t need[kLevels + 1];   // winners still to find inside the chosen bucket (need[0] = k)
  uint32_t in_bucket[kLevels];  // values in the chosen bucket
  uint32_t out_n;               // winners written
  uint32_t buf_n[2];            // values appended to each candidate buffer (may exceed capacity)
};

__device__ __forceinline__ uint32_t key_of(float v) {
  return __float_as_uint(v) & 0x7FFFFFFFu;
}

/// Every coordinate 0 … n − 1 with its value computed by V (the input, or a sketch estimate).
template <class V>
struct Full {
  V value;
  uint64_t n;
  __device__ __forceinline__ void get(uint64_t i, uint32_t& idx, float& val) const {
    idx = uint32_t(i);
    val = value(idx);
  }
};

/// A vector in device memory as a value source.
struct Values {
  const float* x;
  __device__ __forceinline__ float operator()(uint32_t j) const { return __ldg(x + j); }
};

/// Compacted candidates.
struct Buffer {
  const uint32_t* idx;
  const float* val;
  uint64_t n;
  __device__ __forceinline__ void get(uint64_t i, uint32_t& j, float& v) const {
    j = idx[i];
    v = val[i];
  }
};

/// Loads this thread's kPer values of the tile at t0 (element q at t0 + q·blockDim + thread).
/// A whole tile loads without conditions, so all kPer loads are in flight at once (with a bound
/// check per load the compiler issues them one at a time: 0.8 instead of 2.5 TB/s measured).
template <class Src>
__device__ __forceinline__ void load_tile(const Src& src, uint64_t t0, uint32_t (&j)[kPer],
                                          float (&v)[kPer], bool (&ok)[kPer]) {
  const uint64_t first = t0 + threadIdx.x;
  if (t0 + uint64_t(blockDim.x) * kPer <= src.n) {
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      src.get(first + uint64_t(q) * blockDim.x, j[q], v[q]);
      ok[q] = true;
    }
  } else {
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const uint64_t i = first + uint64_t(q) * blockDim.x;
      ok[q] = i < src.n;
      j[q] = 0;
      v[q] = 0.0f;
      if (ok[q]) src.get(i, j[q], v[q]);
    }
  }
}

/// Level-0 histogram of the top digit, in shared memory. With store, the values are also
/// written out (computed once, read back by the later passes).
template <class Src>
__global__ void histogram_kernel(Src src, uint32_t* hist, float* store) {
  __shared__ uint32_t bins[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  const uint64_t tile = uint64_t(blockDim.x) * kPer;
  for (uint64_t t0 = blockIdx.x * tile; t0 < src.n; t0 += gridDim.x * tile) {
    uint32_t j[kPer];
    float v[kPer];
    bool ok[kPer];
    load_tile(src, t0, j, v, ok);
#pragma unroll
    for (int q = 0; q < kPer; ++q)
      if (ok[q]) {
        if (store) store[t0 + uint64_t(q) * blockDim.x + threadIdx.x] = v[q];
        atomicAdd(&bins[key_of(v[q]) >> shift_of(0)], 1u);
      }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += blockDim.x)
    if (bins[b]) atomicAdd(&hist[b], bins[b]);
}

/// One block: picks the bucket of level l that holds the need[l]-th largest key.
template <int kThreadsChoose>
__global__ void choose_kernel(State* st, const uint32_t* hist, int level) {
  using Scan = cub::BlockScan<uint32_t, kThreadsChoose>;
  __shared__ typename Scan::TempStorage temp;
  constexpr int kPer = kBins / kThreadsChoose;
  const uint32_t bins = digits_of(level) + 1;
  // Thread t owns bins from the top down, so an inclusive scan gives suffix sums.
  uint32_t count[kPer], suffix[kPer];
  for (int q = 0; q < kPer; ++q) {
    const int b = kBins - 1 - (int(threadIdx.x) * kPer + q);
    count[q] = b < int(bins) ? hist[b] : 0u;
  }
  Scan(temp).InclusiveSum(count, suffix);
  const uint32_t need = st->need[level];
  for (int q = 0; q < kPer; ++q) {
    const int b = kBins - 1 - (int(threadIdx.x) * kPer + q);
    if (count[q] && suffix[q] >= need && suffix[q] - count[q] < need) {
      const int shift = shift_of(level);
      st->bucket[level] = uint32_t(b);
      st->in_bucket[level] = count[q];
      st->need[level + 1] = need - (suffix[q] - count[q]);
      st->prefix[level + 1] = st->prefix[level] | (uint32_t(b) << shift);
      st->mask[level + 1] = st->mask[level] | (digits_of(level) << shift);
    }
  }
}

/// Level l over src: keys in a higher bucket are winners, keys in the chosen bucket go on as
/// candidates (and into the next level's histogram). At the last level the chosen bucket is the
/// exact threshold key: ties are winners when all of them are needed, else candidates.
/// Appends are block-aggregated: one scan per tile of kPer · blockDim values, then one global
/// atomic per counter per tile (a per-warp atomic on one address serialises in L2).
template <class Src>
__global__ void filter_kernel(Src src, State* st, int level, uint32_t* out_idx, float* out_val,
                              uint32_t* next_hist, uint32_t* cand_idx, float* cand_val,
                              uint32_t* cand_n, uint64_t cap) {
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ uint32_t base_out, base_cand;
  const uint32_t prefix = st->prefix[level], mask = st->mask[level];
  const uint32_t bucket = st->bucket[level];
  const int shift = shift_of(level);
  const uint32_t digits = digits_of(level);
  const bool last = level == kLevels - 1;
  const bool ties_win = last && st->in_bucket[level] == st->need[level + 1];
  const uint64_t tile = uint64_t(blockDim.x) * kPer;
  for (uint64_t t0 = blockIdx.x * tile; t0 < src.n; t0 += gridDim.x * tile) {  // block-uniform
    uint32_t j[kPer], key[kPer];
    float v[kPer];
    bool ok[kPer];
    load_tile(src, t0, j, v, ok);
    uint32_t kind = 0;  // 2 bits per element: 1 winner, 2 candidate
    uint32_t mine = 0;  // winners << 16 | candidates (a tile holds at most 2048 of each)
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      key[q] = key_of(v[q]);
      if (ok[q] && (key[q] & mask) == prefix) {
        {
          const uint32_t digit = (key[q] >> shift) & digits;
          const bool win = digit > bucket || (ties_win && digit == bucket);
          const bool cand = digit == bucket && !ties_win;
          kind |= (win ? 1u : (cand ? 2u : 0u)) << (2 * q);
          mine += win ? (1u << 16) : (cand ? 1u : 0u);
        }
      }
    }
    uint32_t pos, total;
    Scan(temp).ExclusiveSum(mine, pos, total);
    if (threadIdx.x == 0) {
      base_out = (total >> 16) ? atomicAdd(&st->out_n, total >> 16) : 0u;
      base_cand = (total & 0xFFFFu) ? atomicAdd(cand_n, total & 0xFFFFu) : 0u;
    }
    __syncthreads();
    uint32_t o = base_out + (pos >> 16), c = base_cand + (pos & 0xFFFFu);
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const uint32_t k2 = (kind >> (2 * q)) & 3u;
      if (k2 == 1u) {
        out_idx[o] = j[q];
        out_val[o] = v[q];
        ++o;
      } else if (k2 == 2u) {
        if (!last)
          atomicAdd(&next_hist[(key[q] >> shift_of(level + 1)) & digits_of(level + 1)], 1u);
        if (c < cap) {
          cand_idx[c] = j[q];
          cand_val[c] = v[q];
        }
        ++c;
      }
    }
    __syncthreads();  // temp and the bases are reused by the next tile
  }
}

/// Ties at the threshold key in index order when they overflowed the buffer: block g owns one
/// contiguous range of the input; pass 1 counts its ties, pass 2 writes the first `need` of them.
template <class V>
__global__ void tie_count_kernel(Full<V> src, const State* st, uint64_t per_block,
                                 uint32_t* counts) {
  using Reduce = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint32_t threshold = st->prefix[kLevels];
  const uint64_t lo = blockIdx.x * per_block, hi = min(src.n, lo + per_block);
  uint32_t mine = 0;
  for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    uint32_t j;
    float v;
    src.get(i, j, v);
    mine += key_of(v) == threshold;
  }
  uint32_t total;
  Reduce(temp).ExclusiveSum(mine, mine, total);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

template <class V>
__global__ void tie_write_kernel(Full<V> src, State* st, uint64_t per_block,
                                 const uint32_t* offsets, uint32_t* out_idx, float* out_val) {
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const uint32_t threshold = st->prefix[kLevels], need = st->need[kLevels];
  const uint32_t base = st->out_n;
  uint32_t rank = offsets[blockIdx.x];
  if (rank >= need) return;
  const uint64_t lo = blockIdx.x * per_block, hi = min(src.n, lo + per_block);
  for (uint64_t t = lo; t < hi && rank < need; t += blockDim.x) {
    const uint64_t i = t + threadIdx.x;
    uint32_t j = 0;
    float v = 0.0f;
    uint32_t tie = 0;
    if (i < hi) {
      src.get(i, j, v);
      tie = key_of(v) == threshold;
    }
    uint32_t pos, total;
    Scan(temp).ExclusiveSum(tie, pos, total);
    __syncthreads();  // temp is reused by the next tile
    if (tie && rank + pos < need) {
      out_idx[base + rank + pos] = j;
      out_val[base + rank + pos] = v;
    }
    rank += total;
  }
}

/// Appends the first `need` entries of a (sorted) tie buffer to the winners.
__global__ void take_kernel(const State* st, const uint32_t* idx, const float* val,
                            uint32_t* out_idx, float* out_val) {
  const uint32_t need = st->need[kLevels], base = st->out_n;
  for (uint64_t i = thread_index(); i < need; i += grid_stride()) {
    out_idx[base + i] = idx[i];
    out_val[base + i] = val[i];
  }
}

/// Sort keys giving (|v| desc, index asc) under a descending sort.
__global__ void order_keys_kernel(const uint32_t* idx, const float* val, uint64_t n, uint64_t* keys,
                                  uint32_t* pos) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    keys[i] = (uint64_t(key_of(val[i])) << 32) | uint64_t(~idx[i]);
    pos[i] = uint32_t(i);
  }
}

__global__ void permute_kernel(const uint32_t* pos, const uint32_t* idx, const float* val,
                               uint64_t n, uint32_t* out_idx, float* out_val) {
  for (uint64_t i = thread_index(); i < n; i += grid_stride()) {
    out_idx[i] = idx[pos[i]];
    out_val[i] = val[pos[i]];
  }
}

/// Carves one workspace allocation into aligned pieces.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <class T>
  T* take(uint64_t count) {
    T* p = reinterpret_cast<T*>(base_ ? base_ + used_ : nullptr);
    used_ += (count * sizeof(T) + 255) / 256 * 256;
    return p;
  }
  uint64_t used() const { return used_; }

 private:
  char* base_;
  uint64_t used_ = 0;
};

}  // namespace sketchsgd::kernels::cuda::select
