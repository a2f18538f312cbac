#include "zmq_io.hpp"

namespace sketchsgd::ps {

void apply_limits(zmq::socket_t& s, const SocketLimits& l) {
  s.set(zmq::sockopt::linger, int(l.linger.count()));
  if (l.max_frame) s.set(zmq::sockopt::maxmsgsize, int64_t(l.max_frame));
  s.set(zmq::sockopt::rcvhwm, l.hwm);
  s.set(zmq::sockopt::sndhwm, l.hwm);
}

namespace {
Frame to_frame(zmq::message_t&& m) {
  auto owner = std::make_shared<zmq::message_t>(std::move(m));
  const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(owner->data()), owner->size());
  return Frame(std::move(owner), bytes);
}
}  // namespace

std::optional<Received> receive(zmq::socket_t& s, bool routed, size_t max_frames) {
  zmq::message_t part;
  if (!s.recv(part, zmq::recv_flags::dontwait)) return std::nullopt;
  Received r;
  bool first = true;
  for (;;) {
    const bool more = part.more();
    if (routed && first) {
      r.peer.assign(static_cast<const char*>(part.data()), part.size());
    } else if (r.frames.size() < max_frames) {
      r.frames.push_back(to_frame(std::move(part)));
    } else {
      r.overflow = true;  // keep reading: the parts of one message arrive together
    }
    first = false;
    if (!more) break;
    part = zmq::message_t();
    (void)s.recv(part, zmq::recv_flags::none);
  }
  return r;
}

bool send(zmq::socket_t& s, const PeerId* peer, const Frames& frames) {
  const auto flags = [&](size_t i) {
    return i + 1 < frames.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                 : zmq::send_flags::dontwait;
  };
  if (peer) {
    zmq::message_t id(peer->data(), peer->size());
    if (!s.send(id, frames.empty() ? zmq::send_flags::dontwait
                                   : zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return false;
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].size() == 0) {
      zmq::message_t empty;
      (void)s.send(empty, flags(i));
      continue;
    }
    // The message keeps the frame's owner alive until ZeroMQ has sent it: no copy.
    auto* hold = new std::shared_ptr<const void>(frames[i].owner());
    zmq::message_t m(const_cast<uint8_t*>(frames[i].bytes().data()), frames[i].size(),
                     [](void*, void* h) { delete static_cast<std::shared_ptr<const void>*>(h); },
                     hold);
    // After the first part of a multipart message ZeroMQ accepts the rest atomically.
    (void)s.send(m, flags(i));
  }
  return true;
}

}  // namespace sketchsgd::ps
