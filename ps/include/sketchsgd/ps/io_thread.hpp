// One thread that owns one ZeroMQ socket (sockets are not thread-safe): it sends what other threads
// post, reads whole messages into a bounded inbox, and runs its owner's hooks on the I/O thread
// itself, so liveness (heartbeat echoes, idle heartbeats, reconnecting to a silent peer) never
// waits behind a long merge or a training step. The server (a ROUTER) and the worker client (a
// DEALER) both run on it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <zmq.hpp>

#include <sketchsgd/ps/frame.hpp>
#include <sketchsgd/ps/protocol.hpp>
#include <sketchsgd/ps/transport.hpp>

namespace sketchsgd::ps {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct IoOptions {
  bool routed = false;                        ///< a ROUTER: messages carry the peer's routing id
  size_t max_frames = 1 + kMaxPayloadFrames;  ///< frames kept per message; more: dropped, logged
  size_t inbox_bytes = 0;         ///< queued bytes at which reading pauses (0: no limit)
  size_t inbox_messages = 65536;  ///< and queued messages
  Millis poll{50};                ///< longest sleep between two runs of the tick hook
  int drain = 64;                 ///< messages read per wake-up before sending again
};

class IoThread {
 public:
  using Log = std::function<void(const std::string&)>;
  struct Hooks {
    /// Every received message, on the I/O thread, before it is queued: false drops it.
    std::function<bool(IoThread&, const Received&)> screen;
    /// After every wake-up, on the I/O thread.
    std::function<void(IoThread&, Clock::time_point)> tick;
  };

  /// Takes the socket over; ctx must outlive this object.
  IoThread(zmq::context_t& ctx, std::unique_ptr<zmq::socket_t> socket, IoOptions opts, Hooks hooks,
           Log log);
  ~IoThread();  ///< stop()
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  // ---- any thread
  /// Queues a message; the I/O thread sends it soon.
  void post(Outgoing o);
  /// Waits until a message is queued, the deadline passes or the I/O thread failed, then takes
  /// every queued message. Call release() once they are handled.
  std::deque<Received> take(Clock::time_point deadline);
  /// Frees the inbox room of handled messages (memory stays bounded while they are processed).
  void release(const std::deque<Received>& handled);
  /// Sends what is still queued and ends the thread (each send within the socket's limits, never
  /// waiting for a slow peer). Idempotent. Rethrows nothing: see failure().
  void stop();
  /// The exception that ended the I/O thread, if one did.
  std::exception_ptr failure() const;

  // ---- the I/O thread only (inside hooks)
  /// Sends at once; false when the peer's queue is full or the peer is gone (logged).
  bool send_now(const PeerId* peer, const Frames& frames);
  /// Replaces the socket (the peer fell silent: connect again) and queues a Received with
  /// `reconnected` set, so the owner learns that what it sent before may be lost.
  void replace_socket(std::unique_ptr<zmq::socket_t> socket);
  /// When the I/O thread last handed a message to the socket.
  Clock::time_point last_send() const { return last_send_; }

  static size_t bytes_of(const Received& m);

 private:
  void loop();
  void step();
  void run();
  void wake();
  void send_outbox();

  zmq::context_t& ctx_;
  std::unique_ptr<zmq::socket_t> socket_;
  IoOptions opts_;
  Hooks hooks_;
  Log log_;
  std::string wake_addr_;
  zmq::socket_t wake_rx_;
  zmq::socket_t wake_tx_;  // any thread, under wake_mu_
  std::mutex wake_mu_;
  std::atomic<bool> signalled_{false};
  std::atomic<bool> stop_{false};
  Clock::time_point last_send_{};

  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Received> inbox_;
  size_t inbox_bytes_ = 0;
  std::deque<Outgoing> outbox_;
  std::exception_ptr failure_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace sketchsgd::ps
