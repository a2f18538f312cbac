// The outer step every holder of the model applies: without momentum exactly the codec's
// apply_step; with momentum the (Nesterov) heavy-ball arithmetic on the decoded step; corrupt
// updates and bad buffers change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/outer.hpp>
#include "support/ps_synthetic.hpp"

namespace sketchsgd::ps {
namespace {

/// One worker's update for a codec: encode a gradient, aggregate it alone.
Bytes update_of(const std::string& spec, uint64_t dim, uint64_t seed) {
  auto codec = make_compressor(spec, dim);
  const auto g = test::synthetic_grad(test::initial_params(dim, seed), 0, seed, seed);
  auto agg = codec->make_aggregator(1);
  agg->add(codec->encode(g, 0, 0).bytes());
  return std::move(agg->finish()).release();
}

TEST(OuterStep, WithoutMomentumItIsTheCodecsApplyStepBitForBit) {
  constexpr uint64_t kDim = 4000;
  for (const char* spec : {"dense", "topk:k=100", "sketch:k=100,cols=1000"}) {
    auto a = make_compressor(spec, kDim), b = make_compressor(spec, kDim);
    OuterStep outer({}, kDim, Device::cpu());
    EXPECT_TRUE(outer.buffer().empty());
    std::vector<float> p = test::initial_params(kDim, 1), q = p;
    for (uint64_t t = 0; t < 3; ++t) {
      const Bytes u = update_of(spec, kDim, t + 1);
      outer.apply(*a, u, p, 0.3f);
      b->apply_step(u, q, 0.3f);
    }
    EXPECT_EQ(std::memcmp(p.data(), q.data(), kDim * 4), 0) << spec;
  }
}

TEST(OuterStep, NesterovAndHeavyBallFollowTheirDefinitions) {
  constexpr uint64_t kDim = 500;
  constexpr float kLr = 0.7f, kMu = 0.9f;
  for (bool nesterov : {true, false}) {
    auto codec = make_compressor("dense", kDim);
    OuterStep outer({kMu, nesterov}, kDim, Device::cpu());
    std::vector<float> p = test::initial_params(kDim, 2);
    std::vector<double> want(p.begin(), p.end()), m(kDim, 0.0);
    for (uint64_t t = 0; t < 4; ++t) {
      const Bytes u = update_of("dense", kDim, t + 7);
      std::vector<float> step(kDim);
      make_compressor("dense", kDim)->apply(u, step);
      outer.apply(*codec, u, p, kLr);
      for (size_t i = 0; i < kDim; ++i) {
        m[i] = kMu * m[i] + step[i];
        want[i] -= kLr * (nesterov ? step[i] + kMu * m[i] : m[i]);
      }
    }
    for (size_t i = 0; i < kDim; ++i) ASSERT_NEAR(p[i], want[i], 1e-5) << i;
    const auto saved = outer.save();
    for (size_t i = 0; i < kDim; ++i) ASSERT_NEAR(saved[i], m[i], 1e-5) << i;
  }
}

TEST(OuterStep, CorruptUpdatesAndBadBuffersChangeNothing) {
  constexpr uint64_t kDim = 300;
  auto codec = make_compressor("dense", kDim);
  OuterStep outer({0.5f, true}, kDim, Device::cpu());
  std::vector<float> p = test::initial_params(kDim, 3);
  outer.apply(*codec, update_of("dense", kDim, 1), p, 1.0f);
  const std::vector<float> p0 = p, m0 = outer.save();
  Bytes bad = update_of("dense", kDim, 2);
  bad[bad.size() / 2] ^= 0x10;  // the checksum no longer matches
  EXPECT_THROW(outer.apply(*codec, bad, p, 1.0f), WireError);
  EXPECT_THROW(outer.apply(*codec, std::span<const uint8_t>(bad).first(20), p, 1.0f), WireError);
  std::vector<float> wrong(kDim - 1);
  EXPECT_THROW(outer.apply(*codec, update_of("dense", kDim, 2), wrong, 1.0f), InvalidArgument);
  std::vector<float> nan(kDim, 0.0f);
  nan[5] = std::nanf("");
  EXPECT_THROW(outer.load(nan), WireError);
  EXPECT_THROW(outer.load(std::vector<float>(kDim + 1)), WireError);
  EXPECT_EQ(std::memcmp(p.data(), p0.data(), kDim * 4), 0);
  EXPECT_EQ(outer.save(), m0);
  OuterStep plain({}, kDim, Device::cpu());
  EXPECT_THROW(plain.load(m0), InvalidArgument);
  for (OuterOptions o : {OuterOptions{-0.1f, false}, OuterOptions{1.0f, true},
                         OuterOptions{std::nanf(""), false}, OuterOptions{0.0f, true}})
    EXPECT_THROW(OuterStep(o, kDim, Device::cpu()), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::ps
