// Top-k by magnitude on the GPU, host side: a radix select in the style of AIR top-k (SC'23).
// CCCL 3.0 has no cub::DeviceTopK, and a full sort of d values would read them ~8 times.
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
// order as the CPU kernels; or by index (what a sparse message carries), a radix sort over only the
// index bits n needs.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <sketchsgd/kernels/cuda.hpp>
#include "agent.cuh"

namespace sketchsgd::kernels::cuda::select {

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
  size_t d = 0;  // the winners by index, into the caller's arrays
  SKETCHSGD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, d, (const uint32_t*)nullptr,
                                                       (uint32_t*)nullptr, (const float*)nullptr,
                                                       (float*)nullptr, int64_t(k)));
  return std::max({a, b, c, d});
}

inline const State& read_state(const Buffers& b, Workspace& ws, Stream stream) {
  SKETCHSGD_CUDA_CHECK(
      cudaMemcpyAsync(ws.host(), b.st, sizeof(State), cudaMemcpyDeviceToHost, stream));
  SKETCHSGD_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *static_cast<const State*>(ws.host());
}

/// Bits an index below n needs (the index sort skips the rest).
inline int index_bits(uint64_t n) {
  int bits = 1;
  while (bits < 32 && (uint64_t(1) << bits) < n) ++bits;
  return bits;
}

/// Levels 0 … 2 after the level-0 histogram, the ties, and the final ordering.
template <class V>
void finish(const Full<V>& full, uint64_t k, uint32_t* idx, float* val, const Buffers& b,
            uint64_t cap, Workspace& ws, Stream stream, Order order) {
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

  if (order == Order::Index) {  // indices are distinct: the order is total
    size_t bytes = b.temp_bytes;
    SKETCHSGD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        b.temp, bytes, b.out_idx, idx, b.out_val, val, int64_t(k), 0, index_bits(n), stream));
    return;
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
          bool materialize, Order order);

/// The same with the values written first by fill(float* out, stream) (n floats of workspace):
/// for values a dedicated kernel computes faster than one at a time.
template <class Fill>
void topk_filled(Fill fill, uint64_t n, uint64_t k, uint32_t* idx, float* val, Workspace& ws,
                 Stream stream, Order order) {
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
  finish(full, k, idx, val, b, capacity(n, k), ws, stream, order);
}

template <class V>
void topk(V value, uint64_t n, uint64_t k, uint32_t* idx, float* val, Workspace& ws, Stream stream,
          bool materialize, Order order) {
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
    finish(Full<Values>{Values{store}, n}, k, idx, val, b, cap, ws, stream, order);
  else
    finish(full, k, idx, val, b, cap, ws, stream, order);
}

}  // namespace sketchsgd::kernels::cuda::select
