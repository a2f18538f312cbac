// GPU kernels against the CPU kernels on fresh random inputs (the seed is printed with any
// failure). They run where a CUDA device is present and skip with a visible reason elsewhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/half.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/hash.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "support/cuda.hpp"
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

TEST(Cuda, PrecomputedHashesMatchCpuBitForBit) {
  REQUIRE_GPU();
  kernels::SketchLayout s{1000003, 5, 500000, fresh_seed(), nullptr};
  SCOPED_TRACE(s.seed);
  std::vector<uint32_t> cpu(s.rows * s.dim);
  cpu::precompute_hashes(s, cpu.data());
  Dev<uint32_t> d(cpu.size());
  cu::precompute_hashes(s, d.get());
  EXPECT_EQ(cpu, d.host());
}

/// Accumulates one random vector on both backends, in both hashing modes.
TEST(Cuda, AccumulateMatchesCpuToRounding) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (bool packed : {false, true}) {
    kernels::SketchLayout s{300007, 5, 20011, seed, nullptr};
    std::vector<uint32_t> hashes;
    Dev<uint32_t> dhash(packed ? s.rows * s.dim : 0);
    kernels::SketchLayout sg = s;
    if (packed) {
      hashes.resize(s.rows * s.dim);
      cpu::precompute_hashes(s, hashes.data());
      s.packed = hashes.data();
      cu::precompute_hashes(sg, dhash.get());
      sg.packed = dhash.get();
    }
    const auto x = test::gaussian(200003, seed + 1);
    std::vector<float> table(s.rows * s.cols, 0.0f);
    // A slice at an offset with a scale: the per-layer path.
    ASSERT_EQ(cpu::accumulate(s, table.data(), x.data(), x.size(), 99991, -0.75f), kernels::kNone);
    Dev<float> dt(std::vector<float>(table.size(), 0.0f)), dx(x);
    Dev<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
    cu::accumulate(sg, dt.get(), dx.get(), x.size(), 99991, -0.75f, bad.get());
    const auto gpu = dt.host();
    EXPECT_EQ(bad.host()[0], ~0ull);
    double worst = 0.0;
    size_t nonzero = 0;
    for (size_t i = 0; i < table.size(); ++i) {
      worst = std::max(worst, double(std::fabs(gpu[i] - table[i])));
      nonzero += table[i] != 0.0f;
    }
    EXPECT_LT(worst, 1e-4) << "packed=" << packed;
    EXPECT_GT(nonzero, table.size() / 2);
  }
}

TEST(Cuda, AccumulateSkipsAndReportsNonFinite) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  kernels::SketchLayout s{100000, 3, 5003, seed, nullptr};
  auto x = test::gaussian(s.dim, seed);
  x[77777] = std::nanf("");
  x[1234] = INFINITY;
  Dev<float> dt(std::vector<float>(s.rows * s.cols, 0.0f)), dx(x);
  Dev<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
  cu::accumulate(s, dt.get(), dx.get(), x.size(), 0, 1.0f, bad.get());
  EXPECT_EQ(bad.host()[0], 1234u);
  x[77777] = x[1234] = 0.0f;  // skipped values add nothing
  std::vector<float> table(s.rows * s.cols, 0.0f);
  cpu::accumulate(s, table.data(), x.data(), x.size(), 0, 1.0f);
  const auto gpu = dt.host();
  for (size_t i = 0; i < table.size(); ++i) ASSERT_NEAR(gpu[i], table[i], 1e-4) << i;
}

/// Given the same table, estimates are bit-identical (same hashes, same median network).
TEST(Cuda, EstimatesMatchCpuBitForBit) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (uint32_t rows : {1u, 3u, 4u, 5u, 7u}) {
    kernels::SketchLayout s{250001, rows, 30011, seed + rows, nullptr};
    const auto x = test::gaussian(s.dim, seed);
    std::vector<float> table(rows * s.cols, 0.0f);
    cpu::accumulate(s, table.data(), x.data(), x.size(), 0, 1.0f);
    std::vector<float> all(s.dim);
    cpu::estimate_all(s, table.data(), all.data());
    Dev<float> dt(table), dall(s.dim);
    cu::estimate_all(s, dt.get(), dall.get());
    EXPECT_BITS_EQ(dall.host(), all) << "rows=" << rows;

    std::vector<uint32_t> idx(5000);
    std::mt19937 rng{uint32_t(seed)};
    for (auto& j : idx) j = rng() % s.dim;
    std::vector<float> some(idx.size());
    cpu::estimate(s, table.data(), idx.data(), idx.size(), some.data());
    Dev<uint32_t> didx(idx);
    Dev<float> dsome(idx.size());
    cu::estimate(s, dt.get(), didx.get(), idx.size(), dsome.get());
    EXPECT_BITS_EQ(dsome.host(), some) << "rows=" << rows;
  }
}

