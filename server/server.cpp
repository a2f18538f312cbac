#include <sketchsgd/server/server.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <thread>

#include <sketchsgd/ps/io_thread.hpp>
#include <sketchsgd/ps/liveness.hpp>
#include <sketchsgd/ps/log.hpp>
#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/checkpoint_writer.hpp>
#include <sketchsgd/server/replica.hpp>

namespace sketchsgd::ps {
namespace {

std::string json_line(const RoundMetrics& m, uint32_t world, bool async) {
  // An asynchronous job's line is one push: its version (as "round"), pusher and age.
  std::string s =
      "{\"round\":" + std::to_string(m.round) +
      (async ? ",\"pusher\":" + std::to_string(m.pusher) + ",\"age\":" + std::to_string(m.age)
             : std::string()) +
      ",\"aborted\":" + (m.aborted ? "true" : "false") +
      ",\"latency_ms\":" + std::to_string(m.latency_ms) +
      ",\"merge_ms\":" + std::to_string(m.merge_ms) +
      ",\"contributors\":" + std::to_string(m.contributors) +
      ",\"world\":" + std::to_string(world) + ",\"bytes_up\":[";
  // Appended a piece at a time: `"," + std::to_string(...)` trips GCC 12's -Wrestrict (a false
  // positive in its inlined operator+).
  auto list = [&s](const auto& values) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(values[i]);
    }
  };
  list(m.bytes_up);
  uint64_t up = 0;
  for (const uint64_t b : m.bytes_up) up += b;
  const double ratio =
      m.contributors && up ? double(m.dense_bytes) * m.contributors / double(up) : 0;
  s += "],\"bytes_down_each\":" + std::to_string(m.bytes_down_each) +
       ",\"dense_bytes\":" + std::to_string(m.dense_bytes) +
       ",\"uplink_ratio\":" + std::to_string(ratio) + ",\"stragglers\":[";
  list(m.stragglers);
  s += "],\"dead\":[";
  list(m.dead);
  std::string reason;
  for (char c : m.reason) reason += (c == '"' || c == '\\') ? ' ' : c;
  s += "],\"reason\":\"" + reason + "\"}";
  return s;
}

/// A backup's link to its primary: a DEALER on an I/O thread that shows liveness (a heartbeat
/// when idle, once the primary has answered) and connects again when the primary falls silent;
/// each new socket is reported so the backup asks to follow again.
struct Upstream {
  Upstream(zmq::context_t& ctx, const JobConfig& job, std::string endpoint, uint64_t max_frame,
           std::string curve_secret, IoThread::Log log)
      : ctx(ctx),
        job(job),
        endpoint(std::move(endpoint)),
        max_frame(max_frame),
        curve_secret(std::move(curve_secret)) {
    auto first = connect();
    alive.heartbeat = job.heartbeat;
    alive.dead_after = job.dead_after;
    alive.backoff_max = Millis(5000);
    alive.heard(Clock::now());
    IoThread::Hooks hooks;
    hooks.screen = [this](IoThread&, const Received&) {
      alive.heard(Clock::now());
      answered = true;
      return true;
    };
    hooks.tick = [this, log](IoThread& io, Clock::time_point now) {
      if (answered && alive.heartbeat_due(now, io.last_send())) {
        const Envelope hb{Type::Heartbeat, this->job.job, 0, 0, 0, 0};
        (void)io.send_now(nullptr, {Frame::own(encode(hb))});
      }
      if (alive.silent(now)) {
        log("primary silent: connecting again");
        io.replace_socket(connect());
        alive.reconnected(now);
        answered = false;
      }
    };
    IoOptions o;
    o.poll = std::clamp(job.heartbeat / 4, Millis(5), Millis(50));
    io = std::make_unique<IoThread>(ctx, std::move(first), o, std::move(hooks), std::move(log));
  }

  std::unique_ptr<zmq::socket_t> connect() {
    auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    apply_limits(*s, SocketLimits{max_frame, 16, Millis(500)});
    s->set(zmq::sockopt::reconnect_ivl, 100);
    if (!curve_secret.empty()) {
      // The primary's key pair is this server's own: the workers know one key per server.
      const std::string pub = curve_public(curve_secret);
      s->set(zmq::sockopt::curve_serverkey, pub);
      s->set(zmq::sockopt::curve_publickey, pub);
      s->set(zmq::sockopt::curve_secretkey, curve_secret);
    }
    try {
      s->connect(endpoint);
    } catch (const zmq::error_t& e) {
      throw InvalidArgument("server: cannot connect to the primary '" + endpoint +
                            "': " + e.what());
    }
    return s;
  }

  zmq::context_t& ctx;
  JobConfig job;
  std::string endpoint;
  uint64_t max_frame;
  std::string curve_secret;
  std::atomic<bool> answered{false};  // heartbeats only once the primary knows this link
  Liveness alive;                     // I/O thread only (after construction)
  std::unique_ptr<IoThread> io;       // last: stopped first
};

}  // namespace

