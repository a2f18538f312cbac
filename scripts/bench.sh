#!/usr/bin/env bash
# The main job until the training demo exists: builds the release preset, runs the Google Benchmark
# microbenchmarks over d = 2^20 … 2^26, runs the side-by-side PyTorch reference comparison at the
# paper's CIFAR-10 size, and draws PNG plots. Results land in build/bench/.
#   bash scripts/bench.sh            full run (~10 minutes on 2 cores)
#   bash scripts/bench.sh --quick    d = 2^20 and 2^22 only
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/packages.sh
source scripts/venv.sh
ensure_packages cmake ninja-build g++ libbenchmark-dev libgtest-dev libomp-dev libopenblas-dev \
  python3.11 python3.11-dev python3.11-venv
ensure_venv   # PyTorch, NumPy and matplotlib for the side-by-side and the plots

filter='.*'
[ "${1:-}" = "--quick" ] && filter='/d:(1048576|4194304)$|Construct'
out=build/bench
mkdir -p "$out"
echo "== build (preset default)"
cmake --preset default -DSKETCHSGD_TESTS=ON >/dev/null
cmake --build --preset default -j "$(nproc)"

echo "== microbenchmarks -> $out/bench.json"
build/default/benchmarks/sketchsgd_bench --benchmark_filter="$filter" \
  --benchmark_out="$out/bench.json" --benchmark_out_format=json --benchmark_counters_tabular=true

echo "== side by side with the PyTorch reference (d = 6.5M, r = 5, c = 500,000, k = 50,000)"
"$PY" benchmarks/compare_torch.py --binary build/default/benchmarks/sketchsgd_compare \
  --out-json "$out/compare.json"

echo "== plots"
"$PY" benchmarks/plot_bench.py "$out/bench.json" "$out"
