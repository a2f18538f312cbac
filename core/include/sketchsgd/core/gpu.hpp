// The CUDA runtime as the library uses it: devices, memory, streams and a reusable workspace.
// Declared in every build; without CUDA, device_count() is 0 and every other call throws
// CudaError (SKETCHSGD_HAS_CUDA in <sketchsgd/config.hpp> says which build). No CUDA header is
// needed to include this one.
#pragma once

#include <cstddef>

struct CUstream_st;

namespace sketchsgd::gpu {

/// A CUDA stream (cudaStream_t); null is the default stream.
using Stream = CUstream_st*;

/// Number of usable CUDA devices (0 without a driver, a device, or a CUDA build).
int device_count();
void set_device(int id);
/// The calling thread's current device (cudaGetDevice).
int current_device();
/// Whether the process has created device id's primary context (true when the driver cannot
/// tell). Making a device current creates its context, so a scope restores the caller's device
/// only where this holds.
bool context_active(int id);

/// cudaMalloc of at least one byte; CudaError when it fails.
void* alloc(size_t bytes);
/// cudaFree on device gpu (−1: the current one), restoring the current device; never throws
/// (called from destructors).
void free(void* p, int gpu = -1) noexcept;
/// Copies between host and device memory in either direction (unified addressing), ordered on
/// the stream, and waits for it.
void copy(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
/// Copies between device buffers, ordered on the stream (does not wait).
void copy_async(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
/// Sets bytes to a byte value, ordered on the stream (does not wait).
void fill(void* dst, int byte, size_t bytes, Stream stream = nullptr);
void synchronize(Stream stream = nullptr);
/// True for memory a kernel on device `gpu` may touch: that device's memory, managed or
/// page-locked (registered) host memory. Plain host memory, or another GPU's memory (no peer
/// access is set up), would fault inside a kernel and poison the context.
bool accessible(const void* p, int gpu);

/// Throws CudaError for a failed CUDA call (the code is a cudaError_t), with the CUDA error text
/// and the call site, after clearing a non-sticky error so later calls do not report it.
[[noreturn]] void fail(int code, const char* call, const char* file, int line);

/// Scratch device memory for kernels that need temporary room (selection, reductions), reused
/// across calls: it grows to the largest request (stream-ordered allocation) and never shrinks,
/// so the hot path allocates nothing. One workspace serves one stream at a time. It also holds a
/// pinned host buffer: the few counters kernels read back, and results staged on their way into
/// pageable memory (a copy to pinned memory runs several times faster).
class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  /// At least bytes of device memory, valid until the next get() on this workspace.
  void* get(size_t bytes, Stream stream);
  /// Pinned host memory of at least bytes (256 at least), valid until the next larger request.
  void* host(size_t bytes = 256);
  size_t bytes() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;  // where ptr_ lives, so the destructor frees it there
  void* host_ = nullptr;
  size_t host_size_ = 0;
};

}  // namespace sketchsgd::gpu

/// Every CUDA call and launch goes through this: a failure becomes CudaError naming the call.
#define SKETCHSGD_CUDA_CHECK(call)                                                              \
  do {                                                                                          \
    const int sketchsgd_err_ = static_cast<int>(call);                                          \
    if (sketchsgd_err_ != 0) ::sketchsgd::gpu::fail(sketchsgd_err_, #call, __FILE__, __LINE__); \
  } while (0)
