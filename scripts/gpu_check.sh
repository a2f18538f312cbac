#!/usr/bin/env bash
# The GPU check of issue 3, in one call on a machine with a CUDA GPU:
#   1. builds the CUDA configuration (preset `gpu`) unless $BUILD already holds one,
#   2. runs every test, and fails if a GPU test skipped (GPU vs CPU on fresh random inputs),
#   3. runs compute-sanitizer memcheck over the small GPU cases,
#   4. runs the GPU benchmarks and the PyTorch baselines, and prints one table.
# Everything lands in $REPORT (default $BUILD/gpu-check). Exit status non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/gpu}
REPORT=${REPORT:-$BUILD/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$REPORT"

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
if [ ! -x "$BUILD/tests/sketchsgd_tests" ] || [ ! -x "$BUILD/benchmarks/sketchsgd_bench_gpu" ]; then
  step "build (preset gpu)"
  cmake --preset gpu
  cmake --build --preset gpu
fi

step "tests"
"$BUILD/tests/sketchsgd_tests" --gtest_brief=1 --gtest_output="json:$REPORT/tests.json" 2>&1 | tee "$REPORT/tests.log"
if grep -q "no CUDA device" "$REPORT/tests.log"; then
  echo "GPU tests skipped: no usable CUDA device" >&2
  exit 1
fi
"$PY" - "$REPORT/tests.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cuda = [t for s in d["testsuites"] if s["name"].startswith("Cuda") for t in s["testsuite"]]
ran = [t for t in cuda if t.get("result") == "COMPLETED" and "failures" not in t]
print(f"GPU tests passed: {len(ran)} of {len(cuda)}")
sys.exit(0 if cuda and len(ran) == len(cuda) else 1)
PY

step "compute-sanitizer memcheck (small cases)"
compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check full \
  "$BUILD/tests/sketchsgd_tests" --gtest_brief=1 \
  --gtest_filter='Cuda.AccumulateSkips*:Cuda.TopkBreaksTies*:Cuda.PackingMatches*:Cuda.ZeroBuckets*:Cuda.SelectionRejects*:CudaSketch.*:CudaCodec.DenseTopk*' \
  2>&1 | tee "$REPORT/memcheck.log" | tail -n 5

step "benchmarks"
"$BUILD/benchmarks/sketchsgd_bench_gpu" --benchmark_out="$REPORT/gpu.json" --benchmark_out_format=json \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true

step "PyTorch baselines and the table"
"$PY" scripts/gpu_report.py --bench "$REPORT/gpu.json" --markdown "$REPORT/table.md"
