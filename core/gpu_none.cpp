// Build without CUDA: no devices, and every runtime call says so with a typed error.
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/gpu.hpp>

namespace sketchsgd::gpu {
namespace {
[[noreturn]] void absent() {
  throw CudaError("sketchsgd was built without CUDA (configure with -DSKETCHSGD_CUDA=ON)");
}
}  // namespace

int device_count() {
  return 0;
}
void set_device(int) {
  absent();
}
int current_device() {
  absent();
}
bool context_active(int) {
  return false;
}
void* alloc(size_t) {
  absent();
}
void free(void*, int) noexcept {}
void copy(void*, const void*, size_t, Stream) {
  absent();
}
void copy_async(void*, const void*, size_t, Stream) {
  absent();
}
void fill(void*, int, size_t, Stream) {
  absent();
}
void synchronize(Stream) {
  absent();
}
bool accessible(const void*, int) {
  return false;
}
void fail(int code, const char* call, const char* file, int line) {
  detail::raise<CudaError>(call, " failed at ", file, ":", line, ": CUDA error ", code);
}

Workspace::~Workspace() = default;
void* Workspace::get(size_t, Stream) {
  absent();
}
void* Workspace::host(size_t) {
  absent();
}

}  // namespace sketchsgd::gpu
