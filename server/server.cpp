#include "server.hpp"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>

#include "log.hpp"
#include "zmq_io.hpp"

namespace sketchsgd::ps {
namespace {

struct Incoming {
  PeerId peer;
  Frames frames;
  std::string user;
};

size_t bytes_of(const Incoming& m) {
  size_t n = 64;
  for (const auto& f : m.frames) n += f.size();
  return n;
}

std::string json_line(const RoundMetrics& m, uint32_t world) {
  std::string s = "{\"round\":" + std::to_string(m.round) +
                  ",\"aborted\":" + (m.aborted ? "true" : "false") +
                  ",\"latency_ms\":" + std::to_string(m.latency_ms) +
                  ",\"merge_ms\":" + std::to_string(m.merge_ms) +
                  ",\"contributors\":" + std::to_string(m.contributors) +
                  ",\"world\":" + std::to_string(world) + ",\"bytes_up\":[";
  uint64_t up = 0;
  for (size_t i = 0; i < m.bytes_up.size(); ++i) {
    s += (i ? "," : "") + std::to_string(m.bytes_up[i]);
    up += m.bytes_up[i];
  }
  const double ratio =
      m.contributors && up ? double(m.dense_bytes) * m.contributors / double(up) : 0;
  s += "],\"bytes_down_each\":" + std::to_string(m.bytes_down_each) +
       ",\"dense_bytes\":" + std::to_string(m.dense_bytes) +
       ",\"uplink_ratio\":" + std::to_string(ratio) + ",\"stragglers\":[";
  for (size_t i = 0; i < m.stragglers.size(); ++i)
    s += (i ? "," : "") + std::to_string(m.stragglers[i]);
  s += "],\"dead\":[";
  for (size_t i = 0; i < m.dead.size(); ++i) s += (i ? "," : "") + std::to_string(m.dead[i]);
  std::string reason;
  for (char c : m.reason) reason += (c == '"' || c == '\\') ? ' ' : c;
  s += "],\"reason\":\"" + reason + "\"}";
  return s;
}

}  // namespace

struct Server::Impl {
  explicit Impl(bool quiet) : log("server", quiet) {}

  Log log;
  zmq::context_t ctx{1};
  std::unique_ptr<ZapHandler> zap;  // before the router: destroyed after it, before ctx
  std::unique_ptr<zmq::socket_t> router;

  std::mutex mu;
  std::condition_variable ready;
  std::deque<Incoming> inbox;
  std::deque<Outgoing> outbox;
  size_t inbox_cap = 0;  // bytes queued for the merge thread before the I/O thread stops reading
  size_t inbox_bytes = 0;
  std::atomic<bool> merge_done{false};
  std::atomic<bool> outbox_signalled{false};

