#include <sketchsgd/worker/client.hpp>

#include <algorithm>
#include <atomic>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include <sketchsgd/ps/io_thread.hpp>
#include <sketchsgd/ps/log.hpp>
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

// The DEALER socket on an I/O thread, with the worker's liveness rules run there: a heartbeat when
// nothing else went out for an interval, and a new socket when the server has been silent for
// dead_after intervals (with exponential backoff).
struct Client::Link {
  Link(const ClientOptions& o, uint64_t max_frame, IoThread::Log log)
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
      // Not before the first registration: the server would refuse an unregistered heartbeat,
      // addressed to a rank this link does not know yet (a sharded client's later shards wait
      // while the first registers).
      if (session.load() != 0 && now - io.last_send() >= hb)
        (void)io.send_now(nullptr, {Frame::own(encode(Envelope{Type::Heartbeat, opts.job, 0,
                                                               rank.load(), 0, session.load()}))});
      if (now - last_recv > hb * opts.dead_after + backoff) {
        // A replicated server's next endpoint: its backup takes over when workers come to it.
        current = (current + 1) % endpoints.size();
        log("server silent for " +
            std::to_string(std::chrono::duration_cast<Millis>(now - last_recv).count()) +
            " ms: reconnecting to " + endpoints[current]);
        io.replace_socket(connect());
        last_recv = now;
        backoff = std::min(backoff * 2, opts.backoff_max);
      }
    };
    IoOptions io_opts;
    io_opts.poll = std::max(Millis(5), std::min(Millis(50), opts.heartbeat / 4));
    io = std::make_unique<IoThread>(*ctx, std::move(first), io_opts, std::move(hooks),
                                    std::move(log));
  }

  std::unique_ptr<zmq::socket_t> connect() {
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

  const ClientOptions& opts;
  uint64_t max_frame;
  std::atomic<int64_t> hb_ms;           // the server's interval, once registered
  std::atomic<uint64_t> session{0};     // heartbeats carry the registration's token
  std::atomic<uint32_t> rank{0};        // and its rank (a federated client's slot)
  Clock::time_point last_recv;          // I/O thread only
  Millis backoff{100};                  // I/O thread only
  std::vector<std::string> endpoints;   // the server, or its primary then its backup
  size_t current = 0;                   // I/O thread only (after construction)
  std::deque<Received> backlog;         // taken from the I/O thread, not yet handled
  std::shared_ptr<zmq::context_t> ctx;  // this link's own, or the process's (shared_io)
  std::unique_ptr<IoThread> io;         // last: stopped before the context goes
};

// One server of the job (the only one, or one shard): its codec, round logic and link.
struct Client::Shard {
  Shard(ClientOptions opts, Compressor& codec, std::span<const float> initial_params)
      : codec(codec) {
    if (!opts.log) {
      const std::string who =
          "worker " + std::to_string(opts.rank) +
          (opts.shard.count > 1 ? " shard " + std::to_string(opts.shard.index) : std::string());
      auto log = std::make_shared<Log>(who, false);
      opts.log = [log](const std::string& s) { (*log)(s); };
    }
    session = std::make_unique<Session>(std::move(opts), codec, initial_params);
    const ClientOptions& o = session->options();
    link = std::make_unique<Link>(o, max_frame_bytes(codec) + 64, o.log);
  }

  /// Registers and waits for the model.
  void join() {
    Session::Outbox out;
    session->hello(out);
    flush(out);
    const auto deadline = Clock::now() + session->options().timeout;
    while (!session->synced()) {
      Received ev;
      if (!next(deadline, ev)) timeout("registration");
      if (ev.reconnected)
        session->hello(out);
      else
        session->handle_registration(ev.frames, Clock::now(), out);
      flush(out);
    }
  }

  void bye() {
    Session::Outbox out;
    session->bye(out);
    flush(out);
  }

  /// Sends what the session queued.
  void flush(Session::Outbox& out) {
    for (auto& f : out) link->io->post(Outgoing{{}, std::move(f)});
    out.clear();
    link->hb_ms = session->heartbeat().count();
    link->session = session->session();
    link->rank = session->rank();
  }

  [[noreturn]] void timeout(const std::string& what) const {
    const ClientOptions& o = session->options();
    throw TimeoutError("worker " + std::to_string(o.rank) + ": no answer from " + o.server +
                       " for " + what + " within " + std::to_string(o.timeout.count()) + " ms");
  }

  /// The next event of the link (a server message, or the news that the socket was replaced),
  /// running the session's timers meanwhile; false when the deadline passed first.
  bool next(Clock::time_point deadline, Received& ev) {
    for (;;) {
      if (!link->backlog.empty()) {
        ev = std::move(link->backlog.front());
        link->backlog.pop_front();
        return true;
      }
      Session::Outbox out;
      session->tick(Clock::now(), out);  // e.g. a Hello again after a transient refusal
      flush(out);
      auto wake = deadline;
      if (const auto t = session->next_tick()) wake = std::min(wake, *t);
      auto got = link->io->take(std::max(wake, Clock::now()));
      if (const auto failure = link->io->failure()) std::rethrow_exception(failure);
      for (auto& m : got) link->backlog.push_back(std::move(m));
      if (link->backlog.empty() && Clock::now() >= deadline) return false;
    }
  }

