// Low-rank passes on the CPU (PowerSGD's products), each one streaming pass over the matrix.
// OpenBLAS's sgemm packs the big operand into panels first: for a rank-r product that copy costs
// as much as the product itself, and the error feedback around it (M = g + e before,
// e = M − P·Qᵀ after) took two more passes. Here the error feedback rides on the first and last
// products: a round reads g and M and writes M (absorb), reads M (answer), reads M and writes M
// and the step (expand); or, with the subtraction deferred to the next absorb (which reads M
// anyway), only writes the step.
//
// Two kinds of loops. Ranks up to 4 (narrow): the factors transposed, a row of M against all of
// them in one vector loop; the pass is bound by memory. Past 4 (wide): register tiles like a
// GEMM micro-kernel, twelve vector accumulators of the output held over the whole reduction, so
// that each loaded vector feeds three to twelve multiply-adds and the loops run at the FMA
// units' rate rather than the loads' (one-accumulator loops reached a third of it, and OpenBLAS
// half: BM_LowRank).
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "detail/wide.hpp"

namespace sketchsgd::kernels::cpu {
namespace {

constexpr size_t kParallel = 1 << 16;

// ---- eight floats: GCC vector extensions, so that the baseline clone of a SKETCHSGD_WIDE
// function compiles the same code to SSE pairs and the AVX2 clone to ymm registers.
typedef float v8 __attribute__((vector_size(32), aligned(4)));
#define SKETCHSGD_INLINE [[gnu::always_inline]] inline  // into each clone, not called across

typedef int i8 __attribute__((vector_size(32)));
SKETCHSGD_INLINE v8 splat(float x) {  // a shuffle: GCC builds {x, x, ...} lane by lane
  return __builtin_shuffle(v8{x}, i8{});
}
SKETCHSGD_INLINE v8 load(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
SKETCHSGD_INLINE void store(float* p, v8 v) {
  std::memcpy(p, &v, sizeof v);
}
/// p[0, 8) = v by streaming stores (p 16-byte aligned): the lines written past the caches, not
/// fetched first. Ordered for other threads by the sfence after the pass (stream_fence()).
SKETCHSGD_INLINE void stream(float* p, v8 v) {
#if defined(__x86_64__)
  __m128 lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  _mm_stream_ps(p, lo);
  _mm_stream_ps(p + 4, hi);
#else
  store(p, v);
#endif
}
inline void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}
SKETCHSGD_INLINE float hsum(v8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/// f.template operator()<R, K>() for the R ≤ MaxR, K ≤ MaxK given at run time (1 ≤ r, 1 ≤ k):
/// the blocked loops' edge blocks, each its own unrolled instance.
template <int MaxR, int MaxK, class F>
SKETCHSGD_INLINE void blocked(size_t r, size_t k, F&& f) {
  if constexpr (MaxR > 1)
    if (r < MaxR) return blocked<MaxR - 1, MaxK>(r, k, f);
  if constexpr (MaxK > 1)
    if (k < MaxK) return blocked<MaxR, MaxK - 1>(r, k, f);
  f.template operator()<MaxR, MaxK>();
}

/// a where ok, else b, without a branch (a blend in a vector loop; a conditional store is not
/// vectorised).
SKETCHSGD_INLINE float pick(bool ok, float a, float b) {
  const uint32_t k = 0u - uint32_t(ok);
  return bits_float((float_bits(a) & k) | (float_bits(b) & ~k));
}

/// x = g, or u = ρ·u + g and x = u when u is given; m += x (n floats), except where g is NaN or
/// ±Inf: there m and u stay as they were. Whether any was (the finiteness check of the gradient
/// rides on this pass instead of one of its own).
SKETCHSGD_INLINE bool add_in(float* __restrict m, const float* __restrict g, float* __restrict u,
                             float rho, size_t n) {
  uint32_t bad = 0;
  if (u != nullptr) {
#pragma omp simd reduction(| : bad)
    for (size_t j = 0; j < n; ++j) {
      const bool ok = is_finite(g[j]);
      bad |= uint32_t(!ok);
      const float v = rho * u[j] + g[j];
      u[j] = pick(ok, v, u[j]);
    }
#pragma omp simd
    for (size_t j = 0; j < n; ++j) {
      const bool ok = is_finite(g[j]);
      const float v = u[j] + m[j];
      m[j] = pick(ok, v, m[j]);
    }
    return bad != 0;
  }
#pragma omp simd reduction(| : bad)
  for (size_t j = 0; j < n; ++j) {
    const bool ok = is_finite(g[j]);
    bad |= uint32_t(!ok);
    m[j] = pick(ok, g[j] + m[j], m[j]);
  }
  return bad != 0;
}

/// p[i·ldp + f] = Σ_{j<cols} m[i·ldm + j]·q[j·ldq + f] for R rows i and 8·J factors f: the R × 8J
/// tile of p in registers over the whole row, a loaded vector of q feeds R multiply-adds.
template <int R, int J>
SKETCHSGD_INLINE void row_tile(const float* __restrict m, size_t ldm, size_t cols,
                               const float* __restrict q, size_t ldq, float* __restrict p,
                               size_t ldp) {
  v8 acc[R][J] = {};
  for (size_t j = 0; j < cols; ++j) {
    v8 y[J];
#pragma GCC unroll 4
    for (int t = 0; t < J; ++t) y[t] = load(q + j * ldq + 8 * t);
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      const v8 x = splat(m[i * ldm + j]);
#pragma GCC unroll 4
      for (int t = 0; t < J; ++t) acc[i][t] += x * y[t];
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int t = 0; t < J; ++t) store(p + i * ldp + 8 * t, acc[i][t]);
}

/// f.template operator()<R, J>() for R = min(n, 12 / J): as many rows as leave twelve
/// accumulators.
template <int J, int R = (J == 1 ? 8 : 12 / J), class F>
SKETCHSGD_INLINE void with_rows(size_t n, F&& f) {
  if constexpr (R > 1)
    if (n < size_t(R)) return with_rows<J, R - 1>(n, f);
  f.template operator()<R, J>();
}

/// g.template operator()<N>() for the N = n (1 to 4; past 4: 4) known at run time: vectors of
/// factors in a tile, or a rank up to 4.
template <class G>
SKETCHSGD_INLINE void with_vectors(size_t n, G&& g) {
  switch (n) {
    case 1:
      g.template operator()<1>();
      break;
    case 2:
      g.template operator()<2>();
      break;
    case 3:
      g.template operator()<3>();
      break;
    default:
      g.template operator()<4>();
      break;
  }
}

/// q[j·ldq + f] += Σ_{i<rows} m[i·ldm + j]·p[i·ldp + f] for C columns j and 8·J factors f: the
/// C × 8J tile of q in registers over all the rows, a loaded vector of p feeds C multiply-adds.
template <int C, int J>
SKETCHSGD_INLINE void column_tile(const float* __restrict m, size_t ldm, size_t rows,
                                  const float* __restrict p, size_t ldp, float* __restrict q,
                                  size_t ldq) {
  v8 acc[C][J];
#pragma GCC unroll 12
  for (int c = 0; c < C; ++c)
#pragma GCC unroll 4
    for (int t = 0; t < J; ++t) acc[c][t] = load(q + c * ldq + 8 * t);
  for (size_t i = 0; i < rows; ++i) {
    v8 y[J];
#pragma GCC unroll 4
    for (int t = 0; t < J; ++t) y[t] = load(p + i * ldp + 8 * t);
#pragma GCC unroll 12
    for (int c = 0; c < C; ++c) {
      const v8 x = splat(m[i * ldm + c]);
#pragma GCC unroll 4
      for (int t = 0; t < J; ++t) acc[c][t] += x * y[t];
    }
  }
#pragma GCC unroll 12
  for (int c = 0; c < C; ++c)
#pragma GCC unroll 4
    for (int t = 0; t < J; ++t) store(q + c * ldq + 8 * t, acc[c][t]);
}

/// c[i·ldc + j] = Σ_k a[i·r + k]·bt[k·ld + j] for R rows and 8·J columns, the tile held in
/// registers over all r factors; m −= c as well when m is given (then c may be null).
template <int R, int J>
SKETCHSGD_INLINE void tile(const float* __restrict a, size_t r, const float* __restrict bt,
                           size_t ld, float* __restrict c, size_t ldc, float* __restrict m) {
  v8 acc[R][J] = {};
  for (size_t k = 0; k < r; ++k) {
    v8 y[J];
#pragma GCC unroll 4
    for (int t = 0; t < J; ++t) y[t] = load(bt + k * ld + 8 * t);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const v8 x = splat(a[i * r + k]);
#pragma GCC unroll 4
      for (int t = 0; t < J; ++t) acc[i][t] += x * y[t];
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int t = 0; t < J; ++t) {
      if (c != nullptr) store(c + i * ldc + 8 * t, acc[i][t]);
      if (m != nullptr) store(m + i * ldc + 8 * t, load(m + i * ldc + 8 * t) - acc[i][t]);
    }
}

/// Row stride of a transposed factor: past cols by a cache line, so that its rows, the matrix's
/// rows and the output's (all 4 KB apart when cols is 1024) do not fall into one L1 set.
size_t stride(size_t cols) {
  return (cols + 15) / 16 * 16 + 16;
}

/// The cols × r row-major matrix b as r rows of cols, stride(cols) apart (each factor column
/// contiguous), then zero rows up to `padded`.
std::vector<float> transposed(const float* b, size_t cols, size_t r, size_t padded = 0) {
  const size_t ld = stride(cols);
  std::vector<float> t(ld * std::max(r, padded), 0.0f);
  for (size_t j = 0; j < cols; ++j)
    for (size_t k = 0; k < r; ++k) t[k * ld + j] = b[j * r + k];
  return t;
}

int threads_for(size_t work) {
  return work > kParallel ? std::max(1, omp_get_max_threads()) : 1;
}

/// Columns per strip: the matrix is walked strip by strip (rows within a strip), so that the
/// r × w block of a transposed factor every row of the strip reads stays in cache. Whole rows
/// while that block fits in L2 (128 KB): strips of a row break the hardware prefetcher's
/// sequential streams, which costs much once the matrix comes from DRAM (BM_LowRank).
size_t strip_width(size_t cols, size_t r) {
  constexpr size_t kBlock = 32768;  // floats
  return r * cols <= kBlock ? cols : std::min(cols, std::max<size_t>(1024, kBlock / r));
}

/// This thread's share [lo, hi) of n rows.
std::pair<size_t, size_t> my_rows(size_t n) {
  const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
  return {n * t / nt, n * (t + 1) / nt};
}

/// f(lo, n, j, w) for each thread's rows [lo, lo + n) and every strip [j, j + w) of a rows × cols
/// matrix.
template <class F>
void each_strip(size_t rows, size_t cols, size_t w0, F&& f) {
#pragma omp parallel num_threads(threads_for(rows* cols))
  {
    const auto [lo, hi] = my_rows(rows);
    if (hi > lo)
      for (size_t j = 0; j < cols; j += w0) f(lo, hi - lo, j, std::min(w0, cols - j));
  }
}

// ---- ranks up to 4 ----------------------------------------------------------------------

/// m += x for n floats (add_in), for rank 0, where the vector has no matrix shape.
SKETCHSGD_WIDE bool absorb_flat(float* m, const float* g, float* u, float rho, size_t n) {
  return add_in(m, g, u, rho, n);
}

/// One strip of a row for ranks up to 4 (q padded with zero rows): x = g (or u = ρ·u + g, x = u),
/// m += x, p[k] += m·q_k, reading g, u and m once and writing m once; where g is NaN or ±Inf, m
/// and u stay (returns whether any was). With pa (this row of a, padded to 4): m −= pa·btᵀ
/// first (bt: b transposed and padded, or null when b is q: then the subtraction reads nothing
/// more), the subtraction an expand left to this pass.
SKETCHSGD_WIDE bool strip_absorb4(float* __restrict m, const float* __restrict g,
                                  float* __restrict u, float rho, const float* __restrict qt,
                                  size_t ld, size_t w, float* __restrict p,
                                  const float* __restrict pa, const float* __restrict bt) {
  const float *q0 = qt, *q1 = qt + ld, *q2 = qt + 2 * ld, *q3 = qt + 3 * ld;
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  uint32_t bad = 0;
  const float* x = g;  // what m takes in: g, or the momentum
  if (u != nullptr) {
#pragma omp simd
    for (size_t j = 0; j < w; ++j) {
      const bool ok = is_finite(g[j]);
      const float v = rho * u[j] + g[j];
      u[j] = pick(ok, v, u[j]);
    }
    x = u;
  }
  // y: m after the subtraction; m = y + x where g is finite.
  auto pass = [&](auto&& y) __attribute__((always_inline)) {
#pragma omp simd reduction(+ : s0, s1, s2, s3) reduction(| : bad)
    for (size_t j = 0; j < w; ++j) {
      const bool ok = is_finite(g[j]);
      bad |= uint32_t(!ok);
      const float e = y(j);
      const float v = pick(ok, x[j] + e, e);
      m[j] = v;
      s0 += v * q0[j];
      s1 += v * q1[j];
      s2 += v * q2[j];
      s3 += v * q3[j];
    }
  };
  if (pa == nullptr) {
    pass([&](size_t j) __attribute__((always_inline)) { return m[j]; });
  } else {
    const float a0 = pa[0], a1 = pa[1], a2 = pa[2], a3 = pa[3];
    const float *b0 = bt != nullptr ? bt : q0, *b1 = bt != nullptr ? bt + ld : q1,
                *b2 = bt != nullptr ? bt + 2 * ld : q2, *b3 = bt != nullptr ? bt + 3 * ld : q3;
    pass([&](size_t j) __attribute__((always_inline)) {
      return m[j] - (a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]);
    });
  }
  p[0] += s0;
  p[1] += s1;
  p[2] += s2;
  p[3] += s3;
  return bad != 0;
}

/// Eight rows of answer_narrow at rank R: a sweep loads each value of the eight rows once and
/// adds it into all R factor rows of qt (R accumulators a column), so qt is read and written
/// once per eight rows.
template <int R>
SKETCHSGD_INLINE void answer_rows8(const float* __restrict m, size_t ldm, const float* __restrict p,
                                   float* __restrict qt, size_t ld, size_t w) {
  float c[8][R];
  for (int a = 0; a < 8; ++a)
    for (int k = 0; k < R; ++k) c[a][k] = p[a * R + k];
#pragma omp simd
  for (size_t j = 0; j < w; ++j) {
    float x[8], s[R];
#pragma GCC unroll 8
    for (int a = 0; a < 8; ++a) x[a] = m[a * ldm + j];
#pragma GCC unroll 4
    for (int k = 0; k < R; ++k) s[k] = qt[k * ld + j];
#pragma GCC unroll 8
    for (int a = 0; a < 8; ++a)
#pragma GCC unroll 4
      for (int k = 0; k < R; ++k) s[k] += x[a] * c[a][k];
#pragma GCC unroll 4
    for (int k = 0; k < R; ++k) qt[k * ld + j] = s[k];
  }
}

/// qt[k·ld + j] += Σ_i m[i·ldm + j]·p[i·r + k] over `rows` rows and j < w, eight rows a sweep
/// (then four, then one): for ranks up to 4, where a row of p does not fill a vector. Eight
/// rows with every factor in the inner loop load each value of m once and read and write qt
/// once per eight rows (BM_LowRank).
SKETCHSGD_WIDE void answer_narrow(const float* __restrict m, size_t ldm, size_t rows,
                                  const float* __restrict p, size_t r, float* __restrict qt,
                                  size_t ld, size_t w) {
  size_t i = 0;
  for (; i + 8 <= rows; i += 8)
    with_vectors(
        r, [&]<int R>() __attribute__((always_inline)) {
          answer_rows8<R>(m + i * ldm, ldm, p + i * r, qt, ld, w);
        });
  for (; i + 4 <= rows; i += 4) {
    const float *m0 = m + i * ldm, *m1 = m0 + ldm, *m2 = m1 + ldm, *m3 = m2 + ldm;
    const float* pi = p + i * r;
    for (size_t k = 0; k < r; ++k) {
      const float p0 = pi[k], p1 = pi[r + k], p2 = pi[2 * r + k], p3 = pi[3 * r + k];
      float* q = qt + k * ld;
#pragma omp simd
      for (size_t j = 0; j < w; ++j) q[j] += m0[j] * p0 + m1[j] * p1 + m2[j] * p2 + m3[j] * p3;
    }
  }
  for (; i < rows; ++i) {
    const float* mi = m + i * ldm;
    for (size_t k = 0; k < r; ++k) {
      const float pk = p[i * r + k];
      float* q = qt + k * ld;
#pragma omp simd
      for (size_t j = 0; j < w; ++j) q[j] += mi[j] * pk;
    }
  }
}

/// out[j] = Σ_k a[k]·bt[k·ld + j] for j < w and ranks up to 4 (bt padded with zero rows): a
/// strip of one row of a·bᵀ; m[j] −= out[j] too when m is given (then out may be null). With
/// `streamed`, out's aligned whole vectors are written by streaming stores (the same values).
SKETCHSGD_WIDE void expand_narrow(const float* __restrict a, const float* __restrict bt, size_t ld,
                                  size_t r, size_t w, float* __restrict out, float* __restrict m,
                                  bool streamed) {
  const float a0 = a[0], a1 = r > 1 ? a[1] : 0.0f, a2 = r > 2 ? a[2] : 0.0f,
              a3 = r > 3 ? a[3] : 0.0f;
  const float *b0 = bt, *b1 = b0 + ld, *b2 = b1 + ld, *b3 = b2 + ld;
  if (out == nullptr) {
#pragma omp simd
    for (size_t j = 0; j < w; ++j) m[j] -= a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
    return;
  }
  if (streamed) {  // up to an aligned value one at a time, the vectors streamed, the tail
    size_t j = 0;
    auto one = [&](size_t t) __attribute__((always_inline)) {
      const float v = a0 * b0[t] + a1 * b1[t] + a2 * b2[t] + a3 * b3[t];
      out[t] = v;
      if (m != nullptr) m[t] -= v;
    };
    for (; j < w && (reinterpret_cast<uintptr_t>(out + j) & 15) != 0; ++j) one(j);
    const v8 s0 = splat(a0), s1 = splat(a1), s2 = splat(a2), s3 = splat(a3);
    for (; j + 8 <= w; j += 8) {
      const v8 v = s0 * load(b0 + j) + s1 * load(b1 + j) + s2 * load(b2 + j) + s3 * load(b3 + j);
      stream(out + j, v);
      if (m != nullptr) store(m + j, load(m + j) - v);
    }
    for (; j < w; ++j) one(j);
    return;
  }
  if (m != nullptr) {
#pragma omp simd
    for (size_t j = 0; j < w; ++j) {
      const float v = a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
      out[j] = v;
      m[j] -= v;
    }
    return;
  }
#pragma omp simd
  for (size_t j = 0; j < w; ++j) out[j] = a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
}

// ---- ranks past 4 -----------------------------------------------------------------------

/// absorb for ranks past 4: `rows` rows of m (cols wide), a group of rows at a time (as many
/// as leave twelve accumulators for the first 32 factors): their error feedback, then p's rows
/// (r8 wide, q cols × r8) as register tiles, 32 factors a block.
SKETCHSGD_WIDE bool absorb_wide(float* m, const float* g, float* u, float rho, size_t rows,
                                size_t cols, const float* q, size_t r8, float* p) {
  const size_t group = std::min<size_t>(8, 12 / std::min<size_t>(4, r8 / 8));
  bool bad = false;
  for (size_t i0 = 0; i0 < rows; i0 += group) {
    const size_t n = std::min(group, rows - i0);
    for (size_t i = i0; i < i0 + n; ++i)
      bad |= add_in(m + i * cols, g + i * cols, u != nullptr ? u + i * cols : nullptr, rho, cols);
    for (size_t f = 0; f < r8; f += 32)
      with_vectors((r8 - f) / 8, [&]<int J>() __attribute__((always_inline)) {
        with_rows<J>(
            n, [&]<int R, int>() __attribute__((always_inline)) {
              row_tile<R, J>(m + i0 * cols, cols, cols, q + f, r8, p + i0 * r8 + f, r8);
            });
      });
  }
  return bad;
}

/// q (cols × r8, row-major) += mᵀ·p for `rows` rows of m (cols wide, ldm apart) and p (r8 wide,
/// zero past the rank): 16 rows a block, 32 factors a block, q's C × 8J tiles across the row.
SKETCHSGD_WIDE void answer_wide(const float* m, size_t ldm, size_t rows, size_t cols,
                                const float* p, size_t r8, float* q) {
  // Sixteen rows a block: a C-column tile reads the same columns of every row of the block, and
  // at 1024 columns (4 KB rows) those lines share one L1 set: sixteen rows keep them apart with
  // M coming from memory, as in training (a matrix already in L3 would prefer more rows).
  constexpr size_t kRows = 16;
  for (size_t i0 = 0; i0 < rows; i0 += kRows) {
    const size_t n = std::min(kRows, rows - i0);
    for (size_t f = 0; f < r8; f += 32) {
      const size_t vecs = std::min<size_t>(4, (r8 - f) / 8);
      auto each = [&]<int C, int J>() __attribute__((always_inline)) {
        size_t j = 0;
        for (; j + C <= cols; j += C)
          column_tile<C, J>(m + i0 * ldm + j, ldm, n, p + i0 * r8 + f, r8, q + j * r8 + f, r8);
        for (; j < cols; ++j)
          column_tile<1, J>(m + i0 * ldm + j, ldm, n, p + i0 * r8 + f, r8, q + j * r8 + f, r8);
      };
      with_vectors(
          vecs, [&]<int J>()
                    __attribute__((always_inline)) { each.template operator()<12 / J, J>(); });
    }
  }
}

/// Columns [0, w) of `rows` rows of c = a·bᵀ (and m −= c) for ranks past 4: tiles of four rows
/// by 24 columns, narrower at the edges, single columns past the last eight.
SKETCHSGD_WIDE void expand_wide(const float* a, size_t r, const float* bt, size_t ld, size_t rows,
                                float* c, size_t ldc, float* m, size_t w) {
  for (size_t i0 = 0; i0 < rows; i0 += 4) {
    const size_t n = std::min<size_t>(4, rows - i0);
    const float* ai = a + i0 * r;
    float* ci = c != nullptr ? c + i0 * ldc : nullptr;
    float* mi = m != nullptr ? m + i0 * ldc : nullptr;
    size_t j = 0;
    for (; j + 8 <= w; j += 24)
      blocked<4, 3>(
          n, std::min<size_t>(3, (w - j) / 8), [&]<int R, int J>() __attribute__((always_inline)) {
            tile<R, J>(ai, r, bt + j, ld, ci != nullptr ? ci + j : nullptr, ldc,
                       mi != nullptr ? mi + j : nullptr);
          });
    j = w / 8 * 8;
    for (size_t i = 0; i < n; ++i)
      for (size_t t = j; t < w; ++t) {
        float s = 0.0f;
        for (size_t k = 0; k < r; ++k) s += ai[i * r + k] * bt[k * ld + t];
        if (ci != nullptr) ci[i * ldc + t] = s;
        if (mi != nullptr) mi[i * ldc + t] -= s;
      }
  }
}

}  // namespace

void times_upper_transposed(const float* a, const float* r, float* out, size_t rows, size_t k) {
  std::fill(out, out + rows * k, 0.0f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t l = 0; l < k; ++l)
      for (size_t j = l; j < k; ++j) out[i * k + l] += a[i * k + j] * r[l * k + j];
}

bool lowrank_absorb(float* m, const float* g, float* u, float rho, const float* q, float* p,
                    size_t rows, size_t cols, size_t r, const float* a, const float* b) {
  if (rows == 0 || cols == 0) return true;
  std::atomic<bool> bad{false};  // a NaN or ±Inf in g, seen by any thread
  if (a != nullptr && r > 4) {   // bound by the FMA units past 4: a pass of its own costs nothing
    lowrank_expand(a, b, nullptr, rows, cols, r, m);
    a = nullptr;
  }
  if (r == 0) {  // elementwise: any split of the vector will do
    const size_t n = rows * cols, chunk = 4096, chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
    for (size_t c = 0; c < chunks; ++c) {
      const size_t lo = c * chunk, len = std::min(chunk, n - lo);
      if (absorb_flat(m + lo, g + lo, u != nullptr ? u + lo : nullptr, rho, len))
        bad.store(true, std::memory_order_relaxed);
    }
    return !bad.load();
  }
  if (r > 4) {  // rows of q and p padded to whole vectors (r8), p's tiles held in registers
    const size_t r8 = (r + 7) / 8 * 8;
    std::vector<float> q8(cols * r8, 0.0f), p8(rows * r8);
    for (size_t j = 0; j < cols; ++j) std::copy_n(q + j * r, r, &q8[j * r8]);
#pragma omp parallel num_threads(threads_for(rows* cols))
    {
      const auto [lo, hi] = my_rows(rows);
      if (absorb_wide(m + lo * cols, g + lo * cols, u != nullptr ? u + lo * cols : nullptr, rho,
                      hi - lo, cols, q8.data(), r8, p8.data() + lo * r8))
        bad.store(true, std::memory_order_relaxed);
    }
    for (size_t i = 0; i < rows; ++i) std::copy_n(&p8[i * r8], r, p + i * r);
    return !bad.load();
  }
  // r ≤ 4: the dot products (and a deferred subtraction) ride on the pass over g and m (factors
  // padded to four).
  const std::vector<float> qt = transposed(q, cols, r, 4);
  std::vector<float> bt, a4;
  if (a != nullptr) {
    if (b != q) bt = transposed(b, cols, r, 4);
    a4.assign(rows * 4, 0.0f);
    for (size_t i = 0; i < rows; ++i) std::copy_n(a + i * r, r, &a4[i * 4]);
  }
  const size_t ld = stride(cols);
  std::vector<float> p4(rows * 4, 0.0f);
  each_strip(rows, cols, strip_width(cols, 4), [&](size_t lo, size_t n, size_t j, size_t w) {
    for (size_t i = lo; i < lo + n; ++i) {
      const size_t e = i * cols + j;
      if (strip_absorb4(m + e, g + e, u != nullptr ? u + e : nullptr, rho, qt.data() + j, ld, w,
                        &p4[i * 4], a != nullptr ? &a4[i * 4] : nullptr,
                        bt.empty() ? nullptr : bt.data() + j))
        bad.store(true, std::memory_order_relaxed);
    }
  });
  for (size_t i = 0; i < rows; ++i) std::copy_n(&p4[i * 4], r, p + i * r);
  return !bad.load();
}

void lowrank_answer(const float* m, const float* p, float* q, size_t rows, size_t cols, size_t r) {
  if (cols == 0 || r == 0) return;
  // Each thread sums its rows' share into its own copy of Q; the shares add up in thread order,
  // so a given thread count always gives the same bits.
  const int nt =
      int(std::min<size_t>(size_t(threads_for(rows * cols)), std::max<size_t>(1, rows / 4)));
  if (r <= 4) {  // Q transposed, a factor column a row
    const size_t ld = stride(cols);
    std::vector<float> part(size_t(nt) * r * ld, 0.0f);
    const size_t w0 = strip_width(cols, r);
#pragma omp parallel num_threads(nt)
    {
      const auto [lo, hi] = my_rows(rows);
      float* mine = part.data() + size_t(omp_get_thread_num()) * r * ld;
      for (size_t j = 0; j < cols; j += w0)
        answer_narrow(m + lo * cols + j, cols, hi - lo, p + lo * r, r, mine + j, ld,
                      std::min(w0, cols - j));
    }
    for (int t = 1; t < nt; ++t) axpy(part.data(), part.data() + size_t(t) * r * ld, r * ld, 1.0f);
    for (size_t j = 0; j < cols; ++j)
      for (size_t k = 0; k < r; ++k) q[j * r + k] = part[k * ld + j];
    return;
  }
  // Wider: rows of p and Q padded to whole vectors (r8), Q's tiles held in registers.
  const size_t r8 = (r + 7) / 8 * 8;
  std::vector<float> p8(rows * r8, 0.0f), part(size_t(nt) * cols * r8, 0.0f);
  for (size_t i = 0; i < rows; ++i) std::copy_n(p + i * r, r, &p8[i * r8]);
#pragma omp parallel num_threads(nt)
  {
    const auto [lo, hi] = my_rows(rows);
    answer_wide(m + lo * cols, cols, hi - lo, cols, p8.data() + lo * r8, r8,
                part.data() + size_t(omp_get_thread_num()) * cols * r8);
  }
  for (int t = 1; t < nt; ++t)
    axpy(part.data(), part.data() + size_t(t) * cols * r8, cols * r8, 1.0f);
  for (size_t j = 0; j < cols; ++j) std::copy_n(&part[j * r8], r, q + j * r);
}

void lowrank_expand(const float* a, const float* b, float* c, size_t rows, size_t cols, size_t r,
                    float* m, bool streamed) {
  if (rows == 0 || cols == 0) return;
  if (r == 0) {
    if (c != nullptr) std::fill(c, c + rows * cols, 0.0f);
    return;
  }
  const size_t ld = stride(cols);
  if (r <= 4) {
    const std::vector<float> bt = transposed(b, cols, r, 4);
    streamed = streamed && c != nullptr;
    each_strip(rows, cols, strip_width(cols, 4), [&](size_t lo, size_t n, size_t j, size_t w) {
      for (size_t i = lo; i < lo + n; ++i)
        expand_narrow(a + i * r, bt.data() + j, ld, r, w, c != nullptr ? c + i * cols + j : nullptr,
                      m != nullptr ? m + i * cols + j : nullptr, streamed);
      if (streamed) stream_fence();  // this thread's streaming stores before the region's end
    });
    return;
  }
  const std::vector<float> bt = transposed(b, cols, r);
  each_strip(rows, cols, strip_width(cols, r), [&](size_t lo, size_t n, size_t j, size_t w) {
    expand_wide(a + lo * r, r, bt.data() + j, ld, n, c != nullptr ? c + lo * cols + j : nullptr,
                cols, m != nullptr ? m + lo * cols + j : nullptr, w);
  });
}

}  // namespace sketchsgd::kernels::cpu