TEST(Cuda, EstimateTopkFindsPlantedHeavyHittersLikeCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  // c ≫ heavy hitters: a light coordinate colliding with heavy ones in 3 of 5 rows (expected
  // d·10·(heavy/2c)³ times) would pass for one.
  kernels::SketchLayout s{2000003, 5, 1000003, seed, nullptr};
  auto x = test::gaussian(s.dim, seed, 0.01f);
  const auto heavy = test::plant(x, 1000, 5.0f, seed + 1);
  std::vector<float> table(s.rows * s.cols, 0.0f);
  cpu::accumulate(s, table.data(), x.data(), x.size(), 0, 1.0f);
  cu::Workspace ws;
  Dev<float> dt(table);
  for (size_t k : {size_t(1), size_t(1000), size_t(20000)}) {
    std::vector<uint32_t> ci(k);
    std::vector<float> cv(k);
    cpu::estimate_topk(s, table.data(), k, ci.data(), cv.data());
    Dev<uint32_t> gi(k);
    Dev<float> gv(k);
    cu::estimate_topk(s, dt.get(), k, gi.get(), gv.get(), ws);
    EXPECT_EQ(gi.host(), ci) << "k=" << k;
    EXPECT_BITS_EQ(gv.host(), cv);
    cpu::estimate_topk(s, table.data(), k, ci.data(), cv.data(), kernels::Order::Index);
    cu::estimate_topk(s, dt.get(), k, gi.get(), gv.get(), ws, nullptr, kernels::Order::Index);
    EXPECT_EQ(gi.host(), ci) << "by index: k=" << k;
    EXPECT_BITS_EQ(gv.host(), cv);
    if (k == 1000) {
      auto found = gi.host();
      std::sort(found.begin(), found.end());
      EXPECT_EQ(found, heavy);
    }
  }
}

/// Blocked hashing on the GPU against the CPU: the same window words; tables to rounding through
/// the vector-atomic path (aligned windows, whole groups) and the per-coordinate path (unaligned
/// windows, a slice off a group boundary, tiny blocks) and the tiles' bulk reductions (runs of a
/// window, of several windows, wrapping past the last column); estimates, top-k and FetchSGD's
/// reset bit for bit from one table; the first non-finite coordinate found on the vector path.
TEST(CudaBlocked, KernelsMatchTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  struct Shape {
    uint64_t dim;
    uint32_t rows, cols, block;
  };
  for (const Shape sh :
       {Shape{1000003, 5, 100000, 1024}, Shape{300007, 5, 20011, 1024}, Shape{200003, 3, 700, 1024},
        Shape{100003, 1, 4096, 4096}, Shape{50021, 2, 5000, 2}}) {
    SCOPED_TRACE(testing::Message()
                 << sh.dim << " " << sh.rows << "x" << sh.cols << " B" << sh.block);
    kernels::SketchLayout s{sh.dim, sh.rows, sh.cols, seed, nullptr};
    s.block = sh.block;
    const auto b = hash::blocked_shape(sh.block, sh.cols);
    const size_t nw = size_t(s.rows) * ((s.dim + b.size() - 1) >> b.shift);
    std::vector<uint32_t> words(nw);
    cpu::precompute_windows(s, words.data());
    Dev<uint32_t> dwords(nw);
    cu::precompute_windows(s, dwords.get());
    ASSERT_EQ(dwords.host(), words);
    kernels::SketchLayout sg = s;
    s.windows = words.data();
    sg.windows = dwords.get();

    auto x = test::gaussian(s.dim, seed + 1);
    test::plant(x, 500, 4.0f, seed + 2);
    Dev<float> dx(x);
    // The whole vector (tiles), a slice that starts off a group boundary (the per-coordinate
    // path), and one on a group boundary but off a window run (groups, then tiles, then groups).
    for (auto [off, len] : {std::pair<uint64_t, uint64_t>{0, s.dim},
                            {s.dim / 3 | 1, s.dim / 3},
                            {4 * 333, s.dim / 2}}) {
      std::vector<float> table(s.rows * s.cols, 0.0f);
      ASSERT_EQ(cpu::accumulate(s, table.data(), x.data() + off, len, off, -0.75f), kernels::kNone);
      Dev<float> dt(std::vector<float>(table.size(), 0.0f));
      Dev<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
      cu::accumulate(sg, dt.get(), dx.get() + off, len, off, -0.75f, bad.get());
      EXPECT_EQ(bad.host()[0], ~0ull);
      const auto gpu = dt.host();
      double worst = 0.0;
      for (size_t i = 0; i < table.size(); ++i)
        worst = std::max(worst, double(std::fabs(gpu[i] - table[i])));
      EXPECT_LT(worst, 1e-4) << "slice at " << off;
    }
    std::vector<float> table(s.rows * s.cols, 0.0f);
    cpu::accumulate(s, table.data(), x.data(), s.dim, 0, 1.0f);
    Dev<float> dt(table);
    std::vector<float> all(s.dim);
    cpu::estimate_all(s, table.data(), all.data());
    Dev<float> dall(s.dim);
    cu::estimate_all(sg, dt.get(), dall.get());
    EXPECT_BITS_EQ(dall.host(), all);
    cu::Workspace ws;
    for (size_t k : {size_t(1), size_t(500), size_t(s.dim / 10)}) {
      std::vector<uint32_t> ci(k);
      std::vector<float> cv(k);
      cpu::estimate_topk(s, table.data(), k, ci.data(), cv.data());
      Dev<uint32_t> gi(k);
      Dev<float> gv(k);
      cu::estimate_topk(sg, dt.get(), k, gi.get(), gv.get(), ws);
      EXPECT_EQ(gi.host(), ci) << "k=" << k;
      EXPECT_BITS_EQ(gv.host(), cv);
    }
    std::vector<uint32_t> idx = {0, 1, 2, 3, uint32_t(s.dim / 2), uint32_t(s.dim - 1)};
    cpu::zero_buckets(s, table.data(), idx.data(), idx.size());
    Dev<uint32_t> didx(idx);
    cu::zero_buckets(sg, dt.get(), didx.get(), idx.size());
    EXPECT_BITS_EQ(dt.host(), table);
    // A NaN on the vector path: reported at its own index.
    x[4 * 777 + 2] = std::nanf("");
    Dev<float> dnan(x);
    Dev<float> dz(std::vector<float>(table.size(), 0.0f));
    Dev<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
    cu::accumulate(sg, dz.get(), dnan.get(), s.dim, 0, 1.0f, bad.get());
    EXPECT_EQ(bad.host()[0], 4u * 777 + 2);
  }
}

