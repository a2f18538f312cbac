#include "link.hpp"

#include <algorithm>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/ps/shards.hpp>
#include <sketchsgd/ps/transport.hpp>

namespace sketchsgd::ps {

namespace {

/// ClientOptions::shared_io's context: made on first use, never terminated (zmq_ctx_term at exit
/// would wait for any socket a program leaked); a child made by fork makes its own, since a
/// context does not survive fork.
std::shared_ptr<zmq::context_t> shared_context() {
  static std::mutex mu;
  static zmq::context_t* ctx = nullptr;
  static pid_t owner = 0;
  std::lock_guard lock(mu);
  if (!ctx || owner != getpid()) {
    ctx = new zmq::context_t(int(std::clamp(std::thread::hardware_concurrency(), 1u, 4u)));
    owner = getpid();
  }
  return std::shared_ptr<zmq::context_t>(ctx, [](zmq::context_t*) {});
}

}  // namespace

Link::Link(const ClientOptions& o, uint64_t max_frame, IoThread::Log log)
    : opts(o),
      max_frame(max_frame),
      hb_ms(o.heartbeat.count()),
      endpoints(split_endpoints(o.server, '|')),
      ctx(o.shared_io ? shared_context() : std::make_shared<zmq::context_t>(1)) {
  SKETCHSGD_REQUIRE(endpoints.size() <= 8, InvalidArgument, "client: '", o.server, "' lists ",
                    endpoints.size(), " replicas of one server (at most 8)");
  // The first socket is made here, so a bad endpoint is the caller's error.
  std::unique_ptr<zmq::socket_t> first;
  try {
    first = connect();
  } catch (const zmq::error_t& e) {
    throw InvalidArgument("client: cannot connect to '" + o.server + "': " + e.what());
  }
  alive.dead_after = o.dead_after;
  alive.backoff_max = o.backoff_max;
  alive.heard(Clock::now());
  IoThread::Hooks hooks;
  hooks.screen = [this](IoThread&, const Received& m) {
    alive.heard(Clock::now());  // any traffic shows the server is alive
    if (m.frames.size() != 1) return true;
    try {
      return decode_envelope(m.frames[0].bytes(), 0).type != Type::Heartbeat;
    } catch (const Error&) {
      return true;  // the session logs what it cannot read
    }
  };
  hooks.tick = [this, log](IoThread& io, Clock::time_point now) {
    alive.heartbeat = Millis(hb_ms.load());
    // Not before the first registration: the server would refuse an unregistered heartbeat,
    // addressed to a rank this link does not know yet (a sharded client's later shards wait
    // while the first registers).
    if (session.load() != 0 && alive.heartbeat_due(now, io.last_send()))
      (void)io.send_now(nullptr, {Frame::own(encode(Envelope{Type::Heartbeat, opts.job, 0,
                                                             rank.load(), 0, session.load()}))});
    const bool sent_on = elsewhere.exchange(false) && endpoints.size() > 1;
    if (sent_on || alive.silent(now)) {
      // A replicated server's next endpoint: its backup takes over when workers come to it.
      current = (current + 1) % endpoints.size();
      log((sent_on ? std::string("server of an earlier epoch")
                   : "server silent for " +
                         std::to_string(
                             std::chrono::duration_cast<Millis>(now - alive.last_recv).count()) +
                         " ms") +
          ": reconnecting to " + endpoints[current]);
      io.replace_socket(connect());
      alive.reconnected(now);
    }
  };
  IoOptions io_opts;
  io_opts.poll = std::max(Millis(5), std::min(Millis(50), opts.heartbeat / 4));
  io =
      std::make_unique<IoThread>(*ctx, std::move(first), io_opts, std::move(hooks), std::move(log));
}

std::unique_ptr<zmq::socket_t> Link::connect() {
  auto s = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::dealer);
  apply_limits(*s, SocketLimits{max_frame, 16, Millis(500)});
  s->set(zmq::sockopt::reconnect_ivl, 100);
  s->set(zmq::sockopt::reconnect_ivl_max, int(opts.backoff_max.count()));
  if (!opts.curve_server_key.empty()) {
    s->set(zmq::sockopt::curve_serverkey, opts.curve_server_key);
    s->set(zmq::sockopt::curve_publickey, opts.curve_public);
    s->set(zmq::sockopt::curve_secretkey, opts.curve_secret);
  }
  s->connect(endpoints[current]);
  return s;
}

}  // namespace sketchsgd::ps
