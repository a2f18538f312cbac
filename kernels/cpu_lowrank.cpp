// Low-rank passes on the CPU (PowerSGD's products), each one streaming pass over the matrix with
// the small factors held transposed in cache. OpenBLAS's sgemm packs the big operand into panels
// first: for a rank-r product that copy costs as much as the product itself, and the error
// feedback around it (M = g + e before, e = M − P·Qᵀ after) took two more passes. Here the
// error feedback rides on the first and last products: a round reads g and M and writes M
// (absorb), reads M (answer), reads M and writes M and the step (expand). Fastest up to rank 4
// (BM_LowRank): past that OpenBLAS's register blocking wins.
#include <omp.h>

#include <algorithm>
#include <utility>
#include <vector>

#include <sketchsgd/kernels/cpu.hpp>
#include "detail/wide.hpp"

namespace sketchsgd::kernels::cpu {
namespace {

constexpr size_t kParallel = 1 << 16;

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
/// sequential streams, which cost 2-3x once the matrix comes from DRAM (rank 8 at 784 columns
/// in 512-column strips).
size_t strip_width(size_t cols, size_t r) {
  constexpr size_t kBlock = 32768;  // floats
  return r * cols <= kBlock ? cols : std::min(cols, std::max<size_t>(1024, kBlock / r));
}

/// out[j] = Σ_k a[k]·bt[k·ld + j] for j < w: a strip of one row of a·bᵀ, four factors a sweep;
/// m[j] −= out[j] too when m is given.
SKETCHSGD_WIDE void strip_expand(const float* __restrict a, const float* __restrict bt, size_t ld,
                                 size_t r, size_t w, float* __restrict out, float* __restrict m) {
  const size_t first = r % 4 != 0 ? r % 4 : 4;  // the first sweep writes, the others add
  {
    const float a0 = a[0], a1 = first > 1 ? a[1] : 0.0f, a2 = first > 2 ? a[2] : 0.0f,
                a3 = first > 3 ? a[3] : 0.0f;
    const float* b0 = bt;
    const float* b1 = first > 1 ? bt + ld : bt;  // a zero factor times a finite value
    const float* b2 = first > 2 ? bt + 2 * ld : bt;
    const float* b3 = first > 3 ? bt + 3 * ld : bt;
    if (m != nullptr && r <= 4) {  // one sweep: subtract as it is written
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
  for (size_t k = first; k < r; k += 4) {
    const float *b0 = bt + k * ld, *b1 = b0 + ld, *b2 = b1 + ld, *b3 = b2 + ld;
    const float a0 = a[k], a1 = a[k + 1], a2 = a[k + 2], a3 = a[k + 3];
#pragma omp simd
    for (size_t j = 0; j < w; ++j) out[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
  }
  if (m != nullptr) {
#pragma omp simd
    for (size_t j = 0; j < w; ++j) m[j] -= out[j];
  }
}

/// One strip of the error feedback: x = g (or u = ρ·u + g, x = u); m += x.
SKETCHSGD_WIDE void strip_absorb(float* __restrict m, const float* __restrict g,
                                 float* __restrict u, float rho, size_t n) {
  if (u != nullptr) {
#pragma omp simd
    for (size_t j = 0; j < n; ++j) u[j] = rho * u[j] + g[j];
    g = u;
  }
#pragma omp simd
  for (size_t j = 0; j < n; ++j) m[j] = g[j] + m[j];
}

/// p[k] += Σ_j m[j]·qt[k·ld + j] for k < r, j < w: four dot products a sweep (four independent
/// chains of additions).
SKETCHSGD_WIDE void strip_dots(const float* __restrict m, const float* __restrict qt, size_t ld,
                               size_t r, size_t w, float* __restrict p) {
  size_t k = 0;
  for (; k + 4 <= r; k += 4) {
    const float *q0 = qt + k * ld, *q1 = q0 + ld, *q2 = q1 + ld, *q3 = q2 + ld;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (size_t j = 0; j < w; ++j) {
      const float x = m[j];
      s0 += x * q0[j];
      s1 += x * q1[j];
      s2 += x * q2[j];
      s3 += x * q3[j];
    }
    p[k] += s0;
    p[k + 1] += s1;
    p[k + 2] += s2;
    p[k + 3] += s3;
  }
  for (; k < r; ++k) {
    const float* q = qt + k * ld;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (size_t j = 0; j < w; ++j) s += m[j] * q[j];
    p[k] += s;
  }
}

/// qt[k·ld + j] += Σ_i m[i·ldm + j]·p[i·r + k] over `rows` rows and j < w, four rows a sweep.
SKETCHSGD_WIDE void strip_answer(const float* __restrict m, size_t ldm, size_t rows,
                                 const float* __restrict p, size_t r, float* __restrict qt,
                                 size_t ld, size_t w) {
  size_t i = 0;
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

/// strip_absorb and strip_dots in one loop for ranks up to 4 (q padded with zero rows): a strip
/// of g, u and m is read once and m written once.
SKETCHSGD_WIDE void strip_absorb4(float* __restrict m, const float* __restrict g,
                                  float* __restrict u, float rho, const float* __restrict qt,
                                  size_t ld, size_t w, float* __restrict p) {
  const float *q0 = qt, *q1 = qt + ld, *q2 = qt + 2 * ld, *q3 = qt + 3 * ld;
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  if (u != nullptr) {
#pragma omp simd
    for (size_t j = 0; j < w; ++j) u[j] = rho * u[j] + g[j];
    g = u;
  }
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (size_t j = 0; j < w; ++j) {
    const float x = g[j] + m[j];
    m[j] = x;
    s0 += x * q0[j];
    s1 += x * q1[j];
    s2 += x * q2[j];
    s3 += x * q3[j];
  }
  p[0] += s0;
  p[1] += s1;
  p[2] += s2;
  p[3] += s3;
}

/// This thread's share [lo, hi) of n rows.
std::pair<size_t, size_t> my_rows(size_t n) {
  const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
  return {n * t / nt, n * (t + 1) / nt};
}

/// f(i, j, w) for every row i and strip [j, j + w) of a rows × cols matrix: strip by strip, each
/// thread over its own rows.
template <class F>
void each_strip(size_t rows, size_t cols, size_t w0, F&& f) {
#pragma omp parallel num_threads(threads_for(rows* cols))
  {
    const auto [lo, hi] = my_rows(rows);
    for (size_t j = 0; j < cols; j += w0)
      for (size_t i = lo; i < hi; ++i) f(i, j, std::min(w0, cols - j));
  }
}

}  // namespace

void lowrank_absorb(float* m, const float* g, float* u, float rho, const float* q, float* p,
                    size_t rows, size_t cols, size_t r) {
  if (rows == 0 || cols == 0) return;
  std::fill(p, p + rows * r, 0.0f);
  if (r == 0) {  // elementwise: any split of the vector will do
    const size_t n = rows * cols, chunk = 4096, chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
    for (size_t c = 0; c < chunks; ++c) {
      const size_t lo = c * chunk, len = std::min(chunk, n - lo);
      strip_absorb(m + lo, g + lo, u != nullptr ? u + lo : nullptr, rho, len);
    }
    return;
  }
  // The first four dot products ride on the pass over g and m (strip_absorb4, q padded to four
  // rows); the others run over the strip of m while it is in L1.
  const size_t r4 = std::max<size_t>(r, 4);
  const std::vector<float> qt = transposed(q, cols, r, 4);
  const size_t ld = stride(cols);
  std::vector<float> p4(rows * r4, 0.0f);
  each_strip(rows, cols, strip_width(cols, r4), [&](size_t i, size_t j, size_t w) {
    const size_t e = i * cols + j;
    strip_absorb4(m + e, g + e, u != nullptr ? u + e : nullptr, rho, qt.data() + j, ld, w,
                  &p4[i * r4]);
    if (r > 4) strip_dots(m + e, qt.data() + 4 * ld + j, ld, r - 4, w, &p4[i * r4 + 4]);
  });
  for (size_t i = 0; i < rows; ++i) std::copy_n(&p4[i * r4], r, p + i * r);
}

void lowrank_answer(const float* m, const float* p, float* q, size_t rows, size_t cols, size_t r) {
  if (cols == 0 || r == 0) return;
  // Each thread sums its rows' share into its own transposed Q; the shares add up in thread
  // order, so a given thread count always gives the same bits.
  const int nt =
      int(std::min<size_t>(size_t(threads_for(rows * cols)), std::max<size_t>(1, rows / 4)));
  const size_t ld = stride(cols);
  std::vector<float> part(size_t(nt) * r * ld, 0.0f);
  const size_t w0 = strip_width(cols, r);
#pragma omp parallel num_threads(nt)
  {
    const auto [lo, hi] = my_rows(rows);
    float* mine = part.data() + size_t(omp_get_thread_num()) * r * ld;
    for (size_t j = 0; j < cols; j += w0)
      strip_answer(m + lo * cols + j, cols, hi - lo, p + lo * r, r, mine + j, ld,
                   std::min(w0, cols - j));
  }
  for (int t = 1; t < nt; ++t) axpy(part.data(), part.data() + size_t(t) * r * ld, r * ld, 1.0f);
  for (size_t j = 0; j < cols; ++j)
    for (size_t k = 0; k < r; ++k) q[j * r + k] = part[k * ld + j];
}

void lowrank_expand(const float* a, const float* b, float* c, size_t rows, size_t cols, size_t r,
                    float* m) {
  if (rows == 0 || cols == 0) return;
  if (r == 0) {
    std::fill(c, c + rows * cols, 0.0f);
    return;
  }
  const std::vector<float> bt = transposed(b, cols, r);
  const size_t ld = stride(cols);
  each_strip(rows, cols, strip_width(cols, r), [&](size_t i, size_t j, size_t w) {
    strip_expand(a + i * r, bt.data() + j, ld, r, w, c + i * cols + j,
                 m != nullptr ? m + i * cols + j : nullptr);
  });
}

}  // namespace sketchsgd::kernels::cpu