  std::ofstream metrics;
  uint64_t rounds = 0;
};

Server::Server(ServerOptions opts) : opts_(std::move(opts)) {
  impl_ = std::make_unique<Impl>(opts_.quiet);
  Hooks hooks;
  hooks.log = [this](const std::string& s) { impl_->log(s); };
  hooks.round = [this](const RoundMetrics& m) {
    ++impl_->rounds;
    if (impl_->metrics.is_open())
      impl_->metrics << json_line(m, opts_.job.world) << '\n' << std::flush;
  };
  opts_.job.authenticated = !opts_.curve_secret.empty();
  engine_ = std::make_unique<Engine>(opts_.job, std::move(hooks));
  // Counted in bytes, so heartbeats keep flowing (and being echoed) while big pushes wait for a
  // long merge: room for `inbox` (default 2·W + 16) messages of the job's largest frame.
  impl_->inbox_cap = size_t(opts_.inbox ? opts_.inbox : 2 * opts_.job.world + 16) *
                     size_t(engine_->max_frame_bytes() + 64);
  if (!opts_.metrics.empty()) {
    impl_->metrics.open(opts_.metrics, std::ios::app);
    SKETCHSGD_REQUIRE(impl_->metrics.is_open(), Error, "cannot open metrics file ", opts_.metrics);
  }
}

Server::~Server() {
  stop_ = true;
  if (impl_->router) impl_->router->close();
}

void Server::start() {
  if (!opts_.job.checkpoint.empty()) {
    if (auto c = load_checkpoint(opts_.job.checkpoint)) {
      engine_->restore(*c);
      impl_->log("resumed from checkpoint " + opts_.job.checkpoint + " at round " +
                 std::to_string(c->round));
    }
  }
  auto& r = impl_->router;
  r = std::make_unique<zmq::socket_t>(impl_->ctx, zmq::socket_type::router);
  // Larger than any valid frame of this job; anything bigger drops the sender's connection.
  apply_limits(*r, SocketLimits{engine_->max_frame_bytes() + 64, 16, opts_.linger});
  r->set(zmq::sockopt::router_mandatory, 1);
  if (!opts_.curve_secret.empty()) {
    // The ZAP handler must be bound before the socket so that no client slips in unchecked.
    impl_->zap = std::make_unique<ZapHandler>(impl_->ctx, opts_.curve_clients,
                                              [this](const std::string& s) { impl_->log(s); });
    r->set(zmq::sockopt::curve_server, 1);
    r->set(zmq::sockopt::curve_secretkey, opts_.curve_secret);
    r->set(zmq::sockopt::zap_domain, "sketchsgd");
  }
  try {
    r->bind(opts_.bind);
  } catch (const zmq::error_t& e) {
    throw Error("server: cannot bind " + opts_.bind + ": " + e.what());
  }
  endpoint_ = r->get(zmq::sockopt::last_endpoint);
  impl_->log("job " + std::to_string(opts_.job.job) + " listening on " + endpoint_ + ": " +
             std::to_string(opts_.job.world) + " workers, dim " + std::to_string(opts_.job.dim) +
             ", codec " + engine_->config().spec + ", policy " +
             std::string(to_string(opts_.job.policy)));
}

uint64_t Server::run() {
  if (!impl_->router) start();
  Impl& s = *impl_;
  zmq::socket_t& router = *s.router;
  const bool tty = isatty(2);

  // Merge thread: all round logic. Wakes on new messages or every tick for deadlines/liveness.
  const Millis tick = std::clamp(opts_.job.heartbeat / 4, Millis(5), Millis(100));
  // The merge thread wakes the I/O thread through an inproc pair when it has something to send.
  const std::string wake_addr = "inproc://sketchsgd-wake-" + std::to_string(uintptr_t(this));
  zmq::socket_t wake_rx(s.ctx, zmq::socket_type::pair);
  wake_rx.bind(wake_addr);
  std::thread merge([&] {
    zmq::socket_t wake_tx(s.ctx, zmq::socket_type::pair);
    wake_tx.set(zmq::sockopt::linger, 0);
    wake_tx.connect(wake_addr);
    std::vector<Outgoing> out;
    auto last_status = Clock::now();
    std::optional<Clock::time_point> finished_at;
    while (!stop_) {
      std::deque<Incoming> batch;
      {
        std::unique_lock lock(s.mu);
        s.ready.wait_for(lock, tick, [&] { return !s.inbox.empty() || stop_; });
        batch.swap(s.inbox);
      }
      const auto now = Clock::now();
      try {
        for (auto& m : batch) engine_->handle(m.peer, m.frames, now, out, m.user);
        engine_->tick(now, out);
      } catch (const std::exception& e) {
        // The engine turns bad input into refusals; anything reaching here is a bug or an
        // exhausted resource. Log it and keep serving rather than terminate the job.
        s.log(std::string("internal error (round continues): ") + e.what());
      }
      {
        std::lock_guard lock(s.mu);
        for (const auto& m : batch) s.inbox_bytes -= bytes_of(m);
      }
      if (!out.empty()) {
        std::lock_guard lock(s.mu);
        for (auto& o : out) s.outbox.push_back(std::move(o));
        out.clear();
      }
      if (!s.outbox_signalled.exchange(true))
        (void)wake_tx.send(zmq::message_t(), zmq::send_flags::dontwait);
      if (opts_.status && now - last_status >= std::chrono::seconds(tty ? 1 : 10)) {
        last_status = now;
        const std::string line = "round " + std::to_string(engine_->round()) + " | live " +
                                 std::to_string(engine_->live_workers()) + "/" +
                                 std::to_string(opts_.job.world) + " | rejected " +
                                 std::to_string(engine_->rejected());
        if (tty)
          std::fprintf(stderr, "\r\033[K[server] %s", line.c_str());
        else if (!opts_.quiet)
          s.log(line);
      }
      if (engine_->finished()) {
        if (!finished_at) finished_at = now;
        if (now - *finished_at >= opts_.finish_grace) break;
      }
    }
    s.merge_done = true;
  });

  // I/O thread (this one): owns the socket.
  try {
    while (!stop_ && !s.merge_done) {
      try {
        size_t queued;
        {
          std::lock_guard lock(s.mu);
          queued =
              s.inbox.size() < 65536 ? s.inbox_bytes : s.inbox_cap;  // and at most 64k messages
        }
        zmq::pollitem_t items[] = {
            {router.handle(), 0, short(queued < s.inbox_cap ? ZMQ_POLLIN : 0), 0},
            {wake_rx.handle(), 0, ZMQ_POLLIN, 0}};
        try {
          zmq::poll(items, 2, Millis(50));
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;
          continue;  // a signal (stop() comes through one): look at stop_ again
        }
        if (items[1].revents & ZMQ_POLLIN) {
          zmq::message_t m;
          while (wake_rx.recv(m, zmq::recv_flags::dontwait)) {
          }
          s.outbox_signalled = false;
        }
        for (int n = 0; n < 64 && queued < s.inbox_cap; ++n) {
          auto msg = receive(router, true, 1 + kMaxPayloadFrames);
          if (!msg) break;
          if (msg->overflow) {
            s.log("dropped message with more than " + std::to_string(1 + kMaxPayloadFrames) +
                  " frames");
            continue;
          }
          // Heartbeats are echoed here so liveness never waits behind a merge.
          if (!msg->frames.empty() && msg->frames.size() == 1) {
            try {
              const Envelope e = decode_envelope(msg->frames[0].bytes(), 0);
              if (e.type == Type::Heartbeat && e.job == opts_.job.job) {
                try {
                  send(router, &msg->peer,
                       {Frame::own(encode(Envelope{Type::Heartbeat, e.job, 0, e.rank, 0}))});
                } catch (const zmq::error_t&) {
                }
              }
            } catch (const Error&) {
            }
          }
          {
            std::lock_guard lock(s.mu);
            s.inbox.push_back(
                Incoming{std::move(msg->peer), std::move(msg->frames), std::move(msg->user)});
            s.inbox_bytes += bytes_of(s.inbox.back());
            queued = s.inbox.size() < 65536 ? s.inbox_bytes : s.inbox_cap;
          }
          s.ready.notify_one();
        }
        std::deque<Outgoing> out;
        {
          std::lock_guard lock(s.mu);
          out.swap(s.outbox);
        }
        for (auto& o : out) {
          try {
            if (!send(router, &o.peer, o.frames))
              s.log("send queue of a worker is full: message dropped");
          } catch (const zmq::error_t& e) {
            s.log(std::string("send to a departed worker failed: ") + e.what());
          }
        }
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;  // a signal interrupted a call: look at stop_ again
      }
    }
  } catch (...) {
    stop_ = true;
    s.ready.notify_all();
    merge.join();
    throw;
  }
  stop_ = true;
  s.ready.notify_all();
  merge.join();
  wake_rx.close();
  // Flush what the last round produced (the final updates).
  for (auto& o : s.outbox) {
    try {
      send(router, &o.peer, o.frames);
    } catch (const zmq::error_t&) {
    }
  }
  s.outbox.clear();
  if (tty && opts_.status) std::fprintf(stderr, "\n");
  s.log("stopped at round " + std::to_string(engine_->round()) + " after " +
        std::to_string(s.rounds) + " rounds, " + std::to_string(engine_->rejected()) +
        " messages rejected");
  return s.rounds;
}

}  // namespace sketchsgd::ps
