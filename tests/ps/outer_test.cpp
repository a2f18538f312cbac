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

TEST(OuterStep, AdagradAndAdamFollowTheirDefinitions) {
  // Against the definitions in double precision (Duchi et al.; Kingma & Ba with bias correction).
  constexpr uint64_t kDim = 400;
  constexpr float kLr = 0.05f;
  for (OuterKind kind : {OuterKind::Adagrad, OuterKind::Adam}) {
    SCOPED_TRACE(std::string(to_string(kind)));
    OuterOptions o;
    o.kind = kind;
    o.eps = 1e-6f;
    o.beta1 = 0.85f;
    o.beta2 = 0.99f;
    auto codec = make_compressor("dense", kDim);
    OuterStep outer(o, kDim, Device::cpu());
    std::vector<float> p = test::initial_params(kDim, 4);
    std::vector<double> want(p.begin(), p.end()), m(kDim, 0.0), v(kDim, 0.0);
    for (uint64_t t = 1; t <= 5; ++t) {
      const Bytes u = update_of("dense", kDim, t + 3);
      std::vector<float> step(kDim);
      make_compressor("dense", kDim)->apply(u, step);
      outer.apply(*codec, u, p, kLr);
      for (size_t i = 0; i < kDim; ++i) {
        const double s = step[i];
        if (kind == OuterKind::Adagrad) {
          v[i] += s * s;
          want[i] -= kLr * s / (std::sqrt(v[i]) + o.eps);
        } else {
          m[i] = o.beta1 * m[i] + (1 - o.beta1) * s;
          v[i] = o.beta2 * v[i] + (1 - o.beta2) * s * s;
          const double mh = m[i] / (1 - std::pow(double(o.beta1), double(t)));
          const double vh = v[i] / (1 - std::pow(double(o.beta2), double(t)));
          want[i] -= kLr * mh / (std::sqrt(vh) + o.eps);
        }
      }
    }
    for (size_t i = 0; i < kDim; ++i) ASSERT_NEAR(p[i], want[i], 2e-5) << i;
    EXPECT_EQ(outer.steps(), kind == OuterKind::Adam ? 5u : 0u);
    // Its state, saved and loaded into another step, continues bit for bit.
    const auto saved = outer.save();
    ASSERT_EQ(saved.size(), o.buffers() * kDim);
    OuterStep again(o, kDim, Device::cpu());
    again.load(saved, outer.steps());
    std::vector<float> q = p;
    const Bytes u = update_of("dense", kDim, 11);
    outer.apply(*codec, u, p, kLr);
    again.apply(*codec, u, q, kLr);
    EXPECT_EQ(std::memcmp(p.data(), q.data(), kDim * 4), 0);
    EXPECT_EQ(outer.save(), again.save());
    EXPECT_THROW(again.load(std::vector<float>(o.buffers() * kDim + 1)), WireError);
  }
}

TEST(OuterStep, AdaptiveOptionsAreChecked) {
  OuterOptions o;
  o.kind = OuterKind::Adagrad;
  EXPECT_NO_THROW(o.validate());
  EXPECT_EQ(o.buffers(), 1u);
  o.momentum = 0.9f;  // momentum is SGD's
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.momentum = 0;
  for (float eps : {0.0f, -1e-8f, std::nanf("")}) {
    o.eps = eps;
    EXPECT_THROW(o.validate(), InvalidArgument) << eps;
  }
  o = OuterOptions{};
  o.kind = OuterKind::Adam;
  EXPECT_EQ(o.buffers(), 2u);
  for (float b : {1.0f, -0.1f, std::nanf("")}) {
    o.beta2 = b;
    EXPECT_THROW(o.validate(), InvalidArgument) << b;
  }
  EXPECT_EQ(parse_outer_kind("adam"), OuterKind::Adam);
  EXPECT_THROW(parse_outer_kind("rmsprop"), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::ps
