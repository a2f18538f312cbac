// The envelope and info frames of the parameter-server protocol: round trips, and every kind of
// corruption refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/ps/protocol.hpp>

namespace sketchsgd::ps {
namespace {

TEST(Protocol, EnvelopesAndInfosRoundTripAndRejectCorruption) {
  const Envelope e{Type::Update, 9, 1234567890123ull, 17, 0};
  const Bytes b = encode(e);
  ASSERT_EQ(b.size(), kEnvelopeBytes);
  const Envelope d = decode_envelope(b, 2);
  EXPECT_EQ(d.type, e.type);
  EXPECT_EQ(d.job, 9u);
  EXPECT_EQ(d.round, e.round);
  EXPECT_EQ(d.rank, 17u);
  EXPECT_THROW(decode_envelope(b, 1), WireError);
  for (size_t i : {0, 4, 6, 7, 28}) {
    Bytes c = b;
    c[i] ^= 0x40;
    EXPECT_THROW(decode_envelope(c, 2), WireError) << "byte " << i;
  }
  const HelloInfo h{4, 1u << 20, "sketch:rows=5", 1000, ShardId{2, 3, 7u << 20, 3u << 22}};
  const HelloInfo h2 = decode_hello(encode(h));
  EXPECT_EQ(h2.world, 4u);
  EXPECT_EQ(h2.dim, 1u << 20);
  EXPECT_EQ(h2.spec, h.spec);
  EXPECT_EQ(h2.population, 1000u);
  EXPECT_EQ(h2.shard, h.shard);
  Bytes hb = encode(h);
  for (size_t n = 0; n < hb.size(); ++n)
    EXPECT_THROW(decode_hello(std::span<const uint8_t>(hb).first(n)), WireError) << n;
  hb[14] = 0xFF;  // spec length beyond the limit
  EXPECT_THROW(decode_hello(hb), WireError);
  EXPECT_THROW(encode(HelloInfo{1, 1, std::string(kMaxText + 1, 'x')}), InvalidArgument);
  const RefuseInfo r = decode_refuse(encode(RefuseInfo{true, Type::Push, "why"}));
  EXPECT_TRUE(r.retry);
  EXPECT_EQ(r.refused, Type::Push);
  EXPECT_EQ(r.reason, "why");
  Bytes nan = encode(UpdateInfo{0.1f, 3});
  const float bad = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data(), &bad, 4);
  EXPECT_THROW(decode_update_info(nan), WireError);
  EXPECT_THROW(decode_welcome(encode(WelcomeInfo{2, 1000, 0})), WireError);
  EXPECT_THROW(decode_welcome(encode(WelcomeInfo{1, 1000, 65})), WireError);
  const WelcomeInfo outer = decode_welcome(encode(WelcomeInfo{1, 500, 0, 0.9f, 1}));
  EXPECT_EQ(outer.momentum, 0.9f);
  EXPECT_EQ(outer.nesterov, 1);
  for (const WelcomeInfo bad : {WelcomeInfo{1, 500, 0, 1.5f, 0}, WelcomeInfo{1, 500, 0, -0.5f, 0},
                                WelcomeInfo{1, 500, 0, 0.0f, 1}, WelcomeInfo{1, 500, 0, 0.5f, 2},
                                WelcomeInfo{1, 500, 0, std::nanf(""), 0}})
    EXPECT_THROW(decode_welcome(encode(bad)), WireError)
        << bad.momentum << " " << int(bad.nesterov);
}

}  // namespace
}  // namespace sketchsgd::ps
