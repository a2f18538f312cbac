// Wire format of encoded messages: a fixed 48-byte little-endian header, then the codec's payload.
//
//   off size field          off size field
//    0   4  magic "SKSG"     24   4  sender (worker rank; server = 0xFFFFFFFF)
//    4   2  format version   28   4  reserved, zero
//    6   1  codec id         32   8  payload length in bytes
//    7   1  message kind     40   4  CRC-32C of header bytes 0..39 and the payload
//    8   8  dim              44   4  reserved, zero
//   16   8  round
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include <sketchsgd/core/bytes.hpp>

namespace sketchsgd {

enum class CodecId : uint8_t {
  Dense = 1,
  TopK = 2,
  TernGrad = 3,
  SignSGD = 4,
  Sketch = 5,
  PowerSGD = 6,
  QSGD = 7,
  SparseLoCo = 8,
};
inline constexpr uint8_t kLastCodecId = 8;
enum class MessageKind : uint8_t {
  Gradient = 1,  ///< worker → server: the encoded gradient of one round
  Query = 2,     ///< server → workers: coordinates whose exact values the second round needs
  Answer = 3,    ///< worker → server: those values
  Update = 4,    ///< server → workers: the round's update
};

/// How a codec writes float values on the wire (its `wire=` option): fp32, 16-bit floats
/// rounded to nearest even (half the bytes; summed in fp32 by a server, in the collective's type
/// by an all-reduce), or I8 (summable payloads only): 8-bit integers with a float32 scale per
/// group (i8_groups). A message's scales are its own (the largest magnitude of a group over
/// 127); an all-reduce takes every rank's largest first (a max) and rounds to 127 / W levels so
/// that W ranks' integers sum in 8 bits. Replies to I8 sums travel as fp16.
enum class WireFloat : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I8 = 3 };
/// Bytes a value of a 32- or 16-bit format takes (I8's values have scales beside them: wire_size).
inline constexpr uint64_t wire_bytes(WireFloat f) {
  return f == WireFloat::F32 ? 4 : f == WireFloat::I8 ? 1 : 2;
}
/// I8's groups: n values read as rows of `columns` (row-major: PowerSGD's factors have a column
/// per rank, whose magnitudes differ), each column's values in runs of kI8Rows rows sharing a
/// scale. Scale g = (row block g / columns, column g % columns). 64 rather than 256: about 4.5 %
/// more bytes at PowerSGD's ranks 8-16, and validation loss level or better on every job measured
/// (docs/RESULTS.md). Changing it changes the wire: ps/protocol.hpp's version with it.
inline constexpr uint64_t kI8Rows = 64;
inline constexpr uint64_t i8_groups(uint64_t n, uint64_t columns) {
  return (n + columns * kI8Rows - 1) / (columns * kI8Rows) * columns;
}
/// Bytes n values take in a format (I8: its scales, then a byte per value).
inline constexpr uint64_t wire_size(WireFloat f, uint64_t n, uint64_t columns = 1) {
  return f == WireFloat::I8 ? 4 * i8_groups(n, columns) + n : wire_bytes(f) * n;
}

std::string_view to_string(CodecId id);
std::string_view to_string(MessageKind kind);

inline constexpr uint32_t kWireMagic = 0x47534B53;  // "SKSG"
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kHeaderBytes = 48;
inline constexpr uint32_t kServerRank = 0xFFFFFFFFu;

struct Header {
  CodecId codec;
  MessageKind kind;
  uint64_t dim;
  uint64_t round;
  uint32_t sender;
  uint64_t payload_bytes;
};

/// An encoded message: header + payload bytes, owned.
class Message {
 public:
  Message() = default;
  /// Builds a message; fill(writer) appends the payload.
  template <class Fill>
  static Message build(const Header& h, size_t payload_hint, Fill&& fill) {
    Message m;
    m.bytes_.reserve(kHeaderBytes + payload_hint);
    m.bytes_.resize(kHeaderBytes);
    ByteWriter w(m.bytes_);
    fill(w);
    m.seal(h);
    return m;
  }

  std::span<const uint8_t> bytes() const { return bytes_; }
  operator std::span<const uint8_t>() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  /// The kind its header carries.
  MessageKind kind() const { return kind_; }
  Bytes release() && { return std::move(bytes_); }

 private:
  void seal(Header h);
  Bytes bytes_;
  MessageKind kind_ = MessageKind::Gradient;
};

/// Parses and checks a message's header: magic, version, known codec and kind, zero reserved
/// fields, payload length equal to the bytes present and at most max_payload, and the checksum.
/// Throws WireError saying which check failed.
Header decode_header(std::span<const uint8_t> bytes, uint64_t max_payload);

/// The round and sender a message's header names, read without any check: for routing a message
/// before an aggregator validates the whole of it. Both all ones when the bytes are shorter than
/// a header.
struct Origin {
  uint64_t round;
  uint32_t sender;
};
Origin peek_origin(std::span<const uint8_t> bytes);

/// The payload of a message whose header decode_header accepted.
inline std::span<const uint8_t> payload_of(std::span<const uint8_t> bytes) {
  return bytes.subspan(kHeaderBytes);
}

}  // namespace sketchsgd
