// qsgd: levels, unbiasedness, sizes, error feedback, reproducible randomness and refusal of every
// code the encoder cannot write.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

/// The step one worker's message gives (a world of one).
std::vector<float> step_of(Compressor& c, const std::vector<float>& g, uint64_t round) {
  auto agg = c.make_aggregator(1);
  agg->add(c.encode(g, round, 0));
  std::vector<float> step(g.size());
  c.apply(agg->finish(), step);
  return step;
}

/// A Gradient message of round 0 from sender 0 with this payload, under a valid header.
Bytes gradient(const Compressor& c, std::span<const uint8_t> payload) {
  const Header h{c.id(), MessageKind::Gradient, c.dim(), 0, 0, 0};
  return Message::build(h, payload.size(), [&](ByteWriter& w) { w.put_array(payload); }).release();
}

TEST(Qsgd, CodesAreNeighbouringLevelsAndUnbiased) {
  for (uint32_t bits : {2u, 4u, 8u}) {
    const uint32_t sign = 1u << (bits - 1), levels = sign - 1;
    for (float x : {0.0f, 0.3f, -0.3f, 0.55f, -1.0f, 1.0f, 0.999f}) {
      double mean = 0;
      constexpr int kDraws = 20000;
      const float lo = std::floor(std::fabs(x) * levels), hi = lo + 1;
      for (int i = 0; i < kDraws; ++i) {
        const uint32_t code = elem::qsgd_code(x, 1.0f, levels, sign, float(i) / kDraws);
        ASSERT_TRUE(elem::qsgd_valid(code, levels, sign)) << bits << " " << x;
        const float v = elem::qsgd_value(code, 1.0f / float(levels), sign);
        const float level = std::fabs(v) * levels;
        ASSERT_TRUE(std::fabs(level - lo) < 1e-4f || std::fabs(level - hi) < 1e-4f)
            << bits << " " << x << " -> " << v;
        ASSERT_TRUE(v == 0.0f || std::signbit(v) == std::signbit(x));
        mean += v;
      }
      EXPECT_NEAR(mean / kDraws, x, 1e-3) << bits;  // u spread evenly over [0, 1)
    }
    EXPECT_FALSE(elem::qsgd_valid(sign, levels, sign)) << "signed zero";
  }
}

TEST(Qsgd, PayloadIsANormPerBucketAndBitsPerValue) {
  const uint64_t dim = 5003;
  const auto g = test::gaussian(dim, 1);
  for (uint32_t bits : {2u, 4u, 8u}) {
    auto c = make_compressor("qsgd:bucket=512,bits=" + std::to_string(bits), dim);
    const Message m = c->encode(g, 0, 0);
    EXPECT_EQ(payload_of(m).size(), 4 * 10 + (dim * bits + 7) / 8) << bits;
    EXPECT_EQ(payload_of(m).size(), c->max_payload(MessageKind::Gradient));
    EXPECT_FALSE(c->two_rounds());
    EXPECT_EQ(c->sum_size(MessageKind::Gradient), 0u);  // gathered
  }
  // With a layout, a norm per bucket of each tensor (3 + 1), each tensor's codes on bytes of
  // their own.
  auto c = make_compressor("qsgd:bucket=100,layout=10x30+7", 307);
  EXPECT_EQ(c->max_payload(MessageKind::Gradient), 4 * 4 + 300 * 4 / 8 + (7 * 4 + 7) / 8);
}

TEST(Qsgd, StepsAverageToTheGradientAndMaxNormKeepsTheLargestExact) {
  const uint64_t dim = 2000;
  const auto g = test::gaussian(dim, 2);
  for (const char* spec : {"qsgd:bits=4", "qsgd:bits=2,norm=max,bucket=100"}) {
    auto c = make_compressor(spec, dim);
    std::vector<double> mean(dim, 0.0);
    constexpr int kRounds = 400;
    for (uint64_t r = 0; r < kRounds; ++r) {
      const auto s = step_of(*c, g, r);  // a fresh random stream each round
      for (size_t j = 0; j < dim; ++j) mean[j] += s[j] / kRounds;
    }
    double err = 0, norm = 0;
    for (size_t j = 0; j < dim; ++j) {
      err += (mean[j] - g[j]) * (mean[j] - g[j]);
      norm += double(g[j]) * g[j];
    }
    EXPECT_LT(std::sqrt(err / norm), 0.15) << spec;
  }
  // max norm: the largest value of a bucket sits on the top level, sent exactly.
  std::vector<float> x(64, 0.25f);
  x[10] = -3.0f;
  auto c = make_compressor("qsgd:bits=8,norm=max,bucket=64", 64);
  EXPECT_EQ(step_of(*c, x, 0)[10], -3.0f);
}

