// Blocked count-sketch hashing: window geometry at the edges, the fast CPU kernels against a plain
// per-coordinate loop over the same hash functions (bit for bit, any thread count), linearity,
// serialisation (and the older format), the codec option, and heavy-hitter recovery equal to
// random hashing over many seeds.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <tuple>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include <sketchsgd/kernels/hash.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include <sketchsgd/kernels/window_order.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

namespace cpu = kernels::cpu;

TEST(BlockedHash, WindowShapeAtTheEdges) {
  const auto b = hash::blocked_shape(1024, 100000);
  EXPECT_EQ(b.size(), 1024u);
  EXPECT_EQ(b.lanes, 3u);
  EXPECT_TRUE(b.aligned);
  EXPECT_FALSE(hash::blocked_shape(1024, 100001).aligned);
  // Fewer columns than the block: the block shrinks to the largest power of two ≤ cols, so a
  // window never overlaps itself.
  EXPECT_EQ(hash::blocked_shape(1024, 700).size(), 512u);
  EXPECT_EQ(hash::blocked_shape(1024, 3).size(), 2u);
  EXPECT_EQ(hash::blocked_shape(1024, 3).lanes, 1u);
  EXPECT_EQ(hash::blocked_shape(1024, 1).size(), 1u);
  EXPECT_EQ(hash::blocked_shape(1, 1000).size(), 1u);
  EXPECT_EQ(hash::blocked_shape(1, 1000).lanes, 0u);
  // Window starts are multiples of 4 when aligned, and every column is reachable.
  std::set<uint32_t> starts;
  const hash::RowHash h = hash::window_hash(7, 0);
  for (uint32_t blk = 0; blk < 20000; ++blk) {
    const uint32_t w = hash::window_word(h, blk);
    const uint32_t s = hash::window_start(w, 1000, true);
    ASSERT_LT(s, 1000u);
    ASSERT_EQ(s % 4, 0u);
    starts.insert(s);
    ASSERT_LT(hash::window_start(w, 999, false), 999u);
  }
  EXPECT_EQ(starts.size(), 250u);
}

TEST(BlockedHash, PositionsOfOneBlockNeverCollideAndPairsCollideAtRateOneOverC) {
  const uint32_t cols = 64, block = 16;
  const auto b = hash::blocked_shape(block, cols);
  const hash::RowHash wh = hash::window_hash(3, 0);
  for (uint32_t blk = 0; blk < 200; ++blk) {
    std::set<uint32_t> seen;
    const uint32_t w = hash::window_word(wh, blk);
    for (uint32_t t = 0; t < b.size(); ++t) seen.insert(hash::window_column(w, t, cols, b));
    ASSERT_EQ(seen.size(), b.size()) << "block " << blk;
  }
  // Over many seeds, a fixed pair of coordinates in different blocks collides in about 1/c of
  // the rows (the analysis in hash.hpp), whatever their positions.
  for (auto [j1, j2] :
       {std::pair<uint32_t, uint32_t>{5, 21}, {0, 1000}, {3, 35}, {17, 16 * 9 + 1}}) {
    int hits = 0;
    const int trials = 64000;
    for (int s = 0; s < trials; ++s) {
      const hash::RowHash h = hash::window_hash(uint64_t(s), 0);
      const uint32_t a = hash::window_column(hash::window_word(h, j1 / block), j1 % block, cols, b);
      const uint32_t c = hash::window_column(hash::window_word(h, j2 / block), j2 % block, cols, b);
      hits += a == c;
    }
    EXPECT_NEAR(double(hits) / trials, 1.0 / cols, 0.25 / cols) << j1 << ", " << j2;
  }
}

/// The sketch of x computed the plain way: one coordinate at a time, through locate_blocked.
std::vector<float> plain_table(const kernels::SketchLayout& s, const std::vector<uint32_t>& words,
                               const float* x, size_t n, uint64_t offset, float scale) {
  const auto b = hash::blocked_shape(s.block, s.cols);
  const uint64_t blocks = (s.dim + b.size() - 1) >> b.shift;
  std::vector<float> t(size_t(s.rows) * s.cols, 0.0f);
  for (uint32_t r = 0; r < s.rows; ++r) {
    const hash::RowHash sh = hash::sign_hash(s.seed, r);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t j = offset + i;
      const uint32_t p =
          hash::locate_blocked(words[r * blocks + (j >> b.shift)], sh, uint32_t(j), s.cols, b);
      t[size_t(r) * s.cols + hash::bucket_of(p)] += hash::apply_sign(p, scale * x[i]);
    }
  }
  return t;
}

