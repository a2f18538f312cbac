#include <sketchsgd/compress/wire.hpp>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd {

std::string_view to_string(CodecId id) {
  switch (id) {
    case CodecId::Dense:
      return "dense";
    case CodecId::TopK:
      return "topk";
    case CodecId::TernGrad:
      return "terngrad";
    case CodecId::SignSGD:
      return "signsgd";
    case CodecId::Sketch:
      return "sketch";
    case CodecId::PowerSGD:
      return "powersgd";
    case CodecId::QSGD:
      return "qsgd";
    case CodecId::SparseLoCo:
      return "sparseloco";
  }
  return "unknown";
}

std::string_view to_string(MessageKind kind) {
  switch (kind) {
    case MessageKind::Gradient:
      return "gradient";
    case MessageKind::Query:
      return "query";
    case MessageKind::Answer:
      return "answer";
    case MessageKind::Update:
      return "update";
  }
  return "unknown";
}

void Message::seal(Header h) {
  kind_ = h.kind;
  h.payload_bytes = bytes_.size() - kHeaderBytes;
  Bytes head;
  ByteWriter w(head);
  w.put(kWireMagic);
  w.put(kWireVersion);
  w.put(uint8_t(h.codec));
  w.put(uint8_t(h.kind));
  w.put(h.dim);
  w.put(h.round);
  w.put(h.sender);
  w.put(uint32_t(0));
  w.put(h.payload_bytes);
  const uint32_t crc = crc32c(payload_of(bytes_), crc32c(head));
  w.put(crc);
  w.put(uint32_t(0));
  std::copy(head.begin(), head.end(), bytes_.begin());
}

Origin peek_origin(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes) return {~uint64_t(0), kServerRank};
  ByteReader r(bytes.subspan(16, 12), "message header");
  const auto round = r.get<uint64_t>();
  return {round, r.get<uint32_t>()};
}

Header decode_header(std::span<const uint8_t> bytes, uint64_t max_payload) {
  SKETCHSGD_REQUIRE(bytes.size() >= kHeaderBytes, WireError, "message of ", bytes.size(),
                    " bytes is shorter than the ", kHeaderBytes, "-byte header");
  ByteReader r(bytes.first(kHeaderBytes), "message header");
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == kWireMagic, WireError, "message: bad magic");
  const auto version = r.get<uint16_t>();
  SKETCHSGD_REQUIRE(version == kWireVersion, WireError, "message: format version ", version,
                    ", this build speaks ", kWireVersion);
  Header h;
  const auto codec = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(codec >= 1 && codec <= kLastCodecId, WireError, "message: unknown codec id ",
                    int(codec));
  h.codec = CodecId(codec);
  const auto kind = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(kind >= 1 && kind <= 4, WireError, "message: unknown kind ", int(kind));
  h.kind = MessageKind(kind);
  h.dim = r.get<uint64_t>();
  h.round = r.get<uint64_t>();
  h.sender = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == 0, WireError, "message: reserved field set");
  h.payload_bytes = r.get<uint64_t>();
  const auto crc = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == 0, WireError, "message: reserved field set");
  SKETCHSGD_REQUIRE(h.payload_bytes <= max_payload, WireError, "message: payload of ",
                    h.payload_bytes, " bytes exceeds the limit of ", max_payload);
  SKETCHSGD_REQUIRE(h.payload_bytes == bytes.size() - kHeaderBytes, WireError,
                    "message: header declares ", h.payload_bytes, " payload bytes, ",
                    bytes.size() - kHeaderBytes, " present");
  const uint32_t actual = crc32c(payload_of(bytes), crc32c(bytes.first(40)));
  SKETCHSGD_REQUIRE(actual == crc, WireError, "message: checksum mismatch");
  return h;
}

}  // namespace sketchsgd
