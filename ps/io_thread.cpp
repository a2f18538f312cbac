#include <sketchsgd/ps/io_thread.hpp>

#include <atomic>
#include <cerrno>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {

namespace {
/// A name for an I/O thread's wake-up pipe, unique in the process: a context shared by several
/// clients may still hold the endpoint of a closed one (its socket is reaped in the background),
/// so an address that a new thread could reuse (`this`) would fail to bind.
uint64_t next_id() {
  static std::atomic<uint64_t> n{0};
  return n++;
}
}  // namespace

size_t IoThread::bytes_of(const Received& m) {
  size_t n = 64 + m.peer.size();
  for (const auto& f : m.frames) n += f.size();
  return n;
}

IoThread::IoThread(zmq::context_t& ctx, std::unique_ptr<zmq::socket_t> socket, IoOptions opts,
                   Hooks hooks, Log log)
    : ctx_(ctx),
      socket_(std::move(socket)),
      opts_(opts),
      hooks_(std::move(hooks)),
      log_(std::move(log)),
      wake_addr_("inproc://sketchsgd-io-" + std::to_string(next_id())),
      wake_rx_(ctx, zmq::socket_type::pair),
      wake_tx_(ctx, zmq::socket_type::pair) {
  wake_rx_.set(zmq::sockopt::linger, 0);
  wake_tx_.set(zmq::sockopt::linger, 0);
  wake_rx_.bind(wake_addr_);
  wake_tx_.connect(wake_addr_);
  thread_ = std::thread([this] { run(); });
}

IoThread::~IoThread() {
  stop();
}

void IoThread::post(Outgoing o) {
  {
    std::lock_guard lock(mu_);
    outbox_.push_back(std::move(o));
  }
  wake();
}

void IoThread::wake() {
  // One pending wake-up is enough: the I/O thread clears the flag before it takes the outbox.
  if (signalled_.exchange(true)) return;
  std::lock_guard lock(wake_mu_);
  (void)wake_tx_.send(zmq::message_t(), zmq::send_flags::dontwait);
}

std::deque<Received> IoThread::take(Clock::time_point deadline) {
  std::deque<Received> out;
  std::unique_lock lock(mu_);
  ready_.wait_until(lock, deadline, [&] { return !inbox_.empty() || done_; });
  out.swap(inbox_);
  return out;
}

void IoThread::release(const std::deque<Received>& handled) {
  size_t n = 0;
  for (const auto& m : handled) n += bytes_of(m);
  bool was_full;
  {
    std::lock_guard lock(mu_);
    was_full = opts_.inbox_bytes && inbox_bytes_ >= opts_.inbox_bytes;
    SKETCHSGD_ASSERT(n <= inbox_bytes_, "released ", n, " bytes of ", inbox_bytes_, " queued");
    inbox_bytes_ -= n;
  }
  if (was_full) wake();  // reading was paused: look at the socket again
}

std::exception_ptr IoThread::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

void IoThread::stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  {
    std::lock_guard lock(wake_mu_);
    (void)wake_tx_.send(zmq::message_t(), zmq::send_flags::dontwait);
  }
  thread_.join();
  wake_rx_.close();
  wake_tx_.close();
}

bool IoThread::send_now(const PeerId* peer, const Frames& frames) {
  try {
    if (send(*socket_, peer, frames)) {
      last_send_ = Clock::now();
      return true;
    }
    log_("send queue of a peer is full: message dropped");
  } catch (const zmq::error_t& e) {
    log_(std::string("send to a departed peer failed: ") + e.what());
  }
  return false;
}

void IoThread::replace_socket(std::unique_ptr<zmq::socket_t> socket) {
  socket_->close();
  socket_ = std::move(socket);
  Received r;
  r.reconnected = true;
  {
    std::lock_guard lock(mu_);
    inbox_bytes_ += bytes_of(r);
    inbox_.push_back(std::move(r));
  }
  ready_.notify_all();
}

void IoThread::send_outbox() {
  signalled_ = false;
  std::deque<Outgoing> out;
  {
    std::lock_guard lock(mu_);
    out.swap(outbox_);
  }
  for (auto& o : out) (void)send_now(opts_.routed ? &o.peer : nullptr, o.frames);
}

void IoThread::run() {
  try {
    loop();
  } catch (...) {
    std::lock_guard lock(mu_);
    failure_ = std::current_exception();
  }
  // What the owner queued last (final updates, a goodbye) still goes out: sends never block, and
  // the socket's linger bounds how long ZeroMQ keeps trying once it is closed.
  try {
    send_outbox();
  } catch (...) {
  }
  socket_->close();
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  ready_.notify_all();
}

void IoThread::loop() {
  while (!stop_) {
    try {
      step();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;  // a signal of the host program interrupted a call: go on
    }
  }
}

void IoThread::step() {
  {
    bool full;
    {
      std::lock_guard lock(mu_);
      full = (opts_.inbox_bytes && inbox_bytes_ >= opts_.inbox_bytes) ||
             inbox_.size() >= opts_.inbox_messages;
    }
    zmq::pollitem_t items[] = {{socket_->handle(), 0, short(full ? 0 : ZMQ_POLLIN), 0},
                               {wake_rx_.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, opts_.poll);
    if (items[1].revents & ZMQ_POLLIN) {
      zmq::message_t m;
      while (wake_rx_.recv(m, zmq::recv_flags::dontwait)) {
      }
    }
    send_outbox();
    for (int n = 0; n < opts_.drain && !full && !stop_; ++n) {
      auto msg = receive(*socket_, opts_.routed, opts_.max_frames);
      if (!msg) break;
      if (msg->overflow) {
        log_("dropped a message of more than " + std::to_string(opts_.max_frames) +
             " frames, or cut short");
        continue;
      }
      if (hooks_.screen && !hooks_.screen(*this, *msg)) continue;
      const size_t bytes = bytes_of(*msg);
      {
        std::lock_guard lock(mu_);
        inbox_.push_back(std::move(*msg));
        inbox_bytes_ += bytes;
        full = (opts_.inbox_bytes && inbox_bytes_ >= opts_.inbox_bytes) ||
               inbox_.size() >= opts_.inbox_messages;
      }
      ready_.notify_one();
    }
    if (hooks_.tick) hooks_.tick(*this, Clock::now());
  }
}

}  // namespace sketchsgd::ps
