// GPU microbenchmarks (Google Benchmark, manual time from CUDA events after warm-up). The copy
// benchmark measures the ceiling in the same run; every kernel reports bytes_per_second for the
// bytes it must move, so scripts/gpu_table.py can put each against the copy bandwidth.
//   sketchsgd_bench_gpu --benchmark_format=json --benchmark_out=gpu.json
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include <sketchsgd/core/device.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/ops.hpp>

namespace {

namespace cu = sketchsgd::kernels::cuda;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) {
    check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  ~Dev() { cudaFree(p); }
};

/// Gaussian noise with a heavy tail planted every 997th coordinate (real data, never zeros).
std::vector<float> gradient(size_t n, uint64_t seed) {
  std::vector<float> v(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u1 = (double(z >> 11) + 0.5) * 0x1.0p-53, u2 = double(uint32_t(z)) * 0x1.0p-32;
    float g = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    if (i % 997 == 0) g *= 50.0f;
    v[i] = g;
  }
  return v;
}

/// One device copy of the benchmark gradient per size, made once.
const float* device_gradient(size_t n) {
  static std::map<size_t, std::unique_ptr<Dev<float>>> cache;
  auto& slot = cache[n];
  if (!slot) {
    slot = std::make_unique<Dev<float>>(n);
    const auto h = gradient(n, 42);
    check(cudaMemcpy(slot->p, h.data(), n * 4, cudaMemcpyHostToDevice), "upload");
  }
  return slot->p;
}

/// Times f on the default stream with events, one iteration per sample, after two warm-ups.
template <class F>
void timed(benchmark::State& state, F&& f) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  f();
  f();
  check(cudaDeviceSynchronize(), "warm-up");
  for (auto _ : state) {
    check(cudaEventRecord(a), "record");
    f();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    state.SetIterationTime(ms * 1e-3);
  }
  check(cudaGetLastError(), "kernel");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

void BM_CopyDeviceToDevice(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  Dev<float> dst(n);
  const float* src = device_gradient(n);
  timed(state,
        [&] { check(cudaMemcpyAsync(dst.p, src, n * 4, cudaMemcpyDeviceToDevice), "copy"); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n) * 8);  // read + write
}

sketchsgd::kernels::SketchLayout layout(benchmark::State& state) {
  return {uint64_t(state.range(0)), uint32_t(state.range(1)), uint32_t(state.range(2)), 7, nullptr};
}

/// Window words and their grouping for s (blocked, s.order's granularity) as a CountSketch on
/// the GPU makes them, s pointed at them.
std::unique_ptr<Dev<uint32_t>> grouped_windows(sketchsgd::kernels::SketchLayout& s) {
  const auto gpu = sketchsgd::Device::cuda(0);
  auto t = std::make_unique<Dev<uint32_t>>(sketchsgd::ops::precomputed_words(gpu, s));
  sketchsgd::ops::precompute(gpu, s, t->p);
  s = sketchsgd::ops::with_precomputed(gpu, s, t->p);
  if (!s.order.words) std::fprintf(stderr, "no grouping for this shape: the tiles path\n");
  return t;
}

/// The hashing of argument `arg`: 0 random on the fly, 1 random precomputed, 2 blocked (B = 1024;
/// the window words are a table of rows × d/B) by tiles, 3 blocked by columns (the words and their
/// grouping as a CountSketch on the GPU builds them).
std::unique_ptr<Dev<uint32_t>> hashing(benchmark::State& state, int arg,
                                       sketchsgd::kernels::SketchLayout& s) {
  const int64_t mode = state.range(arg);
  std::unique_ptr<Dev<uint32_t>> t;
  if (mode == 1) {
    t = std::make_unique<Dev<uint32_t>>(size_t(s.rows) * s.dim);
    cu::precompute_hashes(s, t->p);
    s.packed = t->p;
  } else if (mode == 2) {
    s.block = 1024;
    t = std::make_unique<Dev<uint32_t>>(size_t(s.rows) * ((s.dim + 1023) / 1024));
    cu::precompute_windows(s, t->p);
    s.windows = t->p;
  } else if (mode == 3) {
    s.block = 1024;
    t = grouped_windows(s);
  }
  state.SetLabel(mode == 0   ? "random, on the fly"
                 : mode == 1 ? "random, precomputed"
                 : mode == 2 ? "blocked"
                             : "blocked, by columns");
  return t;
}

