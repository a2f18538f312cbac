// CPU count-sketch kernels. Accumulate parallelises over rows (each thread owns whole rows), so
// every row sees its additions in coordinate order: results are bit-identical for any thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu.hpp"
#include "detail/select.hpp"
#include "elementwise.hpp"
#include "hash.hpp"

namespace sketchsgd::kernels::cpu {
namespace {

constexpr size_t kBlock = 4096;

struct Hasher {
  const SketchLayout& s;
  hash::RowHash rows[elem::kMaxRows];

  explicit Hasher(const SketchLayout& layout) : s(layout) {
    for (uint32_t i = 0; i < s.rows; ++i) rows[i] = hash::row_hash(s.seed, i);
  }
  uint32_t operator()(uint32_t row, uint64_t j) const {
    return s.packed ? s.packed[row * s.dim + j] : hash::locate(rows[row], uint32_t(j), s.cols);
  }
};

bool block_finite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= uint32_t(!is_finite(x[i]));
  return bad == 0;
}

constexpr size_t kPrefetch = 16;  // table lines touched ahead: the scatter/gather is L2/L3-latency bound

/// Packed hashes of coordinates lo … lo + n − 1 in one row: the precomputed table, or computed
/// into buf (a loop without dependencies that the compiler unrolls).
const uint32_t* row_hashes(const Hasher& h, uint32_t row, uint64_t lo, size_t n, uint32_t* buf) {
  if (h.s.packed) return h.s.packed + row * h.s.dim + lo;
  const hash::RowHash rh = h.rows[row];
  const uint32_t cols = h.s.cols;
  for (size_t i = 0; i < n; ++i) buf[i] = hash::locate(rh, uint32_t(lo + i), cols);
  return buf;
}

void accumulate_row(const Hasher& h, uint32_t row, float* t, const float* x, size_t n,
                    uint64_t offset, float scale) {
  uint32_t buf[kBlock];
  const uint32_t* p = row_hashes(h, row, offset, n, buf);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetch < n) __builtin_prefetch(t + hash::bucket_of(p[i + kPrefetch]), 1, 3);
    t[hash::bucket_of(p[i])] += hash::apply_sign(p[i], scale * x[i]);
  }
}

/// Estimates of coordinates lo … hi − 1 (hi − lo ≤ kBlock): row-major gathers, then medians.
void estimate_range(const Hasher& h, const float* table, uint64_t lo, uint64_t hi, float* out) {
  const size_t m = hi - lo;
  const uint32_t r = h.s.rows;
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(r) * kBlock);
  uint32_t buf[kBlock];
  for (uint32_t i = 0; i < r; ++i) {
    const float* t = table + size_t(i) * h.s.cols;
    float* dst = scratch.data() + size_t(i) * kBlock;
    const uint32_t* p = row_hashes(h, i, lo, m, buf);
    // Independent loads: out-of-order execution overlaps them; a prefetch here only costs.
    for (size_t q = 0; q < m; ++q) dst[q] = hash::apply_sign(p[q], t[hash::bucket_of(p[q])]);
  }
  // The same network as elem::median_inplace, applied row pair by row pair across the whole
  // block: each compare-exchange is a vectorised min/max over m coordinates.
  float* s = scratch.data();
  for (uint32_t i = 1; i < r; ++i)
    for (uint32_t j = i; j > 0; --j) {
      float* a = s + size_t(j - 1) * kBlock;
      float* b = s + size_t(j) * kBlock;
#pragma omp simd
      for (size_t q = 0; q < m; ++q) elem::compare_exchange(a[q], b[q]);
    }
  const float* low = s + size_t((r - 1) / 2) * kBlock;
  const float* high = s + size_t(r / 2) * kBlock;
  if (r & 1) {
    std::copy(high, high + m, out);
  } else {
#pragma omp simd
    for (size_t q = 0; q < m; ++q) out[q] = 0.5f * low[q] + 0.5f * high[q];
  }
}

}  // namespace

