// The codec framework, across codecs: protocol errors change nothing, non-finite gradients are
// refused with the state unchanged, an aggregator outlives its codec, and apply_step equals
// apply() then axpy bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

TEST(Aggregator, ProtocolErrorsChangeNothing) {
  const size_t dim = 100;
  auto worker = make_compressor("topk:k=5", dim);
  auto codec = make_compressor("topk:k=5", dim);
  auto agg = codec->make_aggregator(2);
  const auto g = test::gaussian(dim, 16);
  EXPECT_THROW(agg->finish(), ProtocolError);
  const Message m0 = worker->encode(g, 7, 0);
  EXPECT_THROW(agg->add(worker->encode(g, 7, 2)), ProtocolError);  // sender ≥ W
  agg->add(m0);
  EXPECT_THROW(agg->add(m0), ProtocolError);                       // duplicate
  EXPECT_THROW(agg->add(worker->encode(g, 8, 1)), ProtocolError);  // other round
  auto dense = make_compressor("dense", dim);
  EXPECT_THROW(agg->add(dense->encode(g, 7, 1)), ConfigMismatch);
  auto other_dim = make_compressor("topk:k=5", dim + 1);
  EXPECT_THROW(agg->add(other_dim->encode(test::gaussian(dim + 1, 1), 7, 1)), ConfigMismatch);
  EXPECT_EQ(agg->count(), 1u);
  const Message update = agg->finish();
  EXPECT_THROW(agg->add(update), ProtocolError);  // an Update is not a Gradient
  std::vector<float> step(dim);
  EXPECT_THROW(worker->apply(m0, step), ProtocolError);
  EXPECT_THROW(worker->answer(update, 0), ProtocolError);  // topk has no second round
  EXPECT_THROW(worker->encode(g, 0, kServerRank), InvalidArgument);
  std::vector<float> wrong(dim + 1);
  EXPECT_THROW(worker->apply(update, wrong), InvalidArgument);
  worker->apply(update, step);
  EXPECT_EQ(std::count_if(step.begin(), step.end(), [](float v) { return v != 0; }), 5);
  EXPECT_THROW(codec->make_aggregator(0), InvalidArgument);
}

TEST(Codecs, NonFiniteGradientRejectedStateUnchanged) {
  for (const auto& spec : example_specs(Layout::parse("25x40"))) {
    auto a = make_compressor(spec, 1000), b = make_compressor(spec, 1000);
    auto g = test::gaussian(1000, 17);
    auto bad = g;
    bad[500] = std::nanf("");
    EXPECT_THROW(a->encode(bad, 0, 0), NonFiniteError) << spec;
    EXPECT_THROW(a->encode(std::vector<float>(999), 0, 0), InvalidArgument) << spec;
    const auto ma = a->encode(g, 1, 0), mb = b->encode(g, 1, 0);
    EXPECT_TRUE(
        std::equal(ma.bytes().begin(), ma.bytes().end(), mb.bytes().begin(), mb.bytes().end()))
        << spec;
  }
}

TEST(Aggregator, OutlivesTheCompressorThatMadeIt) {
  auto agg = make_compressor("topk:k=3", 50)->make_aggregator(1);  // compressor destroyed here
  auto worker = make_compressor("topk:k=3", 50);
  agg->add(worker->encode(test::gaussian(50, 1), 0, 0));
  std::vector<float> step(50);
  worker->apply(agg->finish(), step);
  EXPECT_EQ(std::count_if(step.begin(), step.end(), [](float v) { return v != 0; }), 3);
}

// apply_step (the sparse fast path, and a server's own codec) equals apply() + axpy bit for bit,
// state included.
TEST(Codecs, ApplyStepEqualsApplyThenAxpyBitForBit) {
  constexpr uint64_t dim = 4000;
  for (const auto& spec : example_specs(Layout::parse("40x90+400"))) {
    test::Job a(spec, dim, 2), b(spec, dim, 2);
    std::vector<float> pa = test::gaussian(dim, 3), pb = pa, pc = pa;
    for (uint64_t t = 0; t < 3; ++t) {
      const std::vector<std::vector<float>> g = {test::gaussian(dim, 10 + t),
                                                 test::gaussian(dim, 20 + t)};
      const auto steps = a.round(g, t);  // apply() on a's workers
      kernels::cpu::axpy(pa.data(), steps[0].data(), dim, -0.3f);
      // b's workers take the same round through apply_step.
      for (uint32_t w = 0; w < 2; ++w) b.server->add(b.workers[w]->encode(g[w], t, w));
      Message out = b.server->finish();
      if (b.server->expecting() == MessageKind::Answer) {
        for (uint32_t w = 0; w < 2; ++w) b.server->add(b.workers[w]->answer(out, w));
        out = b.server->finish();
      }
      std::vector<float> scratch = pb;
      b.workers[0]->apply_step(out, pb, 0.3f);
      b.workers[1]->apply_step(out, scratch, 0.3f);
      b.server_codec->apply_step(out, pc, 0.3f);
      ASSERT_EQ(std::memcmp(pa.data(), pb.data(), dim * 4), 0) << spec << " round " << t;
      ASSERT_EQ(std::memcmp(pa.data(), pc.data(), dim * 4), 0) << spec << " round " << t;
    }
    std::vector<float> short_params(dim - 1);
    EXPECT_THROW(b.server_codec->apply_step(a.last_update, short_params, 0.1f), InvalidArgument)
        << spec;
    EXPECT_THROW(b.server_codec->apply_step(a.last_update, pc, std::nanf("")), InvalidArgument)
        << spec;
    Bytes bad(a.last_update.bytes().begin(), a.last_update.bytes().end());
    bad.back() ^= 1;
    const std::vector<float> before = pc;
    EXPECT_THROW(b.server_codec->apply_step(bad, pc, 0.1f), WireError) << spec;
    EXPECT_EQ(std::memcmp(before.data(), pc.data(), dim * 4), 0)
        << spec << ": corrupt update wrote";
  }
}

}  // namespace
}  // namespace sketchsgd
