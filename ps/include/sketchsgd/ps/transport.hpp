// The ZeroMQ boundary shared by the server and the worker client: socket limits, bounded receive of
// one multipart message, zero-copy send of shared frames.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include <sketchsgd/ps/frame.hpp>

namespace sketchsgd::ps {

struct SocketLimits {
  uint64_t max_frame = 0;  ///< ZMQ_MAXMSGSIZE: a larger frame drops the connection
  int hwm = 16;            ///< messages queued per peer and direction
  std::chrono::milliseconds linger{1000};
};
void apply_limits(zmq::socket_t& s, const SocketLimits& l);

struct Received {
  PeerId peer;    ///< routing id (ROUTER sockets only)
  Frames frames;  ///< envelope + payload frames
  bool overflow =
      false;         ///< more than max_frames parts (the rest read and discarded), or cut short
  std::string user;  ///< ZAP User-Id of the connection (CURVE: the rank its key is bound to)
  bool reconnected = false;  ///< no message: the socket was replaced (IoThread::replace_socket)
};

/// Receives one whole multipart message without blocking; nullopt when none is queued. At most
/// max_frames frames are kept (the routing id not counted).
std::optional<Received> receive(zmq::socket_t& s, bool routed, size_t max_frames);

/// Sends frames (after the routing id when peer is given) without copying and without blocking.
/// Returns false when the peer's queue is full (EAGAIN); throws zmq::error_t otherwise (e.g.
/// EHOSTUNREACH for an unknown peer on a ROUTER_MANDATORY socket).
bool send(zmq::socket_t& s, const PeerId* peer, const Frames& frames);

/// CURVE keys in Z85 text (40 characters each).
struct CurveKeys {
  std::string public_key, secret_key;
};
CurveKeys curve_keypair();
/// The public key of a Z85 secret key.
std::string curve_public(const std::string& secret);
/// In a ZapHandler's key list: the job's own server key, which a backup server connects with
/// (it holds the same key pair as its primary, the one the workers know); its User-Id is
/// kServerUser, never a rank.
inline constexpr uint32_t kServerIdentity = 0xFFFFFFFF;
inline constexpr const char* kServerUser = "server";
/// Reads "RANK PUBLIC_KEY" lines ('#' comments allowed); throws InvalidArgument naming the line.
std::vector<std::pair<uint32_t, std::string>> read_key_list(const std::string& path);
/// A ZAP handler (RFC 27) on ctx that accepts only CURVE clients whose public key is listed, and
/// names each connection's User-Id after the rank its key is bound to (kServerUser for
/// kServerIdentity). Must be running before the
/// server socket binds; stops when the context shuts down.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& ctx, std::vector<std::pair<uint32_t, std::string>> keys,
             std::function<void(const std::string&)> log);
  ~ZapHandler();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sketchsgd::ps