struct Server::Impl {
  explicit Impl(bool quiet) : log("server", quiet) {}

  Log log;
  zmq::context_t ctx{1};
  std::unique_ptr<ZapHandler> zap;        // before the socket: destroyed after it, before ctx
  std::unique_ptr<zmq::socket_t> router;  // until run() hands it to the I/O thread
  size_t inbox_cap = 0;  // bytes queued for the round logic before the I/O thread stops reading

  std::ofstream metrics;
  uint64_t rounds = 0;
  std::unique_ptr<CheckpointWriter> writer;  // with --checkpoint: the engine's snapshots to disk

  /// Logs the checkpoint writes that failed since the last call.
  void report_failures(const char* what) {
    if (writer)
      for (const auto& why : writer->take_failures()) log(what + why);
  }
};

Server::Server(ServerOptions opts) : opts_(std::move(opts)) {
  impl_ = std::make_unique<Impl>(opts_.quiet);
  Hooks hooks;
  hooks.log = [this](const std::string& s) { impl_->log(s); };
  hooks.round = [this](const RoundMetrics& m) {
    ++impl_->rounds;
    if (impl_->metrics.is_open())
      impl_->metrics << json_line(m, opts_.job.world, opts_.job.async()) << '\n' << std::flush;
  };
  if (!opts_.checkpoint.empty() && opts_.job.checkpoint_every) {
    // The round logic hands out snapshots; the file is written off its thread, the final one
    // before the job reports done.
    impl_->writer = std::make_unique<CheckpointWriter>(opts_.checkpoint);
    hooks.checkpoint = [this](Checkpoint c, bool last) {
      impl_->writer->submit(std::move(c));
      if (last) impl_->writer->flush();
      impl_->report_failures("CHECKPOINT FAILED (training goes on): ");
    };
  }
  opts_.job.authenticated = !opts_.curve_secret.empty();
  if (!opts_.replica_of.empty()) {
    SKETCHSGD_REQUIRE(opts_.job.population() == 0, InvalidArgument,
                      "server: replication needs a job of fixed workers (not --population)");
  }
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
  engine_.reset();        // its hooks use impl_
  impl_->writer.reset();  // writes what is still waiting
  impl_->zap.reset();
  // ZeroMQ keeps trying to deliver what is queued to slow or departed peers for the socket's
  // linger, then gives up; should it ever take longer, the server still goes away: the context
  // is left to finish on its own thread (and to the process's exit).
  auto* impl = impl_.release();
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread closer([impl, done] {
    impl->ctx.close();
    *done = true;
  });
  const auto until = Clock::now() + opts_.linger + Millis(1000);
  while (!*done && Clock::now() < until) std::this_thread::sleep_for(Millis(5));
  if (*done) {
    closer.join();
    delete impl;
  } else {
    impl->log("ZeroMQ still held messages " + std::to_string(opts_.linger.count() + 1000) +
              " ms after the job ended: leaving them");
    closer.detach();  // impl stays allocated: the closing thread still uses its context
  }
}

