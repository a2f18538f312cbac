// A public header that leaks an internal one: public_headers.cmake must refuse it.
#pragma once
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/detail/select.hpp>
