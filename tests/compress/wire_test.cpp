#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include "compress/payload.hpp"
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

/// Recomputes the checksum so that semantic checks (not the CRC) must catch a change.
Bytes reseal(Bytes b) {
  if (b.size() < kHeaderBytes) return b;
  const uint32_t crc = crc32c(std::span(b).subspan(kHeaderBytes), crc32c(std::span(b).first(40)));
  std::memcpy(b.data() + 40, &crc, 4);
  return b;
}

Bytes copy(const Message& m) {
  return Bytes(m.bytes().begin(), m.bytes().end());
}

template <class T>
Bytes poke(Bytes b, size_t at, T value) {
  std::memcpy(b.data() + at, &value, sizeof(T));
  return reseal(std::move(b));
}

TEST(Wire, HeaderChecks) {
  auto c = make_compressor("topk:k=4", 64);
  const Bytes m = copy(c->encode(test::gaussian(64, 1), 5, 2));
  const Header h = decode_header(m, 1000);
  EXPECT_EQ(h.codec, CodecId::TopK);
  EXPECT_EQ(h.kind, MessageKind::Gradient);
  EXPECT_EQ(h.dim, 64u);
  EXPECT_EQ(h.round, 5u);
  EXPECT_EQ(h.sender, 2u);
  EXPECT_EQ(h.payload_bytes, 4u + 8 * 4);
  auto rejects = [&](const Bytes& b, const char* what) {
    try {
      decode_header(b, 1000);
    } catch (const WireError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << what;
  };
  rejects(poke(m, 0, uint32_t(0x12345678)), "magic");
  rejects(poke(m, 4, uint16_t(2)), "version");
  rejects(poke(m, 6, uint8_t(9)), "codec");
  rejects(poke(m, 7, uint8_t(0)), "kind");
  rejects(poke(m, 28, uint32_t(1)), "reserved");
  rejects(poke(m, 44, uint32_t(1)), "reserved");
  rejects(poke(m, 32, uint64_t(1) << 40), "exceeds the limit");
  rejects(poke(m, 32, uint64_t(4)), "declares");
  rejects(Bytes(m.begin(), m.begin() + 47), "shorter");
  Bytes flipped = m;
  flipped[60] ^= 1;
  rejects(flipped, "checksum");
  EXPECT_THROW(decode_header(m, 10), WireError);  // oversized for the caller's limit
}

TEST(Wire, PayloadChecks) {
  const size_t dim = 64;
  auto topk = make_compressor("topk:k=4", dim);
  auto agg = topk->make_aggregator(1);
  const Bytes m = copy(topk->encode(test::gaussian(dim, 2), 0, 0));
  const size_t p = kHeaderBytes;
  EXPECT_THROW(agg->add(poke(m, p, uint32_t(5))), WireError);         // count > k
  EXPECT_THROW(agg->add(poke(m, p + 4, uint32_t(dim))), WireError);   // index out of range
  EXPECT_THROW(agg->add(poke(m, p + 8, uint32_t(0))), WireError);     // not increasing
  EXPECT_THROW(agg->add(poke(m, p + 20, std::nanf(""))), WireError);  // NaN value
  Bytes shorter = m;
  shorter.resize(m.size() - 4);
  shorter = poke(shorter, 32, uint64_t(shorter.size() - kHeaderBytes));
  EXPECT_THROW(agg->add(shorter), WireError);  // truncated payload
  EXPECT_EQ(agg->count(), 0u);
  agg->add(m);
  EXPECT_EQ(agg->count(), 1u);

  auto tern = make_compressor("terngrad", dim);
  auto tagg = tern->make_aggregator(1);
  const Bytes t = copy(tern->encode(test::gaussian(dim, 3), 0, 0));
  EXPECT_THROW(tagg->add(poke(t, p, uint32_t(32))), WireError);       // chunk mismatch
  EXPECT_THROW(tagg->add(poke(t, p + 4, -1.0f)), WireError);          // negative scale
  EXPECT_THROW(tagg->add(poke(t, p + 8, uint8_t(0xFF))), WireError);  // code 3
  tagg->add(t);

  auto sign = make_compressor("signsgd", 40);
  auto sagg = sign->make_aggregator(1);
  const Bytes s = copy(sign->encode(test::gaussian(40, 4), 0, 0));
  EXPECT_THROW(sagg->add(poke(s, p + 4, uint32_t(0xFFFFFFFF))), WireError);  // padding bits
  sagg->add(s);
}

/// Replays thousands of random mutations of valid messages of every codec and kind through every
/// decoding entry point: each must either accept or throw sketchsgd::Error — never crash, hang,
/// or throw anything else. Run under the asan preset this also proves no memory error.
TEST(Wire, MutationReplay) {
  const size_t dim = 300;
  std::mt19937_64 rng(2026);
  int accepted = 0, rejected = 0;
  for (const char* spec : {"dense", "topk:k=20,global=1", "terngrad:chunk=50", "signsgd",
                           "signsgd:ef=1,chunk=64", "sketch:rows=3,cols=40,k=10,p2=2"}) {
    test::Job job(spec, dim, 2);
    const auto g0 = test::gaussian(dim, 5), g1 = test::gaussian(dim, 6);
    std::vector<Bytes> valid;
    const Message a = job.workers[0]->encode(g0, 0, 0), b = job.workers[1]->encode(g1, 0, 1);
    valid.push_back(copy(a));
    job.server->add(a);
    job.server->add(b);
    Message out = job.server->finish();
    valid.push_back(copy(out));
    if (job.server->expecting() == MessageKind::Answer) {
      const Message ans = job.workers[0]->answer(out, 0);
      valid.push_back(copy(ans));
      job.server->add(ans);
      job.server->add(job.workers[1]->answer(out, 1));
      valid.push_back(copy(job.server->finish()));
    }
    for (int i = 0; i < 2500; ++i) {
      Bytes m = valid[rng() % valid.size()];
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        switch (rng() % 5) {
          case 0:
            m[rng() % m.size()] ^= uint8_t(1u << (rng() % 8));
            break;
          case 1:
            m[rng() % m.size()] = uint8_t(rng());
            break;
          case 2:
            m.resize(rng() % (m.size() + 1));
            break;
          case 3:
            m.insert(m.end(), rng() % 16, uint8_t(rng()));
            break;
          case 4: {
            const size_t at = kHeaderBytes + rng() % 64;
            if (at + 4 <= m.size()) {
              const uint32_t v = uint32_t(rng() % 3 == 0 ? rng() : rng() % (2 * dim));
              std::memcpy(m.data() + at, &v, 4);
            }
          }
        }
        if (m.empty()) m.push_back(0);
      }
      if (rng() % 4) m = reseal(m);  // mostly get past the checksum to reach the payload checks
      // Fresh aggregator per message keeps each replay independent of the last.
      auto agg = job.server_codec->make_aggregator(2);
      auto worker = make_compressor(spec, dim);
      std::vector<float> step(dim);
      for (int entry = 0; entry < 3; ++entry) {
        try {
          if (entry == 0) agg->add(m);
          if (entry == 1) worker->apply(m, step);
          if (entry == 2) worker->answer(m, 0);
          ++accepted;
        } catch (const Error&) {
          ++rejected;
        } catch (const std::exception& e) {
          ADD_FAILURE() << spec << ": non-library exception " << e.what();
        }
      }
    }
  }
  EXPECT_GT(rejected, 10000);
  EXPECT_GT(accepted, 100);  // some mutations are still valid messages: the checks are not blanket
}

}  // namespace
}  // namespace sketchsgd

