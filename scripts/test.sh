#!/usr/bin/env bash
# Runs every test from a fresh clone: installs the Debian packages it needs, builds the release
# preset (CUDA code compiles when nvcc is present; GPU tests skip without a GPU; the training demo
# and its end-to-end test with libtorch) and the AddressSanitizer + UBSan preset (without the demo),
# and runs ctest on both.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/packages.sh
ensure_packages cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev libomp-dev \
  libzmq3-dev cppzmq-dev zlib1g-dev libtorch-dev libopenblas0-pthread libopenblas-dev dataset-fashion-mnist python3.11-doc \
  iproute2 python3 python3-dev python3-torch python3-numpy python3-pytest python3-setuptools \
  python3-wheel python3-pip pybind11-dev

jobs=$(nproc)
for preset in default asan; do
  echo "== configure + build: $preset"
  cmake --preset "$preset"
  cmake --build --preset "$preset" -j "$jobs"
  echo "== ctest: $preset"
  ctest --preset "$preset" -j "$jobs"
done
