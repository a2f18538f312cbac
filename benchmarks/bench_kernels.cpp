// Kernel microbenchmarks: sketch accumulate / unsketch+top-k / merge, selection, bit packing.
// items/s = coordinates per second; bytes/s = gradient bytes read per second (4·d).
#include <algorithm>

#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "common.hpp"

namespace sketchsgd::bench {
namespace {

SketchConfig config(size_t d, Hashing h = Hashing::OnTheFly) {
  return SketchConfig{d, 5, cols_for(d), 7, h};
}

void BM_Accumulate(benchmark::State& s, Hashing h) {
  const size_t d = size_t(s.range(0));
  const auto g = gradient(d);
  CountSketch sk(config(d, h));
  for (auto _ : s) {
    sk.zero();
    sk.accumulate(g);
    benchmark::DoNotOptimize(sk.table().data());
  }
  report(s, d, 4 * d);
}
BENCHMARK_CAPTURE(BM_Accumulate, on_the_fly, Hashing::OnTheFly)->Apply(d_axis);
BENCHMARK_CAPTURE(BM_Accumulate, precomputed, Hashing::Precomputed)->Apply(d_axis);

void BM_UnsketchTopK(benchmark::State& s) {
  const size_t d = size_t(s.range(0));
  CountSketch sk(config(d));
  sk.accumulate(gradient(d));
  for (auto _ : s) benchmark::DoNotOptimize(sk.top_k(k_for(d)));
  report(s, d, 4 * sk.table().size());
}
BENCHMARK(BM_UnsketchTopK)->Apply(d_axis);

void BM_Merge(benchmark::State& s) {
  const size_t d = size_t(s.range(0));
  CountSketch a(config(d)), b(config(d));
  b.accumulate(gradient(d));
  for (auto _ : s) {
    a += b;
    benchmark::DoNotOptimize(a.table().data());
  }
  report(s, a.table().size(), 8 * a.table().size());
}
BENCHMARK(BM_Merge)->Apply(d_axis);

/// The server's Adagrad step (ps/outer.hpp) on a dense step and on a 1 %-dense one (a top-k
/// update decoded), beside the vectorised loop over every coordinate that the skip of zero steps
/// replaced (same bits either way).
void BM_Adagrad(benchmark::State& s, bool every) {
  const size_t d = size_t(s.range(0)), stride = size_t(100 / s.range(1));
  std::vector<float> w = gradient(d, 2), v(d, 1.0f), step(d, 0.0f);
  const auto g = gradient(d);
  for (size_t i = 0; i < d; i += stride) step[i] = g[i];
  for (auto _ : s) {
    if (every) {
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < d; ++i) elem::adagrad(w[i], v[i], step[i], 1e-3f, 1e-8f);
    } else {
      kernels::cpu::adagrad(w.data(), v.data(), step.data(), d, 1e-3f, 1e-8f);
    }
    benchmark::DoNotOptimize(w.data());
  }
  report(s, d, 12 * d);
}
BENCHMARK_CAPTURE(BM_Adagrad, skip_zeros, false)->Args({1 << 21, 100})->Args({1 << 21, 1});
BENCHMARK_CAPTURE(BM_Adagrad, every_coordinate, true)->Args({1 << 21, 100})->Args({1 << 21, 1});

void BM_TopK(benchmark::State& s) {
  const size_t d = size_t(s.range(0)), k = d / 100;
  const auto g = gradient(d);
  std::vector<uint32_t> idx(k);
  std::vector<float> val(k);
  for (auto _ : s) {
    kernels::cpu::topk(g.data(), d, k, idx.data(), val.data());
    benchmark::DoNotOptimize(idx.data());
  }
  report(s, d, 4 * d);
}
BENCHMARK(BM_TopK)->Apply(d_axis);

void BM_PackSigns(benchmark::State& s) {
  const size_t d = size_t(s.range(0));
  const auto g = gradient(d);
  std::vector<uint32_t> w((d + 31) / 32);
  for (auto _ : s) {
    kernels::cpu::pack_signs(g.data(), d, w.data());
    benchmark::DoNotOptimize(w.data());
  }
  report(s, d, 4 * d);
}
BENCHMARK(BM_PackSigns)->Apply(d_axis);

void BM_UnpackSigns(benchmark::State& s) {
  const size_t d = size_t(s.range(0));
  const auto g = gradient(d);
  std::vector<uint32_t> w((d + 31) / 32);
  kernels::cpu::pack_signs(g.data(), d, w.data());
  std::vector<float> out(d);
  for (auto _ : s) {
    kernels::cpu::unpack_signs(w.data(), d, d, nullptr, out.data(), false);
    benchmark::DoNotOptimize(out.data());
  }
  report(s, d, 4 * d);
}
BENCHMARK(BM_UnpackSigns)->Apply(d_axis);

void BM_Ternarize(benchmark::State& s) {
  const size_t d = size_t(s.range(0));
  const auto g = gradient(d);
  const float scale = 200.0f;
  std::vector<uint8_t> codes((d + 3) / 4);
  uint64_t round = 0;
  for (auto _ : s) {
    kernels::cpu::ternarize(g.data(), d, d, &scale, 1, round++, codes.data());
    benchmark::DoNotOptimize(codes.data());
  }
  report(s, d, 4 * d);
}
BENCHMARK(BM_Ternarize)->Apply(d_axis);

void BM_UnpackTernary(benchmark::State& s) {
  const size_t d = size_t(s.range(0));
  const auto g = gradient(d);
  std::vector<uint8_t> codes((d + 3) / 4);
  kernels::cpu::pack_ternary(g.data(), d, codes.data());
  std::vector<float> out(d);
  for (auto _ : s) {
    kernels::cpu::unpack_ternary(codes.data(), d, d, nullptr, 1.0f, out.data(), false);
    benchmark::DoNotOptimize(out.data());
  }
  report(s, d, 4 * d);
}
BENCHMARK(BM_UnpackTernary)->Apply(d_axis);

/// PowerSGD's host Gram-Schmidt on an n × r factor (rows of a layer by the rank): every
/// iteration orthonormalises a fresh copy, so the copy (n·r floats) is timed too.
void BM_Orthonormalize(benchmark::State& s) {
  const size_t n = size_t(s.range(0)), r = size_t(s.range(1));
  const auto a = gradient(n * r);
  std::vector<float> b(a.size());
  for (auto _ : s) {
    std::copy(a.begin(), a.end(), b.begin());
    kernels::cpu::orthonormalize(b.data(), n, r);
    benchmark::DoNotOptimize(b.data());
  }
  report(s, n * r, 4 * n * r);
}
BENCHMARK(BM_Orthonormalize)
    ->ArgsProduct({{2048, 8192}, {2, 4, 8, 16, 24, 32}})
    ->Unit(benchmark::kMicrosecond);

/// PowerSGD's three products on a 1024 × 1024 matrix at rank r: the one-pass kernels
/// (lowrank_*, error feedback fused into the first and last) against OpenBLAS (gemm and the
/// error-feedback passes around it).
enum class Product { Absorb, Answer, Expand };
void BM_LowRank(benchmark::State& s, Product what, bool blas) {
  const size_t n = 1024, r = size_t(s.range(0));
  const auto g = gradient(n * n), a = gradient(n * r), b = gradient(n * r);
  auto m = gradient(n * n);
  std::vector<float> p(n * r), c(n * n);
  for (auto _ : s) {
    switch (what) {
      case Product::Absorb:  // m += g; p = m·b
        if (blas) {
          kernels::cpu::axpy(m.data(), g.data(), n * n, 1.0f);
          kernels::cpu::gemm(false, false, n, r, n, 1.0f, m.data(), n, b.data(), r, 0.0f, p.data(),
                             r);
        } else {
          kernels::cpu::lowrank_absorb(m.data(), g.data(), nullptr, 0.0f, b.data(), p.data(), n, n,
                                       r);
        }
        break;
      case Product::Answer:
        if (blas)
          kernels::cpu::gemm(true, false, n, r, n, 1.0f, m.data(), n, a.data(), r, 0.0f, p.data(),
                             r);
        else
          kernels::cpu::lowrank_answer(m.data(), a.data(), p.data(), n, n, r);
        break;
      case Product::Expand:  // c = a·bᵀ; m −= c
        if (blas) {
          kernels::cpu::gemm(false, true, n, n, r, 1.0f, a.data(), r, b.data(), r, 0.0f, c.data(),
                             n);
          kernels::cpu::axpy(m.data(), c.data(), n * n, -1.0f);
        } else {
          kernels::cpu::lowrank_expand(a.data(), b.data(), c.data(), n, n, r, m.data());
        }
        break;
    }
    benchmark::DoNotOptimize(p.data());
    benchmark::DoNotOptimize(c.data());
  }
  report(s, n * n, 4 * n * n);
}
BENCHMARK_CAPTURE(BM_LowRank, absorb_fused, Product::Absorb, false)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LowRank, absorb_blas, Product::Absorb, true)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LowRank, answer_fused, Product::Answer, false)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LowRank, answer_blas, Product::Answer, true)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LowRank, expand_fused, Product::Expand, false)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LowRank, expand_blas, Product::Expand, true)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMicrosecond);

void BM_SketchConstruct(benchmark::State& s) {
  const size_t d = 6500000;
  for (auto _ : s) benchmark::DoNotOptimize(CountSketch(SketchConfig{d, 5, 500000, 7}));
}
BENCHMARK(BM_SketchConstruct)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace sketchsgd::bench
