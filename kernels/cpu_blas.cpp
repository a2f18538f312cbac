// Dense linear algebra on the CPU through OpenBLAS's CBLAS: the matrix products of low-rank
// codecs (PowerSGD) and their orthogonalisation. Matrices are row-major.
#include <cblas.h>

#include <algorithm>
#include <cmath>
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
  // Modified Gram-Schmidt over the r columns: for the small r of low-rank codecs it is as
  // accurate as Householder QR and spans the same space, which is all the codecs use. Row by row,
  // not column by column: column i's dot products with itself and every later column come from
  // one pass over the contiguous rows, and the projections from a second one (the later columns
  // do not depend on each other, so this is MGS exactly). Strided BLAS-1 calls touched a cache
  // line per element, r²/2 times over: 10x slower at r = 16. Dots in double: no overflow or
  // underflow of the squares. A column that vanishes (a zero gradient block) becomes zero
  // instead of NaN.
  std::vector<double> dot(r);
  std::vector<float> coef(r);
  for (size_t i = 0; i < r; ++i) {
    std::fill(dot.begin() + i, dot.end(), 0.0);
    for (size_t j = 0; j < n; ++j) {
      const float* row = a + j * r;
      const double x = row[i];
      for (size_t l = i; l < r; ++l) dot[l] += x * row[l];
    }
    const double norm = std::sqrt(dot[i]);
    const float inv = float(1.0 / norm);
    if (!(norm > 0.0) || !std::isfinite(inv) || inv == 0.0f) {
      for (size_t j = 0; j < n; ++j) a[j * r + i] = 0.0f;
      continue;
    }
    for (size_t l = i + 1; l < r; ++l) coef[l] = float(dot[l] / dot[i]);  // ⟨a_i,a_l⟩ / |a_i|²
    for (size_t j = 0; j < n; ++j) {
      float* row = a + j * r;
      const float x = row[i];
      for (size_t l = i + 1; l < r; ++l) row[l] -= coef[l] * x;
      row[i] = x * inv;
    }
  }
}

}  // namespace sketchsgd::kernels::cpu
