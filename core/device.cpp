#include <sketchsgd/core/device.hpp>

#include <cstring>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd {

std::string Device::name() const {
  return is_gpu() ? "cuda:" + std::to_string(gpu) : "cpu";
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  for (const char* prefix : {"cuda:", "gpu:"}) {
    const std::string p(prefix);
    if (text.rfind(p, 0) == 0 && text.size() > p.size() && text.size() <= p.size() + 3 &&
        text.find_first_not_of("0123456789", p.size()) == std::string::npos)
      return cuda(std::stoi(text.substr(p.size())));
  }
  throw InvalidArgument("device '" + text + "': expected cpu, cuda or cuda:N");
}

DeviceScope::DeviceScope(const Device& d) {
  if (!d.is_gpu()) return;
  const int n = gpu::device_count();
  SKETCHSGD_REQUIRE(d.gpu < n, CudaError, "device cuda:", d.gpu, " is not available (this ",
                    n ? "machine has " : "machine or build has no CUDA device",
                    n ? std::to_string(n) : "", n ? " CUDA devices)" : ")");
  const int current = gpu::current_device();
  if (current == d.gpu) return;
  gpu::set_device(d.gpu);
  // A thread that never chose a device reports device 0; switching "back" to it would create a
  // context there (hundreds of MB on a GPU the process does not use), so leave it then.
  if (gpu::context_active(current)) previous_ = current;
}

DeviceScope::~DeviceScope() {
  if (previous_ < 0) return;
  try {
    gpu::set_device(previous_);
  } catch (...) {  // a destructor must not throw; the device existed a moment ago
  }
}

void Device::require_accessible(const void* p, size_t bytes, const char* what) const {
  if (!is_gpu() || bytes == 0) return;
  SKETCHSGD_REQUIRE(gpu::accessible(p, gpu), InvalidArgument, what,
                    ": memory given to an object on ", name(),
                    " is neither its device memory nor managed or page-locked host memory "
                    "(host memory, or another GPU's?)");
}

namespace detail {

void check_fits(size_t n, size_t size) {
  SKETCHSGD_REQUIRE(n <= size, InvalidArgument, "buffer: ", n, " elements do not fit ", size);
}

std::shared_ptr<void> device_alloc(size_t bytes, const Device& d) {
  const auto scope = d.activate();
  void* p = gpu::alloc(bytes);
  return std::shared_ptr<void>(p, [gpu = d.gpu](void* q) { gpu::free(q, gpu); });
}

void copy_bytes(void* dst, const void* src, size_t bytes, const Device& d) {
  if (bytes == 0) return;
  if (d.is_gpu()) {
    const auto scope = d.activate();  // a null stream means the current device's
    gpu::copy(dst, src, bytes, d.stream);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void zero_bytes(void* dst, size_t bytes, const Device& d) {
  if (bytes == 0) return;
  if (d.is_gpu()) {
    const auto scope = d.activate();
    gpu::fill(dst, 0, bytes, d.stream);
  } else {
    std::memset(dst, 0, bytes);
  }
}

void wait(const Device& d) {
  if (!d.is_gpu()) return;
  const auto scope = d.activate();
  gpu::synchronize(d.stream);
}

}  // namespace detail
}  // namespace sketchsgd
