// sketchsgd: gradient compression for distributed SGD — the umbrella header of the core library
// (sketchsgd::sketchsgd). The parameter server and its workers have their own headers and
// libraries: <sketchsgd/server/…> (sketchsgd::server), <sketchsgd/worker/…> (sketchsgd::worker).
#pragma once

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/round.hpp>
#include <sketchsgd/compress/scatter.hpp>
#include <sketchsgd/compress/sparse_reduce.hpp>
#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/config.hpp>
#include <sketchsgd/core/bytes.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/gpu.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
