// Dense linear algebra on the CPU through OpenBLAS's CBLAS: the matrix products of low-rank
// codecs (PowerSGD) and their orthogonalisation. Matrices are row-major.
#include <cblas.h>

#include <cmath>

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

}  // namespace sketchsgd::kernels::cpu
