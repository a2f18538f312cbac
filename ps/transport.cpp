#include <sketchsgd/ps/transport.hpp>

#include <atomic>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <sketchsgd/core/error.hpp>

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
    // The routing-id part a ROUTER makes carries no metadata; the wire parts do. (cppzmq's gets()
    // throws when the property is absent: ask libzmq directly.)
    if (r.user.empty())
      if (const char* u = zmq_msg_gets(part.handle(), "User-Id")) r.user = u;
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
    // ZeroMQ delivers the parts of a message together, so the rest is already here; never block
    // the I/O thread on it all the same (a message cut short is dropped as malformed).
    if (!s.recv(part, zmq::recv_flags::dontwait)) {
      r.overflow = true;
      break;
    }
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
    zmq::message_t m(
        const_cast<uint8_t*>(frames[i].bytes().data()), frames[i].size(),
        [](void*, void* h) { delete static_cast<std::shared_ptr<const void>*>(h); }, hold);
    // After the first part of a multipart message ZeroMQ accepts the rest atomically.
    (void)s.send(m, flags(i));
  }
  return true;
}

CurveKeys curve_keypair() {
  char pub[41], sec[41];
  SKETCHSGD_REQUIRE(zmq_curve_keypair(pub, sec) == 0, Error,
                    "CURVE is not available in this libzmq (built without libsodium)");
  return CurveKeys{pub, sec};
}

std::string curve_public(const std::string& secret) {
  char pub[41];
  SKETCHSGD_REQUIRE(secret.size() == 40 && zmq_curve_public(pub, secret.c_str()) == 0,
                    InvalidArgument, "not a 40-character Z85 CURVE secret key");
  return pub;
}

std::vector<std::pair<uint32_t, std::string>> read_key_list(const std::string& path) {
  std::ifstream in(path);
  SKETCHSGD_REQUIRE(in.good(), InvalidArgument, "cannot read key list ", path);
  std::vector<std::pair<uint32_t, std::string>> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    long long rank = -1;
    std::string key, rest;
    ls >> rank >> key >> rest;
    SKETCHSGD_REQUIRE(rank >= 0 && rank <= 0xFFFFFFFFll && key.size() == 40 && rest.empty(),
                      InvalidArgument, path, ":", n, ": expected 'RANK PUBLIC_KEY_Z85'");
    keys.emplace_back(uint32_t(rank), key);
  }
  return keys;
}

struct ZapHandler::Impl {
  zmq::socket_t rep;
  std::map<std::string, uint32_t> rank_of;  // raw 32-byte key → rank
  std::function<void(const std::string&)> log;
  std::atomic<bool> stop{false};
  std::thread thread;

  void loop() {
    while (!stop) {
      zmq::pollitem_t item{rep.handle(), 0, ZMQ_POLLIN, 0};
      try {
        if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) <= 0) continue;
        std::vector<zmq::message_t> req;
        for (;;) {
          req.emplace_back();
          (void)rep.recv(req.back());
          if (!req.back().more() || req.size() > 16) break;
        }
        // RFC 27: version, request id, domain, address, identity, mechanism, credentials...
        std::string status = "400", text = "no such key", user;
        if (req.size() >= 7 && req[5].to_string() == "CURVE") {
          const auto it = rank_of.find(req[6].to_string());
          if (it != rank_of.end()) {
            status = "200";
            text = "OK";
            user = it->second == kServerIdentity ? std::string(kServerUser)
                                                 : std::to_string(it->second);
          }
        }
        if (status != "200")
          log("refused a connection from " + (req.size() > 3 ? req[3].to_string() : "?") +
              ": key not listed");
        const std::string version = "1.0";
        const std::string id = req.size() > 1 ? req[1].to_string() : "";
        rep.send(zmq::buffer(version), zmq::send_flags::sndmore);
        rep.send(zmq::buffer(id), zmq::send_flags::sndmore);
        rep.send(zmq::buffer(status), zmq::send_flags::sndmore);
        rep.send(zmq::buffer(text), zmq::send_flags::sndmore);
        rep.send(zmq::buffer(user), zmq::send_flags::sndmore);
        rep.send(zmq::message_t(), zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        log(std::string("zap handler: ") + e.what());
      }
    }
  }
};

ZapHandler::ZapHandler(zmq::context_t& ctx, std::vector<std::pair<uint32_t, std::string>> keys,
                       std::function<void(const std::string&)> log)
    : impl_(new Impl{zmq::socket_t(ctx, zmq::socket_type::rep), {}, std::move(log), {}, {}}) {
  for (const auto& [rank, z85] : keys) {
    uint8_t raw[32];
    SKETCHSGD_REQUIRE(z85.size() == 40 && zmq_z85_decode(raw, z85.c_str()) != nullptr,
                      InvalidArgument, "not a 40-character Z85 CURVE key: ", z85);
    impl_->rank_of[std::string(reinterpret_cast<const char*>(raw), 32)] = rank;
  }
  impl_->rep.set(zmq::sockopt::linger, 0);
  impl_->rep.bind("inproc://zeromq.zap.01");
  impl_->thread = std::thread([this] { impl_->loop(); });
}

ZapHandler::~ZapHandler() {
  impl_->stop = true;
  impl_->thread.join();
}

}  // namespace sketchsgd::ps