/// The column path (window_order.hpp: a CTA per chunk, row and tile adds the blocks whose windows
/// start in its tile in shared memory, then the tile to the table) against the CPU, starting from
/// a table that already holds values: whole vectors and slices (one ending off a group: its last
/// values take the per-coordinate path), blocks of 256 (threads idle for part of a block) to 4,096
/// (four groups a thread; with tiles of 4,096), tiles whose region wraps past the last column,
/// several chunks; a NaN
/// reported at its own index with only its group of 4 left out; and a CountSketch on the GPU
/// taking that path with its own grouping.
TEST(CudaBlocked, ColumnPathMatchesTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  struct Shape {
    uint64_t dim;
    uint32_t rows, cols, block, chunk_shift, tile_shift;
  };
  for (const Shape sh :
       {Shape{4000037, 5, 60000, 1024, 20, 13}, Shape{3000017, 3, 40000, 4096, 21, 12},
        Shape{2000003, 4, 20000, 256, 23, 13}, Shape{1 << 22, 2, 10000, 1024, 19, 13},
        Shape{3000000, 2, 30000, 2048, 18, 13}}) {
    SCOPED_TRACE(testing::Message()
                 << sh.dim << " " << sh.rows << "x" << sh.cols << " B" << sh.block
                 << " chunks of 2^" << sh.chunk_shift << " tiles of 2^" << sh.tile_shift);
    kernels::SketchLayout s{sh.dim, sh.rows, sh.cols, seed, nullptr};
    s.block = sh.block;
    s.order.chunk_shift = sh.chunk_shift;
    s.order.tile_shift = sh.tile_shift;
    const auto b = hash::blocked_shape(sh.block, sh.cols);
    std::vector<uint32_t> words(size_t(s.rows) * ((s.dim + b.size() - 1) >> b.shift));
    cpu::precompute_windows(s, words.data());
    s.windows = words.data();
    std::vector<uint32_t> order(cpu::order_words(s));
    ASSERT_FALSE(order.empty());
    cpu::order_windows(s, order.data());
    Dev<uint32_t> dwords(words), dorder(order);
    kernels::SketchLayout sg = s;
    sg.windows = dwords.get();
    sg.order.words = dorder.get();

    auto x = test::gaussian(s.dim, seed + 1);
    test::plant(x, 500, 4.0f, seed + 2);
    Dev<float> dx(x);
    const auto base = test::gaussian(size_t(s.rows) * s.cols, seed + 3);
    auto compare = [&](const std::vector<float>& want, const std::vector<float>& got) {
      double worst = 0.0;
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, double(std::fabs(got[i] - want[i])));
      return worst;
    };
    for (auto [off, len] : {std::pair<uint64_t, uint64_t>{0, s.dim},
                            {4 * 12345, s.dim / 2},
                            {s.dim / 3 / 4 * 4, s.dim - s.dim / 3 / 4 * 4 - 1}}) {
      ASSERT_GE(len / 4 * 4, 8ull * s.cols);  // long enough for the column path
      std::vector<float> table = base;
      ASSERT_EQ(cpu::accumulate(s, table.data(), x.data() + off, len, off, -0.75f), kernels::kNone);
      Dev<float> dt(base);
      Dev<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
      cu::accumulate(sg, dt.get(), dx.get() + off, len, off, -0.75f, bad.get());
      EXPECT_EQ(bad.host()[0], ~0ull);
      EXPECT_LT(compare(table, dt.host()), 1e-4) << "slice at " << off << " of " << len;
    }
    // A NaN: reported at its index, its group of 4 left out, every other value added.
    const uint64_t at = s.dim / 2 + 4 * 1001 + 2;
    x[at] = std::nanf("");
    Dev<float> dnan(x);
    std::vector<float> skipped = x;
    std::fill(skipped.begin() + at / 4 * 4, skipped.begin() + at / 4 * 4 + 4, 0.0f);
    std::vector<float> table = base;
    ASSERT_EQ(cpu::accumulate(s, table.data(), skipped.data(), s.dim, 0, 1.0f), kernels::kNone);
    Dev<float> dt(base);
    Dev<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
    cu::accumulate(sg, dt.get(), dnan.get(), s.dim, 0, 1.0f, bad.get());
    EXPECT_EQ(bad.host()[0], at);
    EXPECT_LT(compare(table, dt.host()), 1e-4);
  }
  // A CountSketch on the GPU builds its grouping and takes the column path: its table equals the
  // CPU sketch's to rounding, a NaN leaves it as it was.
  SketchConfig c{1 << 22, 5, 50000, seed};
  ASSERT_TRUE(c.blocked());
  const auto gpu = Device::cuda(0);
  CountSketch onc(c), ong(c, gpu);
  EXPECT_NE(ong.layout().order.words, nullptr);
  EXPECT_EQ(onc.layout().order.words, nullptr);
  auto x = test::gaussian(c.dim, seed + 4);
  Dev<float> dx(x);
  onc.accumulate(x);
  ong.accumulate(std::span<const float>(dx.get(), c.dim));
  auto host = [](const CountSketch& k) {
    const CountSketch h = k.to(Device::cpu());
    return std::vector<float>(h.table().begin(), h.table().end());
  };
  const auto want = host(onc);
  const auto got = host(ong);
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, double(std::fabs(got[i] - want[i])));
  EXPECT_LT(worst, 1e-4);
  x[12345] = std::nanf("");
  Dev<float> dnan(x);
  EXPECT_THROW(ong.accumulate(std::span<const float>(dnan.get(), c.dim)), NonFiniteError);
  const auto after = host(ong);
  worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, double(std::fabs(after[i] - got[i])));
  EXPECT_LT(worst, 1e-4);  // taken back by the same pass with −scale
}

