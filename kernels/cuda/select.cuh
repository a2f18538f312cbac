// Top-k by magnitude on the GPU: a radix select in the style of AIR top-k (SC'23). CCCL 3.0 has no
// cub::DeviceTopK, and a full sort of d values would read them ~8 times.
//
// Keys are the bits of |v| (sign cleared: non-negative floats order like unsigned integers),
// selected 11 + 11 + 9 bits at a time. Level 0 histograms the top digit of every value and picks
// the bucket holding the k-th largest; one more pass writes the values of higher buckets to the
// output, compacts that bucket's values into a candidate buffer and histograms their next digit.
// Later levels read only the candidates, so the input is read twice. Values that are expensive
// to compute (count-sketch estimates: r gathers and a median each) are computed once: the
// histogram pass stores them and the second pass reads them back. When the candidates overflow
// their buffer (heavy ties, say a mostly zero vector) a level re-reads the input instead, filtered
// by the key prefix fixed so far. After the last level the threshold key is exact; ties at it are
// broken by smallest index (sorting the tie buffer, or an order-preserving block scan over the
// input when it overflowed), and the k winners are sorted by (|v| desc, index asc): the same total
// order as the CPU kernels.
#pragma once

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "../cuda.hpp"
#include "launch.cuh"

namespace sketchsgd::kernels::cuda::select {

inline constexpr int kLevels = 3;
inline constexpr int kBins = 2048;
__host__ __device__ constexpr int shift_of(int level) {
  return level == 0 ? 20 : (level == 1 ? 9 : 0);
}
__host__ __device__ constexpr uint32_t digits_of(int level) {
  return level == 2 ? 0x1FFu : 0x7FFu;
}

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

inline constexpr int kPer = 8;  // elements per thread per tile

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

inline constexpr unsigned kTieBlocks = 1024;

struct Buffers {
  State* st;
  uint32_t* hist;  // kLevels × kBins
  uint32_t *out_idx, *buf_idx[2], *pos[2], *counts, *offsets;
  float *out_val, *buf_val[2];
  uint64_t* keys[2];
  void* temp;
  size_t temp_bytes;
};

/// Candidate buffer capacity: about 3 % of the input (level 0 keeps ~1/100 of typical data).
inline uint64_t capacity(uint64_t n, uint64_t k) {
  return std::min<uint64_t>(n, std::max<uint64_t>({n / 32, k, uint64_t(1) << 16}));
}

inline Buffers carve(char* base, uint64_t n, uint64_t k, size_t temp_bytes, uint64_t& total) {
  const uint64_t cap = capacity(n, k);
  Carver c(base);
  Buffers b;
  b.st = c.take<State>(1);
  b.hist = c.take<uint32_t>(kLevels * kBins);
  b.out_idx = c.take<uint32_t>(k);
  b.out_val = c.take<float>(k);
  for (int q = 0; q < 2; ++q) {
    b.buf_idx[q] = c.take<uint32_t>(cap);
    b.buf_val[q] = c.take<float>(cap);
    b.keys[q] = c.take<uint64_t>(k);
    b.pos[q] = c.take<uint32_t>(k);
  }
  b.counts = c.take<uint32_t>(kTieBlocks);
  b.offsets = c.take<uint32_t>(kTieBlocks);
  b.temp = c.take<char>(temp_bytes);
  b.temp_bytes = temp_bytes;
  total = c.used();
  return b;
}

inline size_t temp_bytes(uint64_t n, uint64_t k) {
  const uint64_t cap = capacity(n, k);
  size_t a = 0, b = 0, c = 0;
  cub::DoubleBuffer<uint32_t> ki(nullptr, nullptr);
  cub::DoubleBuffer<float> vf(nullptr, nullptr);
  cub::DoubleBuffer<uint64_t> k64(nullptr, nullptr);
  cub::DoubleBuffer<uint32_t> p32(nullptr, nullptr);
  SKETCHSGD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, a, ki, vf, int64_t(cap)));
  SKETCHSGD_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, b, k64, p32, int64_t(k)));
  SKETCHSGD_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, c, (uint32_t*)nullptr,
                                                     (uint32_t*)nullptr, int(kTieBlocks)));
  return std::max({a, b, c});
}

