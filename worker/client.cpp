#include <sketchsgd/worker/client.hpp>

#include <algorithm>
#include <atomic>
#include <deque>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/ps/io_thread.hpp>
#include <sketchsgd/ps/log.hpp>
#include <sketchsgd/ps/transport.hpp>

namespace sketchsgd::ps {

// The DEALER socket on an I/O thread, with the worker's liveness rules run there: a heartbeat when
// nothing else went out for an interval, and a new socket when the server has been silent for
// dead_after intervals (with exponential backoff).
struct Client::Link {
  Link(const ClientOptions& o, uint64_t max_frame, IoThread::Log log)
      : opts(o), max_frame(max_frame), hb_ms(o.heartbeat.count()) {
    // The first socket is made here, so a bad endpoint is the caller's error.
    std::unique_ptr<zmq::socket_t> first;
    try {
      first = connect();
    } catch (const zmq::error_t& e) {
      throw InvalidArgument("client: cannot connect to '" + o.server + "': " + e.what());
    }
    last_recv = Clock::now();
    IoThread::Hooks hooks;
    hooks.screen = [this](IoThread&, const Received& m) {
      last_recv = Clock::now();  // any traffic shows the server is alive
      backoff = Millis(100);
      if (m.frames.size() != 1) return true;
      try {
        return decode_envelope(m.frames[0].bytes(), 0).type != Type::Heartbeat;
      } catch (const Error&) {
        return true;  // the session logs what it cannot read
      }
    };
    hooks.tick = [this, log](IoThread& io, Clock::time_point now) {
      const Millis hb(hb_ms.load());
      if (now - io.last_send() >= hb)
        (void)io.send_now(nullptr, {Frame::own(encode(Envelope{Type::Heartbeat, opts.job, 0,
                                                               rank.load(), 0, session.load()}))});
      if (now - last_recv > hb * opts.dead_after + backoff) {
        log("server silent for " +
            std::to_string(std::chrono::duration_cast<Millis>(now - last_recv).count()) +
            " ms: reconnecting");
        io.replace_socket(connect());
        last_recv = now;
        backoff = std::min(backoff * 2, opts.backoff_max);
      }
    };
    IoOptions io_opts;
    io_opts.poll = std::max(Millis(5), std::min(Millis(50), opts.heartbeat / 4));
    io = std::make_unique<IoThread>(ctx, std::move(first), io_opts, std::move(hooks),
                                    std::move(log));
  }

  std::unique_ptr<zmq::socket_t> connect() {
    auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    apply_limits(*s, SocketLimits{max_frame, 16, Millis(500)});
    s->set(zmq::sockopt::reconnect_ivl, 100);
    s->set(zmq::sockopt::reconnect_ivl_max, int(opts.backoff_max.count()));
    if (!opts.curve_server_key.empty()) {
      s->set(zmq::sockopt::curve_serverkey, opts.curve_server_key);
      s->set(zmq::sockopt::curve_publickey, opts.curve_public);
      s->set(zmq::sockopt::curve_secretkey, opts.curve_secret);
    }
    s->connect(opts.server);
    return s;
  }

  const ClientOptions& opts;
  uint64_t max_frame;
  std::atomic<int64_t> hb_ms;        // the server's interval, once registered
  std::atomic<uint64_t> session{0};  // heartbeats carry the registration's token
  std::atomic<uint32_t> rank{0};     // and its rank (a federated client's slot)
  Clock::time_point last_recv;       // I/O thread only
  Millis backoff{100};               // I/O thread only
  std::deque<Received> backlog;      // taken from the I/O thread, not yet handled
  zmq::context_t ctx{1};
  std::unique_ptr<IoThread> io;  // last: stopped before the context goes
};

Client::Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
               std::span<const float> initial_params)
    : codec_(std::move(codec)) {
  SKETCHSGD_REQUIRE(codec_ != nullptr, InvalidArgument, "client: no codec");
  if (!opts.log) {
    auto log = std::make_shared<Log>("worker " + std::to_string(opts.rank), false);
    opts.log = [log](const std::string& s) { (*log)(s); };
  }
  session_ = std::make_unique<Session>(std::move(opts), *codec_, initial_params);
  const ClientOptions& o = session_->options();
  link_ = std::make_unique<Link>(o, max_frame_bytes(*codec_) + 64, o.log);

  Session::Outbox out;
  session_->hello(out);
  flush(out);
  const auto deadline = Clock::now() + o.timeout;
  while (!session_->synced()) {
    Received ev;
    if (!next(deadline, ev)) timeout("registration");
    if (ev.reconnected)
      session_->hello(out);
    else
      session_->handle_registration(ev.frames, Clock::now(), out);
    flush(out);
  }
}

Client::~Client() {
  if (link_ && session_) {
    Session::Outbox out;
    session_->bye(out);
    flush(out);
  }
  link_.reset();  // sends the goodbye, then closes within the socket's linger
}

void Client::flush(Session::Outbox& out) {
  for (auto& f : out) link_->io->post(Outgoing{{}, std::move(f)});
  out.clear();
  link_->hb_ms = session_->heartbeat().count();
  link_->session = session_->session();
  link_->rank = session_->rank();
}

[[noreturn]] void Client::timeout(const std::string& what) const {
  const ClientOptions& o = session_->options();
  throw TimeoutError("worker " + std::to_string(o.rank) + ": no answer from " + o.server + " for " +
                     what + " within " + std::to_string(o.timeout.count()) + " ms");
}

bool Client::next(Clock::time_point deadline, Received& ev) {
  for (;;) {
    if (!link_->backlog.empty()) {
      ev = std::move(link_->backlog.front());
      link_->backlog.pop_front();
      return true;
    }
    Session::Outbox out;
    session_->tick(Clock::now(), out);  // e.g. a Hello again after a transient refusal
    flush(out);
    auto wake = deadline;
    if (const auto t = session_->next_tick()) wake = std::min(wake, *t);
    auto got = link_->io->take(std::max(wake, Clock::now()));
    if (const auto failure = link_->io->failure()) std::rethrow_exception(failure);
    for (auto& m : got) link_->backlog.push_back(std::move(m));
    if (link_->backlog.empty() && Clock::now() >= deadline) return false;
  }
}

bool Client::dispatch(Received& ev, StepResult& res) {
  Session::Outbox out;
  bool done = false;
  if (ev.reconnected)
    session_->hello(out);  // what went out before may be lost: register again, then resend
  else
    done = session_->handle(ev.frames, Clock::now(), out, res);
  flush(out);
  return done;
}

StepResult Client::step(std::span<const float> grad) {
  StepResult res;
  Session::Outbox out;
  session_->push(grad, out, res);
  flush(out);
  res.pushed_at = Clock::now();
  const auto deadline = Clock::now() + session_->options().timeout;
  for (;;) {
    Received ev;
    if (!session_->must_wait()) {
      // Far enough: take whatever already arrived, without waiting.
      if (!next(Clock::now(), ev)) return res;
    } else if (!next(deadline, ev)) {
      timeout("round " + std::to_string(session_->round()));
    }
    if (dispatch(ev, res)) return res;
  }
}

StepResult Client::sync() {
  StepResult res;
  res.round = session_->round();
  const auto deadline = Clock::now() + session_->options().timeout;
  while (session_->round() < session_->next_push()) {
    Received ev;
    if (!next(deadline, ev)) timeout("round " + std::to_string(session_->round()));
    if (dispatch(ev, res)) break;
  }
  return res;
}

}  // namespace sketchsgd::ps