/// The exact CPU result (set, order and values) for one input and k.
void expect_topk_like_cpu(const std::vector<float>& x, size_t k, cu::Workspace& ws) {
  std::vector<uint32_t> ci(k);
  std::vector<float> cv(k);
  cpu::topk(x.data(), x.size(), k, ci.data(), cv.data());
  Dev<float> dx(x);
  Dev<uint32_t> gi(k);
  Dev<float> gv(k);
  cu::topk(dx.get(), x.size(), k, gi.get(), gv.get(), ws);
  EXPECT_EQ(gi.host(), ci) << "n=" << x.size() << " k=" << k;
  EXPECT_BITS_EQ(gv.host(), cv);
  // By index: the same k, sorted on the device.
  cpu::topk(x.data(), x.size(), k, ci.data(), cv.data(), kernels::Order::Index);
  cu::topk(dx.get(), x.size(), k, gi.get(), gv.get(), ws, nullptr, kernels::Order::Index);
  EXPECT_EQ(gi.host(), ci) << "by index: n=" << x.size() << " k=" << k;
  EXPECT_BITS_EQ(gv.host(), cv);
}

TEST(Cuda, TopkMatchesCpuOnRandomData) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  cu::Workspace ws;
  const auto x = test::gaussian(3000017, seed);
  for (size_t k : {size_t(1), size_t(7), size_t(30000), size_t(300001)})
    expect_topk_like_cpu(x, k, ws);
  const auto small = test::gaussian(1000, seed + 1);
  expect_topk_like_cpu(small, small.size(), ws);  // k = n
  expect_topk_like_cpu(small, 999, ws);
}