  /// Hands an event to the session; true when the step must return (resynchronised).
  bool dispatch(Received& ev, StepResult& res) {
    Session::Outbox out;
    bool done = false;
    if (ev.reconnected)
      session->hello(out);  // what went out before may be lost: register again, then resend
    else
      done = session->handle(ev.frames, Clock::now(), out, res);
    flush(out);
    return done;
  }

  StepResult step(std::span<const float> grad) {
    StepResult res;
    push(grad, res);
    settle(res);
    return res;
  }

  /// Encodes and sends the push of the next round.
  void push(std::span<const float> grad, StepResult& res) {
    Session::Outbox out;
    session->push(grad, out, res);
    flush(out);
    res.pushed_at = Clock::now();
  }

  /// Handles the server's messages (queries answered, updates applied) until at most
  /// `staleness` pushes are unanswered.
  void settle(StepResult& res) {
    const auto deadline = Clock::now() + session->options().timeout;
    for (;;) {
      Received ev;
      if (!session->must_wait()) {
        // Far enough: take whatever already arrived, without waiting.
        if (!next(Clock::now(), ev)) return;
      } else if (!next(deadline, ev)) {
        timeout("round " + std::to_string(session->round()));
      }
      if (dispatch(ev, res)) return;
    }
  }

  StepResult sync() {
    StepResult res;
    res.round = session->round();
    const auto deadline = Clock::now() + session->options().timeout;
    while (!session->settled()) {
      Received ev;
      if (!next(deadline, ev)) timeout("round " + std::to_string(session->round()));
      if (dispatch(ev, res)) break;
    }
    return res;
  }

  std::unique_ptr<Compressor> own;  // a shard's codec of its range (the job's codec: none)
  Compressor& codec;
  std::unique_ptr<Session> session;
  std::unique_ptr<Link> link;
  bool finished = false;  // its job ended: left out of later steps
};

Client::Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
               std::span<const float> initial_params)
    : codec_(std::move(codec)) {
  SKETCHSGD_REQUIRE(codec_ != nullptr, InvalidArgument, "client: no codec");
  const std::vector<std::string> servers = split_endpoints(opts.server);
  if (servers.size() == 1) {
    shards_.push_back(std::make_unique<Shard>(std::move(opts), *codec_, initial_params));
    shards_[0]->join();
    return;
  }
  SKETCHSGD_REQUIRE(servers.size() <= 1024, InvalidArgument, "client: ", servers.size(),
                    " shards (at most 1024)");
  SKETCHSGD_REQUIRE(opts.shard == ShardId{}, InvalidArgument,
                    "client: opts.shard is set per shard by the client itself");
  SKETCHSGD_REQUIRE(initial_params.empty() || initial_params.size() == codec_->dim(),
                    InvalidArgument, "client: ", initial_params.size(),
                    " initial parameters for a model of ", codec_->dim());
  const auto plan = plan_shards(codec_->spec(), codec_->dim(), uint32_t(servers.size()));
  for (const auto& p : plan) {
    ClientOptions o = opts;
    o.server = servers[p.id.index];
    o.shard = p.id;
    auto own = make_compressor(p.spec, p.dim, codec_->device());
    const auto init =
        initial_params.empty() ? initial_params : initial_params.subspan(p.id.begin, p.dim);
    auto s = std::make_unique<Shard>(std::move(o), *own, init);
    s->own = std::move(own);
    shards_.push_back(std::move(s));
  }
  params_ = Buffer<float>(codec_->dim(), codec_->device());
  // In shard order, as every worker does: rank 0 initialises each shard as it comes to it.
  for (auto& s : shards_) s->join();
  assemble();
}

Client::~Client() {
  // Says goodbye; each link then closes within its socket's linger.
  for (auto& s : shards_)
    if (s->link && s->session) s->bye();
  shards_.clear();
}

template <class F>
void Client::each(std::vector<StepResult>& res, std::vector<std::exception_ptr>& errors, F&& f) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (shards_[i]->finished || errors[i]) continue;
    try {
      f(*shards_[i], res[i]);
    } catch (const JobFinished&) {
      shards_[i]->finished = true;
      errors[i] = std::current_exception();
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
}

void Client::rethrow(const std::vector<std::exception_ptr>& errors) const {
  const bool all_finished =
      std::all_of(shards_.begin(), shards_.end(), [](auto& s) { return s->finished; });
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const JobFinished&) {
      if (all_finished) throw;  // else: that shard is left out from now on
    }
  }
}

std::vector<bool> Client::live() const {
  std::vector<bool> v;
  for (const auto& s : shards_) v.push_back(!s->finished);
  return v;
}

