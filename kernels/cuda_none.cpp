// Build without CUDA: no devices, and the device entry points say so with a typed error.
#include "cuda.hpp"
#include "error.hpp"

namespace sketchsgd::kernels::cuda {

int device_count() { return 0; }

void precompute_hashes(const SketchLayout&, uint32_t*) {
  throw CudaError("sketchsgd was built without CUDA (configure with -DSKETCHSGD_CUDA=ON)");
}

}  // namespace sketchsgd::kernels::cuda