inline const State& read_state(const Buffers& b, Workspace& ws, Stream stream) {
  SKETCHSGD_CUDA_CHECK(
      cudaMemcpyAsync(ws.host(), b.st, sizeof(State), cudaMemcpyDeviceToHost, stream));
  SKETCHSGD_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *static_cast<const State*>(ws.host());
}

/// Levels 0 … 2 after the level-0 histogram, the ties, and the final ordering.
template <class V>
void finish(const Full<V>& full, uint64_t k, uint32_t* idx, float* val, const Buffers& b,
            uint64_t cap, Workspace& ws, Stream stream) {
  const uint64_t n = full.n;
  choose_kernel<1024><<<1, 1024, 0, stream>>>(b.st, b.hist, 0);
  SKETCHSGD_LAUNCH_CHECK();
  uint64_t src_n = n;  // values in the current source (n: the full input)
  bool from_full = true;
  int in = 0;  // buffer read at the current level when !from_full
  for (int level = 0; level < kLevels; ++level) {
    const int outb = from_full ? 0 : 1 - in;
    uint32_t* next_hist = level + 1 < kLevels ? b.hist + (level + 1) * kBins : nullptr;
    uint32_t* cand_n = b.st->buf_n + outb;
    SKETCHSGD_CUDA_CHECK(cudaMemsetAsync(cand_n, 0, sizeof(uint32_t), stream));
    if (from_full) {
      filter_kernel<<<grid_for(n, kPer), kThreads, 0, stream>>>(
          full, b.st, level, b.out_idx, b.out_val, next_hist, b.buf_idx[outb], b.buf_val[outb],
          cand_n, cap);
    } else {
      const Buffer src{b.buf_idx[in], b.buf_val[in], src_n};
      filter_kernel<<<grid_for(src_n, kPer), kThreads, 0, stream>>>(
          src, b.st, level, b.out_idx, b.out_val, next_hist, b.buf_idx[outb], b.buf_val[outb],
          cand_n, cap);
    }
    SKETCHSGD_LAUNCH_CHECK();
    if (level + 1 < kLevels) {
      choose_kernel<1024><<<1, 1024, 0, stream>>>(b.st, next_hist, level + 1);
      SKETCHSGD_LAUNCH_CHECK();
    }
    const State& s = read_state(b, ws, stream);
    if (s.out_n == k) break;  // every winner found (ties included)
    const uint64_t appended = s.buf_n[outb];
    if (level + 1 == kLevels) {
      // Ties at the exact threshold key; need[kLevels] of them, smallest indices first.
      if (appended <= cap) {
        cub::DoubleBuffer<uint32_t> keys(b.buf_idx[outb], b.buf_idx[1 - outb]);
        cub::DoubleBuffer<float> vals(b.buf_val[outb], b.buf_val[1 - outb]);
        size_t bytes = b.temp_bytes;
        SKETCHSGD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(b.temp, bytes, keys, vals,
                                                             int64_t(appended), 0, 32, stream));
        take_kernel<<<grid_for(s.need[kLevels]), kThreads, 0, stream>>>(
            b.st, keys.Current(), vals.Current(), b.out_idx, b.out_val);
      } else {
        const uint64_t per_block = (n + kTieBlocks - 1) / kTieBlocks;
        tie_count_kernel<<<kTieBlocks, kThreads, 0, stream>>>(full, b.st, per_block, b.counts);
        SKETCHSGD_LAUNCH_CHECK();
        size_t bytes = b.temp_bytes;
        SKETCHSGD_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(b.temp, bytes, b.counts, b.offsets,
                                                           int(kTieBlocks), stream));
        tie_write_kernel<<<kTieBlocks, kThreads, 0, stream>>>(full, b.st, per_block, b.offsets,
                                                              b.out_idx, b.out_val);
      }
      SKETCHSGD_LAUNCH_CHECK();
      break;
    }
    from_full = appended > cap;
    in = outb;
    src_n = from_full ? n : appended;
  }

  // The k winners in the total order (|v| desc, index asc).
  order_keys_kernel<<<grid_for(k), kThreads, 0, stream>>>(b.out_idx, b.out_val, k, b.keys[0],
                                                          b.pos[0]);
  SKETCHSGD_LAUNCH_CHECK();
  cub::DoubleBuffer<uint64_t> keys(b.keys[0], b.keys[1]);
  cub::DoubleBuffer<uint32_t> pos(b.pos[0], b.pos[1]);
  size_t bytes = b.temp_bytes;
  SKETCHSGD_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(b.temp, bytes, keys, pos,
                                                                 int64_t(k), 0, 63, stream));
  permute_kernel<<<grid_for(k), kThreads, 0, stream>>>(pos.Current(), b.out_idx, b.out_val, k, idx,
                                                       val);
  SKETCHSGD_LAUNCH_CHECK();
}

