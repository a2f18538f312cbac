#include <sketchsgd/ps/protocol.hpp>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/ps/outer.hpp>

#include <algorithm>
#include <cmath>

namespace sketchsgd::ps {

std::string_view to_string(Type t) {
  switch (t) {
    case Type::Hello:
      return "hello";
    case Type::Welcome:
      return "welcome";
    case Type::Refuse:
      return "refuse";
    case Type::Init:
      return "init";
    case Type::Pull:
      return "pull";
    case Type::Model:
      return "model";
    case Type::Push:
      return "push";
    case Type::Query:
      return "query";
    case Type::Answer:
      return "answer";
    case Type::Update:
      return "update";
    case Type::Abort:
      return "abort";
    case Type::Heartbeat:
      return "heartbeat";
    case Type::Bye:
      return "bye";
    case Type::Finished:
      return "finished";
    case Type::Follow:
      return "follow";
    case Type::Sync:
      return "sync";
    case Type::Commit:
      return "commit";
    case Type::Ack:
      return "ack";
    case Type::Deposed:
      return "deposed";
    case Type::Left:
      return "left";
    case Type::Probe:
      return "probe";
    case Type::Present:
      return "present";
  }
  return "unknown";
}

uint32_t payload_frames(Type t) {
  switch (t) {
    case Type::Update:
    case Type::Sync:
    case Type::Commit:
      return 2;
    case Type::Pull:
    case Type::Heartbeat:
    case Type::Bye:
    case Type::Ack:
    case Type::Left:
      return 0;
    default:
      return 1;
  }
}

Bytes encode(const Envelope& e) {
  Bytes out;
  out.reserve(kEnvelopeBytes);
  ByteWriter w(out);
  w.put(kMagic);
  w.put(kProtocolVersion);
  w.put(uint8_t(e.type));
  w.put(uint8_t(0));
  w.put(e.job);
  w.put(e.round);
  w.put(e.rank);
  w.put(payload_frames(e.type));
  w.put(e.session);
  return out;
}

std::optional<ForeignHello> peek_foreign_hello(std::span<const uint8_t> frame) {
  if (frame.size() < 8) return std::nullopt;
  ByteReader r(frame.first(8), "envelope");
  const auto magic = r.get<uint32_t>();
  const auto version = r.get<uint16_t>();
  const auto type = r.get<uint8_t>();
  if (magic != kMagic || version == kProtocolVersion || type != uint8_t(Type::Hello))
    return std::nullopt;
  ForeignHello h{version, 0};
  if (frame.size() >= 28) h.rank = ByteReader(frame.subspan(24, 4), "envelope").get<uint32_t>();
  return h;
}

Envelope decode_envelope(std::span<const uint8_t> frame, size_t frames_present) {
  SKETCHSGD_REQUIRE(frame.size() == kEnvelopeBytes, WireError, "envelope of ", frame.size(),
                    " bytes, expected ", kEnvelopeBytes);
  ByteReader r(frame, "envelope");
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == kMagic, WireError, "envelope: bad magic");
  const auto version = r.get<uint16_t>();
  SKETCHSGD_REQUIRE(version == kProtocolVersion, WireError, "envelope: protocol version ", version,
                    ", this build speaks ", kProtocolVersion);
  const auto type = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(type >= 1 && type <= kMaxType, WireError, "envelope: unknown type ", int(type));
  SKETCHSGD_REQUIRE(r.get<uint8_t>() == 0, WireError, "envelope: flags set");
  Envelope e;
  e.type = Type(type);
  e.job = r.get<uint64_t>();
  e.round = r.get<uint64_t>();
  e.rank = r.get<uint32_t>();
  e.frames = r.get<uint32_t>();
  e.session = r.get<uint64_t>();
  SKETCHSGD_REQUIRE(e.frames == payload_frames(e.type), WireError, "envelope: ", to_string(e.type),
                    " declares ", e.frames, " payload frames, the protocol has ",
                    payload_frames(e.type));
  SKETCHSGD_REQUIRE(e.frames == frames_present, WireError, "envelope: declares ", e.frames,
                    " payload frames, ", frames_present, " arrived");
  return e;
}