void BM_Accumulate(benchmark::State& state) {
  auto s = layout(state);
  Dev<float> table(size_t(s.rows) * s.cols);
  Dev<unsigned long long> bad(1);
  const auto hashes = hashing(state, 3, s);
  const float* x = device_gradient(s.dim);
  check(cudaMemset(table.p, 0, size_t(s.rows) * s.cols * 4), "memset");
  timed(state, [&] { cu::accumulate(s, table.p, x, s.dim, 0, 1.0f, bad.p); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.dim) * 4);  // the gradient read
}

/// The column path's granularity: chunks of 2^range(3) coordinates, tiles of 2^range(4) columns.
void BM_AccumulateColumns(benchmark::State& state) {
  auto s = layout(state);
  s.block = 1024;
  s.order.chunk_shift = uint32_t(state.range(3));
  s.order.tile_shift = uint32_t(state.range(4));
  const auto words = grouped_windows(s);
  Dev<float> table(size_t(s.rows) * s.cols);
  Dev<unsigned long long> bad(1);
  const float* x = device_gradient(s.dim);
  check(cudaMemset(table.p, 0, size_t(s.rows) * s.cols * 4), "memset");
  timed(state, [&] { cu::accumulate(s, table.p, x, s.dim, 0, 1.0f, bad.p); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.dim) * 4);
}

/// Worker compress: momentum + error feedback (u = ρu + g, v += u), then v into the sketch.
void BM_Compress(benchmark::State& state) {
  auto s = layout(state);
  const auto hashes = hashing(state, 3, s);
  Dev<float> table(size_t(s.rows) * s.cols), u(s.dim), v(s.dim);
  Dev<unsigned long long> bad(1);
  check(cudaMemset(u.p, 0, s.dim * 4), "memset");
  check(cudaMemset(v.p, 0, s.dim * 4), "memset");
  const float* g = device_gradient(s.dim);
  timed(state, [&] {
    cu::momentum_accumulate(u.p, v.p, g, s.dim, 0.9f);
    check(cudaMemsetAsync(table.p, 0, size_t(s.rows) * s.cols * 4), "memset");
    cu::accumulate(s, table.p, v.p, s.dim, 0, 1.0f, bad.p);
  });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.dim) * 4 * 5);  // g,u,v r/w
}

/// Server unsketch: estimates of every coordinate + top-k, from a sketch of the gradient.
void BM_UnsketchTopk(benchmark::State& state) {
  auto s = layout(state);
  const size_t k = size_t(state.range(3));
  const auto hashes = hashing(state, 4, s);
  Dev<float> table(size_t(s.rows) * s.cols);
  Dev<unsigned long long> bad(1);
  Dev<uint32_t> idx(k);
  Dev<float> val(k);
  check(cudaMemset(table.p, 0, size_t(s.rows) * s.cols * 4), "memset");
  cu::accumulate(s, table.p, device_gradient(s.dim), s.dim, 0, 1.0f, bad.p);
  cu::Workspace ws;
  timed(state, [&] { cu::estimate_topk(s, table.p, k, idx.p, val.p, ws); });
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(s.dim));
}

/// All d estimates written out (the first half of a two-step unsketch).
void BM_EstimateAll(benchmark::State& state) {
  auto s = layout(state);
  const auto hashes = hashing(state, 3, s);
  Dev<float> table(size_t(s.rows) * s.cols), out(s.dim);
  Dev<unsigned long long> bad(1);
  check(cudaMemset(table.p, 0, size_t(s.rows) * s.cols * 4), "memset");
  cu::accumulate(s, table.p, device_gradient(s.dim), s.dim, 0, 1.0f, bad.p);
  timed(state, [&] { cu::estimate_all(s, table.p, out.p); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.dim) * 4);  // the estimates
}

/// Unsketch in two steps: every estimate written, then the plain top-k of them (the selection
/// then reads floats instead of recomputing estimates in each of its passes).
void BM_UnsketchTwoStep(benchmark::State& state) {
  auto s = layout(state);
  const size_t k = size_t(state.range(3));
  const auto hashes = hashing(state, 4, s);
  Dev<float> table(size_t(s.rows) * s.cols), est(s.dim);
  Dev<unsigned long long> bad(1);
  Dev<uint32_t> idx(k);
  Dev<float> val(k);
  check(cudaMemset(table.p, 0, size_t(s.rows) * s.cols * 4), "memset");
  cu::accumulate(s, table.p, device_gradient(s.dim), s.dim, 0, 1.0f, bad.p);
  cu::Workspace ws;
  timed(state, [&] {
    cu::estimate_all(s, table.p, est.p);
    cu::topk(est.p, s.dim, k, idx.p, val.p, ws);
  });
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(s.dim));
}