struct Shape {
  uint64_t dim;
  uint32_t rows, cols, block;
};

class BlockedKernels : public ::testing::TestWithParam<Shape> {};

TEST_P(BlockedKernels, FastPathsEqualThePlainLoopBitForBitOnAnyThreadCount) {
  const Shape sh = GetParam();
  kernels::SketchLayout s{sh.dim, sh.rows, sh.cols, 11};
  s.block = sh.block;
  const auto b = hash::blocked_shape(sh.block, sh.cols);
  std::vector<uint32_t> words(size_t(s.rows) * ((s.dim + b.size() - 1) >> b.shift));
  cpu::precompute_windows(s, words.data());
  s.windows = words.data();
  const auto x = test::gaussian(s.dim, 5);
  // Whole vectors and slices that start and end off block and group boundaries.
  for (auto [off, len] :
       {std::pair<uint64_t, uint64_t>{0, s.dim}, {3, s.dim - 10}, {s.dim / 2 + 1, s.dim / 3}}) {
    SCOPED_TRACE(testing::Message() << "slice " << off << "+" << len);
    const auto want = plain_table(s, words, x.data() + off, len, off, -0.5f);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> t(want.size(), 0.0f);
      ASSERT_EQ(cpu::accumulate(s, t.data(), x.data() + off, len, off, -0.5f), kernels::kNone);
      EXPECT_EQ(std::memcmp(t.data(), want.data(), t.size() * 4), 0) << threads << " threads";
    }
    omp_set_num_threads(2);
  }
  // Estimates: the windows gathered in runs equal the median of per-coordinate lookups.
  std::vector<float> t(size_t(s.rows) * s.cols, 0.0f);
  cpu::accumulate(s, t.data(), x.data(), s.dim, 0, 1.0f);
  std::vector<float> all(s.dim);
  cpu::estimate_all(s, t.data(), all.data());
  std::vector<uint32_t> idx(s.dim);
  for (uint32_t j = 0; j < s.dim; ++j) idx[j] = j;
  std::vector<float> one(s.dim);
  cpu::estimate(s, t.data(), idx.data(), s.dim, one.data());
  EXPECT_EQ(std::memcmp(all.data(), one.data(), s.dim * 4), 0);
  const uint64_t blocks = (s.dim + b.size() - 1) >> b.shift;
  for (uint32_t j = 0; j < s.dim; j += 97) {
    float v[elem::kMaxRows];
    for (uint32_t r = 0; r < s.rows; ++r) {
      const uint32_t p = hash::locate_blocked(words[r * blocks + (j >> b.shift)],
                                              hash::sign_hash(s.seed, r), j, s.cols, b);
      v[r] = hash::apply_sign(p, t[size_t(r) * s.cols + hash::bucket_of(p)]);
    }
    ASSERT_EQ(all[j], elem::median_inplace(v, int(s.rows))) << j;
  }
  // FetchSGD's reset zeroes exactly the cells the coordinates hash to.
  std::vector<uint32_t> some = {0, 1, uint32_t(s.dim / 2), uint32_t(s.dim - 1)};
  std::vector<float> z = t;
  cpu::zero_buckets(s, z.data(), some.data(), some.size());
  std::set<size_t> cells;
  for (uint32_t j : some)
    for (uint32_t r = 0; r < s.rows; ++r)
      cells.insert(size_t(r) * s.cols +
                   hash::bucket_of(hash::locate_blocked(words[r * blocks + (j >> b.shift)],
                                                        hash::sign_hash(s.seed, r), j, s.cols, b)));
  for (size_t i = 0; i < z.size(); ++i) ASSERT_EQ(z[i], cells.count(i) ? 0.0f : t[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BlockedKernels,
    ::testing::Values(Shape{100003, 5, 4000, 1024},  // windows wrap at c; d not a multiple of B
                      Shape{50000, 3, 4001, 1024},   // c not a multiple of 4: unaligned windows
                      Shape{20000, 5, 700, 1024},    // c < B: the block shrinks to 512
                      Shape{30011, 32, 256, 64},     // 32 rows
                      Shape{10007, 1, 4096, 4096},   // one row, B = c: every window wraps
                      Shape{9001, 2, 3, 1024},       // c = 3: blocks of 2, no vector groups
                      Shape{12000, 4, 1000, 1}));    // B = 1: every coordinate its own block

// ---- the grouping by window (window_order.hpp): what the GPU's column path reads ----------------

struct Grouped {
  kernels::SketchLayout s;
  std::vector<uint32_t> words, order;
  kernels::OrderShape o;
};

Grouped grouped(uint64_t dim, uint32_t rows, uint32_t cols, uint32_t block, uint32_t chunk_shift,
                uint32_t tile_shift, uint64_t seed) {
  Grouped g{kernels::SketchLayout{dim, rows, cols, seed}, {}, {}, {}};
  g.s.block = block;
  g.s.order.chunk_shift = chunk_shift;
  g.s.order.tile_shift = tile_shift;
  const auto b = hash::blocked_shape(block, cols);
  g.words.resize(size_t(rows) * ((dim + b.size() - 1) >> b.shift));
  cpu::precompute_windows(g.s, g.words.data());
  g.s.windows = g.words.data();
  g.order.resize(cpu::order_words(g.s));
  if (!g.order.empty()) cpu::order_windows(g.s, g.order.data());
  g.o = kernels::order_shape(dim, cols, b, g.s.order);
  return g;
}

TEST(BlockedOrder, ListsEveryBlockOnceUnderTheChunkAndTileOfItsWindow) {
  for (auto [dim, cols, block, chunk, tile] :
       {std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, uint32_t>{1000003, 20000, 1024, 17, 12},
        {2000000, 9000, 4096, 20, 12},   // a region (T + B) wider than half the table
        {300001, 7000, 256, 14, 10},     // d not a multiple of B: a short last block
        {65536, 6000, 1024, 30, 12}}) {  // one chunk
    SCOPED_TRACE(testing::Message() << dim << " c" << cols << " B" << block);
    const Grouped g = grouped(dim, 3, cols, block, chunk, tile, dim);
    ASSERT_EQ(g.order.size(), 3 * g.o.per_row);
    ASSERT_EQ(g.o.tiles, (cols + (1u << tile) - 1) >> tile);
    for (uint32_t r = 0; r < 3; ++r) {
      const uint32_t* row = g.order.data() + r * g.o.per_row;
      const uint32_t* first = row + g.o.blocks;
      ASSERT_EQ(first[0], 0u);
      ASSERT_EQ(first[g.o.items()], g.o.blocks);
      std::vector<int> seen(g.o.blocks, 0);
      for (uint64_t item = 0; item < g.o.items(); ++item) {
        ASSERT_LE(first[item], first[item + 1]);
        for (uint32_t at = first[item]; at < first[item + 1]; ++at) {
          const uint32_t blk = row[at];
          ASSERT_LT(blk, g.o.blocks);
          ++seen[blk];
          EXPECT_EQ(blk >> g.o.chunk_blocks, item % g.o.chunks);
          const uint32_t start =
              hash::window_start(g.words[r * g.o.blocks + blk], cols, /*aligned=*/true);
          EXPECT_EQ(start >> tile, item / g.o.chunks);
          // A tile's blocks ascend through its chunks: its list is in gradient order.
          if (at > first[item / g.o.chunks * g.o.chunks]) EXPECT_LT(row[at - 1], blk);
        }
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), int64_t(g.o.blocks));
    }
  }
}

