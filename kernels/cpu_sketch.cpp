// CPU count-sketch kernels. Accumulate parallelises over rows (each thread owns whole rows), so
// every row sees its additions in coordinate order: results are bit-identical for any thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include <sketchsgd/kernels/hash.hpp>
#include "detail/select.hpp"

namespace sketchsgd::kernels::cpu {
namespace {

constexpr size_t kBlock = 4096;

struct Hasher {
  const SketchLayout& s;
  hash::RowHash rows[elem::kMaxRows];  // random: bucket hashes; blocked: sign hashes
  hash::Blocked b{};
  uint64_t blocks = 0;  // per row (blocked)

  explicit Hasher(const SketchLayout& layout) : s(layout) {
    if (s.block) {
      b = hash::blocked_shape(s.block, s.cols);
      blocks = (s.dim + b.size() - 1) >> b.shift;
      for (uint32_t i = 0; i < s.rows; ++i) rows[i] = hash::sign_hash(s.seed, i);
    } else {
      for (uint32_t i = 0; i < s.rows; ++i) rows[i] = hash::row_hash(s.seed, i);
    }
  }
  bool blocked() const { return s.block != 0; }
  uint32_t word(uint32_t row, uint64_t block) const { return s.windows[row * blocks + block]; }
  uint32_t operator()(uint32_t row, uint64_t j) const {
    if (blocked())
      return hash::locate_blocked(word(row, j >> b.shift), rows[row], uint32_t(j), s.cols, b);
    return s.packed ? s.packed[row * s.dim + j] : hash::locate(rows[row], uint32_t(j), s.cols);
  }
};

bool block_finite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= uint32_t(!is_finite(x[i]));
  return bad == 0;
}

constexpr size_t kPrefetch =
    16;  // table lines touched ahead: the scatter/gather is L2/L3-latency bound

/// Packed hashes of coordinates lo … lo + n − 1 in one row: the precomputed table, or computed
/// into buf (a loop without dependencies that the compiler unrolls).
const uint32_t* row_hashes(const Hasher& h, uint32_t row, uint64_t lo, size_t n, uint32_t* buf) {
  if (h.blocked()) {
    for (size_t i = 0; i < n; ++i) buf[i] = h(row, lo + i);
    return buf;
  }
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

// ---- blocked windows --------------------------------------------------------------------------
// A block's positions [plo, phi) sit on contiguous columns but for the lane key, which swaps
// positions inside aligned groups of 4: column col + q of a run starting at an aligned position
// p holds position p + (q XOR key). The runs below move whole groups with the key fixed at
// compile time, so each becomes a vector load, a shuffle and a vector add or store.

// One 16-byte group as a GCC/Clang vector: elementwise IEEE adds, so the sums are the scalar ones.
using Float4 = float __attribute__((vector_size(16)));
inline Float4 load4(const float* p) {
  Float4 v;
  std::memcpy(&v, p, 16);
  return v;
}
inline void store4(float* p, Float4 v) {
  std::memcpy(p, &v, 16);
}
/// Lane l of the result is lane l XOR K of v.
template <int K>
inline Float4 permute(Float4 v) {
#if defined(__clang__)
  return __builtin_shufflevector(v, v, 0 ^ K, 1 ^ K, 2 ^ K, 3 ^ K);
#else
  using Int4 = int __attribute__((vector_size(16)));
  return __builtin_shuffle(v, Int4{0 ^ K, 1 ^ K, 2 ^ K, 3 ^ K});
#endif
}

using Uint4 = uint32_t __attribute__((vector_size(16)));

/// dst[q] += sign · scale · x[q XOR K] for a run of whole groups, where h0 = a·j + b (mod 2^32)
/// for the run's first coordinate j: the sign hash of j + i is h0 + i·a, so the signs of a
/// group are one vector add away from the last group's (hash::sign_bit, incrementally).
template <int K>
void add_signed_run(float* dst, const float* x, uint32_t n, uint32_t h0, uint32_t a, float scale) {
  Uint4 h = {h0, h0 + a, h0 + 2 * a, h0 + 3 * a};
  const Uint4 step = {4 * a, 4 * a, 4 * a, 4 * a};
  const Uint4 sign = {hash::kSignBit, hash::kSignBit, hash::kSignBit, hash::kSignBit};
  const Float4 sc = {scale, scale, scale, scale};
  for (size_t g = 0; g < n; g += 4) {
    Float4 v = load4(x + g) * sc;
    Uint4 bits;
    std::memcpy(&bits, &v, 16);
    bits ^= h & sign;
    std::memcpy(&v, &bits, 16);
    store4(dst + g, load4(dst + g) + permute<K>(v));
    h += step;
  }
}

template <int K>
void gather_run(float* dst, const float* src, uint32_t n) {
  for (size_t g = 0; g < n; g += 4) store4(dst + g, permute<K>(load4(src + g)));
}

template <template <int> class Op, class... A>
void with_key(uint32_t key, A... a) {
  switch (key) {
    case 0:
      return Op<0>::run(a...);
    case 1:
      return Op<1>::run(a...);
    case 2:
      return Op<2>::run(a...);
    default:
      return Op<3>::run(a...);
  }
}
template <int K>
struct AddRun {
  static void run(float* d, const float* x, uint32_t n, uint32_t h0, uint32_t a, float scale) {
    add_signed_run<K>(d, x, n, h0, a, scale);
  }
};
template <int K>
struct GatherRun {
  static void run(float* d, const float* s, uint32_t n) { gather_run<K>(d, s, n); }
};

/// Calls run(col, p, n) for the runs of whole groups among positions [plo, phi) of the window
/// (start, key) that fall in columns [c0, c1) (multiples of 4 when aligned), and one(col, p) for
/// every other position whose column is in [c0, c1).
template <class Run, class One>
void for_window(const hash::Blocked& b, uint32_t cols, uint32_t start, uint32_t key, uint32_t plo,
                uint32_t phi, uint32_t c0, uint32_t c1, Run&& run, One&& one) {
  auto single = [&](uint32_t p) {
    uint32_t col = start + (p ^ key);
    if (col >= cols) col -= cols;
    if (col >= c0 && col < c1) one(col, p);
  };
  if (!b.aligned || b.lanes != 3) {
    for (uint32_t p = plo; p < phi; ++p) single(p);
    return;
  }
  const uint32_t pa = std::min(phi, (plo + 3) & ~3u), pb = std::max(pa, phi & ~3u);
  for (uint32_t p = plo; p < pa; ++p) single(p);
  for (uint32_t p = pb; p < phi; ++p) single(p);
  if (pa >= pb) return;
  // Columns start + pa … start + pb − 1 wrap at cols at most once (B ≤ cols).
  auto piece = [&](uint64_t a, uint64_t e, uint64_t back) {
    const uint64_t lo = std::max<uint64_t>(a, c0), hi = std::min<uint64_t>(e, c1);
    if (lo < hi) run(uint32_t(lo), uint32_t(lo + back - start), uint32_t(hi - lo));
  };
  const uint64_t a = uint64_t(start) + pa, e = uint64_t(start) + pb;
  piece(a, std::min<uint64_t>(e, cols), 0);
  if (e > cols) piece(std::max<uint64_t>(a, cols) - cols, e - cols, cols);
}

/// Calls f(row's window word, first coordinate j, positions [plo, phi)) for the pieces of
/// coordinates [lo, lo + m) that lie in one block each.
template <class F>
void for_blocks(const Hasher& h, uint32_t row, uint64_t lo, size_t m, F&& f) {
  const uint64_t end = lo + m, mask = h.b.size() - 1;
  for (uint64_t j = lo; j < end;) {
    const uint64_t block = j >> h.b.shift;
    const uint64_t je = std::min<uint64_t>((block + 1) << h.b.shift, end);
    f(h.word(row, block), j, uint32_t(j & mask), uint32_t((j & mask) + (je - j)));
    j = je;
  }
}

/// Column bound i of `slices` equal parts of a row (multiples of 4 when windows are aligned, so
/// runs of whole groups never straddle two parts).
uint32_t slice_bound(uint32_t i, uint32_t slices, uint32_t cols, bool aligned) {
  if (i >= slices) return cols;
  const uint32_t c = uint32_t(uint64_t(cols) * i / slices);
  return aligned ? c & ~3u : c;
}

/// The accumulate driver both hashings share: `threads` threads walk x in chunks of kBlock;
/// every thread checks the same chunk for non-finite values (while it is hot in L1), so all stop
/// at the same place, then body(thread, threads, first, count) adds the chunk's share of that
/// thread. Returns the first coordinate of the chunk that held a non-finite value, or kNone.
template <class Body>
size_t in_chunks(int threads, const float* x, size_t n, Body&& body) {
  size_t stop = kNone;
#pragma omp parallel num_threads(threads)
  {
    const uint32_t t = uint32_t(omp_get_thread_num()), nt = uint32_t(omp_get_num_threads());
    size_t my_stop = kNone;
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t m = std::min(kBlock, n - b);
      if (!block_finite(x + b, m)) {
        my_stop = b;
        break;
      }
      body(t, nt, b, m);
    }
    if (t == 0) stop = my_stop;
  }
  return stop;
}

/// Blocked accumulate: every thread owns (row, column slice) units, so no two threads write one
/// cell and every cell gets its coordinates in block order whatever the thread count: the table
/// is bit-identical for any number of threads. Each block's piece is added to its window as runs
/// of contiguous columns, signing and scaling on the way (no pass over a buffer in between).
size_t accumulate_blocked(const Hasher& h, float* table, const float* x, size_t n, uint64_t offset,
                          float scale) {
  const SketchLayout& s = h.s;
  const uint32_t cols = s.cols;
  const int threads =
      int(std::min<size_t>(size_t(omp_get_max_threads()), std::max<size_t>(1, n / kBlock)));
  const uint32_t slices = s.rows % uint32_t(threads) == 0 ? 1 : uint32_t(threads);
  const uint32_t units = s.rows * slices;
  return in_chunks(threads, x, n, [&](uint32_t t, uint32_t nt, size_t b0, size_t m) {
    const uint64_t j0 = offset + b0;
    for (uint32_t u = t; u < units; u += nt) {
      const uint32_t row = u / slices, slice = u % slices;
      const uint32_t c0 = slice_bound(slice, slices, cols, h.b.aligned);
      const uint32_t c1 = slice_bound(slice + 1, slices, cols, h.b.aligned);
      float* tr = table + size_t(row) * cols;
      const hash::RowHash sh = h.rows[row];
      const uint32_t a = uint32_t(sh.a);
      for_blocks(h, row, j0, m, [&](uint32_t w, uint64_t j, uint32_t plo, uint32_t phi) {
        const float* src = x + (j - offset);  // position p is src[p − plo], coordinate j + p − plo
        const uint32_t key = w & h.b.lanes;
        for_window(
            h.b, cols, hash::window_start(w, cols, h.b.aligned), key, plo, phi, c0, c1,
            [&](uint32_t col, uint32_t p, uint32_t len) {
              const uint32_t jp = uint32_t(j + (p - plo));
              with_key<AddRun>(key, tr + col, src + (p - plo), len, hash::sign_word(sh, jp), a,
                               scale);
            },
            [&](uint32_t col, uint32_t p) {
              tr[col] += hash::apply_sign(hash::sign_bit(sh, uint32_t(j + (p - plo))),
                                          scale * src[p - plo]);
            });
      });
    }
  });
}

/// One row's signed values of coordinates lo … lo + m − 1 under blocked hashing, into dst.
void gather_blocked(const Hasher& h, uint32_t row, const float* tr, uint64_t lo, size_t m,
                    float* dst) {
  const uint32_t cols = h.s.cols;
  for_blocks(h, row, lo, m, [&](uint32_t w, uint64_t j, uint32_t plo, uint32_t phi) {
    float* out = dst + (j - lo);  // position p is out[p − plo]
    const uint32_t key = w & h.b.lanes;
    for_window(
        h.b, cols, hash::window_start(w, cols, h.b.aligned), key, plo, phi, 0, cols,
        [&](uint32_t col, uint32_t p, uint32_t len) {
          with_key<GatherRun>(key, out + (p - plo), tr + col, len);
        },
        [&](uint32_t col, uint32_t p) { out[p - plo] = tr[col]; });
  });
  // Signs incrementally: the sign hash of lo + q is a·q + (a·lo + b) (mod 2^32).
  const hash::RowHash sh = h.rows[row];
  const uint32_t a = uint32_t(sh.a), h0 = hash::sign_word(sh, uint32_t(lo));
  for (size_t q = 0; q < m; ++q)
    dst[q] = hash::apply_sign((h0 + a * uint32_t(q)) & hash::kSignBit, dst[q]);
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
    if (h.blocked()) {
      gather_blocked(h, i, t, lo, m, dst);
      continue;
    }
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

void precompute_windows(const SketchLayout& s, uint32_t* words) {
  const Hasher h(s);
  for (uint32_t i = 0; i < s.rows; ++i) {
    const hash::RowHash wh = hash::window_hash(s.seed, i);
    uint32_t* w = words + size_t(i) * h.blocks;
    for (uint64_t b = 0; b < h.blocks; ++b) w[b] = hash::window_word(wh, b);
  }
}

size_t order_words(const SketchLayout& s) {
  if (!order_fits(s.block, s.cols, s.order)) return 0;
  const auto shape = order_shape(s.dim, s.cols, hash::blocked_shape(s.block, s.cols), s.order);
  // More (tile, chunk) items than blocks: tiles too many for the gradient to fill them (a table
  // near the size of the gradient), where adding columns saves nothing.
  if (shape.items() > shape.blocks) return 0;
  return size_t(s.rows) * shape.per_row;
}

void order_windows(const SketchLayout& s, uint32_t* out) {
  const hash::Blocked b = hash::blocked_shape(s.block, s.cols);
  const OrderShape o = order_shape(s.dim, s.cols, b, s.order);
  // A counting sort per row by item (tile, chunk): stable, so a tile's blocks are in gradient
  // order and a chunk's of them a range.
  std::vector<uint32_t> key(o.blocks);
  for (uint32_t i = 0; i < s.rows; ++i) {
    const uint32_t* w = s.windows + size_t(i) * o.blocks;
    uint32_t* row = out + size_t(i) * o.per_row;
    uint32_t* first = row + o.blocks;
    std::fill(first, first + o.items() + 1, 0u);
    for (uint64_t blk = 0; blk < o.blocks; ++blk) {
      const uint32_t tile = hash::window_start(w[blk], s.cols, b.aligned) >> s.order.tile_shift;
      key[blk] = uint32_t(tile * o.chunks + (blk >> o.chunk_blocks));
      ++first[key[blk] + 1];
    }
    for (uint64_t k = 0; k < o.items(); ++k) first[k + 1] += first[k];
    std::vector<uint32_t> next(first, first + o.items());
    for (uint64_t blk = 0; blk < o.blocks; ++blk) row[next[key[blk]]++] = uint32_t(blk);
  }
}

size_t accumulate(const SketchLayout& s, float* table, const float* x, size_t n, uint64_t offset,
                  float scale) {
  const Hasher h(s);
  if (h.blocked()) return accumulate_blocked(h, table, x, n, offset, scale);
  const int threads = int(std::min<size_t>(
      {size_t(s.rows), size_t(omp_get_max_threads()), std::max<size_t>(1, n / kBlock)}));
  return in_chunks(threads, x, n, [&](uint32_t t, uint32_t nt, size_t b, size_t m) {
    for (uint32_t row = t; row < s.rows; row += nt)
      accumulate_row(h, row, table + size_t(row) * s.cols, x + b, m, offset + b, scale);
  });
}

void estimate(const SketchLayout& s, const float* table, const uint32_t* idx, size_t n,
              float* out) {
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

namespace {

/// Coordinates per column of a one-row blocked sketch: a full block covers a window of B
/// consecutive columns (mod cols), so the counts come from a difference array over the windows
/// (O(blocks + cols)), and only the last, partial block is walked coordinate by coordinate.
std::vector<uint32_t> column_counts(const Hasher& h) {
  const uint32_t cols = h.s.cols, B = h.b.size();
  const uint64_t full = h.s.dim >> h.b.shift;
  std::vector<uint32_t> n(cols + 1, 0);  // differences; unsigned wrap-around cancels out
  for (uint64_t b = 0; b < full; ++b) {
    const uint32_t start = hash::window_start(h.word(0, b), cols, h.b.aligned);
    const uint64_t end = uint64_t(start) + B;
    ++n[start];
    if (end <= cols) {
      --n[end];
    } else {
      --n[cols];
      ++n[0];
      --n[end - cols];
    }
  }
  for (uint32_t c = 1; c < cols; ++c) n[c] += n[c - 1];
  n.pop_back();
  if (const uint64_t tail = h.s.dim - (full << h.b.shift)) {
    const uint32_t w = h.word(0, full);
    for (uint32_t p = 0; p < tail; ++p) ++n[hash::window_column(w, p, cols, h.b)];
  }
  return n;
}

/// The largest key T with Σ count[c] over keys[c] ≥ T at least k (k ≤ Σ count), by a weighted
/// radix select over the columns (three passes of 10-11 bits); `above` gets Σ count over
/// keys > T.
uint32_t weighted_threshold(const std::vector<uint32_t>& keys, const std::vector<uint32_t>& count,
                            uint64_t k, uint64_t& above) {
  uint32_t prefix = 0, mask = 0;
  above = 0;
  for (const auto& [shift, bits] : {std::pair{21, 10}, {10, 11}, {0, 10}}) {
    const uint32_t digits = 1u << bits;
    std::vector<uint64_t> hist(digits, 0);
    for (size_t c = 0; c < keys.size(); ++c)
      if ((keys[c] & mask) == prefix) hist[(keys[c] >> shift) & (digits - 1)] += count[c];
    uint32_t d = digits - 1;
    while (above + hist[d] < k) above += hist[d--];  // stops: the totals reach k
    prefix |= d << shift;
    mask |= (digits - 1) << shift;
  }
  return prefix;
}

/// One row under blocked hashing: |estimate of j| is |table[column of j]|, so the k-th largest
/// magnitude is found over the columns, each weighted by its coordinates, and one pass in index
/// order collects those above it and the ties with the lowest indices. The same k as
/// select_topk, without estimating every coordinate; only groups of four whose columns hold a
/// key at or above the threshold are looked at closer.
void one_row_topk(const Hasher& h, const float* t, size_t k, uint32_t* idx, float* val,
                  Order order) {
  const uint32_t cols = h.s.cols, B = h.b.size();
  const uint64_t dim = h.s.dim, blocks = h.blocks;
  std::vector<uint32_t> keys(cols);
  for (uint32_t c = 0; c < cols; ++c) keys[c] = float_bits(t[c]) & 0x7FFFFFFFu;
  uint64_t above = 0;
  const uint32_t T = weighted_threshold(keys, column_counts(h), k, above);
  const uint64_t ties = k - above;  // ≥ 1 coordinates of key T, lowest indices first
  const hash::RowHash sh = h.rows[0];
  const bool groups = h.b.aligned && h.b.lanes == 3;

  const int threads = int(
      std::clamp<uint64_t>(dim / (16 * detail::kSelectBlock), 1, uint64_t(omp_get_max_threads())));
  // Per thread, in index order: every coordinate above T and at most `ties` of key T.
  std::vector<std::vector<detail::Candidate>> kept(threads);
#pragma omp parallel num_threads(threads)
  {
    const int th = omp_get_thread_num();
    auto& out = kept[th];
    uint64_t tied = 0;
    auto take = [&](uint64_t j, uint32_t col) {
      const uint32_t key = keys[col];
      if (key < T || (key == T && tied++ >= ties)) return;
      out.push_back(detail::Candidate::of(
          key, uint32_t(j), hash::apply_sign(hash::sign_bit(sh, uint32_t(j)), t[col])));
    };
    for (uint64_t b = blocks * th / threads, be = blocks * (th + 1) / threads; b < be; ++b) {
      const uint32_t w = h.word(0, b);
      const uint64_t j0 = b << h.b.shift;
      const uint32_t m = uint32_t(std::min<uint64_t>(B, dim - j0));
      const uint32_t start = hash::window_start(w, cols, h.b.aligned);
      if (!groups || m < B) {
        for (uint32_t p = 0; p < m; ++p) take(j0 + p, hash::window_column(w, p, cols, h.b));
        continue;
      }
      // Positions 4g … 4g + 3 sit on the four columns from start + 4g (mod cols, which 4
      // divides: a group never straddles the wrap), permuted by the lane key.
      const uint32_t key = w & 3;
#if defined(__SSE2__)
      const __m128i below = _mm_set1_epi32(int(T) - 1);  // keys ≤ 2^31 − 1: signed compare
#endif
      for (uint32_t g = 0; g < B; g += 4) {
        uint32_t c4 = start + g;
        if (c4 >= cols) c4 -= cols;
#if defined(__SSE2__)
        const __m128i k4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keys.data() + c4));
        if (T > 0 && _mm_movemask_epi8(_mm_cmpgt_epi32(k4, below)) == 0) continue;
#endif
        for (uint32_t q = 0; q < 4; ++q) take(j0 + g + q, c4 + (q ^ key));
      }
    }
  }
  // Threads hold consecutive index ranges: concatenate, giving the ties to the lowest indices.
  std::vector<detail::Candidate> all;
  all.reserve(k);
  uint64_t tied = 0;
  for (const auto& part : kept)
    for (const auto& c : part)
      if (c.key() > T || tied++ < ties) all.push_back(c);
  if (order == Order::Index) {
    for (size_t i = 0; i < all.size(); ++i) {
      idx[i] = all[i].idx();
      val[i] = all[i].val;
    }
  } else {
    detail::write_out(all, false, idx, val);
  }
}

}  // namespace

void estimate_topk(const SketchLayout& s, const float* table, size_t k, uint32_t* idx, float* val,
                   Order order) {
  if (k == 0) return;
  const Hasher h(s);
  if (s.rows == 1 && h.blocked()) return one_row_topk(h, table, k, idx, val, order);
  static_assert(detail::kSelectBlock <= kBlock);
  detail::select_topk(
      s.dim, k,
      [&](size_t lo, size_t hi, float* out) {
        estimate_range(h, table, lo, hi, out);
        return static_cast<const float*>(out);
      },
      idx, val, order == Order::Index);
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

void topk(const float* x, size_t n, size_t k, uint32_t* idx, float* val, Order order) {
  detail::select_topk(
      n, k, [x](size_t lo, size_t, float*) { return x + lo; }, idx, val, order == Order::Index);
}

void sort_pairs(uint32_t* idx, float* val, size_t n) {
  detail::sort_pairs(idx, val, n);
}

}  // namespace sketchsgd::kernels::cpu
