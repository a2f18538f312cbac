// sparseloco: the chunked selection, the level codes and their scale, the payload's size, error
// feedback with its decay, the server's mean, and refusal of payloads the encoder cannot write.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/gpu.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

/// The step the server's mean of these workers' messages gives.
std::vector<float> mean_step(std::vector<std::unique_ptr<Compressor>>& workers,
                             const std::vector<std::vector<float>>& g, uint64_t round) {
  auto agg = workers[0]->make_aggregator(uint32_t(workers.size()));
  for (size_t w = 0; w < workers.size(); ++w)
    agg->add(workers[w]->encode(g[w], round, uint32_t(w)));
  std::vector<float> step(g[0].size());
  workers[0]->apply(agg->finish(), step);
  return step;
}

Bytes gradient(const Compressor& c, std::span<const uint8_t> payload) {
  const Header h{c.id(), MessageKind::Gradient, c.dim(), 0, 0, 0};
  return Message::build(h, payload.size(), [&](ByteWriter& w) { w.put_array(payload); }).release();
}

TEST(SparseLoCo, LevelCodesRoundToTheNearestNonZeroLevel) {
  for (uint32_t bits : {2u, 4u, 8u}) {
    const uint32_t levels = 1u << (bits - 1), sign = levels;
    for (float x : {1.0f, -1.0f, 0.74f, -0.26f, 0.01f, 0.0f}) {
      const uint32_t code = elem::level_code(x, 1.0f, levels, sign);
      const float v = elem::level_value(code, 1.0f, levels, sign);
      const float m =
          std::max(1.0f, std::min(float(levels), std::nearbyint(std::fabs(x) * levels)));
      EXPECT_FLOAT_EQ(std::fabs(v), m / float(levels)) << bits << " " << x;  // never zero
      EXPECT_EQ(std::signbit(v), std::signbit(x) && x != 0.0f) << bits << " " << x;
    }
  }
  // Packed four to a byte at 2 bits, decoded with the same values.
  const float x[] = {0.9f, -0.2f, 0.6f, -1.0f, 0.4f};
  uint8_t codes[2];
  float q[5], back[5];
  kernels::cpu::level_pack(x, 5, 1.0f, 2, codes, q);
  kernels::cpu::level_unpack(codes, 5, 1.0f, 2, 1.0f, back);
  const float want[] = {1.0f, -0.5f, 0.5f, -1.0f, 0.5f};
  for (int i = 0; i < 5; ++i) {
    EXPECT_FLOAT_EQ(q[i], want[i]) << i;
    EXPECT_FLOAT_EQ(back[i], want[i]) << i;
  }
}

