#include <sketchsgd/server/checkpoint_writer.hpp>

#include <cstdio>
#include <utility>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {

CheckpointWriter::CheckpointWriter(std::string path)
    : path_(std::move(path)), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
  // Nobody is left to take these: say them rather than lose them.
  for (const auto& why : failures_) std::fprintf(stderr, "CHECKPOINT FAILED: %s\n", why.c_str());
}

void CheckpointWriter::submit(Checkpoint c) {
  {
    std::lock_guard lock(mutex_);
    pending_ = std::move(c);
  }
  wake_.notify_one();
}

void CheckpointWriter::flush() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return !pending_ && !writing_; });
}

std::vector<std::string> CheckpointWriter::take_failures() {
  std::lock_guard lock(mutex_);
  return std::exchange(failures_, {});
}

void CheckpointWriter::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return pending_ || stop_; });
    if (!pending_) return;  // stopping with nothing left to write
    Checkpoint c = std::move(*pending_);
    pending_.reset();
    writing_ = true;
    lock.unlock();
    std::string failure;
    try {
      save_checkpoint(path_, c);
    } catch (const std::exception& e) {  // Error from the file system, or bad_alloc
      failure = e.what();
    }
    lock.lock();
    writing_ = false;
    if (!failure.empty()) failures_.push_back(std::move(failure));
    if (!pending_) idle_.notify_all();
  }
}

}  // namespace sketchsgd::ps
