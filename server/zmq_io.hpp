// The ZeroMQ boundary shared by the server and the worker client: socket limits, bounded receive of
// one multipart message, zero-copy send of shared frames.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <zmq.hpp>

#include "frame.hpp"

namespace sketchsgd::ps {

struct SocketLimits {
  uint64_t max_frame = 0;  ///< ZMQ_MAXMSGSIZE: a larger frame drops the connection
  int hwm = 16;            ///< messages queued per peer and direction
  std::chrono::milliseconds linger{1000};
};
void apply_limits(zmq::socket_t& s, const SocketLimits& l);

struct Received {
  PeerId peer;       ///< routing id (ROUTER sockets only)
  Frames frames;     ///< envelope + payload frames
  bool overflow = false;  ///< more than max_frames parts: the rest was read and discarded
};

/// Receives one whole multipart message without blocking; nullopt when none is queued. At most
/// max_frames frames are kept (the routing id not counted).
std::optional<Received> receive(zmq::socket_t& s, bool routed, size_t max_frames);

/// Sends frames (after the routing id when peer is given) without copying and without blocking.
/// Returns false when the peer's queue is full (EAGAIN); throws zmq::error_t otherwise (e.g.
/// EHOSTUNREACH for an unknown peer on a ROUTER_MANDATORY socket).
bool send(zmq::socket_t& s, const PeerId* peer, const Frames& frames);

}  // namespace sketchsgd::ps