TEST(BlockedOrder, OnlyShapesTheColumnPathTakesGetOne) {
  EXPECT_GT(grouped(1 << 20, 5, 20000, 1024, 23, 12, 1).order.size(), 0u);
  EXPECT_EQ(grouped(1 << 20, 5, 20001, 1024, 23, 12, 1).order.size(), 0u);  // unaligned windows
  EXPECT_EQ(grouped(1 << 20, 5, 5116, 1024, 23, 12, 1).order.size(), 0u);   // c < T + B
  EXPECT_GT(grouped(1 << 20, 5, 5120, 1024, 23, 12, 1).order.size(), 0u);   // c = T + B
  // A region (T + B floats) over 44 KiB: more shared memory than a launch gets by default.
  EXPECT_EQ(grouped(1 << 20, 5, 40000, 8192, 23, 12, 1).order.size(), 0u);
  EXPECT_EQ(grouped(1 << 20, 5, 40000, 4096, 23, 13, 1).order.size(), 0u);
  EXPECT_GT(grouped(1 << 20, 5, 40000, 4096, 23, 12, 1).order.size(), 0u);
  EXPECT_GT(grouped(1 << 20, 5, 40000, 2048, 23, 13, 1).order.size(), 0u);
  EXPECT_EQ(grouped(1 << 20, 5, 20000, 2, 23, 12, 1).order.size(), 0u);     // no groups of 4
  EXPECT_EQ(grouped(1 << 20, 5, 20000, 1024, 23, 14, 1).order.size(), 0u);  // region > 48 KiB
  // A table about as wide as the gradient: more items than blocks, nothing to save.
  EXPECT_EQ(grouped(1 << 16, 5, 1 << 16, 16, 4, 2, 1).order.size(), 0u);
  kernels::SketchLayout random{1 << 20, 5, 20000, 1};
  EXPECT_EQ(cpu::order_words(random), 0u);
  // A CPU sketch keeps the window words alone; the grouping is made for GPUs only.
  kernels::SketchLayout l{1 << 20, 5, 20000, 1};
  l.block = 1024;
  EXPECT_EQ(ops::precomputed_words(Device::cpu(), l), 5u * 1024);
  EXPECT_EQ(ops::with_precomputed(Device::cpu(), l, nullptr).order.words, nullptr);
}

