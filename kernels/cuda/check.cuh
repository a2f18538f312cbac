// Every CUDA call and launch goes through SKETCHSGD_CUDA_CHECK: failures become CudaError with
// the CUDA error text and the call site.
#pragma once

#include <cuda_runtime.h>

#include "../error.hpp"

#define SKETCHSGD_CUDA_CHECK(call)                                                             \
  do {                                                                                         \
    const cudaError_t sketchsgd_err_ = (call);                                                 \
    if (sketchsgd_err_ != cudaSuccess) {                                                       \
      (void)cudaGetLastError(); /* clear a non-sticky error so later calls do not report it */ \
      ::sketchsgd::detail::raise<::sketchsgd::CudaError>(#call, " failed at ", __FILE__, ":",  \
                                                         __LINE__, ": ",                       \
                                                         cudaGetErrorString(sketchsgd_err_));  \
    }                                                                                          \
  } while (0)
