#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {
namespace k = kernels::cpu;

/// Reference top-k: full sort by (|x| desc, index asc).
void reference_topk(const std::vector<float>& x, size_t kk, std::vector<uint32_t>& idx) {
  idx.resize(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa != fb ? fa > fb : a < b;
  });
  idx.resize(kk);
}

class TopK : public testing::TestWithParam<std::tuple<size_t, size_t>> {};

TEST_P(TopK, MatchesFullSortIncludingTies) {
  const auto [n, kk] = GetParam();
  auto x = test::gaussian(n, n + kk);
  // Ties: quantise a third of the values so many magnitudes repeat, with both signs.
  for (size_t i = 0; i < n; i += 3) x[i] = std::round(x[i] * 4) / 4;
  std::vector<uint32_t> want;
  reference_topk(x, kk, want);
  std::vector<uint32_t> idx(kk);
  std::vector<float> val(kk);
  k::topk(x.data(), n, kk, idx.data(), val.data());
  EXPECT_EQ(idx, want);
  for (size_t i = 0; i < kk; ++i) EXPECT_EQ(val[i], x[idx[i]]);
  // The same k by index.
  std::sort(want.begin(), want.end());
  k::topk(x.data(), n, kk, idx.data(), val.data(), kernels::Order::Index);
  EXPECT_EQ(idx, want);
  for (size_t i = 0; i < kk; ++i) EXPECT_EQ(val[i], x[idx[i]]);
}

