// Dense linear algebra on the CPU through OpenBLAS's CBLAS: the matrix products of low-rank
// codecs (PowerSGD) and their orthogonalisation. Matrices are row-major.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>

namespace sketchsgd::kernels::cpu {

void gemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha, const float* a,
          size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a, int(lda), b,
              int(ldb), beta, c, int(ldc));
}

namespace {

/// Modified Gram-Schmidt row by row: column i's dot products with itself and every later
/// column come from one pass over the contiguous rows, and the projections from a second one
/// (the later columns do not depend on each other, so this is MGS exactly). Dots in double: no
/// overflow or underflow of the squares. R: the rank fixed at compile time (0: r at run time),
/// which unrolls the per-row loops.
template <size_t R>
void gram_schmidt_rows(float* a, size_t n, size_t r, float* rr) {
  if constexpr (R != 0) r = R;
  constexpr size_t kMax = R != 0 ? R : 64;
  // Four partial sums per dot product (rows j mod 4): four independent chains of additions
  // instead of one, which bound the pass by add latency at small r.
  double part_fixed[4 * kMax], dot_fixed[kMax];
  float coef_fixed[kMax];
  std::vector<double> part_heap, dot_heap;
  std::vector<float> coef_heap;
  double* part = part_fixed;
  double* dot = dot_fixed;
  float* coef = coef_fixed;
  if (r > kMax) {
    part_heap.resize(4 * r);
    dot_heap.resize(r);
    coef_heap.resize(r);
    part = part_heap.data();
    dot = dot_heap.data();
    coef = coef_heap.data();
  }
  for (size_t i = 0; i < r; ++i) {
    for (size_t l = i; l < r; ++l) part[l] = part[r + l] = part[2 * r + l] = part[3 * r + l] = 0.0;
    {
      size_t j = 0;
      for (; j + 4 <= n; j += 4)
        for (size_t q = 0; q < 4; ++q) {
          const float* row = a + (j + q) * r;
          const double x = row[i];
          double* p = part + q * r;
          for (size_t l = i; l < r; ++l) p[l] += x * row[l];
        }
      for (; j < n; ++j) {
        const float* row = a + j * r;
        const double x = row[i];
        for (size_t l = i; l < r; ++l) part[l] += x * row[l];
      }
    }
    for (size_t l = i; l < r; ++l)
      dot[l] = (part[l] + part[r + l]) + (part[2 * r + l] + part[3 * r + l]);
    const float inv = elem::gram_schmidt_inverse(dot[i]);
    if (inv == 0.0f) {
      for (size_t j = 0; j < n; ++j) a[j * r + i] = 0.0f;
      continue;
    }
    const double norm = std::sqrt(dot[i]);
    if (rr != nullptr)  // a_l = a_l' + ⟨a_i,a_l⟩/|a_i| · q_i
      for (size_t l = i; l < r; ++l) rr[i * r + l] = float(dot[l] / norm);
    for (size_t l = i + 1; l < r; ++l) coef[l] = float(dot[l] / dot[i]);  // ⟨a_i,a_l⟩ / |a_i|²
    for (size_t j = 0; j < n; ++j) {
      float* row = a + j * r;
      const float x = row[i];
      for (size_t l = i + 1; l < r; ++l) row[l] -= coef[l] * x;
      row[i] = x * inv;
    }
  }
}

}  // namespace

void orthonormalize(float* a, size_t n, size_t r, float* rr) {
  // Modified Gram-Schmidt over the r columns: for the small r of low-rank codecs it is as
  // accurate as Householder QR and spans the same space, which is all the codecs use. A column
  // that vanishes (a zero gradient block) becomes zero instead of NaN. Two ways, one result to
  // rounding: column by column through strided BLAS-1 calls, which read a cache line per element
  // once a row fills a line (so it loses from r = 16), and row by row, which is slower below
  // (short rows, much loop control per value). BM_Orthonormalize measures both.
  if (rr != nullptr) std::fill(rr, rr + r * r, 0.0f);
  if (r == 16) return gram_schmidt_rows<16>(a, n, r, rr);
  if (r == 32) return gram_schmidt_rows<32>(a, n, r, rr);
  if (r > 16) return gram_schmidt_rows<0>(a, n, r, rr);
  for (size_t i = 0; i < r; ++i) {
    float* col = a + i;
    const float norm = cblas_snrm2(int(n), col, int(r));
    if (!(norm > 0.0f) || !std::isfinite(1.0f / norm)) {
      for (size_t j = 0; j < n; ++j) col[j * r] = 0.0f;
      continue;
    }
    cblas_sscal(int(n), 1.0f / norm, col, int(r));
    if (rr != nullptr) rr[i * r + i] = norm;
    for (size_t l = i + 1; l < r; ++l) {
      const float d = cblas_sdot(int(n), col, int(r), a + l, int(r));
      cblas_saxpy(int(n), -d, col, int(r), a + l, int(r));
      if (rr != nullptr) rr[i * r + l] = d;
    }
  }
}

}  // namespace sketchsgd::kernels::cpu
