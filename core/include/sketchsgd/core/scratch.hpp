// Device memory an object keeps for staging and checks on a GPU (unused on the CPU): owned by the
// object that runs the work (a sketch, a codec, its feedback, an aggregator), grown on demand and
// kept, so after the first round its hot path allocates nothing, and freed with the object. One
// object runs its work one call at a time, so one scratch serves all of it; a copy starts empty
// (it may run on another device or stream).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>

#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/gpu.hpp>

namespace sketchsgd {

class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) {}
  Scratch& operator=(const Scratch&) {
    *this = Scratch();
    return *this;
  }
  Scratch(Scratch&&) noexcept = default;
  Scratch& operator=(Scratch&&) noexcept = default;

  /// Device room for n Ts in slot 0 or 1 (a call that stages two lists uses both); grown by half
  /// again, so rising sizes seldom reallocate. Reuse is safe: work on the stream that reads the
  /// old contents is ordered before anything written next.
  template <class T>
  T* room(const Device& d, size_t n, int slot) {
    Buffer<uint8_t>& b = slot_[slot];
    const size_t bytes = std::max<size_t>(n * sizeof(T), 1);
    if (b.size() < bytes || !(b.device() == d))
      b = Buffer<uint8_t>(std::max(bytes, b.size() + b.size() / 2), d);
    return reinterpret_cast<T*>(b.data());
  }

  /// The device check: launch(flag) runs kernels that atomically min a position into *flag
  /// (device memory preset to "none"); returns that position, or kNoPosition when none was found.
  /// One 8-byte read-back, so a check costs one synchronisation whatever it scans.
  template <class Launch>
  size_t first_flagged(const Device& d, Launch&& launch) {
    if (flag_.empty() || !(flag_.device() == d)) flag_ = Buffer<unsigned long long>(1, d);
    gpu::fill(flag_.data(), 0xFF, sizeof(unsigned long long), d.stream);
    launch(flag_.data());
    unsigned long long got = 0;
    flag_.download(std::span<unsigned long long>(&got, 1));
    return got == ~0ull ? kNoPosition : size_t(got);
  }
  static constexpr size_t kNoPosition = ~size_t(0);

  /// The kernels' workspace (selection), created on first use.
  gpu::Workspace& workspace() {
    if (!ws_) ws_ = std::make_unique<gpu::Workspace>();
    return *ws_;
  }

 private:
  Buffer<uint8_t> slot_[2];
  Buffer<unsigned long long> flag_;
  std::unique_ptr<gpu::Workspace> ws_;
};

}  // namespace sketchsgd
