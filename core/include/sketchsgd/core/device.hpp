// Where a sketch or codec keeps its memory and runs its kernels, faiss-style: choose the device
// once when creating the object; afterwards every span it takes or returns lives there (device
// memory for a GPU), and the object runs the matching kernels. Callers never branch again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <sketchsgd/core/gpu.hpp>

namespace sketchsgd {

struct Device;

/// Makes a device current for one scope and gives the caller back its own device afterwards, so a
/// library call never moves the thread's current device under a multi-GPU caller (libtorch
/// allocates on the current device). A CPU device does nothing.
class DeviceScope {
 public:
  explicit DeviceScope(const Device& d);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;  ///< the device to restore; −1: nothing was changed
};

struct Device {
  int gpu = -1;                  ///< CUDA device ordinal; −1: the CPU
  gpu::Stream stream = nullptr;  ///< the caller's stream (null: the default stream)

  static Device cpu() { return {}; }
  static Device cuda(int id = 0, gpu::Stream s = nullptr) { return {id, s}; }
  bool is_gpu() const { return gpu >= 0; }
  bool operator==(const Device& o) const { return gpu == o.gpu && stream == o.stream; }
  /// "cpu" or "cuda:N".
  std::string name() const;
  /// Parses "cpu", "cuda" or "cuda:N" (InvalidArgument otherwise).
  static Device parse(const std::string& text);
  /// Makes this device current until the returned scope ends; CudaError when it does not exist
  /// or the build has no CUDA. No-op for the CPU.
  [[nodiscard]] DeviceScope activate() const { return DeviceScope(*this); }
  /// On a GPU: InvalidArgument unless p (bytes > 0) is memory its kernels can touch — a host
  /// pointer passed by mistake is an error, not a fault that poisons the CUDA context.
  void require_accessible(const void* p, size_t bytes, const char* what) const;
};

namespace detail {
/// Owning device allocation (cudaMalloc on the device; the deleter frees it on that device).
std::shared_ptr<void> device_alloc(size_t bytes, const Device& d);
/// Copies between any two of host and device memory and waits for it (stream order kept).
void copy_bytes(void* dst, const void* src, size_t bytes, const Device& d);
/// Zeroes, ordered on the device's stream (does not wait).
void zero_bytes(void* dst, size_t bytes, const Device& d);
/// Waits for the device's stream.
void wait(const Device& d);
/// InvalidArgument when a copy of n elements does not fit a buffer of size.
void check_fits(size_t n, size_t size);
}  // namespace detail

/// A zero-initialised array on a Device: a std::vector on the CPU, device memory on a GPU.
/// Copies are deep on every device (a copied sketch must not share its table).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t n, const Device& d) : dev_(d), n_(n) {
    if (d.is_gpu()) {
      mem_ = detail::device_alloc(n * sizeof(T), d);
      zero();
      detail::wait(d);  // a new buffer is ready for work on any stream
    } else {
      host_.assign(n, T{});
    }
  }
  Buffer(const Buffer& o) : dev_(o.dev_), n_(o.n_), host_(o.host_) {
    if (o.mem_) {
      mem_ = detail::device_alloc(n_ * sizeof(T), dev_);
      detail::copy_bytes(mem_.get(), o.mem_.get(), n_ * sizeof(T), dev_);
    }
  }
  Buffer(Buffer&& o) noexcept
      : dev_(o.dev_),
        n_(std::exchange(o.n_, 0)),
        host_(std::move(o.host_)),
        mem_(std::move(o.mem_)) {}
  Buffer& operator=(const Buffer& o) {
    if (this != &o) *this = Buffer(o);
    return *this;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this == &o) return *this;
    dev_ = o.dev_;
    n_ = std::exchange(o.n_, 0);
    host_ = std::move(o.host_);
    mem_ = std::move(o.mem_);
    return *this;
  }

  const Device& device() const { return dev_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T* data() { return dev_.is_gpu() ? static_cast<T*>(mem_.get()) : host_.data(); }
  const T* data() const { return dev_.is_gpu() ? static_cast<const T*>(mem_.get()) : host_.data(); }
  std::span<T> span() { return {data(), n_}; }
  std::span<const T> span() const { return {data(), n_}; }

  void zero() { detail::zero_bytes(data(), n_ * sizeof(T), dev_); }
  /// Host → this buffer's first src.size() elements (src.size() ≤ size()).
  void upload(std::span<const T> src) {
    detail::check_fits(src.size(), n_);
    detail::copy_bytes(data(), src.data(), src.size_bytes(), dev_);
  }
  /// This buffer's first dst.size() elements → host (dst.size() ≤ size()).
  void download(std::span<T> dst) const {
    detail::check_fits(dst.size(), n_);
    detail::copy_bytes(dst.data(), data(), dst.size_bytes(), dev_);
  }
  std::vector<T> to_vector() const {
    std::vector<T> out(n_);
    download(out);
    return out;
  }

 private:
  Device dev_;
  size_t n_ = 0;
  std::vector<T> host_;
  std::shared_ptr<void> mem_;
};

}  // namespace sketchsgd