/// The column path in plain loops, as the CUDA kernel runs it: per (row, tile) a region of T + B
/// floats gets the signed values of every listed block of the chunks the slice overlaps at its
/// window's offset from the tile's first column (lanes in the window's order), then goes into the
/// table piece by piece, wrapping past the last column.
std::vector<float> by_columns(const Grouped& g, const float* x, uint64_t lo, uint64_t hi,
                              float scale) {
  const auto& s = g.s;
  const auto b = hash::blocked_shape(s.block, s.cols);
  std::vector<float> table(size_t(s.rows) * s.cols, 0.0f), region(g.o.region);
  const uint64_t chunk0 = (lo >> b.shift) >> g.o.chunk_blocks;
  const uint64_t chunk1 = (((hi - 1) >> b.shift) >> g.o.chunk_blocks) + 1;
  for (uint64_t item = 0; item < uint64_t(s.rows) * g.o.tiles; ++item) {
    const uint32_t r = uint32_t(item / g.o.tiles), tile = uint32_t(item % g.o.tiles);
    const uint32_t* row = g.order.data() + r * g.o.per_row;
    const uint32_t* first = row + g.o.blocks + uint64_t(tile) * g.o.chunks;
    const uint32_t tile_col = tile * g.o.tile;
    std::fill(region.begin(), region.end(), 0.0f);
    for (uint32_t at = first[chunk0]; at < first[chunk1]; ++at) {
      const uint32_t w = g.words[r * g.o.blocks + row[at]];
      const uint32_t rel = hash::window_start(w, s.cols, true) - tile_col;
      EXPECT_LT(rel, g.o.tile);
      for (uint32_t t = 0; t < b.size(); ++t) {
        const uint64_t j = (uint64_t(row[at]) << b.shift) + t;
        if (j < lo || j >= hi) continue;
        const float v = hash::apply_sign(hash::sign_bit(hash::sign_hash(s.seed, r), uint32_t(j)),
                                         scale * x[j - lo]);
        region[rel + (t ^ (w & b.lanes))] += v;
      }
    }
    for (uint32_t p = 0; p < g.o.region;) {
      const auto piece = kernels::region_piece(tile_col, p, g.o.region, s.cols, 1024);
      EXPECT_LE(piece.col + piece.len, s.cols);
      EXPECT_GT(piece.len, 0u);
      for (uint32_t i = 0; i < piece.len; ++i) table[r * s.cols + piece.col + i] += region[p + i];
      p += piece.len;
    }
  }
  return table;
}

TEST(BlockedOrder, AddingEachTilesRegionOnceEqualsTheAccumulate) {
  for (auto [dim, cols, block, chunk] :
       {std::tuple<uint64_t, uint32_t, uint32_t, uint32_t>{1000003, 20000, 1024, 18},
        {600000, 9000, 4096, 19},  // the last tile's region wraps past the last column
        {300001, 6000, 256, 30}}) {
    SCOPED_TRACE(testing::Message() << dim << " c" << cols << " B" << block);
    const Grouped g = grouped(dim, 5, cols, block, chunk, 12, cols);
    ASSERT_FALSE(g.order.empty());
    const auto x = test::gaussian(dim, dim + 1);
    for (auto [lo, hi] : {std::pair<uint64_t, uint64_t>{0, dim}, {4 * 1001, dim / 2}}) {
      std::vector<float> want(size_t(5) * cols, 0.0f);
      ASSERT_EQ(cpu::accumulate(g.s, want.data(), x.data() + lo, hi - lo, lo, -0.75f),
                kernels::kNone);
      const auto got = by_columns(g, x.data() + lo, lo, hi, -0.75f);
      double worst = 0.0;
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, double(std::fabs(got[i] - want[i])));
      EXPECT_LT(worst, 1e-4) << "slice " << lo << " … " << hi;
    }
  }
}

