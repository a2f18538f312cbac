#!/usr/bin/env bash
# The main job: compressed training of Fashion-MNIST with a parameter server and 4 workers on this
# machine (PowerSGD rank 4 with fp16 wire values, 3 epochs; under 5 minutes on 2 cores). Installs
# what it needs, builds the demo, runs it. Extra arguments go to sketchsgd-train (see --help), e.g.
#   bash scripts/demo.sh --codec topk:k=18000 --epochs 1
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/packages.sh
source scripts/venv.sh
ensure_packages cmake ninja-build g++ libomp-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libzmq3-dev cppzmq-dev zlib1g-dev libopenblas0-pthread libopenblas-dev dataset-fashion-mnist \
  python3.11 python3.11-dev python3.11-venv pybind11-dev
ensure_venv   # the demo links the libtorch of .venv's torch

echo "== build (preset default, target sketchsgd-train)"
cmake --preset default >/dev/null
cmake --build --preset default --target sketchsgd-train -j "$(nproc)"
echo "== train"
exec build/default/demo/sketchsgd-train "$@"
