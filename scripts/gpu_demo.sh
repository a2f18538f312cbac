#!/usr/bin/env bash
# The training demo on a GPU (issue 5's CUDA path), on a machine with nvcc, CMake, ninja and a
# CUDA PyTorch >= 2.7, with build/gpu-demo-deps staged by scripts/gpu_demo_prepare.sh. Builds the
# demo against that PyTorch's libtorch, checks that it picks the GPU, then trains the default job
# (server + 4 workers, sketch codec) on the GPU and the same job on the CPU, and prints both
# summaries. Results go to $REPORT (default build/gpu-demo-out). Extra arguments go to both runs.
#   REPORT=$OUT bash scripts/gpu_demo.sh --epochs 1
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=$PWD/${DEPS:-build/gpu-demo-deps}
BUILD=${BUILD:-build/gpu-demo}
REPORT=${REPORT:-build/gpu-demo-out}
[ -d "$DEPS/include" ] || { echo "no $DEPS: run scripts/gpu_demo_prepare.sh first" >&2; exit 1; }
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
python3 -c 'import torch; assert torch.cuda.is_available(), "this PyTorch sees no GPU"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
export LD_LIBRARY_PATH=$DEPS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$REPORT"

echo "== configure + build $BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSKETCHSGD_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DSKETCHSGD_SERVER=ON -DSKETCHSGD_DEMO=ON \
  -DSKETCHSGD_TESTS=OFF -DSKETCHSGD_BENCHMARKS=OFF "-DCMAKE_PREFIX_PATH=$DEPS;$torch_prefix" \
  -DZeroMQ_DIR="$DEPS" -DZLIB_ROOT="$DEPS" > "$REPORT/configure.log"
cmake --build "$BUILD" --target sketchsgd-train
train=$BUILD/demo/sketchsgd-train

for device in cuda cpu; do
  echo "== train on $device"
  start=$(date +%s)
  "$train" --device "$device" --data "$DEPS/data" --out "$REPORT/$device" "$@" 2>&1 |
    tee "$REPORT/train-$device.log"
  echo "$device: $(( $(date +%s) - start )) s wall" | tee -a "$REPORT/summary.txt"
  cat "$REPORT/$device/summary.json" >> "$REPORT/summary.txt"
  echo >> "$REPORT/summary.txt"
done
echo "== summaries"
cat "$REPORT/summary.txt"
