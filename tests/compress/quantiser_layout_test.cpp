// signsgd and terngrad with a layout: one scale per tensor (or per chunk within a tensor), each
// tensor's signs or codes packed on their own; without a layout, the same bytes as before.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

// 700 + 30 + 300 + 3: runs of sizes that are not multiples of 32 (nor of 4).
const Layout kLayout({{35, 20}, {30}, {10, 30}, {3}});
constexpr uint64_t kDim = 1033;
struct Span {
  uint64_t offset, numel;
};
const Span kTensors[] = {{0, 700}, {700, 30}, {730, 300}, {1030, 3}};

/// One worker's update (W = 1) for g.
std::vector<float> step_of(const std::string& spec, const std::vector<float>& g) {
  auto c = make_compressor(spec, kLayout);
  auto a = c->make_aggregator(1);
  a->add(c->encode(g, 0, 0).bytes());
  std::vector<float> step(kDim);
  c->apply(a->finish().bytes(), step);
  return step;
}

std::vector<float> varied() {  // every tensor at its own scale
  auto g = test::gaussian(kDim, 11);
  const float mags[] = {1.0f, 50.0f, 0.01f, 7.0f};
  for (size_t t = 0; t < 4; ++t)
    for (uint64_t j = 0; j < kTensors[t].numel; ++j) g[kTensors[t].offset + j] *= mags[t];
  return g;
}

TEST(QuantiserLayout, EfSignSgdScalesEveryTensorByItsOwnMeanMagnitude) {
  const auto g = varied();
  const auto step = step_of("signsgd:ef=1", g);
  for (const auto& t : kTensors) {
    double l1 = 0;
    for (uint64_t j = 0; j < t.numel; ++j) l1 += std::fabs(g[t.offset + j]);
    const float scale = float(l1 / double(t.numel));
    for (uint64_t j = 0; j < t.numel; ++j) {
      const uint64_t i = t.offset + j;
      EXPECT_NEAR(step[i], g[i] < 0 ? -scale : scale, 1e-5f * scale) << i;
    }
  }
  // chunk= cuts within a tensor, never across: the 30-value bias in chunks of 16 and 14.
  const auto chunked = step_of("signsgd:ef=1,chunk=16", g);
  for (uint64_t start : {700, 716}) {
    const uint64_t n = start == 700 ? 16 : 14;
    double l1 = 0;
    for (uint64_t j = 0; j < n; ++j) l1 += std::fabs(g[start + j]);
    EXPECT_NEAR(std::fabs(chunked[start]), float(l1 / double(n)), 1e-4f) << start;
  }
  auto c = make_compressor("signsgd:ef=1", kLayout);
  // 4 scales + words of 700, 30, 300 and 3 signs (22 + 1 + 10 + 1).
  EXPECT_EQ(c->max_payload(MessageKind::Gradient), 4u * 4 + 4u * 34);
}

TEST(QuantiserLayout, TernGradScalesEveryTensorByItsOwnMaximum) {
  const auto g = varied();
  const auto step = step_of("terngrad", g);
  for (const auto& t : kTensors) {
    float mx = 0;
    for (uint64_t j = 0; j < t.numel; ++j) mx = std::max(mx, std::fabs(g[t.offset + j]));
    for (uint64_t j = 0; j < t.numel; ++j) {
      const float v = step[t.offset + j];
      EXPECT_TRUE(v == 0.0f || std::fabs(std::fabs(v) - mx) <= 1e-6f * mx) << t.offset + j;
    }
  }
  // The largest entry of each tensor is always sent at its scale (probability 1).
  for (const auto& t : kTensors) {
    const auto* b = g.data() + t.offset;
    const uint64_t arg =
        std::max_element(b, b + t.numel,
                         [](float x, float y) { return std::fabs(x) < std::fabs(y); }) -
        g.data();
    EXPECT_NE(step[arg], 0.0f) << arg;
  }
}

TEST(QuantiserLayout, VotesAreTheSameWithOrWithoutALayout) {
  for (const std::string spec : {"signsgd", "signsgd:momentum=0.9"}) {
    std::vector<std::unique_ptr<Compressor>> with, without;
    for (int i = 0; i < 3; ++i) {
      with.push_back(make_compressor(spec, kLayout));
      without.push_back(make_compressor(spec, kDim));
    }
    auto a = with[0]->make_aggregator(3), b = without[0]->make_aggregator(3);
    for (uint64_t r = 0; r < 2; ++r) {
      for (uint32_t i = 0; i < 3; ++i) {
        const auto g = test::gaussian(kDim, 10 * r + i);
        a->add(with[i]->encode(g, r, i).bytes());
        b->add(without[i]->encode(g, r, i).bytes());
      }
      const Message ua = a->finish(), ub = b->finish();
      EXPECT_TRUE(std::ranges::equal(payload_of(ua.bytes()), payload_of(ub.bytes()))) << spec;
    }
  }
}

/// A code or padding bit wrong in a later run refuses the whole message and changes nothing.
TEST(QuantiserLayout, ACorruptLaterRunIsRefusedWhole) {
  const auto g = varied();
  {
    auto c = make_compressor("terngrad", kLayout);
    auto a = c->make_aggregator(2);
    const Message m = c->encode(g, 0, 0);
    Bytes bad(m.bytes().begin(), m.bytes().end());
    bad.back() = 0xFF;  // code 3 (invalid) in the last run
    EXPECT_THROW(a->add(bad), WireError);
    a->add(m.bytes());
    auto d = make_compressor("terngrad", kLayout);  // same seed, round and sender: same codes
    auto one = d->make_aggregator(1);
    one->add(d->encode(g, 0, 0).bytes());
    std::vector<float> want(kDim), got(kDim);
    d->apply(one->finish().bytes(), want);
    c->apply(a->finish().bytes(), got);  // the mean of the one message that was taken
    EXPECT_EQ(got, want);                // same codes, same sums: equal floats
  }
  {
    auto c = make_compressor("signsgd:ef=1", kLayout);
    auto a = c->make_aggregator(1);
    const Message m = c->encode(g, 0, 0);
    Bytes bad(m.bytes().begin(), m.bytes().end());
    // The first run's last word (signs 672..699): bit 28 onwards is padding.
    const size_t word = bad.size() - 4 * 34 + 4 * 21;
    bad[word + 3] |= 0x80;
    EXPECT_THROW(a->add(bad), WireError);
  }
}

}  // namespace
}  // namespace sketchsgd