namespace sketchsgd {
namespace {

/// I8 values: a float32 scale per group (a column's run of kI8Rows rows), then a byte each;
/// every value within half its group's unit (largest / 127), each group's largest exact; a
/// small column keeps its precision beside a large one; what a reader must refuse is refused.
TEST(Wire, Int8ValuesByColumn) {
  EXPECT_EQ(i8_groups(1, 1), 1u);
  EXPECT_EQ(i8_groups(kI8Rows, 1), 1u);
  EXPECT_EQ(i8_groups(kI8Rows + 1, 1), 2u);
  EXPECT_EQ(i8_groups(3 * kI8Rows, 3), 3u);
  EXPECT_EQ(i8_groups(3 * kI8Rows + 1, 3), 6u);
  EXPECT_EQ(wire_size(WireFloat::I8, 4 * kI8Rows - 6, 2), 4 * 4 + 4 * kI8Rows - 6);
  EXPECT_EQ(wire_size(WireFloat::F16, 1000), 2000u);
  const uint64_t columns = 3,
                 n = 3 * (kI8Rows + kI8Rows / 4) + 2;  // two row blocks, the last short
  std::vector<float> v(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (uint64_t i = 0; i < n; ++i) v[i] = normal(rng) * (i % columns == 2 ? 1e-3f : 1.0f);
  for (uint64_t cols : {columns, uint64_t(1)}) {
    Bytes b;
    ByteWriter w(b);
    payload::write_values(w, v, WireFloat::I8, "value", cols);
    ASSERT_EQ(b.size(), wire_size(WireFloat::I8, n, cols));
    ByteReader r(b);
    const auto back = payload::read_values(r, n, WireFloat::I8, "value", cols);
    r.expect_end();
    std::vector<float> largest(i8_groups(n, cols), 0.0f);
    auto group = [&](uint64_t i) { return i / cols / kI8Rows * cols + i % cols; };
    for (uint64_t i = 0; i < n; ++i)
      largest[group(i)] = std::max(largest[group(i)], std::fabs(v[i]));
    double small_err = 0, small_norm = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const float unit = largest[group(i)] / 127.0f;
      EXPECT_LE(std::fabs(back[i] - v[i]), 0.5f * unit * 1.0001f) << "value " << i;
      if (std::fabs(v[i]) == largest[group(i)]) EXPECT_NEAR(back[i], v[i], 1e-6f * unit);
      if (i % columns == 2) {
        small_err += (back[i] - v[i]) * (back[i] - v[i]);
        small_norm += v[i] * v[i];
      }
    }
    // By column, the 1e-3 column is rounded at its own scale; mixed into rows, it is mostly 0.
    if (cols == columns)
      EXPECT_LT(std::sqrt(small_err / small_norm), 0.02);
    else
      EXPECT_GT(std::sqrt(small_err / small_norm), 0.5);
    if (cols != columns) continue;
    // Truncated, a scale that is NaN or negative, an integer of -128: refused.
    ByteReader cut(std::span<const uint8_t>(b).first(b.size() - 1));
    EXPECT_THROW(payload::read_values(cut, n, WireFloat::I8, "value", cols), WireError);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -1.0f}) {
      Bytes c = b;
      std::memcpy(c.data() + 4, &bad, 4);
      ByteReader rc(c);
      EXPECT_THROW(payload::read_values(rc, n, WireFloat::I8, "value", cols), WireError) << bad;
    }
    Bytes c = b;
    c[4 * i8_groups(n, cols) + 7] = 0x80;
    ByteReader rc(c);
    EXPECT_THROW(payload::read_values(rc, n, WireFloat::I8, "value", cols), WireError);
  }
  // A value that is not finite is refused before anything is written.
  v[11] = std::numeric_limits<float>::infinity();
  Bytes b;
  ByteWriter w(b);
  EXPECT_THROW(payload::write_values(w, v, WireFloat::I8, "value", columns), NonFiniteError);
  EXPECT_TRUE(b.empty());
}

