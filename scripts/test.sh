#!/usr/bin/env bash
# Runs every test from a fresh clone: installs the Debian packages it needs, builds the release
# preset (CUDA code compiles when nvcc is present; GPU tests skip without a GPU) and the
# AddressSanitizer + UBSan preset, and runs ctest on both.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev libomp-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then echo "need root to apt-get install ${missing[*]}" >&2; exit 1; fi
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc)
for preset in default asan; do
  echo "== configure + build: $preset"
  cmake --preset "$preset"
  cmake --build --preset "$preset" -j "$jobs"
  echo "== ctest: $preset"
  ctest --preset "$preset" -j "$jobs"
done