void precompute_hashes(const SketchLayout& s, uint32_t* packed) {
  for (uint32_t i = 0; i < s.rows; ++i) {
    const hash::RowHash rh = hash::row_hash(s.seed, i);
    uint32_t* p = packed + size_t(i) * s.dim;
#pragma omp parallel for schedule(static)
    for (uint64_t j = 0; j < s.dim; ++j) p[j] = hash::locate(rh, uint32_t(j), s.cols);
  }
}

size_t accumulate(const SketchLayout& s, float* table, const float* x, size_t n, uint64_t offset,
                  float scale) {
  const Hasher h(s);
  const int threads = int(std::min<size_t>({size_t(s.rows), size_t(omp_get_max_threads()),
                                            std::max<size_t>(1, n / kBlock)}));
  size_t stop = kNone;
#pragma omp parallel num_threads(threads)
  {
    const uint32_t t = uint32_t(omp_get_thread_num()), nt = uint32_t(omp_get_num_threads());
    size_t my_stop = kNone;
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t m = std::min(kBlock, n - b);
      // Checked while the block is hot in L1; every thread checks the same block, so all stop
      // at the same place and the rows stay consistent with each other.
      if (!block_finite(x + b, m)) {
        my_stop = b;
        break;
      }
      for (uint32_t row = t; row < s.rows; row += nt)
        accumulate_row(h, row, table + size_t(row) * s.cols, x + b, m, offset + b, scale);
    }
    if (t == 0) stop = my_stop;
  }
  return stop;
}

void estimate(const SketchLayout& s, const float* table, const uint32_t* idx, size_t n, float* out) {
  const Hasher h(s);
#pragma omp parallel for schedule(static) if (n > 4 * kBlock)
  for (size_t q = 0; q < n; ++q) {
    float v[elem::kMaxRows];
    for (uint32_t i = 0; i < s.rows; ++i) {
      const uint32_t p = h(i, idx[q]);
      v[i] = hash::apply_sign(p, table[size_t(i) * s.cols + hash::bucket_of(p)]);
    }
    out[q] = elem::median_inplace(v, int(s.rows));
  }
}

void zero_buckets(const SketchLayout& s, float* table, const uint32_t* idx, size_t n) {
  const Hasher h(s);
  for (uint32_t i = 0; i < s.rows; ++i)
    for (size_t q = 0; q < n; ++q) table[size_t(i) * s.cols + hash::bucket_of(h(i, idx[q]))] = 0.0f;
}

void estimate_all(const SketchLayout& s, const float* table, float* out) {
  const Hasher h(s);
  const size_t blocks = (s.dim + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const uint64_t lo = b * kBlock, hi = std::min<uint64_t>(s.dim, lo + kBlock);
    estimate_range(h, table, lo, hi, out + lo);
  }
}

void estimate_topk(const SketchLayout& s, const float* table, size_t k, uint32_t* idx, float* val) {
  const Hasher h(s);
  static_assert(detail::kSelectBlock <= kBlock);
  detail::select_topk(
      s.dim, k, [&](size_t lo, size_t hi, float* out) { estimate_range(h, table, lo, hi, out); },
      idx, val);
}

double l2_estimate(const SketchLayout& s, const float* table) {
  std::vector<float> sums(s.rows);
  for (uint32_t i = 0; i < s.rows; ++i) {
    const float* t = table + size_t(i) * s.cols;
    double acc = 0.0;
#pragma omp parallel for reduction(+ : acc) schedule(static) if (s.cols > 65536)
    for (uint32_t c = 0; c < s.cols; ++c) acc += double(t[c]) * double(t[c]);
    sums[i] = float(acc);
  }
  return std::sqrt(double(elem::median_inplace(sums.data(), int(s.rows))));
}

void topk(const float* x, size_t n, size_t k, uint32_t* idx, float* val) {
  detail::select_topk(
      n, k, [&](size_t lo, size_t hi, float* out) { std::copy(x + lo, x + hi, out); }, idx, val);
}

}  // namespace sketchsgd::kernels::cpu