TEST(SparseLoCo, EachChunkSendsItsTopKAtTwoBitsUnderItsOwnScale) {
  // Chunks of 8 (the last has 4), k = 2: the two largest |x| of each chunk, quantised to
  // ± scale / 2 or ± scale with scale the chunk's largest.
  const std::vector<float> g = {0.1f, 4.0f,  -0.2f, 0.0f, -1.5f, 0.3f, 0.2f,  0.1f,  // 4, -1.5
                                0.0f, 0.0f,  0.0f,  9.0f, 0.0f,  0.0f, -8.0f, 0.0f,  // 9, -8
                                0.5f, -0.6f, 0.1f,  0.2f};                           // -0.6, 0.5
  auto c = make_compressor("sparseloco:chunk=8,k=2,bits=2,ef=0", g.size());
  const Message m = c->encode(g, 0, 0);
  EXPECT_EQ(payload_of(m).size(), 3 * 4 + 6 * 2 + 3 * 1);  // scales, u16 offsets, codes
  std::vector<std::unique_ptr<Compressor>> one;
  one.push_back(std::move(c));
  const auto step = mean_step(one, {g}, 0);
  std::vector<float> want(g.size(), 0.0f);
  want[1] = 4.0f;
  want[4] = -2.0f;  // 1.5 / 4 · 2 = 0.75 levels: rounds up to 1 of 2 → scale / 2
  want[11] = 9.0f;
  want[14] = -9.0f;  // 8 / 9 · 2 = 1.78: the top level
  want[16] = 0.6f;   // 0.5 / 0.6 · 2 = 1.67: the top level
  want[17] = -0.6f;
  for (size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(step[i], want[i]) << i;
  // The defaults (chunks of 4096, k = 64, 2 bits): 4 + 128 + 16 bytes a chunk, 110x with the
  // message's header.
  auto big = make_compressor("sparseloco", 1 << 20);
  big->encode(test::gaussian(1 << 20, 2), 0, 0);
  EXPECT_DOUBLE_EQ(big->compression_ratio(), 4.0 * (1 << 20) / (kHeaderBytes + 256 * 148));
}

TEST(SparseLoCo, AVectorShorterThanAChunkOrThanKIsOnePartialChunk) {
  // As the last chunk of a longer vector: min(k, its length) values go out. A unit this small
  // is an FSDP module's shard or a chunk's piece of a matrix, under the model's one spec.
  for (uint64_t dim : {1u, 13u, 40u}) {
    auto c = make_compressor("sparseloco:chunk=256,k=16,bits=8,ef=0", dim);
    std::vector<std::unique_ptr<Compressor>> one;
    one.push_back(std::move(c));
    const auto g = test::gaussian(dim, 3);
    const auto step = mean_step(one, {g}, 0);
    uint64_t nonzero = 0;
    for (float s : step) nonzero += s != 0.0f;
    EXPECT_EQ(nonzero, std::min<uint64_t>(dim, 16)) << dim;
  }
}

TEST(SparseLoCo, ErrorFeedbackKeepsEverythingNotSentAndDecays) {
  const uint64_t dim = 1000;
  for (float decay : {1.0f, 0.5f}) {
    auto c = make_compressor("sparseloco:chunk=100,k=5,bits=2,decay=" + std::to_string(decay), dim);
    std::vector<double> kept(dim, 0.0);  // e by hand: e = decay · e + g − sent
    std::vector<std::unique_ptr<Compressor>> one;
    one.push_back(std::move(c));
    for (uint64_t round = 0; round < 4; ++round) {
      const auto g = test::gaussian(dim, 10 + round);
      const auto step = mean_step(one, {g}, round);
      for (uint64_t j = 0; j < dim; ++j) kept[j] = decay * kept[j] + g[j] - step[j];
      uint64_t nonzero = 0;
      for (float s : step) nonzero += s != 0.0f;
      EXPECT_EQ(nonzero, 10 * 5u);
    }
    // The codec's own error equals the hand-kept one (to float rounding): with g = 0 the next
    // step selects from decay · e, and each chunk's largest goes out exactly (the top level).
    const auto step = mean_step(one, {std::vector<float>(dim, 0.0f)}, 4);
    for (uint64_t c = 0; c < 10; ++c) {
      uint64_t top = 100 * c;
      for (uint64_t j = 100 * c; j < 100 * (c + 1); ++j)
        if (std::fabs(kept[j]) > std::fabs(kept[top])) top = j;
      EXPECT_NEAR(step[top], decay * kept[top], 1e-4 * std::fabs(kept[top])) << decay << " " << c;
    }
  }
}

TEST(SparseLoCo, TheServerAveragesOverlappingSelections) {
  const uint64_t dim = 64;
  std::vector<std::unique_ptr<Compressor>> w;
  for (int i = 0; i < 3; ++i)
    w.push_back(make_compressor("sparseloco:chunk=32,k=1,bits=8,ef=0", dim));
  std::vector<std::vector<float>> g(3, std::vector<float>(dim, 0.0f));
  g[0][5] = 2.0f;  // chunk 0: workers 0 and 1 pick 5, worker 2 picks 7
  g[1][5] = 4.0f;
  g[2][7] = -3.0f;
  for (auto& v : g) v[40] = 1.0f;  // chunk 1: everyone picks 40
  const auto step = mean_step(w, g, 0);
  EXPECT_FLOAT_EQ(step[5], 2.0f);   // (2 + 4) / 3
  EXPECT_FLOAT_EQ(step[7], -1.0f);  // -3 / 3
  EXPECT_FLOAT_EQ(step[40], 1.0f);
}

TEST(SparseLoCo, CorruptPayloadsAreRefusedAndTheSumUnchanged) {
  const uint64_t dim = 40;
  auto c = make_compressor("sparseloco:chunk=16,k=3,bits=4,ef=0", dim);
  const Message m = c->encode(test::gaussian(dim, 3), 0, 0);
  const auto good = payload_of(m);
  // 3 scales (12 B), 9 offsets (18 B), codes 2 + 2 + 2 B.
  ASSERT_EQ(good.size(), 12u + 18u + 6u);
  auto bad = [&](auto&& edit) {
    Bytes p(good.begin(), good.end());
    edit(p);
    auto agg = c->make_aggregator(1);
    EXPECT_THROW(agg->add(gradient(*c, p)), WireError);
    EXPECT_EQ(agg->count(), 0u);
  };
  bad([](Bytes& p) { p.pop_back(); });
  bad([](Bytes& p) { p.push_back(0); });
  bad([](Bytes& p) {
    const float nan = std::nanf("");
    std::memcpy(p.data() + 4, &nan, 4);
  });
  bad([](Bytes& p) {
    const float negative = -1.0f;
    std::memcpy(p.data(), &negative, 4);
  });
  bad([](Bytes& p) {
    const uint16_t past = 16;  // chunk 0 holds offsets 0 … 15
    std::memcpy(p.data() + 12, &past, 2);
  });
  bad([](Bytes& p) {
    const uint16_t past = 8;  // the short last chunk (32 … 39) holds offsets 0 … 7
    std::memcpy(p.data() + 12 + 2 * 8, &past, 2);
  });
  bad([](Bytes& p) { std::memcpy(p.data() + 12 + 2, p.data() + 12, 2); });  // repeated offset
  bad([](Bytes& p) { p[12 + 18 + 1] |= 0xF0; });  // 3 codes of 4 bits: the high nibble is padding
}

TEST(SparseLoCo, RefusesWhatItCannotDo) {
  EXPECT_THROW(make_compressor("sparseloco:bits=3", 1000), InvalidArgument);
  EXPECT_THROW(make_compressor("sparseloco:chunk=16,k=17", 1000), InvalidArgument);
  EXPECT_THROW(make_compressor("sparseloco:decay=0", 1000), InvalidArgument);
  EXPECT_THROW(make_compressor("sparseloco:chunk=70000", 1000), InvalidArgument);
  if (gpu::device_count() > 0)
    EXPECT_THROW(make_compressor("sparseloco", 1000, Device::cuda()), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd
