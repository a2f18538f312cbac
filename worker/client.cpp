#include "client.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "../kernels/cpu.hpp"
#include "../kernels/error.hpp"
#include "../server/log.hpp"
#include "../server/protocol.hpp"
#include "../server/zmq_io.hpp"

namespace sketchsgd::ps {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct Client::Event {
  bool reconnected = false;  // the link replaced its socket: register again
  Envelope env{};
  Frames frames;
};

// Background thread that owns the DEALER socket: sends what the caller queues, receives and
// checks envelopes, sends heartbeats, and replaces the socket when the server falls silent.
struct Client::Link {
  Link(const ClientOptions& o, uint64_t max_frame, std::function<void(const std::string&)> log)
      : opts(o), max_frame(max_frame), log(std::move(log)), hb_ms(o.heartbeat.count()) {
    wake_rx.bind(wake_addr());
    wake_tx.set(zmq::sockopt::linger, 0);
    wake_tx.connect(wake_addr());
    // The first socket is made here, so a bad endpoint is the caller's error, not a crash on the
    // link thread (which takes the socket over; thread start orders the accesses).
    try {
      connect();
    } catch (const zmq::error_t& e) {
      throw InvalidArgument("client: cannot connect to '" + o.server + "': " + e.what());
    }
    thread = std::thread([this] { loop(); });
  }

  ~Link() {
    stop = true;
    notify();
    thread.join();
  }

  std::string wake_addr() const {
    return "inproc://sketchsgd-client-" + std::to_string(uintptr_t(this));
  }

  /// Caller's thread.
  void post(Frames f) {
    {
      std::lock_guard lock(mu);
      outbox.push_back(std::move(f));
    }
    notify();
  }
  void notify() {
    std::lock_guard lock(wake_mu);
    (void)wake_tx.send(zmq::message_t(), zmq::send_flags::dontwait);
  }
  bool pop(Event& e, Clock::time_point deadline) {
    std::unique_lock lock(mu);
    if (!ready.wait_until(lock, deadline, [&] { return !inbox.empty(); })) return false;
    e = std::move(inbox.front());
    inbox.pop_front();
    return true;
  }

  void connect() {
    dealer = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    apply_limits(*dealer, SocketLimits{max_frame, 16, Millis(500)});
    dealer->set(zmq::sockopt::reconnect_ivl, 100);
    dealer->set(zmq::sockopt::reconnect_ivl_max, int(opts.backoff_max.count()));
    if (!opts.curve_server_key.empty()) {
      dealer->set(zmq::sockopt::curve_serverkey, opts.curve_server_key);
      dealer->set(zmq::sockopt::curve_publickey, opts.curve_public);
      dealer->set(zmq::sockopt::curve_secretkey, opts.curve_secret);
    }
    dealer->connect(opts.server);
    last_recv = Clock::now();
  }

  void deliver(Event e) {
    {
      std::lock_guard lock(mu);
      inbox.push_back(std::move(e));
    }
    ready.notify_one();
  }

  void loop() {
    Millis backoff(100);
    auto last_send = Clock::time_point{};
    while (!stop) {
      const Millis hb(hb_ms.load());
      zmq::pollitem_t items[] = {{dealer->handle(), 0, ZMQ_POLLIN, 0},
                                 {wake_rx.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::max(Millis(5), hb / 4));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
        continue;  // interrupted by a signal of the host program
      }
      if (items[1].revents & ZMQ_POLLIN) {
        zmq::message_t m;
        while (wake_rx.recv(m, zmq::recv_flags::dontwait)) {
        }
      }
      std::deque<Frames> out;
      {
        std::lock_guard lock(mu);
        out.swap(outbox);
      }
      for (auto& f : out) {
        if (!send(*dealer, nullptr, f)) log("send queue full: message dropped");
        last_send = Clock::now();
      }
      for (int n = 0; n < 64; ++n) {
        auto msg = receive(*dealer, false, 1 + kMaxPayloadFrames);
        if (!msg) break;
        last_recv = Clock::now();
        backoff = Millis(100);
        if (msg->overflow || msg->frames.empty()) {
          log("dropped a server message with too many frames");
          continue;
        }
        try {
          Event e;
          e.env = decode_envelope(msg->frames[0].bytes(), msg->frames.size() - 1);
          SKETCHSGD_REQUIRE(e.env.job == opts.job && e.env.rank == opts.rank, ProtocolError,
                            "message for job ", e.env.job, " rank ", e.env.rank);
          if (e.env.type == Type::Heartbeat) continue;
          e.frames = std::move(msg->frames);
          deliver(std::move(e));
        } catch (const Error& ex) {
          log(std::string("dropped server message: ") + ex.what());
        }
      }
      const auto now = Clock::now();
      if (now - last_send >= hb) {
        (void)send(*dealer, nullptr,
                   {Frame::own(encode(Envelope{Type::Heartbeat, opts.job, 0, opts.rank, 0}))});
        last_send = now;
      }
      if (now - last_recv > hb * opts.dead_after + backoff) {
        log("server silent for " +
            std::to_string(std::chrono::duration_cast<Millis>(now - last_recv).count()) +
            " ms: reconnecting");
        dealer->close();
        connect();
        backoff = std::min(backoff * 2, opts.backoff_max);
        deliver(Event{true, {}, {}});
      }
    }
    // What the caller queued last (its Bye) still goes out, within the socket's linger.
    std::deque<Frames> out;
    {
      std::lock_guard lock(mu);
      out.swap(outbox);
    }
    for (auto& f : out) (void)send(*dealer, nullptr, f);
    dealer->close();
  }

  const ClientOptions& opts;
  uint64_t max_frame;
  std::function<void(const std::string&)> log;
  std::atomic<int64_t> hb_ms;
  std::atomic<bool> stop{false};

  zmq::context_t ctx{1};
  std::unique_ptr<zmq::socket_t> dealer;
  zmq::socket_t wake_rx{ctx, zmq::socket_type::pair};
  zmq::socket_t wake_tx{ctx, zmq::socket_type::pair};
  std::mutex wake_mu;
  Clock::time_point last_recv;

  std::mutex mu;
  std::condition_variable ready;
  std::deque<Frames> outbox;
  std::deque<Event> inbox;
  std::thread thread;
};

namespace {
Frame env_frame(Type t, const ClientOptions& o, uint64_t round) {
  return Frame::own(encode(Envelope{t, o.job, round, o.rank, 0}));
}
}  // namespace

Client::Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
               std::span<const float> initial_params)
    : opts_(std::move(opts)), codec_(std::move(codec)) {
  SKETCHSGD_REQUIRE(codec_ != nullptr, InvalidArgument, "client: no codec");
  SKETCHSGD_REQUIRE(opts_.world >= 1 && opts_.rank < opts_.world, InvalidArgument, "client: rank ",
                    opts_.rank, " outside a world of ", opts_.world);
  SKETCHSGD_REQUIRE(opts_.timeout.count() >= 1 && opts_.heartbeat.count() >= 1, InvalidArgument,
                    "client: timeout and heartbeat must be ≥ 1 ms");
  if (opts_.rank == 0) {
    SKETCHSGD_REQUIRE(initial_params.size() == codec_->dim(), InvalidArgument,
                      "client: rank 0 needs initial parameters of length ", codec_->dim(), ", got ",
                      initial_params.size());
    init_.resize(initial_params.size());
    detail::copy_bytes(init_.data(), initial_params.data(), initial_params.size_bytes(),
                       codec_->device());
    const size_t bad = kernels::cpu::find_nonfinite(init_.data(), init_.size());
    SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError,
                      "client: non-finite initial parameter at ", bad);
  }
  if (!opts_.log) {
    auto log = std::make_shared<Log>("worker " + std::to_string(opts_.rank), false);
    opts_.log = [log](const std::string& s) { (*log)(s); };
  }
  uint64_t max_frame = std::max<uint64_t>(codec_->dim() * 4, kMaxText + 64);  // model, refusal
  for (auto k : {MessageKind::Query, MessageKind::Update})
    max_frame = std::max(max_frame, codec_->max_payload(k) + kHeaderBytes);
  link_ = std::make_unique<Link>(opts_, max_frame + 64, opts_.log);

  hello();
  const auto deadline = Clock::now() + opts_.timeout;
  while (!synced_) {
    const Event e = wait(deadline, "registration");
    if (!handle_control(e))
      opts_.log("ignored " + std::string(to_string(e.env.type)) + " before registration");
  }
  model_changed_round_ = false;
}

Client::~Client() {
  if (link_ && registered_) link_->post({env_frame(Type::Bye, opts_, round_)});
  link_.reset();
}

void Client::hello() {
  registered_ = false;
  synced_ = false;
  const HelloInfo h{opts_.world, codec_->dim(), codec_->spec()};
  link_->post({env_frame(Type::Hello, opts_, round_), Frame::own(encode(h))});
}

Client::Event Client::wait(Clock::time_point deadline, const char* what) {
  Event e;
  if (!link_->pop(e, deadline))
    throw TimeoutError("worker " + std::to_string(opts_.rank) + ": no answer from " + opts_.server +
                       " for " + what + " within " + std::to_string(opts_.timeout.count()) + " ms");
  return e;
}