/// Ties at the threshold resolve by smallest index, whether they fit the candidate buffer (few
/// distinct values) or overflow it (a mostly zero vector, every value equal).
TEST(Cuda, TopkBreaksTiesByIndexLikeCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  cu::Workspace ws;
  std::vector<float> few(1 << 20);
  for (auto& v : few) v = float(int(rng() % 33) - 16) * 0.25f;  // 33 distinct values
  expect_topk_like_cpu(few, 100000, ws);
  std::vector<float> sparse(1 << 21, 0.0f);
  for (int i = 0; i < 1000; ++i) sparse[rng() % sparse.size()] = float(rng() % 1000 + 1);
  expect_topk_like_cpu(sparse, 150000, ws);  // 149,000+ zeros picked by index
  std::vector<float> equal(1 << 20, -2.5f);
  expect_topk_like_cpu(equal, 12345, ws);
}

TEST(Cuda, SelectionRejectsKAboveN) {
  REQUIRE_GPU();
  cu::Workspace ws;
  Dev<float> x(std::vector<float>(10, 1.0f));
  Dev<uint32_t> i(11);
  Dev<float> v(11);
  EXPECT_THROW(cu::topk(x.get(), 10, 11, i.get(), v.get(), ws), InvalidArgument);
}

TEST(Cuda, FailedAllocationIsACudaError) {
  REQUIRE_GPU();
  cu::Workspace ws;
  EXPECT_THROW(ws.get(size_t(1) << 52, nullptr), CudaError);
  EXPECT_NE(ws.get(1024, nullptr), nullptr);  // the workspace still works afterwards
}

TEST(Cuda, ZeroBucketsAndL2MatchCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  kernels::SketchLayout s{500000, 5, 40009, seed, nullptr};
  const auto x = test::gaussian(s.dim, seed);
  std::vector<float> table(s.rows * s.cols, 0.0f);
  cpu::accumulate(s, table.data(), x.data(), x.size(), 0, 1.0f);
  Dev<float> dt(table);
  cu::Workspace ws;
  Dev<double> l2(1);
  cu::l2_estimate(s, dt.get(), l2.get(), ws);
  EXPECT_NEAR(l2.host()[0], cpu::l2_estimate(s, table.data()),
              1e-5 * cpu::l2_estimate(s, table.data()));
  std::vector<uint32_t> idx{0, 17, 4242, 499999};
  cpu::zero_buckets(s, table.data(), idx.data(), idx.size());
  Dev<uint32_t> didx(idx);
  cu::zero_buckets(s, dt.get(), didx.get(), idx.size());
  EXPECT_BITS_EQ(dt.host(), table);
}