TEST(SortPairs, ByIndexThenValueBitsWhateverTheInputOrder) {
  // Duplicate indices (a top-k aggregator's concatenated messages): the order of equal indices
  // must not depend on the order the pairs came in, or sums would round differently.
  const size_t n = 5000;
  auto v = test::gaussian(n, 11);
  std::vector<uint32_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = uint32_t((i * 7919) % 1777);
  auto ri = idx;
  auto rv = v;
  std::reverse(ri.begin(), ri.end());
  std::reverse(rv.begin(), rv.end());
  k::sort_pairs(idx.data(), v.data(), n);
  k::sort_pairs(ri.data(), rv.data(), n);
  EXPECT_EQ(idx, ri);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(float_bits(v[i]), float_bits(rv[i]));
  for (size_t i = 1; i < n; ++i) {
    ASSERT_LE(idx[i - 1], idx[i]);
    if (idx[i - 1] == idx[i]) ASSERT_LT(float_bits(v[i - 1]), float_bits(v[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, TopK,
                         testing::Values(std::make_tuple(1, 1), std::make_tuple(10, 0),
                                         std::make_tuple(10, 10), std::make_tuple(1000, 7),
                                         std::make_tuple(100000, 1), std::make_tuple(100000, 5000),
                                         std::make_tuple(300000, 150000),
                                         std::make_tuple(1 << 20, 20000)));

TEST(TopK, AdversarialIncreasingOrder) {
  // Increasing magnitudes defeat the running threshold as often as possible.
  const size_t n = 200000, kk = 1000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * float(i);
  std::vector<uint32_t> idx(kk);
  std::vector<float> val(kk);
  k::topk(x.data(), n, kk, idx.data(), val.data());
  for (size_t i = 0; i < kk; ++i) EXPECT_EQ(idx[i], n - 1 - i);
}

/// Every value equal: the whole selection is tie-breaking by index. A pruning that dropped the
/// running k-th candidate itself once lost the last winner here (found by the GPU comparison).
TEST(TopK, AllEqualMagnitudesPickSmallestIndices) {
  for (size_t n : {size_t(1) << 20, size_t(100003)}) {
    std::vector<float> x(n, -2.5f);
    for (size_t i = 1; i < n; i += 2) x[i] = 2.5f;
    const size_t kk = 12345;
    std::vector<uint32_t> idx(kk);
    std::vector<float> val(kk);
    k::topk(x.data(), n, kk, idx.data(), val.data());
    for (size_t i = 0; i < kk; ++i) ASSERT_EQ(idx[i], i) << "n=" << n;
  }
}

TEST(DeltaCoding, GapsAsLittleEndianBase128Varints) {
  // Gaps 5, 0, 127 (one byte each), 128 (two), 2^21 (four), then one near 2^32 (five).
  const std::vector<uint32_t> idx = {5, 6, 134, 263, 263 + (1u << 21) + 1, 0xFFFFFFFFu};
  const std::vector<uint8_t> want = {5,    0,    127,  0x80, 0x01, 0x80, 0x80,
                                     0x80, 0x01, 0xF6, 0xFD, 0xFF, 0xFE, 0x0F};
  ASSERT_EQ(kernels::cpu::delta_bytes(idx.data(), idx.size()), want.size());
  std::vector<uint8_t> got(want.size());
  kernels::cpu::delta_encode(idx.data(), idx.size(), got.data());
  EXPECT_EQ(got, want);
}

TEST(Signs, PackUnpackExactWithPadding) {
  for (size_t n : {1u, 31u, 32u, 33u, 1000u, 65537u}) {
    auto x = test::gaussian(n, n);
    x[0] = 0.0f;  // sign(0) = +1
    std::vector<uint32_t> words((n + 31) / 32, 0xFFFFFFFFu);
    k::pack_signs(x.data(), n, words.data());
    EXPECT_TRUE(k::sign_padding_clear(words.data(), n));
    std::vector<float> out(n);
    k::unpack_signs(words.data(), n, n, nullptr, out.data(), false);
    for (size_t j = 0; j < n; ++j) ASSERT_EQ(out[j], x[j] < 0 ? -1.0f : 1.0f) << n << " " << j;
    std::vector<uint32_t> neg(n, 0);
    k::count_negative(words.data(), n, neg.data());
    for (size_t j = 0; j < n; ++j) ASSERT_EQ(neg[j], x[j] < 0 ? 1u : 0u);
    if (n % 32) {
      words.back() |= 1u << 31;
      EXPECT_FALSE(k::sign_padding_clear(words.data(), n));
    }
  }
}

TEST(Signs, ScaledUnpackPerChunk) {
  const size_t n = 100, chunk = 30;
  auto x = test::gaussian(n, 3);
  std::vector<uint32_t> words(4);
  k::pack_signs(x.data(), n, words.data());
  const float scales[] = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> out(n, 1.0f);
  k::unpack_signs(words.data(), n, chunk, scales, out.data(), true);
  for (size_t j = 0; j < n; ++j) EXPECT_EQ(out[j], 1.0f + scales[j / chunk] * (x[j] < 0 ? -1 : 1));
}

TEST(Ternary, PackUnpackRoundTripAndRejectsInvalid) {
  for (size_t n : {1u, 3u, 4u, 5u, 1001u}) {
    std::vector<float> x(n);
    for (size_t j = 0; j < n; ++j) x[j] = float(int(j % 3) - 1);
    std::vector<uint8_t> codes((n + 3) / 4);
    k::pack_ternary(x.data(), n, codes.data());
    std::vector<float> out(n, 9.0f);
    ASSERT_EQ(k::unpack_ternary(codes.data(), n, n, nullptr, 2.0f, out.data(), false),
              kernels::kNone);
    for (size_t j = 0; j < n; ++j) ASSERT_EQ(out[j], 2.0f * x[j]);
    auto bad = codes;
    bad[bad.size() / 2] |= 0x3;  // code 3
    std::vector<float> untouched(n, 7.0f);
    EXPECT_NE(k::unpack_ternary(bad.data(), n, n, nullptr, 1.0f, untouched.data(), true),
              kernels::kNone);
    EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) { return v == 7.0f; }));
    if (n % 4) {
      auto pad = codes;
      pad.back() |= uint8_t(1u << 6);
      EXPECT_NE(k::unpack_ternary(pad.data(), n, n, nullptr, 1.0f, untouched.data(), true),
                kernels::kNone);
    }
  }
}

TEST(Ternary, StochasticRoundingIsUnbiased) {
  // Average of many independent streams approaches x (|x| ≤ s). Fixed seeds: deterministic test.
  const size_t n = 64;
  std::vector<float> x(n);
  for (size_t j = 0; j < n; ++j) x[j] = std::sin(float(j)) * 0.9f;
  const float scale = 1.0f;
  std::vector<double> mean(n, 0.0);
  const int draws = 20000;
  std::vector<uint8_t> codes(n / 4);
  std::vector<float> out(n);
  for (int d = 0; d < draws; ++d) {
    k::ternarize(x.data(), n, n, &scale, 5, uint64_t(d), codes.data());
    ASSERT_EQ(k::unpack_ternary(codes.data(), n, n, &scale, 1.0f, out.data(), false),
              kernels::kNone);
    for (size_t j = 0; j < n; ++j) mean[j] += out[j];
  }
  for (size_t j = 0; j < n; ++j) {
    const double p = std::fabs(x[j]), sd = std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR(mean[j] / draws, x[j], 6 * sd + 1e-6) << j;
  }
}

/// Gram-Schmidt's contract at every rank (strided below 16, row by row from 16, a heap-sized
/// rank past 64): orthonormal columns, column i orthogonal to the original columns before it and
/// positive against its own (which pins Q), a zero column left zero, not NaN, and the R of a = QR.
/// The pivot shared by the CPU and GPU Gram-Schmidt: 1/|a|, or 0 (the column becomes zero) when
/// the column vanished or its inverse does not fit a float.
TEST(Orthonormalize, PivotZeroesOnlyVanishedColumns) {
  EXPECT_EQ(elem::gram_schmidt_inverse(4.0), 0.5f);
  EXPECT_EQ(elem::gram_schmidt_inverse(1e-70), float(1e35));
  EXPECT_EQ(elem::gram_schmidt_inverse(0.0), 0.0f);
  EXPECT_EQ(elem::gram_schmidt_inverse(1e-90), 0.0f);  // 1/1e-45 is beyond float
  EXPECT_EQ(elem::gram_schmidt_inverse(1e100), 0.0f);  // 1/1e50 underflows to 0
  EXPECT_EQ(elem::gram_schmidt_inverse(-1.0), 0.0f);
  EXPECT_EQ(elem::gram_schmidt_inverse(std::numeric_limits<double>::quiet_NaN()), 0.0f);
  EXPECT_EQ(elem::gram_schmidt_inverse(std::numeric_limits<double>::infinity()), 0.0f);
}

TEST(Orthonormalize, GramSchmidtAtEveryRank) {
  for (size_t r : {1, 3, 8, 15, 16, 24, 32, 70}) {
    SCOPED_TRACE(r);
    const size_t n = 300;
    auto a = test::gaussian(n * r, 40 + r);
    for (size_t j = 0; j < n; ++j) a[j * r] *= 1e3f;  // columns of very different sizes
    if (r > 5)
      for (size_t j = 0; j < n; ++j) a[j * r + 5] = 0.0f;
    auto q = a;
    k::orthonormalize(q.data(), n, r);
    auto col_dot = [&](const std::vector<float>& x, size_t i, const std::vector<float>& y,
                       size_t l) {
      double d = 0;
      for (size_t j = 0; j < n; ++j) d += double(x[j * r + i]) * y[j * r + l];
      return d;
    };
    for (size_t i = 0; i < r; ++i) {
      const bool zero = r > 5 && i == 5;
      for (size_t j = 0; j < n; ++j) ASSERT_TRUE(std::isfinite(q[j * r + i]));
      EXPECT_NEAR(col_dot(q, i, q, i), zero ? 0.0 : 1.0, 1e-5) << i;
      if (zero) continue;
      for (size_t l = 0; l < i; ++l) {
        EXPECT_NEAR(col_dot(q, i, q, l), 0.0, 1e-5) << i << " " << l;
        EXPECT_NEAR(col_dot(q, i, a, l), 0.0, 1e-4 * std::sqrt(col_dot(a, l, a, l)))
            << i << " " << l;
      }
      EXPECT_GT(col_dot(q, i, a, i), 0.0) << i;
    }
    // With R: the same Q, and a = Q·R (upper triangular) to rounding, the zero column included.
    auto q2 = a;
    std::vector<float> rr(r * r, -1.0f);
    k::orthonormalize(q2.data(), n, r, rr.data());
    EXPECT_EQ(q2, q);
    for (size_t i = 0; i < r; ++i)
      for (size_t l = 0; l < i; ++l) ASSERT_EQ(rr[i * r + l], 0.0f) << i << " " << l;
    for (size_t j = 0; j < n; ++j)
      for (size_t l = 0; l < r; ++l) {
        double s = 0;
        for (size_t i = 0; i < r; ++i) s += double(q[j * r + i]) * rr[i * r + l];
        ASSERT_NEAR(s, a[j * r + l], 1e-5 * std::sqrt(col_dot(a, l, a, l))) << j << " " << l;
      }
  }
}

/// The low-rank passes against loops in double: every rank up to 9 (the one-loop kernel to 4,
/// four-wide sweeps and their remainders past it), row counts that are not a multiple of four,
/// a size past the threading threshold, with and without momentum and the error subtraction
/// (in expand, or deferred to the next absorb).
TEST(LowRank, PassesMatchPlainLoops) {
  for (auto [rows, cols] : {std::pair<size_t, size_t>{7, 5}, {33, 70}, {300, 260}}) {
    for (size_t r : {1, 2, 3, 4, 5, 8, 9, 16, 23, 33}) {
      SCOPED_TRACE(testing::Message() << rows << "x" << cols << " rank " << r);
      const size_t n = rows * cols;
      const auto g = test::gaussian(n, 1), m0 = test::gaussian(n, 2), u0 = test::gaussian(n, 3);
      const auto a = test::gaussian(rows * r, 4), b = test::gaussian(cols * r, 5);
      auto ab = [&](size_t i, size_t j) {
        double s = 0;
        for (size_t l = 0; l < r; ++l) s += double(a[i * r + l]) * b[j * r + l];
        return s;
      };
      for (bool mom : {false, true}) {
        auto m = m0, u = u0;
        std::vector<float> p(rows * r, -1.0f);
        k::lowrank_absorb(m.data(), g.data(), mom ? u.data() : nullptr, 0.9f, b.data(), p.data(),
                          rows, cols, r);
        for (size_t i = 0; i < rows; ++i)
          for (size_t l = 0; l < r; ++l) {
            double want = 0;
            for (size_t j = 0; j < cols; ++j) {
              const size_t e = i * cols + j;
              const double x = mom ? 0.9 * double(u0[e]) + g[e] : g[e];
              if (l == 0) {
                ASSERT_NEAR(m[e], x + m0[e], 1e-5 * (1 + std::fabs(x + m0[e]))) << mom << e;
                if (mom) ASSERT_NEAR(u[e], x, 1e-6 * (1 + std::fabs(x)));
              }
              want += (x + m0[e]) * b[j * r + l];
            }
            ASSERT_NEAR(p[i * r + l], want, 1e-4 * std::sqrt(double(cols))) << mom << i << " " << l;
          }
      }
      // A subtraction deferred to absorb leaves m, u and p as an expand before it would.
      for (bool mom : {false, true}) {
        const auto b2 = test::gaussian(cols * r, 6);
        auto m = m0, u = u0, m2 = m0, u2 = u0;
        std::vector<float> c(n), p(rows * r), p2(rows * r);
        k::lowrank_expand(a.data(), b2.data(), c.data(), rows, cols, r, m.data());
        k::lowrank_absorb(m.data(), g.data(), mom ? u.data() : nullptr, 0.9f, b.data(), p.data(),
                          rows, cols, r);
        k::lowrank_absorb(m2.data(), g.data(), mom ? u2.data() : nullptr, 0.9f, b.data(), p2.data(),
                          rows, cols, r, a.data(), b2.data());
        ASSERT_EQ(m2, m) << mom;
        ASSERT_EQ(u2, u) << mom;
        ASSERT_EQ(p2, p) << mom;
        // The subtraction on q's own columns (b is q): the same, to rounding.
        auto m4 = m0, u4 = u0, m5 = m0;
        std::vector<float> p4(rows * r), c5(n);
        k::lowrank_expand(a.data(), b.data(), c5.data(), rows, cols, r, m5.data());
        k::lowrank_absorb(m5.data(), mom ? u.data() : g.data(), nullptr, 0.0f, nullptr, nullptr, 1,
                          n, 0);  // u already holds x: m5 = (m0 − a·bᵀ) + x
        k::lowrank_absorb(m4.data(), g.data(), mom ? u4.data() : nullptr, 0.9f, b.data(), p4.data(),
                          rows, cols, r, a.data(), b.data());
        for (size_t e = 0; e < n; ++e)
          ASSERT_NEAR(m4[e], m5[e], 1e-5 * (1 + std::fabs(m5[e]))) << e;
        for (size_t i = 0; i < rows; ++i)
          for (size_t l = 0; l < r; ++l) {
            double want = 0;
            for (size_t j = 0; j < cols; ++j) want += double(m5[i * cols + j]) * b[j * r + l];
            ASSERT_NEAR(p4[i * r + l], want, 1e-4 * std::sqrt(double(cols))) << i << " " << l;
          }
        auto m3 = m0;  // and without a step to write
        k::lowrank_expand(a.data(), b2.data(), nullptr, rows, cols, r, m3.data());
        for (size_t e = 0; e < n; ++e) ASSERT_EQ(m3[e], m0[e] - c[e]) << e;
      }
      std::vector<float> qt(cols * r, -1.0f), c(n, -1.0f), c2(n, -1.0f);
      k::lowrank_answer(m0.data(), a.data(), qt.data(), rows, cols, r);
      k::lowrank_expand(a.data(), b.data(), c.data(), rows, cols, r);
      auto m = m0;
      k::lowrank_expand(a.data(), b.data(), c2.data(), rows, cols, r, m.data());
      for (size_t j = 0; j < cols; ++j)
        for (size_t l = 0; l < r; ++l) {
          double want = 0;
          for (size_t i = 0; i < rows; ++i) want += double(m0[i * cols + j]) * a[i * r + l];
          ASSERT_NEAR(qt[j * r + l], want, 1e-4 * std::sqrt(double(rows + 1))) << j << " " << l;
        }
      for (size_t e = 0; e < n; ++e) {
        ASSERT_NEAR(c[e], ab(e / cols, e % cols), 1e-5 * r) << e;
        ASSERT_EQ(c2[e], c[e]) << e;
        ASSERT_EQ(m[e], m0[e] - c[e]) << e;  // the error written in the same pass
      }
      // Streamed stores write the same bits, wherever c starts (its rows' aligned vectors
      // streamed, the ends one value at a time), with and without the error, nothing past c.
      for (size_t shift : {0, 1, 3, 5}) {
        std::vector<float> room(n + 16, -7.0f);
        auto m2 = m0;
        float* cs = room.data() + shift;
        k::lowrank_expand(a.data(), b.data(), cs, rows, cols, r, nullptr, true);
        ASSERT_TRUE(std::equal(c.begin(), c.end(), cs)) << shift;
        k::lowrank_expand(a.data(), b.data(), cs, rows, cols, r, m2.data(), true);
        ASSERT_TRUE(std::equal(c.begin(), c.end(), cs)) << shift;
        ASSERT_EQ(m2, m) << shift;
        for (size_t e = 0; e < room.size(); ++e)
          if (e < shift || e >= shift + n) ASSERT_EQ(room[e], -7.0f) << shift << " " << e;
      }
    }
  }
  // Rank 0 expands to zero; absorb without a product is elementwise.
  std::vector<float> c(12, 5.0f), m(100000, 1.0f), g(100000, 2.0f);
  k::lowrank_expand(nullptr, nullptr, c.data(), 3, 4, 0);
  EXPECT_EQ(c, std::vector<float>(12, 0.0f));
  k::lowrank_absorb(m.data(), g.data(), nullptr, 0.0f, nullptr, nullptr, 1, m.size(), 0);
  EXPECT_EQ(m, std::vector<float>(m.size(), 3.0f));
}

/// The finiteness check in absorb's pass: at every rank path (elementwise, up to 4, past 4), with
/// and without momentum and a deferred subtraction, a NaN or ±Inf in g is reported and leaves m
/// (past the subtraction) and u as they were there.
TEST(LowRank, AbsorbReportsNonFiniteGradients) {
  const size_t rows = 33, cols = 70, n = rows * cols;
  for (size_t r : {0, 2, 8}) {
    for (bool mom : {false, true}) {
      SCOPED_TRACE(testing::Message() << "rank " << r << " momentum " << mom);
      auto g = test::gaussian(n, 1);
      const auto m0 = test::gaussian(n, 2), u0 = test::gaussian(n, 3);
      const auto a = test::gaussian(rows * std::max<size_t>(r, 1), 4);
      const auto q = test::gaussian(cols * std::max<size_t>(r, 1), 5);
      const size_t rr = r == 0 ? 1 : rows, cc = r == 0 ? n : cols;
      std::vector<float> p(rows * std::max<size_t>(r, 1));
      auto m = m0, u = u0;
      EXPECT_TRUE(k::lowrank_absorb(m.data(), g.data(), mom ? u.data() : nullptr, 0.9f,
                                    r ? q.data() : nullptr, p.data(), rr, cc, r));
      g[5] = std::nanf("");
      g[n - 1] = std::numeric_limits<float>::infinity();
      auto m2 = m0, u2 = u0, settled = m0;
      if (r > 0) k::lowrank_expand(a.data(), q.data(), nullptr, rows, cols, r, settled.data());
      EXPECT_FALSE(k::lowrank_absorb(m2.data(), g.data(), mom ? u2.data() : nullptr, 0.9f,
                                     r ? q.data() : nullptr, p.data(), rr, cc, r,
                                     r ? a.data() : nullptr, r ? q.data() : nullptr));
      for (size_t e : {size_t(5), n - 1}) {
        EXPECT_FLOAT_EQ(m2[e], settled[e]) << e;
        EXPECT_EQ(u2[e], u0[e]) << e;
      }
    }
  }
}

TEST(Vector, FindNonFinite) {
  std::vector<float> x(100000, 1.0f);
  EXPECT_EQ(k::find_nonfinite(x.data(), x.size()), kernels::kNone);
  x[77777] = std::numeric_limits<float>::infinity();
  x[88888] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(k::find_nonfinite(x.data(), x.size()), 77777u);
  x[5] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(k::find_nonfinite(x.data(), x.size()), 5u);
}

TEST(Vector, ChunkStats) {
  const float x[] = {1, -3, 2, 0, 4};
  kernels::ChunkStats s[2];
  k::chunk_stats(x, 5, 3, s);
  EXPECT_FLOAT_EQ(s[0].abs_max, 3);
  EXPECT_FLOAT_EQ(s[0].abs_mean, 2);
  EXPECT_NEAR(s[0].stddev, std::sqrt((1 + 9 + 4) / 3.0 - 0.0), 1e-6);
  EXPECT_FLOAT_EQ(s[1].abs_max, 4);
  EXPECT_FLOAT_EQ(s[1].stddev, 2);
}

}  // namespace
}  // namespace sketchsgd