bool Client::handle_control(const Event& e) {
  if (e.reconnected) {
    hello();
    return true;
  }
  switch (e.env.type) {
    case Type::Welcome: {
      const WelcomeInfo w = decode_welcome(e.frames[1].bytes());
      registered_ = true;
      link_->hb_ms = w.heartbeat_ms;
      staleness_ = w.staleness;
      if (!w.has_model && opts_.rank == 0) {
        // A server restarted without a checkpoint starts again from rank 0's current model.
        const std::vector<float> p = init_.empty() ? params_.to_vector() : init_;
        link_->post({env_frame(Type::Init, opts_, round_),
                     Frame::own(Bytes(reinterpret_cast<const uint8_t*>(p.data()),
                                      reinterpret_cast<const uint8_t*>(p.data() + p.size())))});
      }
      link_->post({env_frame(Type::Pull, opts_, round_)});
      return true;
    }
    case Type::Refuse: {
      const RefuseInfo r = decode_refuse(e.frames[1].bytes());
      if (!r.retry)
        throw ConfigMismatch("worker " + std::to_string(opts_.rank) +
                             ": server refused: " + r.reason);
      if (r.refused == Type::Hello) {
        opts_.log("registration refused for now: " + r.reason);
        std::this_thread::sleep_for(Millis(std::min<int64_t>(link_->hb_ms.load(), 500)));
        hello();
      } else if (registered_) {
        // The server forgot us (it restarted): register again, then pull.
        opts_.log("server: " + r.reason + ": registering again");
        hello();
      }
      return true;
    }
    case Type::Model: {
      const auto b = e.frames[1].bytes();
      SKETCHSGD_REQUIRE(b.size() == codec_->dim() * 4, WireError, "model of ", b.size(),
                        " bytes for dim ", codec_->dim());
      std::vector<float> p(codec_->dim());
      std::memcpy(p.data(), b.data(), b.size());
      const size_t bad = kernels::cpu::find_nonfinite(p.data(), p.size());
      SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, "model: non-finite value at ", bad);
      if (params_.size() != p.size()) params_ = Buffer<float>(p.size(), codec_->device());
      params_.upload(p);
      if (e.env.round != round_) model_changed_round_ = true;  // the server is elsewhere
      round_ = e.env.round;
      if (model_changed_round_ || pending_.empty()) next_push_ = round_;
      synced_ = true;
      init_.clear();
      init_.shrink_to_fit();
      return true;
    }
    default:
      return false;
  }
}

StepResult Client::step(std::span<const float> grad) {
  StepResult res;
  const uint64_t r = next_push_;
  res.round = r;
  const Frame push = Frame::own(codec_->encode(grad, r, opts_.rank).release());
  pending_.emplace_back(r, push);
  link_->post({env_frame(Type::Push, opts_, r), push});
  res.pushed_at = Clock::now();
  res.bytes_up += push.size();
  ++next_push_;
  const auto deadline = Clock::now() + opts_.timeout;
  for (;;) {
    Event e;
    if (next_push_ - round_ <= staleness_) {
      // Far enough: take whatever already arrived, without waiting.
      if (!link_->pop(e, Clock::now())) return res;
    } else {
      e = wait(deadline, ("round " + std::to_string(round_)).c_str());
    }
    if (settle(e, res)) return res;
  }
}

StepResult Client::sync() {
  StepResult res;
  res.round = round_;
  const auto deadline = Clock::now() + opts_.timeout;
  while (round_ < next_push_)
    if (settle(wait(deadline, ("round " + std::to_string(round_)).c_str()), res)) break;
  return res;
}

bool Client::settle(const Event& e, StepResult& res) {
  const bool was_synced = synced_;
  if (handle_control(e)) {
    if (model_changed_round_) {
      model_changed_round_ = false;
      pending_.clear();
      next_push_ = round_;
      opts_.log("resynchronised with the server at round " + std::to_string(round_));
      res.outcome = StepResult::Outcome::Resynced;
      return true;
    }
    // A Model of our round after (re)registration: the server may have lost our pushes.
    if (e.env.type == Type::Model && !was_synced)
      for (const auto& [round, frame] : pending_) {
        link_->post({env_frame(Type::Push, opts_, round), frame});
        res.bytes_up += frame.size();
      }
    return false;
  }
  if (e.env.round > round_ && (e.env.type == Type::Update || e.env.type == Type::Abort)) {
    // An outcome of a later round: ours was lost on the way. Catch up through the model.
    opts_.log("missed the outcome of round " + std::to_string(round_) + ": pulling the model");
    link_->post({env_frame(Type::Pull, opts_, round_)});
    return false;
  }
  if (e.env.round != round_) return false;  // a duplicate of an earlier round's outcome
  switch (e.env.type) {
    case Type::Query: {
      const auto q = e.frames[1].bytes();
      res.bytes_down += q.size();
      const Frame ans = Frame::own(codec_->answer(q, opts_.rank).release());
      res.bytes_up += ans.size();
      link_->post({env_frame(Type::Answer, opts_, round_), ans});
      return false;
    }
    case Type::Update: {
      const UpdateInfo info = decode_update_info(e.frames[1].bytes());
      const auto u = e.frames[2].bytes();
      codec_->apply_step(u, params_.span(), info.lr);
      res.bytes_down += u.size();
      res.lr = info.lr;
      res.contributors = info.contributors;
      res.outcome = StepResult::Outcome::Updated;
      break;
    }
    case Type::Abort:
      opts_.log("round " + std::to_string(round_) +
                " aborted: " + decode_text(e.frames[1].bytes()));
      res.outcome = StepResult::Outcome::Aborted;
      break;
    default:
      opts_.log("ignored unexpected " + std::string(to_string(e.env.type)));
      return false;
  }
  ++round_;
  while (!pending_.empty() && pending_.front().first < round_) pending_.pop_front();
  if (next_push_ < round_) next_push_ = round_;
  return false;
}

}  // namespace sketchsgd::ps
