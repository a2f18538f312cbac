#include "device.hpp"

#include <cstring>

#include "error.hpp"

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

void Device::activate() const {
  if (!is_gpu()) return;
  const int n = kernels::cuda::device_count();
  SKETCHSGD_REQUIRE(gpu < n, CudaError, "device cuda:", gpu, " is not available (this ",
                    n ? "machine has " : "machine or build has no CUDA device",
                    n ? std::to_string(n) : "", n ? " CUDA devices)" : ")");
  kernels::cuda::set_device(gpu);
}

void Device::require_accessible(const void* p, size_t bytes, const char* what) const {
  if (!is_gpu() || bytes == 0) return;
  SKETCHSGD_REQUIRE(kernels::cuda::device_accessible(p), InvalidArgument, what,
                    ": host memory given to an object on ", name(),
                    "; pass device (or managed, or page-locked) memory");
}

namespace detail {

void check_fits(size_t n, size_t size) {
  SKETCHSGD_REQUIRE(n <= size, InvalidArgument, "buffer: ", n, " elements do not fit ", size);
}

std::shared_ptr<void> device_alloc(size_t bytes, const Device& d) {
  d.activate();
  void* p = kernels::cuda::alloc(bytes);
  return std::shared_ptr<void>(p, [](void* q) { kernels::cuda::free(q); });
}

void copy_bytes(void* dst, const void* src, size_t bytes, const Device& d) {
  if (bytes == 0) return;
  if (d.is_gpu())
    kernels::cuda::copy(dst, src, bytes, d.stream);
  else
    std::memcpy(dst, src, bytes);
}

void zero_bytes(void* dst, size_t bytes, const Device& d) {
  if (bytes == 0) return;
  if (d.is_gpu())
    kernels::cuda::zero(dst, bytes, d.stream);
  else
    std::memset(dst, 0, bytes);
}

}  // namespace detail
}  // namespace sketchsgd
