// Writes checkpoints on a thread of their own, so a round never waits for the disk (a big model's
// fsync can take longer than a round). The caller hands over a snapshot and goes on; a newer
// snapshot replaces one still waiting, since only the latest matters. Each file is still written
// atomically by save_checkpoint, so a crash leaves the previous checkpoint or the new one.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sketchsgd/server/checkpoint.hpp>

namespace sketchsgd::ps {

class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string path);
  /// Writes what is still waiting, then stops.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const std::string& path() const { return path_; }
  /// Queues a snapshot and returns at once.
  void submit(Checkpoint c);
  /// Waits until every submitted snapshot is on disk (or failed).
  void flush();
  /// Reasons of the writes that failed since the last call.
  std::vector<std::string> take_failures();

 private:
  void run();

  std::string path_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::optional<Checkpoint> pending_;
  bool writing_ = false;
  bool stop_ = false;
  std::vector<std::string> failures_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace sketchsgd::ps