namespace {
void put_text(ByteWriter& w, std::string_view s) {
  SKETCHSGD_REQUIRE(s.size() <= kMaxText, InvalidArgument, "text of ", s.size(), " bytes exceeds ",
                    kMaxText);
  w.put(uint32_t(s.size()));
  w.put_array(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

std::string get_text(ByteReader& r) {
  const auto n = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(n <= kMaxText, WireError, "text of ", n, " bytes exceeds ", kMaxText);
  const auto b = r.take<uint8_t>(n);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
}  // namespace

std::string ShardId::describe(uint64_t dim) const {
  return "shard " + std::to_string(index) + " of " + std::to_string(count) + ": [" +
         std::to_string(begin) + ", " + std::to_string(begin + dim) + ") of " +
         std::to_string(model_dim ? model_dim : dim);
}

Bytes encode(const HelloInfo& h) {
  Bytes out;
  ByteWriter w(out);
  w.put(h.world);
  w.put(h.dim);
  put_text(w, h.spec);
  w.put(h.population);
  w.put(h.shard.index);
  w.put(h.shard.count);
  w.put(h.shard.begin);
  w.put(h.shard.model_dim);
  w.put(h.epoch);
  w.put(h.weight);
  return out;
}

HelloInfo decode_hello(std::span<const uint8_t> frame) {
  ByteReader r(frame, "hello");
  HelloInfo h;
  h.world = r.get<uint32_t>();
  h.dim = r.get<uint64_t>();
  h.spec = get_text(r);
  h.population = r.get<uint32_t>();
  h.shard.index = r.get<uint32_t>();
  h.shard.count = r.get<uint32_t>();
  h.shard.begin = r.get<uint64_t>();
  h.shard.model_dim = r.get<uint64_t>();
  h.epoch = r.get<uint64_t>();
  h.weight = r.get<float>();
  r.expect_end();
  SKETCHSGD_REQUIRE(std::isfinite(h.weight) && h.weight > 0.0f && h.weight <= 1e6f, WireError,
                    "hello: weight ", h.weight, " (must be in (0, 10^6])");
  return h;
}

Bytes encode(const WelcomeInfo& w) {
  Bytes out;
  ByteWriter b(out);
  b.put(w.has_model);
  b.put(w.heartbeat_ms);
  b.put(w.staleness);
  b.put(w.momentum);
  b.put(w.nesterov);
  b.put(w.epoch);
  b.put(w.optimizer);
  b.put(w.eps);
  b.put(w.beta1);
  b.put(w.beta2);
  b.put(w.async);
  return out;
}

WelcomeInfo decode_welcome(std::span<const uint8_t> frame) {
  ByteReader r(frame, "welcome");
  WelcomeInfo w;
  w.has_model = r.get<uint8_t>();
  w.heartbeat_ms = r.get<uint32_t>();
  w.staleness = r.get<uint32_t>();
  w.momentum = r.get<float>();
  w.nesterov = r.get<uint8_t>();
  w.epoch = r.get<uint64_t>();
  w.optimizer = r.get<uint8_t>();
  w.eps = r.get<float>();
  w.beta1 = r.get<float>();
  w.beta2 = r.get<float>();
  w.async = r.get<uint8_t>();
  r.expect_end();
  try {
    SKETCHSGD_REQUIRE(w.optimizer <= 2, InvalidArgument, "optimizer ", int(w.optimizer));
    outer_options(w).validate();
  } catch (const InvalidArgument& e) {
    throw WireError(std::string("welcome: ") + e.what());
  }
  SKETCHSGD_REQUIRE(w.nesterov <= 1, WireError, "welcome: nesterov = ", int(w.nesterov));
  SKETCHSGD_REQUIRE(w.staleness <= 64, WireError, "welcome: staleness ", w.staleness);
  SKETCHSGD_REQUIRE(w.has_model <= 1, WireError, "welcome: has_model = ", int(w.has_model));
  SKETCHSGD_REQUIRE(w.async <= 1, WireError, "welcome: async = ", int(w.async));
  SKETCHSGD_REQUIRE(w.heartbeat_ms >= 1 && w.heartbeat_ms <= 3600000, WireError,
                    "welcome: heartbeat interval ", w.heartbeat_ms, " ms");
  return w;
}

OuterOptions outer_options(const WelcomeInfo& w) {
  return OuterOptions{w.momentum, w.nesterov != 0, OuterKind(w.optimizer), w.eps, w.beta1, w.beta2};
}

WelcomeInfo& with_outer(WelcomeInfo& w, const OuterOptions& o) {
  w.momentum = o.momentum;
  w.nesterov = uint8_t(o.nesterov);
  w.optimizer = uint8_t(o.kind);
  w.eps = o.eps;
  w.beta1 = o.beta1;
  w.beta2 = o.beta2;
  return w;
}

Bytes encode(const RefuseInfo& f) {
  Bytes out;
  ByteWriter w(out);
  w.put(uint8_t(f.retry));
  w.put(uint8_t(f.elsewhere));
  w.put(uint8_t(f.refused));
  put_text(w, f.reason);
  return out;
}

RefuseInfo decode_refuse(std::span<const uint8_t> frame) {
  ByteReader r(frame, "refuse");
  RefuseInfo f;
  const auto retry = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(retry <= 1, WireError, "refuse: retry = ", int(retry));
  f.retry = retry;
  const auto elsewhere = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(elsewhere <= 1, WireError, "refuse: elsewhere = ", int(elsewhere));
  f.elsewhere = elsewhere;
  const auto refused = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(refused >= 1 && refused <= kMaxType, WireError, "refuse: type ", int(refused));
  f.refused = Type(refused);
  f.reason = get_text(r);
  r.expect_end();
  return f;
}

Bytes encode(const UpdateInfo& u) {
  Bytes out;
  ByteWriter w(out);
  w.put(u.lr);
  w.put(u.contributors);
  w.put(u.version);
  w.put(u.age);
  w.put(u.pusher);
  w.put(u.push);
  return out;
}

UpdateInfo decode_update_info(std::span<const uint8_t> frame) {
  ByteReader r(frame, "update info");
  UpdateInfo u;
  u.lr = r.get<float>();
  u.contributors = r.get<uint32_t>();
  u.version = r.get<uint64_t>();
  u.age = r.get<uint32_t>();
  u.pusher = r.get<uint32_t>();
  u.push = r.get<uint64_t>();
  r.expect_end();
  SKETCHSGD_REQUIRE(std::isfinite(u.lr), WireError, "update info: learning rate ", u.lr);
  return u;
}

Bytes encode(const ReplicaInfo& i) {
  Bytes out;
  ByteWriter w(out);
  w.put(i.epoch);
  w.put(i.token);
  w.put(uint32_t(i.outcome.size()));
  for (const Bytes& f : i.outcome) {
    w.put(uint64_t(f.size()));
    w.put_array(std::span<const uint8_t>(f));
  }
  w.put(uint32_t(i.pushes.size()));
  w.put_array(std::span<const uint64_t>(i.pushes));
  w.put(uint32_t(i.left.size()));
  w.put_array(std::span<const uint32_t>(i.left));
  return out;
}

ReplicaInfo decode_replica_info(std::span<const uint8_t> frame) {
  ByteReader r(frame, "replica info");
  ReplicaInfo i;
  i.epoch = r.get<uint64_t>();
  i.token = r.get<uint64_t>();
  const auto frames = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(frames <= 1 + kMaxPayloadFrames, WireError, "replica info: an outcome of ",
                    frames, " frames");
  for (uint32_t k = 0; k < frames; ++k) {
    const auto n = r.get<uint64_t>();
    SKETCHSGD_REQUIRE(n <= r.left(), WireError, "replica info: a frame of ", n, " bytes, ",
                      r.left(), " left");
    const auto b = r.take<uint8_t>(n);
    i.outcome.emplace_back(b.begin(), b.end());
  }
  const auto ranks = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(uint64_t(ranks) * 8 <= r.left(), WireError, "replica info: ", ranks,
                    " push numbers, ", r.left(), " bytes left");
  i.pushes.resize(ranks);
  r.get_array(std::span<uint64_t>(i.pushes));
  const auto left = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(uint64_t(left) * 4 <= r.left(), WireError, "replica info: ", left,
                    " ranks that left, ", r.left(), " bytes left");
  i.left.resize(left);
  r.get_array(std::span<uint32_t>(i.left));
  r.expect_end();
  return i;
}

Bytes encode(const DeposedInfo& d) {
  Bytes out;
  ByteWriter w(out);
  w.put(d.token);
  put_text(w, d.reason);
  return out;
}

DeposedInfo decode_deposed(std::span<const uint8_t> frame) {
  ByteReader r(frame, "deposed");
  DeposedInfo d;
  d.token = r.get<uint64_t>();
  d.reason = get_text(r);
  r.expect_end();
  return d;
}

Bytes encode(const ProbeInfo& p) {
  Bytes out;
  ByteWriter w(out);
  w.put(p.epoch);
  w.put(p.release);
  return out;
}

ProbeInfo decode_probe(std::span<const uint8_t> frame) {
  ByteReader r(frame, "probe");
  ProbeInfo p;
  p.epoch = r.get<uint64_t>();
  p.release = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(p.release <= 1, WireError, "probe: release ", int(p.release));
  r.expect_end();
  return p;
}

Bytes encode(const CommitInfo& c) {
  SKETCHSGD_REQUIRE(c.outcome == Type::Update || c.outcome == Type::Abort, InvalidArgument,
                    "commit of a round that ended with ", to_string(c.outcome));
  Bytes out;
  ByteWriter w(out);
  w.put(c.epoch);
  w.put(uint8_t(c.outcome));
  w.put(c.info.lr);
  w.put(c.info.contributors);
  w.put(c.info.version);
  w.put(c.info.age);
  w.put(c.info.pusher);
  w.put(c.info.push);
  w.put(uint64_t(c.codec_state.size()));
  w.put_array(std::span<const uint8_t>(c.codec_state));
  return out;
}

CommitInfo decode_commit_info(std::span<const uint8_t> frame) {
  ByteReader r(frame, "commit info");
  CommitInfo c;
  c.epoch = r.get<uint64_t>();
  const auto t = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(t == uint8_t(Type::Update) || t == uint8_t(Type::Abort), WireError,
                    "commit info: outcome type ", int(t));
  c.outcome = Type(t);
  c.info.lr = r.get<float>();
  c.info.contributors = r.get<uint32_t>();
  c.info.version = r.get<uint64_t>();
  c.info.age = r.get<uint32_t>();
  c.info.pusher = r.get<uint32_t>();
  c.info.push = r.get<uint64_t>();
  SKETCHSGD_REQUIRE(std::isfinite(c.info.lr), WireError, "commit info: learning rate ", c.info.lr);
  const auto n = r.get<uint64_t>();
  SKETCHSGD_REQUIRE(n <= r.left(), WireError, "commit info: codec state of ", n, " bytes, ",
                    r.left(), " left");
  const auto state = r.take<uint8_t>(n);
  c.codec_state.assign(state.begin(), state.end());
  r.expect_end();
  return c;
}

uint64_t max_frame_bytes(const Compressor& codec) {
  uint64_t m = std::max<uint64_t>(codec.dim() * 8, kMaxText + 64);  // model + momentum, refusal
  for (auto k :
       {MessageKind::Gradient, MessageKind::Query, MessageKind::Answer, MessageKind::Update})
    m = std::max(m, codec.max_payload(k) + kHeaderBytes);
  return m;
}

Bytes encode_text(std::string_view s) {
  Bytes out;
  ByteWriter w(out);
  put_text(w, s);
  return out;
}

std::string decode_text(std::span<const uint8_t> frame) {
  ByteReader r(frame, "text");
  auto s = get_text(r);
  r.expect_end();
  return s;
}

}  // namespace sketchsgd::ps
