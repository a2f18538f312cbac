// The job the in-process parameter-server tests run (Engine and Session alike): job id 42, fast
// heartbeats and deadlines so that a fake clock reaches them in a few ticks.
#pragma once

#include <chrono>
#include <string>

#include <sketchsgd/server/engine.hpp>

namespace sketchsgd::ps::test_job {

inline constexpr uint64_t kJob = 42;

inline JobConfig make(const std::string& spec, uint32_t world, uint64_t dim) {
  JobConfig c;
  c.job = kJob;
  c.world = world;
  c.dim = dim;
  c.spec = spec;
  c.lr = 0.25f;
  c.deadline = std::chrono::milliseconds(1000);
  c.heartbeat = std::chrono::milliseconds(100);
  return c;
}

}  // namespace sketchsgd::ps::test_job
