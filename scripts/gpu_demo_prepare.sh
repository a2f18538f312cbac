#!/usr/bin/env bash
# Stages, here, what the training demo needs on a GPU machine that has nvcc, CMake, ninja and a
# CUDA build of PyTorch (>= 2.7) but none of our other dependencies: the ZeroMQ, cppzmq and zlib
# headers, libzmq and the libraries it loads, and the Fashion-MNIST files, into
# build/gpu-demo-deps (about 35 MB). Carry that folder; there, run scripts/gpu_demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh
ensure_packages libzmq3-dev cppzmq-dev zlib1g-dev dataset-fashion-mnist

DEPS=${DEPS:-build/gpu-demo-deps}
lib=/usr/lib/$(gcc -dumpmachine)
rm -rf "$DEPS"
mkdir -p "$DEPS/include" "$DEPS/lib" "$DEPS/share/cmake" "$DEPS/data"
cp /usr/include/{zmq.h,zmq_utils.h,zmq.hpp,zmq_addon.hpp,zlib.h,zconf.h} "$DEPS/include/"
cp -r /usr/share/cmake/cppzmq "$DEPS/share/cmake/"
# Link names for the build, sonames for the loader.
for so in libzmq.so.5 libz.so.1; do
  cp -L "$lib/$so" "$DEPS/lib/$so"
  ln -sf "$so" "$DEPS/lib/${so%.*}"
done
# libzmq's own dependencies (libsodium, pgm, norm, Kerberos, …) beyond glibc and libstdc++.
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libresolv'
ldd "$lib/libzmq.so.5" | awk '/=>/ {print $1, $3}' | grep -vE "$skip" | while read -r name path; do
  [ -f "$DEPS/lib/$name" ] || cp -L "$path" "$DEPS/lib/$name"
done
cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$DEPS/data/"
echo "staged $DEPS ($(du -sh "$DEPS" | cut -f1)): $(ls "$DEPS/lib" | tr '\n' ' ')"