TEST(BlockedSketch, IsLinearAndItsTopKNearDEqualsTheEstimates) {
  SketchConfig c{20011, 5, 2000, 9};
  ASSERT_TRUE(c.blocked());
  CountSketch a(c), b(c), ab(c);
  const auto x = test::gaussian(c.dim, 1), y = test::gaussian(c.dim, 2);
  std::vector<float> xy(c.dim);
  for (size_t j = 0; j < c.dim; ++j) xy[j] = x[j] + y[j];
  a.accumulate(x);
  b.accumulate(y);
  ab.accumulate(xy);
  a += b;
  for (size_t i = 0; i < a.table().size(); ++i) ASSERT_NEAR(a.table()[i], ab.table()[i], 1e-4);
  // k close to d: the top-k is every estimate, ordered by magnitude.
  const auto all = ab.estimate_all();
  const auto top = ab.top_k(c.dim - 1);
  ASSERT_EQ(top.indices.size(), c.dim - 1);
  for (size_t i = 0; i < top.indices.size(); ++i) ASSERT_EQ(top.values[i], all[top.indices[i]]);
  for (size_t i = 1; i < top.values.size(); ++i)
    ASSERT_GE(std::fabs(top.values[i - 1]), std::fabs(top.values[i]));
  // Blocked and random sketches of one config never merge.
  SketchConfig r = c;
  r.hashing = Hashing::OnTheFly;
  CountSketch other(r);
  EXPECT_THROW(a += other, ConfigMismatch);
  SketchConfig wider = c;
  wider.block = 512;
  EXPECT_THROW(a += CountSketch(wider), ConfigMismatch);
}

/// One-row blocked sketches select over columns weighted by their coordinates, not over every
/// estimate: the result must still be the reference order of all estimates (|value| descending,
/// index ascending) or its index-sorted form, with heavy ties (a table of few distinct
/// magnitudes, zero columns), partial last blocks, unaligned and tiny windows, any thread count.
struct OneRow {
  uint64_t dim;
  uint32_t cols, block;
};
class OneRowTopK : public testing::TestWithParam<OneRow> {};