void Client::assemble() {
  if (shards_.size() == 1) return;
  for (const auto& s : shards_) {
    const ShardId& id = s->session->options().shard;
    ops::copy(codec_->device(), params_.span().subspan(id.begin, s->codec.dim()),
              s->session->params());
  }
}

namespace {

/// The results of the shards that took part as one: bytes summed, the most eventful outcome,
/// the lowest round.
StepResult merge(const std::vector<StepResult>& all, const std::vector<bool>& took_part) {
  std::vector<StepResult> parts;
  for (size_t i = 0; i < all.size(); ++i)
    if (took_part[i]) parts.push_back(all[i]);
  if (parts.empty()) return StepResult{};
  auto rank = [](StepResult::Outcome o) {
    switch (o) {
      case StepResult::Outcome::Resynced:
        return 3;
      case StepResult::Outcome::Aborted:
        return 2;
      case StepResult::Outcome::Pending:
        return 1;
      case StepResult::Outcome::Updated:
        return 0;
    }
    return 0;
  };
  StepResult m = parts.front();
  for (size_t i = 1; i < parts.size(); ++i) {
    const StepResult& p = parts[i];
    if (rank(p.outcome) > rank(m.outcome)) m.outcome = p.outcome;
    m.round = std::min(m.round, p.round);
    m.contributors = std::min(m.contributors, p.contributors);
    m.bytes_up += p.bytes_up;
    m.bytes_down += p.bytes_down;
    m.fetched = m.fetched && p.fetched;  // every shard's model came
    m.age = std::max(m.age, p.age);
    m.pushed_at = std::max(m.pushed_at, p.pushed_at);
  }
  return m;
}

}  // namespace

StepResult Client::step(std::span<const float> grad) {
  if (shards_.size() == 1) return shards_[0]->step(grad);
  SKETCHSGD_REQUIRE(grad.size() == codec_->dim(), InvalidArgument, "client: gradient of ",
                    grad.size(), " values for a model of ", codec_->dim());
  // Checked whole first, so no shard gets a part of a gradient the others refuse.
  const size_t bad = ops::find_nonfinite(codec_->device(), scratch_, grad);
  SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, "client: gradient value ", bad,
                    " is not finite");
  // Every part goes out first, then each shard's round is settled in shard order (every worker
  // keeps that order, so a two-round codec's queries cannot wait on each other): the rounds run
  // at once on the shards' links while the codecs' work stays on this thread, where their
  // kernels' own threads (OpenMP) do not compete with other shards' for the cores.
  std::vector<StepResult> parts(shards_.size());
  std::vector<std::exception_ptr> errors(shards_.size());
  std::vector<bool> took_part = live();
  each(parts, errors, [&](Shard& s, StepResult& r) {
    s.push(grad.subspan(s.session->options().shard.begin, s.codec.dim()), r);
  });
  each(parts, errors, [](Shard& s, StepResult& r) { s.settle(r); });
  assemble();  // the shards that completed their round moved on
  rethrow(errors);
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) took_part[i] = false;  // finished during this call
  return merge(parts, took_part);
}

StepResult Client::sync() {
  if (shards_.size() == 1) return shards_[0]->sync();
  std::vector<StepResult> parts(shards_.size());
  std::vector<std::exception_ptr> errors(shards_.size());
  std::vector<bool> took_part = live();
  each(parts, errors, [](Shard& s, StepResult& r) { r = s.sync(); });
  assemble();
  rethrow(errors);
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) took_part[i] = false;  // finished during this call
  return merge(parts, took_part);
}

StepResult Client::fetch() {
  std::vector<StepResult> parts(shards_.size());
  std::vector<std::exception_ptr> errors(shards_.size());
  std::vector<bool> took_part = live();
  // Every shard asked first, then each waited for: the models come at once.
  each(parts, errors, [](Shard& s, StepResult&) {
    Session::Outbox out;
    s.session->fetch(out);
    s.flush(out);
  });
  each(parts, errors, [](Shard& s, StepResult& r) { s.settle(r); });
  assemble();
  rethrow(errors);
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) took_part[i] = false;
  return merge(parts, took_part);
}

bool Client::async() const {
  return shards_[0]->session->async();
}

std::span<const float> Client::params() const {
  return shards_.size() == 1 ? shards_[0]->session->params() : params_.span();
}

uint64_t Client::round() const {
  uint64_t r = UINT64_MAX;
  for (const auto& s : shards_) r = std::min(r, s->session->round());
  return r;
}

uint64_t Client::next_push() const {
  uint64_t r = UINT64_MAX;
  for (const auto& s : shards_) r = std::min(r, s->session->next_push());
  return r;
}

uint32_t Client::staleness() const {
  return shards_[0]->session->staleness();
}
uint32_t Client::rank() const {
  return shards_[0]->session->rank();
}

uint64_t Client::shard_round(size_t i) const {
  SKETCHSGD_REQUIRE(i < shards_.size(), InvalidArgument, "client: shard ", i, " of ",
                    shards_.size());
  return shards_[i]->session->round();
}

}  // namespace sketchsgd::ps
