// sketchsgd: gradient compression for distributed SGD — the umbrella header.
#pragma once

#include <sketchsgd/config.hpp>
#include <sketchsgd/kernels/error.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/kernels/cuda.hpp>
