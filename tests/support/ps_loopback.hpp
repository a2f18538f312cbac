// The ZeroMQ server in a thread of the test process, bound to 127.0.0.1, and the options its
// workers connect with (job 5, fast heartbeats, a short grace at the job's end).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/server/server.hpp>
#include <sketchsgd/worker/client.hpp>
#include <sketchsgd/worker/session.hpp>
#include "support/ps_synthetic.hpp"

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

inline ClientOptions client_options(const std::string& endpoint, uint32_t rank, uint32_t world,
                                    bool shared_io = false) {
  using namespace std::chrono_literals;
  ClientOptions c;
  c.server = endpoint;
  c.job = kJob;
  c.rank = rank;
  c.world = world;
  c.timeout = 20s;
  c.shared_io = shared_io;
  c.log = [](const std::string&) {};
  return c;
}

/// W workers in threads of this process, `rounds` steps each on synthetic gradients (seeded by
/// grad_seed; rank 0 starts the model at initial_params(dim, 3)); every step must be updated and
/// counted. Their final parameters (a failing worker's: empty, and the test fails). shared_io:
/// the workers share one ZeroMQ context (ClientOptions::shared_io).
inline std::vector<std::vector<float>> train(const std::string& endpoints, const std::string& spec,
                                             uint32_t world, uint64_t dim, uint64_t rounds,
                                             uint64_t grad_seed, bool shared_io = false) {
  const auto init = test::initial_params(dim, 3);
  std::vector<std::vector<float>> out(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (uint32_t r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        Client c(client_options(endpoints, r, world, shared_io), make_compressor(spec, dim),
                 r == 0 ? std::span<const float>(init) : std::span<const float>());
        for (uint64_t t = 0; t < rounds; ++t) {
          const auto res = c.step(test::synthetic_grad(c.params(), r, t, grad_seed));
          if (res.outcome != StepResult::Outcome::Updated) throw Error("round not updated");
          if (res.bytes_up == 0 || res.bytes_down == 0) throw Error("no traffic counted");
        }
        out[r].assign(c.params().begin(), c.params().end());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (uint32_t r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

struct StaleRun {
  std::vector<std::vector<float>> params;  ///< each worker's after sync()
  std::vector<uint64_t> max_ahead;         ///< the most pushes each had unanswered
};

/// Two workers of a job with bounded staleness (the server's): rank 1 sleeps 15 ms before each
/// push, rank 0 runs ahead as far as the server lets it; both push until `rounds` are pushed,
/// then sync(). A failing worker fails the test (its params stay empty).
inline StaleRun train_stale(const std::string& endpoints, const std::string& spec, uint64_t dim,
                            uint64_t rounds, uint32_t staleness) {
  using namespace std::chrono_literals;
  const auto init = test::initial_params(dim, 3);
  StaleRun out{std::vector<std::vector<float>>(2), std::vector<uint64_t>(2, 0)};
  std::vector<std::string> errors(2);
  std::vector<std::thread> ws;
  for (uint32_t r = 0; r < 2; ++r)
    ws.emplace_back([&, r] {
      try {
        Client c(client_options(endpoints, r, 2), make_compressor(spec, dim),
                 r == 0 ? std::span<const float>(init) : std::span<const float>());
        if (c.staleness() != staleness) throw Error("staleness not taken from the server");
        while (c.next_push() < rounds) {
          if (r == 1) std::this_thread::sleep_for(15ms);
          c.step(test::synthetic_grad(c.params(), r, c.next_push(), 9));
          out.max_ahead[r] = std::max(out.max_ahead[r], c.next_push() - c.round());
        }
        c.sync();
        if (c.round() != rounds) throw Error("sync did not settle every round");
        out.params[r].assign(c.params().begin(), c.params().end());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ws) t.join();
  for (uint32_t r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

}  // namespace sketchsgd::ps::test_loopback
