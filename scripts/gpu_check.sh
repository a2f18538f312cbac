#!/usr/bin/env bash
# The GPU check of issue 3, in one call on a machine with a CUDA GPU:
#   1. builds the CUDA configuration (preset `gpu`) unless $BUILD already holds one,
#   2. runs the GoogleTest suite (core and codecs; the server and demo are not in this build) and
#      fails if a GPU test skipped (GPU vs CPU on fresh random inputs; CudaMultiGpu needs 2 GPUs),
#   3. runs compute-sanitizer memcheck over the small GPU cases,
#   4. runs the GPU benchmarks and the PyTorch baselines, and prints one table.
# Every step runs even when an earlier one failed; each failure is printed as it happens and again
# at the end. Everything lands in $REPORT (default $BUILD/gpu-check). Exit status non-zero on any
# failure.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/gpu}
REPORT=${REPORT:-$BUILD/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$REPORT"
# A build made elsewhere (scripts/gpu_prepare.sh) finds its libraries and programs here.
B=$(cd "$BUILD" 2>/dev/null && pwd || echo "$PWD/$BUILD")
export LD_LIBRARY_PATH="$B:$B/ps:$B/server:$B/worker:$B/extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SKETCHSGD_SERVER_BIN="$B/server/sketchsgd-server" SKETCHSGD_WORKER_BIN="$B/tests/sketchsgd_test_worker"

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }
failed=()
fail() { failed+=("$1"); printf '*** FAILED: %s\n' "$1" >&2; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
if [ ! -x "$BUILD/tests/sketchsgd_tests" ] || [ ! -x "$BUILD/benchmarks/sketchsgd_bench_gpu" ]; then
  step "build (preset gpu)"
  { cmake --preset gpu && cmake --build --preset gpu; } || { fail "build"; exit 1; }
fi

step "tests"
"$BUILD/tests/sketchsgd_tests" --gtest_brief=1 --gtest_output="json:$REPORT/tests.json" 2>&1 |
  tee "$REPORT/tests.log" || fail "tests (see $REPORT/tests.log)"
grep -q "no CUDA device" "$REPORT/tests.log" && fail "GPU tests skipped: no usable CUDA device"
"$PY" - "$REPORT/tests.json" <<'PY' || fail "GPU tests: some failed or skipped"
import json, sys
d = json.load(open(sys.argv[1]))
suites = [s for s in d["testsuites"] if s["name"].startswith("Cuda")]
cuda = [t for s in suites for t in s["testsuite"]]
ran = [t for t in cuda if t.get("result") == "COMPLETED" and "failures" not in t]
failed = [t["name"] for t in cuda if "failures" in t]
# CudaMultiGpu tests need two GPUs and may skip on a one-GPU machine; every other one must run.
skipped = [t["name"] for s in suites if s["name"] != "CudaMultiGpu" for t in s["testsuite"]
           if t.get("result") != "COMPLETED"]
print(f"GPU tests passed: {len(ran)} of {len(cuda)}" +
      (f"; failed: {failed}" if failed else "") + (f"; skipped: {skipped}" if skipped else ""))
sys.exit(0 if ran and not failed and not skipped else 1)
PY

step "compute-sanitizer memcheck (small cases)"
compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check full \
  "$BUILD/tests/sketchsgd_tests" --gtest_brief=1 \
  --gtest_filter='CudaBlocked.*:Cuda.AccumulateSkips*:Cuda.TopkBreaksTies*:Cuda.PackingMatches*:Cuda.ZeroBuckets*:Cuda.SelectionRejects*:CudaSketch.*:CudaCodec.DenseTopk*:CudaEngine.*' \
  > "$REPORT/memcheck.log" 2>&1 || fail "compute-sanitizer memcheck (see $REPORT/memcheck.log)"
tail -n 5 "$REPORT/memcheck.log"

step "benchmarks"
"$BUILD/benchmarks/sketchsgd_bench_gpu" --benchmark_out="$REPORT/gpu.json" --benchmark_out_format=json \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true || fail "GPU benchmarks"

step "PyTorch baselines and the table"
"$PY" scripts/gpu_report.py --bench "$REPORT/gpu.json" --markdown "$REPORT/table.md" \
  --json "$REPORT/report.json" --png "$REPORT/gpu.png" || fail "PyTorch baselines and the table"

step "summary"
if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu_check: every step passed"
  exit 0
fi
printf 'gpu_check: %d step(s) failed:\n' "${#failed[@]}" >&2
printf '  - %s\n' "${failed[@]}" >&2
exit 1
