// The ZeroMQ server in a thread of the test process, bound to 127.0.0.1, and the options its
// workers connect with (job 5, fast heartbeats, a short grace at the job's end).
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include <sketchsgd/server/server.hpp>
#include <sketchsgd/worker/session.hpp>

namespace sketchsgd::ps::test_loopback {

inline constexpr uint64_t kJob = 5;

struct Running {
  explicit Running(ServerOptions o) : server(std::move(o)) {
    server.start();
    thread = std::thread([this] { rounds = server.run(); });
  }
  ~Running() { finish(); }
  /// Stops the server (idempotent); the rounds it ran.
  uint64_t finish() {
    server.stop();
    if (thread.joinable()) thread.join();
    return rounds;
  }
  Server server;
  std::thread thread;
  uint64_t rounds = 0;
};

inline ServerOptions options(const std::string& spec, uint32_t world, uint64_t dim,
                             uint64_t rounds) {
  using namespace std::chrono_literals;
  ServerOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.quiet = true;
  o.status = false;
  o.job.job = kJob;
  o.job.world = world;
  o.job.dim = dim;
  o.job.spec = spec;
  o.job.lr = 0.125f;
  o.job.max_rounds = rounds;
  o.job.heartbeat = 200ms;
  o.finish_grace = 300ms;
  return o;
}

inline ClientOptions client_options(const std::string& endpoint, uint32_t rank, uint32_t world) {
  using namespace std::chrono_literals;
  ClientOptions c;
  c.server = endpoint;
  c.job = kJob;
  c.rank = rank;
  c.world = world;
  c.timeout = 20s;
  c.log = [](const std::string&) {};
  return c;
}

}  // namespace sketchsgd::ps::test_loopback
