// What the binding files share: tensors as (address, length), messages as buffers (module.cpp
// says why). Each file binds one family of classes; module.cpp makes the module and its errors.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>

#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/error.hpp>

namespace sketchsgd::python {

namespace py = pybind11;

/// A float vector of the codec's device, from the address and length the Python layer checked.
inline std::span<float> floats(uintptr_t address, uint64_t n) {
  SKETCHSGD_REQUIRE(address != 0 || n == 0, InvalidArgument, "null tensor address");
  return {reinterpret_cast<float*>(address), size_t(n)};
}

/// The bytes of a contiguous buffer; the object stays alive (and the GIL held) while they are read.
struct View {
  py::buffer_info info;
  explicit View(const py::buffer& b) : info(b.request()) {
    SKETCHSGD_REQUIRE(info.ndim <= 1 && (info.ndim == 0 || info.strides[0] == info.itemsize),
                      InvalidArgument, "message buffer must be contiguous and one-dimensional");
  }
  std::span<const uint8_t> bytes() const {
    return {static_cast<const uint8_t*>(info.ptr), size_t(info.size * info.itemsize)};
  }
};

inline py::bytes to_py(std::span<const uint8_t> b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

/// A message's bytes kept alive by the read-only memoryview over them (finish(copy=False)):
/// handing an update of megabytes to Python without copying it into a bytes object.
struct Owned {
  Bytes bytes;
};

inline py::memoryview view_of(Message&& msg) {
  return py::memoryview(py::cast(Owned{std::move(msg).release()}));
}

inline Device device_of(int gpu, uintptr_t stream) {
  return gpu < 0 ? Device::cpu() : Device::cuda(gpu, reinterpret_cast<gpu::Stream>(stream));
}

inline const char* format_name(WireFloat f) {
  return f == WireFloat::F16    ? "fp16"
         : f == WireFloat::BF16 ? "bf16"
         : f == WireFloat::I8   ? "int8"
                                : "fp32";
}

/// The codecs and their aggregators (codec.cpp).
void bind_codec(py::module_& m);
/// The Round, its requests and the per-destination Scatter (round.cpp).
void bind_round(py::module_& m);

}  // namespace sketchsgd::python