TEST(Qsgd, SameSeedRoundAndSenderSameBytes) {
  const uint64_t dim = 1000;
  const auto g = test::gaussian(dim, 3);
  auto a = make_compressor("qsgd:bits=2", dim), b = make_compressor("qsgd:bits=2", dim);
  const Message ma = a->encode(g, 5, 1), mb = b->encode(g, 5, 1);
  EXPECT_TRUE(std::ranges::equal(ma.bytes(), mb.bytes()));
  const Message other = b->encode(g, 5, 2);
  EXPECT_FALSE(std::ranges::equal(payload_of(ma), payload_of(other))) << "sender ignored";
  auto c = make_compressor("qsgd:bits=2,seed=9", dim);
  EXPECT_FALSE(std::ranges::equal(payload_of(ma), payload_of(c->encode(g, 5, 1))));
}

TEST(Qsgd, ErrorFeedbackKeepsWhatTheRoundingLost) {
  const uint64_t dim = 3000;
  const auto g = test::gaussian(dim, 4);
  auto c = make_compressor("qsgd:bits=2,ef=1", dim);
  const auto sent = step_of(*c, g, 0);
  // The state now holds g − sent; the next encode of zero sends (a rounding of) that.
  auto plain = make_compressor("qsgd:bits=2,ef=1", dim);
  std::vector<float> residual(dim);
  for (size_t j = 0; j < dim; ++j) residual[j] = g[j] - sent[j];
  const auto next = step_of(*c, std::vector<float>(dim, 0.0f), 1);
  const auto want = step_of(*plain, residual, 1);
  for (size_t j = 0; j < dim; ++j) ASSERT_NEAR(next[j], want[j], 1e-5f * (1 + std::fabs(want[j])));
  // Without error feedback nothing carries over: zero in, zero out.
  auto none = make_compressor("qsgd:bits=2", dim);
  step_of(*none, g, 0);
  for (float v : step_of(*none, std::vector<float>(dim, 0.0f), 1)) ASSERT_EQ(v, 0.0f);
}

TEST(Qsgd, CorruptCodesAndNormsAreRefusedAndChangeNothing) {
  const uint64_t dim = 41;  // a partial last group: padding bits
  const auto g = test::gaussian(dim, 5);
  auto c = make_compressor("qsgd:bits=2,bucket=0", dim);
  const Message m = c->encode(g, 0, 0);
  const Bytes good(payload_of(m).begin(), payload_of(m).end());
  auto refused = [&](const Bytes& bad, const char* what) {
    auto agg = c->make_aggregator(2);
    EXPECT_THROW(agg->add(gradient(*c, bad)), WireError) << what;
    EXPECT_EQ(agg->count(), 0u) << what;
    agg->add(gradient(*c, good));  // and the aggregator still works
    EXPECT_EQ(agg->count(), 1u) << what;
  };
  const size_t codes = 4;  // past the one norm
  Bytes bad = good;
  bad[codes] = (bad[codes] & ~0x3u) | 0x2u;  // sign bit with level 0: a signed zero
  refused(bad, "signed zero");
  bad = good;
  bad.back() |= 0x80;  // 41 values: the last byte uses 2 bits
  refused(bad, "padding");
  bad = good;
  const float nan = std::nanf("");
  std::memcpy(bad.data(), &nan, 4);
  refused(bad, "NaN norm");
  bad = good;
  const float negative = -1.0f;
  std::memcpy(bad.data(), &negative, 4);
  refused(bad, "negative norm");
  bad = good;
  bad.pop_back();
  refused(bad, "truncated");
  bad = good;
  bad.push_back(0);
  refused(bad, "trailing byte");
  // Four-bit codes: 0x8 is a signed zero.
  auto c4 = make_compressor("qsgd:bits=4,bucket=0", dim);
  const Message m4 = c4->encode(g, 0, 0);
  Bytes b4(payload_of(m4).begin(), payload_of(m4).end());
  b4[codes] = 0x08;
  auto a4 = c4->make_aggregator(1);
  EXPECT_THROW(a4->add(gradient(*c4, b4)), WireError);
}

TEST(Qsgd, OptionsAreChecked) {
  EXPECT_THROW(make_compressor("qsgd:bits=3", 100), InvalidArgument);
  EXPECT_THROW(make_compressor("qsgd:bits=16", 100), InvalidArgument);
  EXPECT_THROW(make_compressor("qsgd:norm=l1", 100), InvalidArgument);
  EXPECT_EQ(make_compressor("qsgd", 100)->spec(),
            "qsgd:bits=4,bucket=512,norm=l2,seed=1,ef=0,momentum=0");
  // A norm beyond float's range: refused, state as before.
  auto c = make_compressor("qsgd:ef=1,bucket=0", 4);
  const Bytes before = c->save_state();
  EXPECT_THROW(c->encode(std::vector<float>{3e38f, 3e38f, 3e38f, 0}, 0, 0), NonFiniteError);
  EXPECT_EQ(c->save_state(), before);
}

}  // namespace
}  // namespace sketchsgd