/// Sketch tables in 16-bit floats: half the bytes, the same heavy hitters found as with fp32, a
/// 16-bit Inf or NaN refused after resealing, and a table beyond fp16's range refused by the
/// encoder with the worker's state as before.
TEST(Wire, SixteenBitSketchTables) {
  const uint64_t dim = 20000;
  auto g = test::gaussian(dim, 9, 0.01f);
  const auto heavy = test::plant(g, 20, 5.0f, 10);
  for (const char* wire : {"fp16", "bf16"}) {
    const std::string base = "sketch:rows=3,cols=2000,k=20,momentum=0";
    auto c32 = make_compressor(base, dim), c16 = make_compressor(base + ",wire=" + wire, dim);
    const Message m32 = c32->encode(g, 0, 0), m16 = c16->encode(g, 0, 0);
    EXPECT_EQ(m16.bytes().size() - kHeaderBytes, (m32.bytes().size() - kHeaderBytes) / 2);
    auto a32 = c32->make_aggregator(1), a16 = c16->make_aggregator(1);
    a32->add(m32.bytes());
    a16->add(m16.bytes());
    std::vector<float> s32(dim), s16(dim);
    c32->apply(a32->finish().bytes(), s32);
    c16->apply(a16->finish().bytes(), s16);
    for (uint32_t j : heavy) {
      EXPECT_EQ(s16[j] != 0.0f, s32[j] != 0.0f) << wire << ": heavy hitter " << j;
      EXPECT_NEAR(s16[j], s32[j], 0.01f * std::fabs(s32[j]) + 1e-3f) << wire;
    }
    // A 16-bit Inf in the table: refused even with a valid checksum.
    Bytes bad(m16.bytes().begin(), m16.bytes().end());
    const uint16_t inf = std::string(wire) == "fp16" ? 0x7C00 : 0x7F80;
    std::memcpy(bad.data() + kHeaderBytes + 6, &inf, 2);
    auto a = c16->make_aggregator(1);
    EXPECT_THROW(a->add(reseal(bad)), WireError) << wire;
    EXPECT_EQ(a->count(), 0u);
  }
  // The update's indices delta-coded: fewer bytes, the same step.
  {
    auto u32 = make_compressor("sketch:rows=3,cols=2000,k=200,momentum=0", dim);
    auto delta = make_compressor("sketch:rows=3,cols=2000,k=200,momentum=0,index=delta", dim);
    auto au = u32->make_aggregator(1), ad = delta->make_aggregator(1);
    au->add(u32->encode(g, 0, 0).bytes());
    ad->add(delta->encode(g, 0, 0).bytes());
    const Message mu = au->finish(), md = ad->finish();
    EXPECT_LT(md.bytes().size() - kHeaderBytes, (mu.bytes().size() - kHeaderBytes) * 3 / 4);
    std::vector<float> su(dim), sd(dim);
    u32->apply(mu.bytes(), su);
    delta->apply(md.bytes(), sd);
    EXPECT_EQ(su, sd);
    EXPECT_THROW(u32->apply(md.bytes(), su), WireError);  // another format: refused
  }
  // Beyond fp16's range: NonFiniteError, and the worker state is as before (up to rounding).
  auto c = make_compressor("sketch:rows=3,cols=2000,k=20,wire=fp16", dim);
  auto fresh = make_compressor("sketch:rows=3,cols=2000,k=20,wire=fp16", dim);
  std::vector<float> huge(dim, 1e5f);
  EXPECT_THROW(c->encode(huge, 0, 0), NonFiniteError);
  EXPECT_EQ(copy(c->encode(g, 1, 0)), copy(fresh->encode(g, 1, 0)));
}

}  // namespace
}  // namespace sketchsgd

