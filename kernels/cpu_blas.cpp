// Dense linear algebra on the CPU through OpenBLAS's CBLAS: the matrix products of low-rank
// codecs (PowerSGD) and their orthogonalisation. Matrices are row-major.
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::kernels::cpu {

void gemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha, const float* a,
          size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a, int(lda), b,
              int(ldb), beta, c, int(ldc));
}

void orthonormalize(float* a, size_t n, size_t r) {
  // Modified Gram-Schmidt over the r columns (stride r): for the small r of low-rank codecs it is
  // as accurate as Householder QR and spans the same space, which is all the codecs use. A
  // column that vanishes (a zero gradient block) becomes zero instead of NaN.
  for (size_t i = 0; i < r; ++i) {
    float* col = a + i;
    const float norm = cblas_snrm2(int(n), col, int(r));
    if (!(norm > 0.0f) || !std::isfinite(1.0f / norm)) {
      for (size_t j = 0; j < n; ++j) col[j * r] = 0.0f;
      continue;
    }
    cblas_sscal(int(n), 1.0f / norm, col, int(r));
    for (size_t l = i + 1; l < r; ++l) {
      const float d = cblas_sdot(int(n), col, int(r), a + l, int(r));
      cblas_saxpy(int(n), -d, col, int(r), a + l, int(r));
    }
  }
}

namespace {

// Eight lanes always (two SSE registers, or one AVX2 register in the AVX2 clone): the partial sums
// and so the results are the same on every x86-64, whichever clone runs.
using Float8 = float __attribute__((vector_size(32)));
__attribute__((always_inline)) inline Float8 load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, 32);
  return v;
}

/// Rows [lo, hi): e = e + g − pp_i·qqᵀ, then p_i = e·q, with qq and q given transposed (r × cols)
/// so every product runs along a row, eight columns at a time.
__attribute__((target_clones("avx2", "default"))) void feedback_rows(
    float* e, const float* g, size_t lo, size_t hi, size_t cols, size_t r, const float* pp,
    const float* qqt, const float* qt, float* p) {
  Float8 acc[1024];  // r ≤ 1024; a local array keeps the vectors' 32-byte alignment
  const size_t body = cols & ~size_t(7);
  for (size_t i = lo; i < hi; ++i) {
    float* ei = e + i * cols;
    const float* gi = g + i * cols;
    const float* ppi = pp ? pp + i * r : nullptr;
    std::fill(acc, acc + r, Float8{});
    for (size_t j = 0; j < body; j += 8) {
      Float8 m = load8(ei + j) + load8(gi + j);
      if (ppi)
        for (size_t l = 0; l < r; ++l) m -= ppi[l] * load8(qqt + l * cols + j);
      std::memcpy(ei + j, &m, 32);
      for (size_t l = 0; l < r; ++l) acc[l] += m * load8(qt + l * cols + j);
    }
    for (size_t l = 0; l < r; ++l) {
      float sum = 0.0f;
      for (int k = 0; k < 8; ++k) sum += acc[l][k];
      p[i * r + l] = sum;
    }
    for (size_t j = body; j < cols; ++j) {
      float m = ei[j] + gi[j];
      if (ppi)
        for (size_t l = 0; l < r; ++l) m -= ppi[l] * qqt[l * cols + j];
      ei[j] = m;
      for (size_t l = 0; l < r; ++l) p[i * r + l] += m * qt[l * cols + j];
    }
  }
}

std::vector<float> transposed(const float* a, size_t n, size_t r) {
  std::vector<float> t(n * r);
  for (size_t j = 0; j < n; ++j)
    for (size_t l = 0; l < r; ++l) t[l * n + j] = a[j * r + l];
  return t;
}

}  // namespace

void lowrank_feedback(float* e, const float* g, size_t rows, size_t cols, size_t r,
                      const float* pp, const float* qq, const float* q, float* p) {
  const std::vector<float> qt = transposed(q, cols, r);
  const std::vector<float> qqt = pp ? transposed(qq, cols, r) : std::vector<float>();
  const int threads = rows * cols > (size_t(1) << 18) ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
  {
    const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
    feedback_rows(e, g, rows * t / nt, rows * (t + 1) / nt, cols, r, pp, qqt.data(), qt.data(),
                  p);
  }
}

}  // namespace sketchsgd::kernels::cpu