void Server::start() {
  if (!opts_.checkpoint.empty()) {
    if (auto c = load_checkpoint(opts_.checkpoint)) {
      engine_->restore(*c);
      impl_->log("resumed from checkpoint " + opts_.checkpoint + " at round " +
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
    // Its own key admitted too: a backup connects with the job's server key pair.
    auto keys = opts_.curve_clients;
    keys.emplace_back(kServerIdentity, curve_public(opts_.curve_secret));
    impl_->zap = std::make_unique<ZapHandler>(impl_->ctx, std::move(keys),
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
             std::string(to_string(opts_.job.policy())) +
             (engine_->config().shard.count > 1
                  ? ", " + engine_->config().shard.describe(opts_.job.dim)
                  : std::string()));
}

uint64_t Server::run() {
  if (!impl_->router) start();
  SKETCHSGD_REQUIRE(impl_->router != nullptr, Error, "server: run() may be called once");
  Impl& s = *impl_;
  const bool tty = isatty(2);
  const uint64_t job = opts_.job.job;

  // The I/O thread owns the socket and echoes heartbeats itself, so liveness never waits behind
  // a merge; this thread runs the round logic (the Engine) on what it queues.
  IoThread::Hooks io_hooks;
  io_hooks.screen = [job](IoThread& io, const Received& m) {
    if (m.frames.size() == 1) {
      try {
        const Envelope e = decode_envelope(m.frames[0].bytes(), 0);
        if (e.type == Type::Heartbeat && e.job == job)
          (void)io.send_now(
              &m.peer,
              {Frame::own(encode(Envelope{Type::Heartbeat, job, 0, e.rank, 0, e.session}))});
      } catch (const Error&) {
      }
    }
    return true;  // the Engine still sees it: liveness, and refusals of garbage
  };
  IoOptions io_opts;
  io_opts.routed = true;
  io_opts.inbox_bytes = s.inbox_cap;
  IoThread io(s.ctx, std::move(s.router), io_opts, std::move(io_hooks),
              [&s](const std::string& line) { s.log(line); });

  // Wakes on new messages or every tick for deadlines and liveness.
  const Millis tick = std::clamp(opts_.job.heartbeat / 4, Millis(5), Millis(100));
  std::vector<Outgoing> out;
  auto last_status = Clock::now();
  auto log = [&s](const std::string& line) { s.log(line); };
  // Every server may be followed by a backup; a backup follows its primary until a worker comes.
  ReplicaOptions ro;
  ro.backup = !opts_.replica_of.empty();
  ro.finish_grace = opts_.finish_grace;
  ro.finish_wait = opts_.finish_wait;
  Replica replica(*engine_, ro, log);
  std::unique_ptr<Upstream> up;
  if (ro.backup) {
    // The primary's whole state (model, momentum, FetchSGD's sketches) in one frame.
    up = std::make_unique<Upstream>(s.ctx, opts_.job, opts_.replica_of,
                                    3 * engine_->max_frame_bytes() + (1 << 20), opts_.curve_secret,
                                    log);
    up->io->post(Outgoing{{}, replica.follow()});
  }
  std::vector<Frames> replies;  // to the primary
  const auto send_up = [&] {
    for (auto& f : replies) up->io->post(Outgoing{{}, std::move(f)});
    replies.clear();
  };
  const auto upstream = [&](Clock::time_point deadline) {
    std::deque<Received> got = up->io->take(deadline);
    if (const auto failure = up->io->failure()) std::rethrow_exception(failure);
    for (auto& m : got) {
      if (m.reconnected)
        replies.push_back(replica.reconnected());
      else
        replica.upstream(m.frames, Clock::now(), replies);  // ConfigMismatch ends the server
    }
    up->io->release(got);
    send_up();
  };
  while (!stop_) {
    std::deque<Received> batch;
    if (replica.following()) {
      // The primary's traffic wakes this thread at once (its rounds wait for the
      // acknowledgements); a worker's Hello, which means the workers found the primary gone, is
      // looked at every tick: taking over is not in a hurry (the workers waited dead_after
      // heartbeats), and a following backup should not spin on the cores its primary needs.
      upstream(Clock::now() + tick);
      batch = io.take(Clock::now());
    } else {
      // At the next tick, or at the round's deadline if it comes first (a quorum round closes
      // at its deadline, not up to a tick later).
      const auto before = Clock::now();
      auto wake = before + tick;
      if (const auto d = replica.deadline(); d && *d > before) wake = std::min(wake, *d);
      batch = io.take(wake);
      if (up) upstream(Clock::now());  // answers a deposed primary's rounds
    }
    if (const auto failure = io.failure()) std::rethrow_exception(failure);
    const auto now = Clock::now();
    try {
      for (auto& m : batch) replica.handle(m.peer, m.frames, now, out, replies, m.user);
      replica.tick(now, out);
    } catch (const std::exception& e) {
      // The engine turns bad input into refusals; anything reaching here is a bug or an
      // exhausted resource. Log it and keep serving rather than end the job.
      s.log(std::string("internal error (round continues): ") + e.what());
    }
    io.release(batch);
    if (up) send_up();
    for (auto& o : out) io.post(std::move(o));
    out.clear();
    if (replica.deposed() && deposed_.empty()) deposed_ = *replica.deposed();
    if (!deposed_.empty()) break;
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
    if (replica.done(now)) {
      s.log("stopping: " + replica.why());
      break;
    }
  }
  stop_ = true;
  if (!deposed_.empty()) {
    s.log("deposed: " + deposed_);
  } else {
    replica.bye(out);  // a backup may stop once the job is over
    for (auto& o : out) io.post(std::move(o));
    out.clear();
  }
  if (up) up->io->stop();
  io.stop();  // the last round's updates go out first
  if (impl_->writer) impl_->writer->flush();
  impl_->report_failures("CHECKPOINT FAILED: ");
  if (const auto failure = io.failure()) std::rethrow_exception(failure);
  if (tty && opts_.status) std::fprintf(stderr, "\n");
  s.log("stopped at round " + std::to_string(engine_->round()) + " after " +
        std::to_string(s.rounds) + " rounds, " + std::to_string(engine_->rejected()) +
        " messages rejected (" + std::to_string(engine_->replays()) + " of another session), " +
        std::to_string(engine_->late_requests()) + " late requests told the job had finished");
  return s.rounds;
}

}  // namespace sketchsgd::ps
