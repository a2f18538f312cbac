// Frames as the server logic sees them: bytes with a shared owner, so a received ZeroMQ message is
// read in place and one Update buffer is broadcast to every worker without copies.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sketchsgd/core/bytes.hpp>

namespace sketchsgd::ps {

class Frame {
 public:
  Frame() = default;
  Frame(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes)
      : owner_(std::move(owner)), bytes_(bytes) {}
  /// Takes ownership of a byte vector.
  static Frame own(Bytes b) {
    auto p = std::make_shared<const Bytes>(std::move(b));
    return Frame(p, std::span<const uint8_t>(*p));
  }

  std::span<const uint8_t> bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::shared_ptr<const void> owner_;
  std::span<const uint8_t> bytes_;
};

using Frames = std::vector<Frame>;
/// A worker connection as the transport names it (a ZeroMQ routing id).
using PeerId = std::string;

struct Outgoing {
  PeerId peer;
  Frames frames;
};

}  // namespace sketchsgd::ps
