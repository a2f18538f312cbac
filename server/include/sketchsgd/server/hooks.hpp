// What a server reports as it runs: its log, each round's metrics, its checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sketchsgd/server/checkpoint.hpp>

namespace sketchsgd::ps {

struct RoundMetrics {
  uint64_t round = 0;
  bool aborted = false;
  std::string reason;                ///< why it closed early or aborted
  double latency_ms = 0;             ///< first push → update sent
  double merge_ms = 0;               ///< time spent merging and reducing
  uint32_t contributors = 0;         ///< gradients in the update
  std::vector<uint64_t> bytes_up;    ///< per rank, this round (gradient + answer messages)
  uint64_t bytes_down_each = 0;      ///< update (+ query) bytes sent to each worker
  uint64_t dense_bytes = 0;          ///< what one dense fp32 gradient would cost
  std::vector<uint32_t> stragglers;  ///< live workers not in the update
  std::vector<uint32_t> dead;        ///< registered workers counted as dead
  /// Asynchronous jobs: the push's pusher and age (the update's contributors is 1).
  uint32_t pusher = 0;
  uint64_t age = 0;
};

struct Hooks {
  std::function<void(const std::string&)> log = [](const std::string&) {};
  std::function<void(const RoundMetrics&)> round = [](const RoundMetrics&) {};
  /// A snapshot of the model and the server state, every checkpoint_every rounds and after the
  /// last (last = true: the job is done once it is stored). The caller stores it (the server
  /// writes it on a thread of its own); unset: no snapshots are taken.
  std::function<void(Checkpoint, bool last)> checkpoint;
};

}  // namespace sketchsgd::ps