/// The k largest |value(j)| over j < n, ordered; idx/val are the caller's device arrays. With
/// materialize, values are computed once into workspace (n floats) instead of once per pass
/// over the input: worth it when a value costs more than reading 8 bytes.
template <class V>
void topk(V value, uint64_t n, uint64_t k, uint32_t* idx, float* val, Workspace& ws, Stream stream,
          bool materialize);

/// The same with the values written first by fill(float* out, stream) (n floats of workspace):
/// for values a dedicated kernel computes faster than one at a time.
template <class Fill>
void topk_filled(Fill fill, uint64_t n, uint64_t k, uint32_t* idx, float* val, Workspace& ws,
                 Stream stream) {
  if (k == 0 || n == 0) return;
  const size_t tb = temp_bytes(n, k);
  uint64_t total = 0;
  carve(nullptr, n, k, tb, total);
  char* base = static_cast<char*>(ws.get(total + (n * sizeof(float) + 255) / 256 * 256, stream));
  const Buffers b = carve(base, n, k, tb, total);
  float* store = reinterpret_cast<float*>(base + total);
  fill(store, stream);
  State init{};
  init.need[0] = uint32_t(k);
  SKETCHSGD_CUDA_CHECK(cudaMemcpyAsync(b.st, &init, sizeof(State), cudaMemcpyHostToDevice, stream));
  SKETCHSGD_CUDA_CHECK(cudaMemsetAsync(b.hist, 0, kLevels * kBins * sizeof(uint32_t), stream));
  const Full<Values> full{Values{store}, n};
  histogram_kernel<<<grid_for(n, kPer), kThreads, 0, stream>>>(full, b.hist, nullptr);
  SKETCHSGD_LAUNCH_CHECK();
  finish(full, k, idx, val, b, capacity(n, k), ws, stream);
}

template <class V>
void topk(V value, uint64_t n, uint64_t k, uint32_t* idx, float* val, Workspace& ws, Stream stream,
          bool materialize) {
  if (k == 0 || n == 0) return;
  const size_t tb = temp_bytes(n, k);
  uint64_t total = 0;
  carve(nullptr, n, k, tb, total);
  const uint64_t extra = materialize ? (n * sizeof(float) + 255) / 256 * 256 : 0;
  char* base = static_cast<char*>(ws.get(total + extra, stream));
  const Buffers b = carve(base, n, k, tb, total);
  float* store = materialize ? reinterpret_cast<float*>(base + total) : nullptr;
  const uint64_t cap = capacity(n, k);

  State init{};
  init.need[0] = uint32_t(k);
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so init may go.
  SKETCHSGD_CUDA_CHECK(cudaMemcpyAsync(b.st, &init, sizeof(State), cudaMemcpyHostToDevice, stream));
  SKETCHSGD_CUDA_CHECK(cudaMemsetAsync(b.hist, 0, kLevels * kBins * sizeof(uint32_t), stream));
  const Full<V> full{value, n};
  histogram_kernel<<<grid_for(n, kPer), kThreads, 0, stream>>>(full, b.hist, store);
  SKETCHSGD_LAUNCH_CHECK();
  if (materialize)
    finish(Full<Values>{Values{store}, n}, k, idx, val, b, cap, ws, stream);
  else
    finish(full, k, idx, val, b, cap, ws, stream);
}

}  // namespace sketchsgd::kernels::cuda::select