void BM_Topk(benchmark::State& state) {
  const size_t n = size_t(state.range(0)), k = size_t(state.range(1));
  Dev<uint32_t> idx(k);
  Dev<float> val(k);
  const float* x = device_gradient(n);
  cu::Workspace ws;
  timed(state, [&] { cu::topk(x, n, k, idx.p, val.p, ws); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n) * 4);
}

/// PowerSGD's orthonormalisation of three rows × rank factors (the demo MLP's P side at rows 1024,
/// four times wider at 4096) from fresh data each time (a copy of the inputs included):
/// method 0 Gram-Schmidt (one block a factor; what asking for R gives), 1 the library's choice
/// (CholeskyQR2 past rank 8).
void BM_Orthonormalize(benchmark::State& state) {
  const uint64_t rows = uint64_t(state.range(0)), rank = uint64_t(state.range(1));
  std::vector<sketchsgd::kernels::Factor> list;
  for (uint64_t i = 0; i < 3; ++i) list.push_back({i * rows * rank, rows, rank, i * rank * rank});
  const size_t n = 3 * rows * rank;
  Dev<float> a(n), rr(3 * rank * rank);
  Dev<sketchsgd::kernels::Factor> dl(list.size());
  check(cudaMemcpy(dl.p, list.data(), list.size() * sizeof(list[0]), cudaMemcpyHostToDevice),
        "upload");
  const float* src = device_gradient(n);
  cu::Workspace ws;
  const bool with_r = state.range(2) == 0;
  timed(state, [&] {
    check(cudaMemcpyAsync(a.p, src, n * 4, cudaMemcpyDeviceToDevice), "copy");
    cu::orthonormalize(a.p, list, dl.p, with_r ? rr.p : nullptr, ws);
  });
}

void BM_PackSigns(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  Dev<uint32_t> words((n + 31) / 32);
  const float* x = device_gradient(n);
  timed(state, [&] { cu::pack_signs(x, n, words.p); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n * 4 + n / 8));
}

void BM_Ternarize(benchmark::State& state) {
  const size_t n = size_t(state.range(0)), chunk = 1 << 16;
  Dev<uint8_t> codes((n + 3) / 4);
  Dev<float> scales((n + chunk - 1) / chunk);
  std::vector<float> ones((n + chunk - 1) / chunk, 3.0f);
  check(cudaMemcpy(scales.p, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice), "scales");
  const float* x = device_gradient(n);
  timed(state, [&] { cu::ternarize(x, n, chunk, scales.p, 1, 2, codes.p); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n * 4 + n / 4));
}

void BM_PackTernary(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  Dev<uint8_t> codes((n + 3) / 4);
  const float* x = device_gradient(n);
  timed(state, [&] { cu::pack_ternary(x, n, codes.p); });
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n * 4 + n / 4));
}

constexpr int64_t kD = int64_t(1) << 27, kC = int64_t(1) << 20;

BENCHMARK(BM_CopyDeviceToDevice)
    ->Arg(kD)
    ->Arg(100'000'000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Accumulate)
    ->Args({kD, 5, kC, 0})
    ->Args({kD, 5, kC, 1})
    ->Args({kD, 1, kC, 0})
    ->Args({kD, 5, kC, 2})
    ->Args({kD, 1, kC, 2})
    ->Args({kD, 5, kC, 3})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AccumulateColumns)
    ->ArgsProduct({{kD}, {5}, {kC}, {23}, {11, 12, 13}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Compress)
    ->Args({kD, 5, kC, 0})
    ->Args({kD, 5, kC, 2})
    ->Args({kD, 5, kC, 3})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_UnsketchTopk)
    ->Args({kD, 5, kC, 1'000'000, 0})
    ->Args({kD, 1, kC, 1'000'000, 0})
    ->Args({kD, 5, kC, 1'000'000, 2})
    ->Args({kD, 1, kC, 1'000'000, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EstimateAll)
    ->Args({kD, 5, kC, 0})
    ->Args({kD, 5, kC, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_UnsketchTwoStep)
    ->Args({kD, 5, kC, 1'000'000, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Topk)
    ->Args({100'000'000, 1'000'000})
    ->Args({100'000'000, 1000})
    ->Args({kD, 1'000'000})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Orthonormalize)
    ->ArgsProduct({{1024, 4096}, {4, 8, 16, 32}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PackSigns)->Arg(kD)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Ternarize)->Arg(kD)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PackTernary)->Arg(kD)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
