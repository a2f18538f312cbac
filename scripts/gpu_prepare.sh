#!/usr/bin/env bash
# Builds the GPU check configuration here (with the parameter server, whose tests then run on the
# GPU too) and makes it self-contained for a machine that has a GPU and the CUDA driver but none
# of our build dependencies (no gtest, benchmark, ZeroMQ): the shared libraries the binaries need
# beyond glibc, libstdc++ and the CUDA runtime are copied into BUILD/extra. Then, on the GPU
# machine, from the repository root (gpu_check.sh sets the library path itself):
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/gpu}
cmake --preset gpu >/dev/null
cmake --build --preset gpu
mkdir -p "$BUILD/extra"
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libresolv|libcudart|libsketchsgd'
for bin in "$BUILD/tests/sketchsgd_tests" "$BUILD/benchmarks/sketchsgd_bench_gpu" \
  "$BUILD/server/sketchsgd-server" "$BUILD/tests/sketchsgd_test_worker"; do
  [ -x "$bin" ] || continue  # no server without ZeroMQ
  ldd "$bin" | awk '/=>/ {print $1, $3}' | grep -vE "$skip" | while read -r name path; do
    [ -f "$path" ] && cp -L "$path" "$BUILD/extra/$name"
  done
done
echo "self-contained GPU build in $BUILD ($(du -sh "$BUILD" | cut -f1)); extra libraries: $(ls "$BUILD/extra" | tr '\n' ' ')"
