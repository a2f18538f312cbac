// Threshold top-k selection shared by topk() and estimate_topk(): each thread streams values in
// blocks, keeps candidates that beat its running k-th best, and prunes with nth_element whenever
// the buffer reaches 2k. O(n) work, O(k) memory per thread, and no full sort of n values.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../hd.hpp"

namespace sketchsgd::kernels::detail {

struct Candidate {
  uint32_t key;  // bits of |value|: for non-negative floats the integer order is the float order
  uint32_t idx;
  float val;
};

inline bool better(const Candidate& a, const Candidate& b) {
  return a.key != b.key ? a.key > b.key : a.idx < b.idx;
}

inline constexpr size_t kSelectBlock = 2048;

/// fill(lo, hi, out) writes the values of coordinates lo … hi − 1 into out.
template <class Fill>
void select_topk(size_t n, size_t k, const Fill& fill, uint32_t* out_idx, float* out_val) {
  if (k == 0 || n == 0) return;
  const int threads = int(std::clamp<size_t>(n / (16 * kSelectBlock), 1, size_t(omp_get_max_threads())));
  std::vector<std::vector<Candidate>> kept(threads);
  const size_t cap = 2 * k + kSelectBlock;

#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
    auto& buf = kept[t];
    buf.reserve(std::min(hi - lo, cap) + kSelectBlock);
    float block[kSelectBlock];
    Candidate worst{0, 0, 0.0f};
    bool pruned = false;
    for (size_t b = lo; b < hi; b += kSelectBlock) {
      const size_t m = std::min(kSelectBlock, hi - b);
      fill(b, b + m, block);
      for (size_t i = 0; i < m; ++i) {
        const Candidate c{float_bits(block[i]) & 0x7FFFFFFFu, uint32_t(b + i), block[i]};
        if (!pruned || better(c, worst)) buf.push_back(c);
      }
      if (buf.size() >= cap) {
        std::nth_element(buf.begin(), buf.begin() + (k - 1), buf.end(), better);
        buf.resize(k);
        worst = buf[k - 1];
        pruned = true;
      }
    }
  }

  std::vector<Candidate> all;
  size_t total = 0;
  for (auto& v : kept) total += v.size();
  all.reserve(total);
  for (auto& v : kept) all.insert(all.end(), v.begin(), v.end());
  const size_t take = std::min(k, all.size());
  std::nth_element(all.begin(), all.begin() + (take - 1), all.end(), better);
  all.resize(take);
  std::sort(all.begin(), all.end(), better);
  for (size_t i = 0; i < take; ++i) {
    out_idx[i] = all[i].idx;
    out_val[i] = all[i].val;
  }
}

}  // namespace sketchsgd::kernels::detail
