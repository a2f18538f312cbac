// The CUDA runtime calls of <sketchsgd/core/gpu.hpp>.
#include <cuda.h>  // driver types only: the driver is reached through the runtime, never linked

#include <cuda_runtime.h>

#include <algorithm>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/gpu.hpp>

namespace sketchsgd::gpu {

int device_count() {
  int n = 0;
  // No driver or no device is not an error here: the caller asks whether it can use a GPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void set_device(int id) {
  SKETCHSGD_CUDA_CHECK(cudaSetDevice(id));
}

bool context_active(int id) {
  // cuDevicePrimaryCtxGetState through the runtime's entry-point lookup, so that the library
  // does not link libcuda (CI machines have none).
  using Get = CUresult (*)(CUdevice*, int);
  using State = CUresult (*)(CUdevice, unsigned int*, int*);
  static const auto fns = [] {
    void* get = nullptr;
    void* state = nullptr;
    cudaDriverEntryPointQueryResult q1{}, q2{};
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 12000, cudaEnableDefault, &q1) !=
            cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &state, 12000,
                                         cudaEnableDefault, &q2) != cudaSuccess ||
        q1 != cudaDriverEntryPointSuccess || q2 != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      get = state = nullptr;
    }
    return std::pair(reinterpret_cast<Get>(get), reinterpret_cast<State>(state));
  }();
  if (!fns.first || !fns.second) return true;  // cannot tell: assume it is
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 0;
  if (fns.first(&dev, id) != CUDA_SUCCESS || fns.second(dev, &flags, &active) != CUDA_SUCCESS)
    return true;
  return active != 0;
}

int current_device() {
  int id = 0;
  SKETCHSGD_CUDA_CHECK(cudaGetDevice(&id));
  return id;
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  SKETCHSGD_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}

void free(void* p, int gpu) noexcept {
  if (!p) return;
  // A failed call must not stay behind as the runtime's last error, where the next launch check
  // (ours or the caller's) would report it as its own.
  int current = -1;
  if (gpu >= 0 && (cudaGetDevice(&current) != cudaSuccess || current == gpu ||
                   cudaSetDevice(gpu) != cudaSuccess)) {
    (void)cudaGetLastError();
    current = -1;  // already there, or cannot switch: free from here
  }
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  // Switching back to a device whose context the process never created would create one.
  if (current >= 0 && context_active(current) && cudaSetDevice(current) != cudaSuccess)
    (void)cudaGetLastError();
}

void copy(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  SKETCHSGD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  SKETCHSGD_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void copy_async(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes) SKETCHSGD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}

void fill(void* dst, int byte, size_t bytes, Stream stream) {
  if (bytes) SKETCHSGD_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, stream));
}

bool accessible(const void* p, int gpu) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  // Registered host memory is usable at its own address only where the device maps it there.
  return (a.type == cudaMemoryTypeDevice && a.device == gpu) || a.type == cudaMemoryTypeManaged ||
         (a.type == cudaMemoryTypeHost && a.devicePointer == p);
}

void synchronize(Stream stream) {
  SKETCHSGD_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void fail(int code, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // a non-sticky error must not be reported again by the next check
  detail::raise<CudaError>(call, " failed at ", file, ":", line, ": ",
                           cudaGetErrorString(static_cast<cudaError_t>(code)));
}

Workspace::~Workspace() {
  // Destructors must not throw; a failing free at teardown leaves nothing to recover.
  if (ptr_) free(ptr_, device_);
  if (host_ && cudaFreeHost(host_) != cudaSuccess) (void)cudaGetLastError();
}

void* Workspace::get(size_t bytes, Stream stream) {
  if (bytes <= size_) return ptr_;
  // Grow by at least half so a slowly rising request does not reallocate every call. The old
  // block may still be read by queued work: free it in stream order.
  const size_t grown = std::max(bytes, size_ + size_ / 2);
  if (ptr_) SKETCHSGD_CUDA_CHECK(cudaFreeAsync(ptr_, stream));
  ptr_ = nullptr;
  size_ = 0;
  SKETCHSGD_CUDA_CHECK(cudaMallocAsync(&ptr_, grown, stream));
  size_ = grown;
  SKETCHSGD_CUDA_CHECK(cudaGetDevice(&device_));
  return ptr_;
}

void* Workspace::host(size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (bytes <= host_size_) return host_;
  if (host_ && cudaFreeHost(host_) != cudaSuccess) (void)cudaGetLastError();
  host_ = nullptr;
  host_size_ = 0;
  SKETCHSGD_CUDA_CHECK(cudaMallocHost(&host_, bytes));
  host_size_ = bytes;
  return host_;
}

}  // namespace sketchsgd::gpu
