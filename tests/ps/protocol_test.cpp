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

TEST(Protocol, AsynchronousFieldsRoundTripAndBadWeightsAreRefused) {
  HelloInfo h{4, 100, "dense", 0, ShardId{0, 1, 0, 100}, 0, 2.5f};
  EXPECT_EQ(decode_hello(encode(h)).weight, 2.5f);
  for (const float bad : {0.0f, -1.0f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    h.weight = bad;
    EXPECT_THROW(decode_hello(encode(h)), WireError) << bad;
  }
  WelcomeInfo w{1, 500, 0};
  w.async = 1;
  EXPECT_EQ(decode_welcome(encode(w)).async, 1);
  w.async = 2;
  EXPECT_THROW(decode_welcome(encode(w)), WireError);
  const UpdateInfo u = decode_update_info(encode(UpdateInfo{0.5f, 1, 17, 3, 2, 9}));
  EXPECT_EQ(u.version, 17u);
  EXPECT_EQ(u.age, 3u);
  EXPECT_EQ(u.pusher, 2u);
  EXPECT_EQ(u.push, 9u);
  const Bytes ub = encode(u);
  for (size_t n = 0; n < ub.size(); ++n)
    EXPECT_THROW(decode_update_info(std::span<const uint8_t>(ub).first(n)), WireError) << n;
}

TEST(Protocol, EpochsAndReplicationMessagesRoundTripAndRejectCorruption) {
  HelloInfo h{4, 100, "dense", 0, ShardId{0, 1, 0, 100}, 7};
  EXPECT_EQ(decode_hello(encode(h)).epoch, 7u);
  EXPECT_EQ(decode_welcome(encode(WelcomeInfo{1, 500, 0, 0.0f, 0, 9})).epoch, 9u);
  EXPECT_EQ(decode_replica_info(encode(ReplicaInfo{5})).epoch, 5u);
  for (Type t : {Type::Follow, Type::Sync, Type::Commit, Type::Ack, Type::Deposed}) {
    const Envelope e{t, 3, 4, 0, 0, 0};
    EXPECT_EQ(decode_envelope(encode(e), payload_frames(t)).type, t) << to_string(t);
  }
  const CommitInfo c{2, Type::Update, UpdateInfo{0.25f, 3, 17, 4, 2, 9}, Bytes{1, 2, 3, 4, 5}};
  const Bytes cb = encode(c);
  const CommitInfo c2 = decode_commit_info(cb);
  EXPECT_EQ(c2.epoch, 2u);
  EXPECT_EQ(c2.outcome, Type::Update);
  EXPECT_EQ(c2.info.lr, 0.25f);
  EXPECT_EQ(c2.info.contributors, 3u);
  // An asynchronous push's identity: a backup answers it again rather than apply it twice.
  EXPECT_EQ(c2.info.version, 17u);
  EXPECT_EQ(c2.info.age, 4u);
  EXPECT_EQ(c2.info.pusher, 2u);
  EXPECT_EQ(c2.info.push, 9u);
  EXPECT_EQ(c2.codec_state, c.codec_state);
  for (size_t n = 0; n < cb.size(); ++n)
    EXPECT_THROW(decode_commit_info(std::span<const uint8_t>(cb).first(n)), WireError) << n;
  Bytes other = cb;
  other[8] = uint8_t(Type::Push);  // a round ends with an update or an abort
  EXPECT_THROW(decode_commit_info(other), WireError);
  Bytes huge = cb;
  huge[41] = 0xFF;  // a codec state longer than the frame
  EXPECT_THROW(decode_commit_info(huge), WireError);
  EXPECT_THROW(encode(CommitInfo{0, Type::Model}), InvalidArgument);
}

TEST(Protocol, AProbeAndItsReleaseRoundTripAndRejectCorruption) {
  for (Type t : {Type::Probe, Type::Present}) {
    const Envelope e{t, 3, 4, 1, 0, 0x1234567};
    EXPECT_EQ(decode_envelope(encode(e), payload_frames(t)).session, 0x1234567u) << to_string(t);
  }
  const ProbeInfo p = decode_probe(encode(ProbeInfo{6, 0}));
  EXPECT_EQ(p.epoch, 6u);
  EXPECT_EQ(p.release, 0);
  EXPECT_EQ(decode_probe(encode(ProbeInfo{6, 1})).release, 1);
  const Bytes b = encode(ProbeInfo{6, 1});
  for (size_t n = 0; n < b.size(); ++n)
    EXPECT_THROW(decode_probe(std::span<const uint8_t>(b).first(n)), WireError) << n;
  Bytes bad = b;
  bad.back() = 2;  // neither a probe nor a release
  EXPECT_THROW(decode_probe(bad), WireError);
  bad = b;
  bad.push_back(0);
  EXPECT_THROW(decode_probe(bad), WireError);
}

}  // namespace
}  // namespace sketchsgd::ps