TEST(Cuda, VectorKernelsMatchCpuBitForBit) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const size_t n = 1000037;
  auto u = test::gaussian(n, seed), v = test::gaussian(n, seed + 1);
  const auto g = test::gaussian(n, seed + 2);
  Dev<float> du(u), dv(v), dg(g);
  cpu::momentum_accumulate(u.data(), v.data(), g.data(), n, 0.9f);
  cu::momentum_accumulate(du.get(), dv.get(), dg.get(), n, 0.9f);
  EXPECT_BITS_EQ(du.host(), u);
  EXPECT_BITS_EQ(dv.host(), v);
  cpu::axpy(v.data(), g.data(), n, -0.125f);
  cu::axpy(dv.get(), dg.get(), n, -0.125f);
  cpu::scale(v.data(), n, 0.3f);
  cu::scale(dv.get(), dv.get(), n, 0.3f);
  EXPECT_BITS_EQ(dv.host(), v);

  std::vector<uint32_t> idx(20000);
  std::mt19937 rng{uint32_t(seed)};
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = uint32_t(i * 50 + rng() % 50);  // distinct
  Dev<uint32_t> didx(idx);
  std::vector<float> got(idx.size());
  cpu::gather(v.data(), idx.data(), idx.size(), got.data());
  Dev<float> dgot(idx.size());
  cu::gather(dv.get(), didx.get(), idx.size(), dgot.get());
  EXPECT_BITS_EQ(dgot.host(), got);
  cpu::scatter_axpy(v.data(), idx.data(), got.data(), idx.size(), 2.5f);
  cu::scatter_axpy(dv.get(), didx.get(), dgot.get(), idx.size(), 2.5f);
  cpu::zero_at(u.data(), idx.data(), 100);
  cu::zero_at(du.get(), didx.get(), 100);
  cpu::scatter(u.data(), idx.data() + 100, got.data(), 100);
  cu::scatter(du.get(), didx.get() + 100, dgot.get(), 100);
  EXPECT_BITS_EQ(dv.host(), v);
  EXPECT_BITS_EQ(du.host(), u);

  auto bad = g;
  bad[654321] = -INFINITY;
  bad[700000] = std::nanf("");
  Dev<float> dbad(bad);
  Dev<unsigned long long> first(std::vector<unsigned long long>{~0ull});
  cu::find_nonfinite(dbad.get(), n, first.get());
  EXPECT_EQ(first.host()[0], 654321u);
  EXPECT_EQ(cpu::find_nonfinite(bad.data(), n), 654321u);

  // chunk 1 over 2^20 + 4099 values: more chunks than the kernel's grid (2^20 blocks), so blocks
  // stride over chunks.
  const size_t m = (size_t(1) << 20) + 4099;
  const auto h = test::gaussian(m, seed + 7);
  Dev<float> dh(h);
  for (const auto& [x, dx, len, chunk] :
       {std::tuple(&g, &dg, n, size_t(4099)), std::tuple(&h, &dh, m, size_t(1))}) {
    std::vector<kernels::ChunkStats> cs((len + chunk - 1) / chunk);
    cpu::chunk_stats(x->data(), len, chunk, cs.data());
    Dev<kernels::ChunkStats> dcs(cs.size());
    cu::chunk_stats(dx->get(), len, chunk, dcs.get());
    const auto gs = dcs.host();
    for (size_t c = 0; c < cs.size(); ++c) {
      ASSERT_EQ(gs[c].abs_max, cs[c].abs_max) << c;
      ASSERT_NEAR(gs[c].abs_mean, cs[c].abs_mean, 1e-6f * cs[c].abs_mean) << c;
      ASSERT_NEAR(gs[c].stddev, cs[c].stddev, 1e-6f * cs[c].stddev) << c;
    }
  }
}

// A round's runs moved by one launch per 16 (ops::scale_pieces): 40 runs of every length from 0
// up, copied bit for bit (a NaN's payload too) or scaled as the CPU scales, nothing else written.
TEST(Cuda, ScalePiecesCopiesAndScalesEveryRunLikeTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::vector<uint64_t> lengths;
  for (uint64_t i = 0; i < 40; ++i) lengths.push_back(i * i * 37 % 5000);
  uint64_t total = 0;
  for (auto n : lengths) total += n;
  auto src = test::gaussian(total, seed);
  src[3] = std::bit_cast<float>(0x7fc01234u);  // a NaN with a payload
  Dev<float> dsrc(src);
  for (const float a : {1.0f, 0.25f}) {
    Dev<float> ddst(2 * total);  // every run at twice its offset: gaps left as they were
    std::vector<kernels::Piece> pieces;
    auto want = ddst.host();
    uint64_t at = 0, nan_at = 0;
    for (auto n : lengths) {
      if (at <= 3 && 3 < at + n) nan_at = 2 * at + (3 - at);
      pieces.push_back({ddst.get() + 2 * at, dsrc.get() + at, n});
      for (uint64_t j = 0; j < n; ++j) want[2 * at + j] = a == 1.0f ? src[at + j] : a * src[at + j];
      at += n;
    }
    ops::scale_pieces(Device::cuda(), pieces, a);
    auto got = ddst.host();
    if (a != 1.0f) {  // a product of a NaN is some NaN (the device's has no payload)
      EXPECT_TRUE(std::isnan(got[nan_at]));
      got[nan_at] = want[nan_at];
    }
    EXPECT_BITS_EQ(got, want) << a;
  }
}

