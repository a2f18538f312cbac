// The worker's link to one server (client.cpp's, one per shard).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <sketchsgd/ps/io_thread.hpp>
#include <sketchsgd/ps/liveness.hpp>
#include <sketchsgd/worker/client.hpp>

namespace sketchsgd::ps {

// The DEALER socket on an I/O thread, with the worker's liveness rules (ps/liveness.hpp) run
// there, and a new socket at once when the server says another replica serves the job.
struct Link {
  /// Connects to the first of o.server's endpoints ('|'-separated: a server and its backups);
  /// InvalidArgument for a bad one. The I/O thread runs from here on.
  Link(const ClientOptions& o, uint64_t max_frame, IoThread::Log log);
  /// A new socket to endpoints[current], with the options' limits and keys.
  std::unique_ptr<zmq::socket_t> connect();

  const ClientOptions& opts;
  uint64_t max_frame;
  std::atomic<int64_t> hb_ms;           // the server's interval, once registered
  std::atomic<uint64_t> session{0};     // heartbeats carry the registration's token
  std::atomic<uint32_t> rank{0};        // and its rank (a federated client's slot)
  std::atomic<bool> elsewhere{false};   // the server sent us on: try the next endpoint
  Liveness alive;                       // I/O thread only (after construction)
  std::vector<std::string> endpoints;   // the server, or its primary then its backup
  size_t current = 0;                   // I/O thread only (after construction)
  std::deque<Received> backlog;         // taken from the I/O thread, not yet handled
  std::shared_ptr<zmq::context_t> ctx;  // this link's own, or the process's (shared_io)
  std::unique_ptr<IoThread> io;         // last: stopped before the context goes
};

}  // namespace sketchsgd::ps
