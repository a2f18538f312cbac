// CPU kernels over dense and sparse float vectors: axpy, momentum + error accumulation, chunk
// statistics, gathers and scatters. Simple loops the compiler vectorises; OpenMP past ~64K
// elements.
#include <algorithm>
#include <cmath>

#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "detail/wide.hpp"

namespace sketchsgd::kernels::cpu {
namespace {
constexpr size_t kParallel = 1 << 16;

/// Whether x[0, n) holds a NaN or ±Inf: the exponent bits of every value at vector width.
SKETCHSGD_WIDE bool any_nonfinite(const float* __restrict x, size_t n) {
  uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
  for (size_t i = 0; i < n; ++i) bad |= uint32_t(!is_finite(x[i]));
  return bad != 0;
}
}  // namespace

size_t find_nonfinite(const float* x, size_t n) {
  constexpr size_t kChunk = 4096;
  size_t first = kNone;
  const size_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) reduction(min : first) if (n > kParallel)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    if (any_nonfinite(x + lo, hi - lo)) {
      for (size_t i = lo; i < hi; ++i)
        if (!is_finite(x[i])) {
          first = std::min(first, i);
          break;
        }
    }
  }
  return first;
}

void axpy(float* y, const float* x, size_t n, float a) {
#pragma omp parallel for simd schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scatter_axpy(float* y, const uint32_t* idx, const float* val, size_t n, float a) {
  for (size_t i = 0; i < n; ++i) y[idx[i]] += a * val[i];
}

void scale(float* y, size_t n, float a) {
  scale(y, y, n, a);
}

void scale(float* y, const float* x, size_t n, float a) {
#pragma omp parallel for simd schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i) y[i] = a * x[i];
}

void momentum_accumulate(float* u, float* v, const float* g, size_t n, float rho) {
#pragma omp parallel for simd schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i) {
    const float m = rho * u[i] + g[i];
    u[i] = m;
    v[i] += m;
  }
}

void adagrad(float* w, float* v, const float* s, size_t n, float lr, float eps) {
  // A zero step leaves w and v as they are (v + 0, w − lr · 0 with ε > 0), so skipping it gives
  // the same bits, and a sparse update (top-k's, the sketch's) reads the rest of the model only
  // to find its coordinates. Scalar: vectorised, every lane would take the root anyway.
#pragma omp parallel for schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i)
    if (s[i] != 0.0f) elem::adagrad(w[i], v[i], s[i], lr, eps);
}

void adam(float* w, float* m, float* v, const float* s, size_t n, float lr, float b1, float b2,
          float c1, float c2, float eps) {
#pragma omp parallel for simd schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i) elem::adam(w[i], m[i], v[i], s[i], lr, b1, b2, c1, c2, eps);
}

void chunk_stats(const float* x, size_t n, size_t chunk, ChunkStats* out) {
  const size_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > kParallel)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t lo = c * chunk, hi = std::min(n, lo + chunk);
    double sum = 0.0, sq = 0.0, abs_sum = 0.0;
    float abs_max = 0.0f;
    for (size_t i = lo; i < hi; ++i) {
      const double v = x[i];
      sum += v;
      sq += v * v;
      abs_sum += std::fabs(v);
      abs_max = std::max(abs_max, std::fabs(x[i]));
    }
    const double m = double(hi - lo);
    const double mean = sum / m;
    out[c] = ChunkStats{abs_max, float(abs_sum / m),
                        float(std::sqrt(std::max(0.0, sq / m - mean * mean)))};
  }
}

void gather(const float* x, const uint32_t* idx, size_t n, float* out) {
#pragma omp parallel for schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i) out[i] = x[idx[i]];
}

void scatter(float* y, const uint32_t* idx, const float* val, size_t n) {
  // Indices are distinct (validated by the callers), so threads never write the same element.
#pragma omp parallel for schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i) y[idx[i]] = val[i];
}

void zero_at(float* y, const uint32_t* idx, size_t n) {
#pragma omp parallel for schedule(static) if (n > kParallel)
  for (size_t i = 0; i < n; ++i) y[idx[i]] = 0.0f;
}

}  // namespace sketchsgd::kernels::cpu