// The server's outer optimisers (elem::adagrad, elem::adam, compiled with --fmad=false): the
// device's weights and moments are the CPU's bits, step after step.
TEST(Cuda, OuterOptimisersMatchCpuBitForBit) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const size_t n = 300007;
  auto w = test::gaussian(n, seed), m = std::vector<float>(n), v = std::vector<float>(n);
  auto w2 = w, v2 = v;
  Dev<float> dw(w), dm(m), dv(v), dw2(w2), dv2(v2);
  for (int t = 1; t <= 3; ++t) {
    const auto s = test::gaussian(n, seed + t, 0.01f * float(t));
    Dev<float> ds(s);
    const float c1 = 1.0f - std::pow(0.9f, float(t)), c2 = 1.0f - std::pow(0.999f, float(t));
    cpu::adam(w.data(), m.data(), v.data(), s.data(), n, 0.01f, 0.9f, 0.999f, c1, c2, 1e-8f);
    cu::adam(dw.get(), dm.get(), dv.get(), ds.get(), n, 0.01f, 0.9f, 0.999f, c1, c2, 1e-8f);
    cpu::adagrad(w2.data(), v2.data(), s.data(), n, 0.1f, 1e-10f);
    cu::adagrad(dw2.get(), dv2.get(), ds.get(), n, 0.1f, 1e-10f);
  }
  EXPECT_BITS_EQ(dw.host(), w);
  EXPECT_BITS_EQ(dm.host(), m);
  EXPECT_BITS_EQ(dv.host(), v);
  EXPECT_BITS_EQ(dw2.host(), w2);
  EXPECT_BITS_EQ(dv2.host(), v2);
}

/// The update's delta-coded indices: the device's lengths, scan and writes give the CPU's bytes,
/// for gaps of every varint length.
TEST(Cuda, DeltaCodingMatchesTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  cu::Workspace ws;
  for (size_t n : {size_t(1), size_t(5), size_t(100003)}) {
    std::vector<uint32_t> idx;
    const uint64_t budget = (uint64_t(1) << 32) / n;  // the last index stays below 2^32
    for (uint64_t next = 0; idx.size() < n;) {
      const uint64_t gap = (rng() & ((uint64_t(1) << (rng() % 33)) - 1)) % budget;
      idx.push_back(uint32_t(next + gap));
      next += gap + 1;
    }
    std::vector<uint8_t> want(cpu::delta_bytes(idx.data(), n));
    cpu::delta_encode(idx.data(), n, want.data());
    Dev<uint32_t> di(idx);
    Dev<uint8_t> out(5 * n);
    ASSERT_EQ(cu::delta_encode(di.get(), n, out.get(), ws), want.size()) << n;
    auto got = out.host();
    got.resize(want.size());
    EXPECT_EQ(got, want) << n;
  }
}

TEST(Cuda, PackingMatchesCpuBitForBit) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (size_t n : {size_t(1), size_t(31), size_t(1000037)}) {
    auto x = test::gaussian(n, seed + n);
    for (size_t j = 0; j < n; j += 97) x[j] = 0.0f;  // ternary zero codes
    Dev<float> dx(x);
    const size_t nw = (n + 31) / 32, nb = (n + 3) / 4, chunk = 1000;
    std::vector<uint32_t> words(nw);
    cpu::pack_signs(x.data(), n, words.data());
    Dev<uint32_t> dw(nw);
    cu::pack_signs(dx.get(), n, dw.get());
    EXPECT_EQ(dw.host(), words) << n;

    std::vector<float> scales((n + chunk - 1) / chunk);
    for (size_t c = 0; c < scales.size(); ++c) scales[c] = 0.5f + float(c % 7);
    scales[0] = 0.0f;  // a zero scale codes everything as 0
    Dev<float> ds(scales);
    std::vector<float> out = test::gaussian(n, seed);
    Dev<float> dout(out);
    cpu::unpack_signs(words.data(), n, chunk, scales.data(), out.data(), true);
    cu::unpack_signs(dw.get(), n, chunk, ds.get(), dout.get(), true);
    EXPECT_BITS_EQ(dout.host(), out);
    std::vector<uint32_t> neg(n, 3);
    Dev<uint32_t> dneg(neg);
    cpu::count_negative(words.data(), n, neg.data());
    cu::count_negative(dw.get(), n, dneg.get());
    EXPECT_EQ(dneg.host(), neg);

    std::vector<uint8_t> codes(nb);
    Dev<uint8_t> dc(nb);
    cpu::ternarize(x.data(), n, chunk, scales.data(), seed, 42, codes.data());
    cu::ternarize(dx.get(), n, chunk, ds.get(), seed, 42, dc.get());
    EXPECT_EQ(dc.host(), codes) << n;
    cpu::pack_ternary(x.data(), n, codes.data());
    cu::pack_ternary(dx.get(), n, dc.get());
    EXPECT_EQ(dc.host(), codes) << n;

    Dev<unsigned long long> bad(std::vector<unsigned long long>{~0ull});
    ASSERT_EQ(cpu::unpack_ternary(codes.data(), n, chunk, scales.data(), 0.25f, out.data(), true),
              kernels::kNone);
    cu::unpack_ternary(dc.get(), n, chunk, ds.get(), 0.25f, dout.get(), true, bad.get());
    EXPECT_EQ(bad.host()[0], ~0ull);
    EXPECT_BITS_EQ(dout.host(), out);

    // An invalid code: nothing is written, the position is reported.
    auto corrupt = codes;
    corrupt[nb / 2] |= 0x3u;
    Dev<uint8_t> dcor(corrupt);
    const auto before = dout.host();
    cu::unpack_ternary(dcor.get(), n, chunk, ds.get(), 1.0f, dout.get(), false, bad.get());
    EXPECT_EQ(bad.host()[0], nb / 2 * 4);
    EXPECT_BITS_EQ(dout.host(), before);
  }
}