namespace sketchsgd {
namespace {

/// Sparse lists with delta-coded indices and 16-bit values: round trips at every gap size, under
/// four bytes a pair for top-k of 1 % (fp16) instead of eight, every malformed varint refused, and
/// error feedback keeping what the rounding lost.
TEST(Wire, DeltaIndicesAndSixteenBitValues) {
  const uint64_t dim = 20000;
  auto g = test::gaussian(dim, 3);
  auto c32 = make_compressor("topk:k=200", dim);
  auto cd = make_compressor("topk:k=200,index=delta,wire=fp16", dim);
  const Message m32 = c32->encode(g, 0, 0), md = cd->encode(g, 0, 0);
  EXPECT_LT(md.bytes().size() - kHeaderBytes, 4 + 200 * 4);  // 1-2 byte gaps + 2-byte values
  EXPECT_EQ(m32.bytes().size() - kHeaderBytes, 4u + 200 * 8);
  std::vector<float> s32(dim), sd(dim);
  auto a32 = c32->make_aggregator(1), ad = cd->make_aggregator(1);
  a32->add(m32.bytes());
  ad->add(md.bytes());
  c32->apply(a32->finish().bytes(), s32);
  cd->apply(ad->finish().bytes(), sd);
  for (size_t j = 0; j < dim; ++j) {
    ASSERT_EQ(s32[j] != 0.0f, sd[j] != 0.0f) << j;
    ASSERT_NEAR(sd[j], s32[j], 2e-3f * std::fabs(s32[j])) << j;
  }
  // Gaps of every size, the first and last index, through a one-entry and a full list.
  for (const std::vector<uint32_t>& idx :
       {std::vector<uint32_t>{0}, std::vector<uint32_t>{19999},
        std::vector<uint32_t>{0, 1, 127, 128, 16511, 16512, 19999}}) {
    Bytes b;
    ByteWriter w(b);
    std::vector<float> val(idx.size(), 1.5f);
    payload::write_sparse(w, idx, val, {true, WireFloat::F16});
    ByteReader r(b);
    const auto back = payload::read_sparse(r, dim, 200, {true, WireFloat::F16});
    EXPECT_EQ(back.indices, idx);
    EXPECT_EQ(back.values, val);
  }
  // Malformed: a varint of six bytes, a gap past dim, a count beyond the bytes, truncation.
  auto refuse = [&](Bytes b) {
    ByteReader r(b);
    EXPECT_THROW(payload::read_sparse(r, dim, 200, {true, WireFloat::F16}), WireError);
  };
  refuse({1, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0, 0x3C});
  refuse({1, 0, 0, 0, 0xA0, 0x9C, 0x01, 0, 0x3C});  // index 20000 = dim
  refuse({200, 0, 0, 0, 1, 2});
  refuse({2, 0, 0, 0, 1, 2, 0, 0x3C});  // values truncated
  // Error feedback keeps what fp16 rounding lost: a second round with no gradient sends it.
  auto ef = make_compressor("topk:k=20000,wire=fp16", dim);
  auto agg = ef->make_aggregator(1);
  std::vector<float> step(dim), zero(dim, 0.0f);
  agg->add(ef->encode(g, 0, 0).bytes());
  ef->apply(agg->finish().bytes(), step);
  agg->add(ef->encode(zero, 1, 0).bytes());
  std::vector<float> step2(dim);
  ef->apply(agg->finish().bytes(), step2);
  double before = 0, after = 0;
  for (size_t j = 0; j < dim; ++j) {
    before += (g[j] - step[j]) * (g[j] - step[j]);
    after += (g[j] - step[j] - step2[j]) * (g[j] - step[j] - step2[j]);
  }
  EXPECT_GT(before, 0.0);
  EXPECT_LT(after, 1e-3 * before);
}

}  // namespace
}  // namespace sketchsgd
