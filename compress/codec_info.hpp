// What a message must match to belong to a codec: identity, dim, size limits and the formats of
// payloads that are float vectors. The framework's plumbing (Compressor::info(), an aggregator's
// info_), not part of the installed API.
#pragma once

#include <cstdint>
#include <span>

#include <sketchsgd/compress/wire.hpp>

namespace sketchsgd {

struct CodecInfo {
  CodecId id;
  uint64_t dim;
  uint64_t max_payload[5];  ///< by MessageKind
  /// Floats of a payload that is a float vector, by MessageKind: sum_size() for Gradient and
  /// Answer, reply_size() for Query and Update (0: not one).
  uint64_t values[5];
  WireFloat format[5];  ///< their float format on the wire
  uint64_t columns[5];  ///< their columns (I8's scales)

  /// Decodes a header and checks codec id, dim, kind and the payload limit.
  Header check(std::span<const uint8_t> message, MessageKind expected) const;
  Header header(MessageKind kind, uint64_t round, uint32_t sender) const {
    return Header{id, kind, dim, round, sender, 0};
  }
};

}  // namespace sketchsgd