/// Factors of several shapes orthonormalised at once as the CPU does one by one: CholeskyQR2 for
/// the well-conditioned ones (ranks that fill a Gram tile, leave it part full, one row), and
/// Gram-Schmidt for a factor with a zero column, one past CholeskyQR2's ranks, and all of them
/// where R is asked for.
TEST(Cuda, OrthonormalizeMatchesCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::vector<kernels::Factor> list;
  uint64_t at = 0, r_at = 0;
  for (auto [n, r] : {std::pair<uint64_t, uint64_t>{300, 1},
                      {1000, 4},
                      {77, 8},
                      {513, 16},
                      {2050, 20},
                      {40, 3},
                      {150, 70},
                      {64, 64}}) {
    list.push_back({at, n, r, r_at});
    at += n * r;
    r_at += r * r;
  }
  auto base = test::gaussian(at, seed);
  const auto& z = list[3];  // its column 5 is zero
  for (uint64_t j = 0; j < z.rows; ++j) base[z.at + j * z.rank + 5] = 0.0f;
  auto want = base;
  std::vector<float> want_r(r_at, -1.0f);
  for (const auto& f : list)
    kernels::cpu::orthonormalize(want.data() + f.at, f.rows, f.rank, want_r.data() + f.r_at);
  Dev<kernels::Factor> dl(list);
  gpu::Workspace ws;
  for (bool with_r : {true, false}) {
    SCOPED_TRACE(with_r ? "Gram-Schmidt, with R" : "CholeskyQR2");
    Dev<float> d(base), dr(r_at);
    cu::orthonormalize(d.get(), list, dl.get(), with_r ? dr.get() : nullptr, ws);
    const auto got = d.host();
    for (const auto& f : list)
      for (uint64_t e = 0; e < f.rows * f.rank; ++e)
        ASSERT_NEAR(got[f.at + e], want[f.at + e], 2e-5f) << f.rows << "x" << f.rank << " " << e;
    for (uint64_t j = 0; j < z.rows; ++j) ASSERT_EQ(got[z.at + j * z.rank + 5], 0.0f);
    if (with_r) {
      const auto got_r = dr.host();
      for (size_t i = 0; i < r_at; ++i)
        ASSERT_NEAR(got_r[i], want_r[i], 1e-4f * (1.0f + std::fabs(want_r[i]))) << i;
    }
  }
  // The same bits every time (the ranks of a job must agree).
  Dev<float> d1(base), d2(base);
  cu::orthonormalize(d1.get(), list, dl.get(), nullptr, ws);
  cu::orthonormalize(d2.get(), list, dl.get(), nullptr, ws);
  EXPECT_BITS_EQ(d1.host(), d2.host());
}

/// Rounding to 16-bit floats as the wire carries them: the CPU's conversions bit for bit, and the
/// first value beyond fp16 reported.
TEST(Cuda, RoundHalfMatchesTheWireFormats) {
  REQUIRE_GPU();
  auto x = test::gaussian(100003, fresh_seed(), 100.0f);
  x[5] = 1e-9f;
  x[6] = -0.0f;
  x[7] = 65519.0f;
  for (bool bf16 : {false, true}) {
    Dev<float> d(x);
    Dev<unsigned long long> flag(std::vector<unsigned long long>{~0ull});
    cu::round_half(d.get(), x.size(), bf16, flag.get());
    auto want = x;
    for (auto& v : want) v = bf16 ? bf16_float(bf16_bits(v)) : half_float(half_bits(v));
    EXPECT_BITS_EQ(d.host(), want) << bf16;
    EXPECT_EQ(flag.host()[0], ~0ull);
  }
  x[4321] = 70000.0f;  // beyond fp16, not bf16
  x[99999] = -1e6f;
  Dev<float> d(x);
  Dev<unsigned long long> flag(std::vector<unsigned long long>{~0ull});
  cu::round_half(d.get(), x.size(), false, flag.get());
  EXPECT_EQ(flag.host()[0], 4321u);
}

}  // namespace
}  // namespace sketchsgd