TEST_P(OneRowTopK, EqualsSortingEveryEstimateWithTiesAndAnyThreadCount) {
  const auto [dim, cols, block] = GetParam();
  SketchConfig c{dim, 1, cols, 5};
  c.block = block;
  for (bool quantised : {false, true}) {
    CountSketch s(c);
    auto t = test::gaussian(cols, cols + block);
    if (quantised)  // magnitudes 0, 0.5, 1, …: every selection ends in a tie
      for (auto& v : t) v = std::round(v * 2) / 2;
    s.add_table(t);
    const auto est = s.estimate_all();
    std::vector<uint32_t> order(dim);
    for (uint32_t j = 0; j < dim; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const float fa = std::fabs(est[a]), fb = std::fabs(est[b]);
      return fa != fb ? fa > fb : a < b;
    });
    for (uint64_t k : {uint64_t(1), dim / 100 + 1, dim / 7, dim}) {
      std::vector<uint32_t> want(order.begin(), order.begin() + k);
      std::vector<uint32_t> sorted = want;
      std::sort(sorted.begin(), sorted.end());
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        const TopK by_value = s.top_k(k), by_index = s.top_k(k, TopKOrder::Index);
        ASSERT_EQ(by_value.indices, want) << "k=" << k << " threads=" << threads;
        ASSERT_EQ(by_index.indices, sorted) << "k=" << k << " threads=" << threads;
        for (size_t i = 0; i < k; ++i) {
          ASSERT_EQ(by_value.values[i], est[by_value.indices[i]]);
          ASSERT_EQ(by_index.values[i], est[by_index.indices[i]]);
        }
      }
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

INSTANTIATE_TEST_SUITE_P(Shapes, OneRowTopK,
                         testing::Values(OneRow{200000, 9000, 1024},   // aligned, partial tail
                                         OneRow{131072, 4096, 1024},   // whole blocks only
                                         OneRow{50001, 9001, 1024},    // unaligned windows
                                         OneRow{20000, 700, 1024},     // the block shrinks
                                         OneRow{9001, 3, 1024},        // blocks of 2
                                         OneRow{12000, 1000, 1},       // one coordinate a block
                                         OneRow{70000, 1024, 1024}));  // B = c: windows wrap

TEST(BlockedSketch, SerialisesItsModeAndReadsTheOlderFormat) {
  SketchConfig c{5000, 3, 400, 4};
  c.block = 256;
  CountSketch s(c);
  s.accumulate(test::gaussian(c.dim, 3));
  const Bytes bytes = s.serialize();
  const CountSketch back = CountSketch::deserialize(bytes);
  EXPECT_EQ(back.config().hashing, Hashing::Blocked);
  EXPECT_EQ(back.config().block, 256u);
  EXPECT_EQ(back.estimate_all(), s.estimate_all());
  // Version-1 bytes (random hashing only) are still read.
  SketchConfig r = c;
  r.hashing = Hashing::OnTheFly;
  CountSketch old(r);
  old.accumulate(test::gaussian(c.dim, 3));
  Bytes v1 = old.serialize();
  v1[4] = 1;
  const uint32_t crc = crc32c(std::span<const uint8_t>(v1).first(v1.size() - 4));
  std::memcpy(v1.data() + v1.size() - 4, &crc, 4);
  EXPECT_EQ(CountSketch::deserialize(v1).estimate_all(), old.estimate_all());
  // A version-1 header claiming blocked hashing, or a bad block byte, is refused with a reason.
  auto patched = [](Bytes b, size_t at, uint8_t v) {
    b[at] = v;
    const uint32_t k = crc32c(std::span<const uint8_t>(b).first(b.size() - 4));
    std::memcpy(b.data() + b.size() - 4, &k, 4);
    return b;
  };
  EXPECT_THROW(CountSketch::deserialize(patched(patched(bytes, 4, 1), 4, 1)), WireError);
  try {
    CountSketch::deserialize(patched(bytes, 7, 17));
    FAIL();
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("block"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CountSketch::deserialize(patched(v1, 7, 3)), WireError);  // random with a block
}

TEST(BlockedCodec, TheModeIsPartOfTheCanonicalSpec) {
  const auto def = make_compressor("sketch:k=10", 1000);
  EXPECT_NE(def->spec().find("hashing=blocked,block=1024"), std::string::npos) << def->spec();
  EXPECT_EQ(make_compressor("sketch:k=10,hashing=2", 1000)->spec(), def->spec());
  const auto rnd = make_compressor("sketch:k=10,hashing=random", 1000);
  EXPECT_NE(rnd->spec(), def->spec());
  EXPECT_EQ(make_compressor(rnd->spec(), 1000)->spec(), rnd->spec());
  EXPECT_NE(make_compressor("sketch:k=10,hashing=precomputed", 1000)->spec().find("precomputed"),
            std::string::npos);
  try {
    make_compressor("sketch:k=10,hashing=fancy", 1000);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("random|precomputed|blocked"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_compressor("sketch:k=10,block=1000", 1000), InvalidArgument);  // not 2^n
  EXPECT_THROW(make_compressor("sketch:k=10,hashing=3", 1000), InvalidArgument);
}

/// Recall of planted heavy hitters over many hash seeds, random against blocked on the same
/// vectors: a statistical comparison with fixed seeds, so it cannot flake.
TEST(BlockedSketch, RecoversPlantedHeavyHittersAsWellAsRandomHashing) {
  const uint64_t dim = 60000;
  const size_t heavy = 60, seeds = 60;
  double recall[2] = {0, 0};
  for (uint64_t seed = 0; seed < seeds; ++seed) {
    auto x = test::gaussian(dim, 100 + seed, 0.05f);
    const auto pos = test::plant(x, heavy, 1.0f, 200 + seed);
    const std::set<uint32_t> truth(pos.begin(), pos.end());
    for (int mode = 0; mode < 2; ++mode) {
      SketchConfig c{dim, 5, 1500, seed};
      c.hashing = mode ? Hashing::Blocked : Hashing::OnTheFly;
      CountSketch s(c);
      s.accumulate(x);
      size_t found = 0;
      for (uint32_t j : s.top_k(heavy).indices) found += truth.count(j);
      recall[mode] += double(found) / double(heavy * seeds);
    }
  }
  EXPECT_GT(recall[0], 0.5);  // a regime where the sketch is stretched, not trivially exact
  EXPECT_LT(recall[0], 0.99);
  EXPECT_GE(recall[1], recall[0] - 0.02) << "random " << recall[0] << ", blocked " << recall[1];
}

}  // namespace
}  // namespace sketchsgd
