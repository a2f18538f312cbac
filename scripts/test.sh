#!/usr/bin/env bash
# Runs every test from a fresh clone: installs the Debian packages it needs and the project's Python
# environment (.venv, pinned), builds the release preset (CUDA code compiles when nvcc is present;
# GPU tests skip without a GPU; the Python package for .venv's interpreter; the training demo and
# its end-to-end test against .venv's libtorch) and the AddressSanitizer + UBSan preset (without the demo),
# and runs ctest on both.
#
#   bash scripts/test.sh          everything (CI)
#   bash scripts/test.sh --fast   the edit-compile-test loop: the release build, then ctest's fast
#                                 tier (label fast: every C++ case, the quick Python files, the
#                                 docs' tables); other tiers: ctest --preset default -L <label>
#                                 with unit, process, python, e2e, network, docs or style
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
case "${1:-}" in
  "") ;;
  --fast) fast=1 ;;
  *) echo "usage: bash scripts/test.sh [--fast]" >&2; exit 2 ;;
esac

source scripts/packages.sh
source scripts/venv.sh
ensure_packages cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev libomp-dev \
  libzmq3-dev cppzmq-dev zlib1g-dev libopenblas0-pthread libopenblas-dev dataset-fashion-mnist python3.11-doc \
  iproute2 python3.11 python3.11-dev python3.11-venv pybind11-dev clang-format
ensure_venv   # .venv with python/requirements.txt: torch 2.13 (CPU), accelerate, lightning, pytest, ...

jobs=$(nproc)
if [ "$fast" = 1 ]; then
  cmake --preset default >/dev/null
  cmake --build --preset default -j "$jobs"
  exec ctest --preset fast -j "$jobs"
fi
for preset in default asan; do
  echo "== configure + build: $preset"
  cmake --preset "$preset"
  cmake --build --preset "$preset" -j "$jobs"
  echo "== ctest: $preset"
  ctest --preset "$preset" -j "$jobs"
done
