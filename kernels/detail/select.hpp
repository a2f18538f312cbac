// Threshold top-k selection shared by topk() and estimate_topk(): each thread streams values in
// blocks, keeps candidates that beat its running k-th best, and prunes with nth_element whenever
// the buffer reaches 2k. O(n) work, O(k) memory per thread, and no full sort of n values.
#pragma once

#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <sketchsgd/core/hd.hpp>

namespace sketchsgd::kernels::detail {

/// A value and its coordinate, ordered by one integer: |value| descending, then index ascending.
struct Candidate {
  uint64_t rank;  // (0x7FFFFFFF − bits of |value|) << 32 | index: smaller is better
  float val;

  static Candidate of(uint32_t key, uint32_t idx, float val) {
    return {(uint64_t(0x7FFFFFFFu - key) << 32) | idx, val};
  }
  uint32_t key() const { return 0x7FFFFFFFu - uint32_t(rank >> 32); }
  uint32_t idx() const { return uint32_t(rank); }
};

inline bool better(const Candidate& a, const Candidate& b) {
  return a.rank < b.rank;
}

inline constexpr size_t kSelectBlock = 2048;

/// Sorts v by key(element), a 64-bit integer, ascending: LSD radix sort, 8 bits a pass, skipping
/// passes where every element has the same digit (stable). For 10^4 or more elements (the k
/// results) it is several times faster than a comparison sort.
template <class T, class Key>
void radix_sort(std::vector<T>& v, Key key) {
  if (v.size() < 256)
    return std::sort(v.begin(), v.end(), [&](const T& a, const T& b) { return key(a) < key(b); });
  std::vector<T> tmp(v.size());
  for (int shift = 0; shift < 64; shift += 8) {
    size_t count[257] = {};
    for (const T& c : v) ++count[((key(c) >> shift) & 0xFF) + 1];
    if (std::any_of(count + 1, count + 257, [&](size_t n) { return n == v.size(); })) continue;
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (const T& c : v) tmp[count[(key(c) >> shift) & 0xFF]++] = c;
    v.swap(tmp);
  }
}

/// Sorts candidates by rank (best first).
inline void sort_by_rank(std::vector<Candidate>& v) {
  radix_sort(v, [](const Candidate& c) { return c.rank; });
}

/// Sorts n (index, value) pairs by index, equal indices by the value's bits, so the order never
/// depends on the input's; returns at once when the indices already increase.
inline void sort_pairs(uint32_t* idx, float* val, size_t n) {
  if (std::is_sorted(idx, idx + n, std::less_equal<uint32_t>())) return;
  std::vector<uint64_t> pairs(n);
  for (size_t i = 0; i < n; ++i) pairs[i] = (uint64_t(idx[i]) << 32) | float_bits(val[i]);
  radix_sort(pairs, [](uint64_t p) { return p; });
  for (size_t i = 0; i < n; ++i) {
    idx[i] = uint32_t(pairs[i] >> 32);
    val[i] = bits_float(uint32_t(pairs[i]));
  }
}

/// Candidates (best first) into idx/val, ordered by rank or by index.
inline void write_out(std::vector<Candidate>& all, bool by_index, uint32_t* idx, float* val) {
  if (by_index)
    radix_sort(all, [](const Candidate& c) { return uint64_t(c.idx()); });
  else
    sort_by_rank(all);
  for (size_t i = 0; i < all.size(); ++i) {
    idx[i] = all[i].idx();
    val[i] = all[i].val;
  }
}

/// A key that at least k of the n values are likely to reach, from evenly spread sample blocks
/// (0 when n is too small to sample): the stream then starts with it, so few values enter the
/// buffer and it is rarely pruned; for large k (1 % of n) pruning otherwise dominates.
template <class Fill>
uint32_t sampled_threshold(size_t n, size_t k, const Fill& fill) {
  constexpr size_t kBlocks = 32;
  if (n < 8 * kBlocks * kSelectBlock) return 0;
  std::vector<uint32_t> keys(kBlocks * kSelectBlock);
  float scratch[kSelectBlock];
  for (size_t b = 0; b < kBlocks; ++b) {
    const size_t lo = (n - kSelectBlock) * b / (kBlocks - 1);
    const float* block = fill(lo, lo + kSelectBlock, scratch);
    for (size_t i = 0; i < kSelectBlock; ++i)
      keys[b * kSelectBlock + i] = float_bits(block[i]) & 0x7FFFFFFFu;
  }
  // The sample rank of the k-th largest, plus a margin of four standard deviations.
  const double expect = double(k) * double(keys.size()) / double(n);
  const size_t rank = size_t(expect + 4.0 * std::sqrt(expect) + 16.0);
  if (rank >= keys.size()) return 0;
  std::nth_element(keys.begin(), keys.begin() + rank, keys.end(), std::greater<uint32_t>());
  return keys[rank];
}

/// fill(lo, hi, scratch) returns the values of coordinates lo … hi − 1: where they already lie in
/// memory (a plain vector: no copy), or written into scratch (kSelectBlock floats) and scratch.
template <class Fill>
void select_topk(size_t n, size_t k, const Fill& fill, uint32_t* out_idx, float* out_val,
                 bool by_index = false, uint32_t start = ~0u) {
  if (k == 0 || n == 0) return;
  if (start == ~0u) start = sampled_threshold(n, k, fill);
  const int threads =
      int(std::clamp<size_t>(n / (16 * kSelectBlock), 1, size_t(omp_get_max_threads())));
  std::vector<std::vector<Candidate>> kept(threads);
  const size_t cap = 2 * k + kSelectBlock;

#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
    // Candidates are appended without a branch: every value is written at the end of the buffer
    // and the end advances only when its key reaches the threshold (a data-dependent branch here
    // mispredicts on most of the values that pass while the threshold is still low).
    std::unique_ptr<Candidate[]> buf(new Candidate[cap + kSelectBlock]);
    size_t used = 0;
    float scratch[kSelectBlock];
    uint32_t keys[kSelectBlock];
    Candidate worst = Candidate::of(0, 0, 0.0f);
    uint32_t threshold = start;  // keys below it cannot enter the top k
    bool pruned = false;
    for (size_t b = lo; b < hi; b += kSelectBlock) {
      const size_t m = std::min(kSelectBlock, hi - b);
      const float* block = fill(b, b + m, scratch);
#pragma omp simd
      for (size_t i = 0; i < m; ++i) keys[i] = float_bits(block[i]) & 0x7FFFFFFFu;
      if (threshold == 0) {
        for (size_t i = 0; i < m; ++i) {
          buf[used] = Candidate::of(keys[i], uint32_t(b + i), block[i]);
          used += keys[i] >= threshold;
        }
      } else {  // few pass a real threshold: test four keys at once, skip groups where none does
        size_t i = 0;
#if defined(__SSE2__)
        const __m128i below =
            _mm_set1_epi32(int(threshold - 1));  // keys ≤ 2^31 − 1: signed is fine
        for (; i + 4 <= m; i += 4) {
          const __m128i k4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keys + i));
          if (_mm_movemask_epi8(_mm_cmpgt_epi32(k4, below)) == 0) continue;
          for (size_t j = i; j < i + 4; ++j)
            if (keys[j] >= threshold)
              buf[used++] = Candidate::of(keys[j], uint32_t(b + j), block[j]);
        }
#endif
        for (; i < m; ++i)
          if (keys[i] >= threshold) buf[used++] = Candidate::of(keys[i], uint32_t(b + i), block[i]);
      }
      if (used >= cap) {
        // Ties with the threshold passed the cheap test; drop those worse than worst (worst
        // itself stays: it is one of the k kept last time).
        if (pruned)
          used = size_t(std::remove_if(buf.get(), buf.get() + used,
                                       [&](const Candidate& c) { return better(worst, c); }) -
                        buf.get());
        if (used >= cap) {
          std::nth_element(buf.get(), buf.get() + (k - 1), buf.get() + used, better);
          used = k;
          worst = buf[k - 1];
          threshold = worst.key();
          pruned = true;
        }
      }
    }
    kept[t].assign(buf.get(), buf.get() + used);
  }

  std::vector<Candidate> all;
  size_t total = 0;
  for (auto& v : kept) total += v.size();
  // Fewer than k reached the sampled start: the sample misled it; select again from 0.
  if (start > 0 && total < std::min(k, n))
    return select_topk(n, k, fill, out_idx, out_val, by_index, 0);
  all.reserve(total);
  for (auto& v : kept) all.insert(all.end(), v.begin(), v.end());
  const size_t take = std::min(k, all.size());
  std::nth_element(all.begin(), all.begin() + (take - 1), all.end(), better);
  all.resize(take);
  write_out(all, by_index, out_idx, out_val);
}

}  // namespace sketchsgd::kernels::detail
