// CUDA backend entry points. Declared in every build; in a build without CUDA, device_count()
// is 0 and the device kernels are absent (SKETCHSGD_HAS_CUDA in <sketchsgd/config.hpp>).
#pragma once

#include <cstdint>

#include "cpu.hpp"

namespace sketchsgd::kernels::cuda {

/// Number of usable CUDA devices (0 without a driver, a device, or a CUDA build).
int device_count();

/// packed[row · dim + j] on the device, bit-identical to cpu::precompute_hashes. packed is device
/// memory of rows × dim words.
void precompute_hashes(const SketchLayout& s, uint32_t* packed);

}  // namespace sketchsgd::kernels::cuda
