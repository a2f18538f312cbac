#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one entry point. The lent GPU machine has nvcc, CMake, ninja,
# ncu, compute-sanitizer and a CUDA PyTorch but none of our other dependencies, so the `prepare`
# steps run here and stage what the GPU machine lacks; the others run there.
#
#   bash scripts/gpu.sh prepare        here: build preset `gpu` (CUDA sm_90, the server where
#                                      ZeroMQ is found; PRESET=default: the release build, which
#                                      CI's test command made) and copy the shared libraries its programs
#                                      need beyond glibc, libstdc++ and the CUDA runtime into
#                                      build/gpu/extra (carry build/gpu); build/gpu-carry: the
#                                      programs and libraries alone, to carry with the deps
#                                      (BUILD=build/gpu-carry there)
#   bash scripts/gpu.sh check          there: the GoogleTest suite (fails if a GPU test skipped;
#                                      the two-GPU one may skip on one GPU; TESTS_FILTER, a
#                                      --gtest_filter, narrows it), compute-sanitizer
#                                      memcheck, the GPU benchmarks against PyTorch, one table and
#                                      a PNG (GPU_BENCH=0: tests only). Every step runs;
#                                      failures are listed at the end.
#   bash scripts/gpu.sh profile        there: the Nsight Compute figures quoted in BENCHMARKS.md
#   bash scripts/gpu.sh demo-prepare   here: ZeroMQ, cppzmq, zlib and OpenBLAS headers and libraries, the
#                                      Fashion-MNIST files into build/gpu-demo-deps (carry it)
#   bash scripts/gpu.sh demo [ARGS]    there: build the demo against the machine's PyTorch, train
#                                      the default job on the GPU and on the CPU, print both
#                                      summaries (ARGS go to both runs, e.g. --epochs 1)
#   bash scripts/gpu.sh python         there: build the Python package for the machine's Python
#                                      and PyTorch (pybind11 staged by demo-prepare), run the
#                                      Python tests (GPU variants included: gloo with CUDA tensors;
#                                      NCCL with two GPUs), the DDP example on CUDA and the
#                                      hooks' own work per step on the GPU (bench_hook.py;
#                                      HOOK_ONLY=powersgd,... and HOOK_WIDTHS="1024" narrow it,
#                                      HOOK_ROUNDS=3 times the hooks in turn three times;
#                                      PYTEST_ARGS="tests/python/test_outer.py" narrows the tests;
#                                      GPU_EXTRAS=0: the tests only)
#   bash scripts/gpu.sh round          there, after prepare and demo-prepare here: the sketch
#                                      server's round, the accumulate and the PowerSGD hooks on
#                                      NCCL at device speed (GPU tests, memcheck, kernel
#                                      benchmarks, bench_round.py, bench_hook.py at ranks 1-16,
#                                      both widths, with a profile), in one call
#   bash scripts/gpu.sh accumulate     there, after prepare and demo-prepare here: the sketch's
#                                      accumulate (its GPU tests, benchmarks, ncu counters of
#                                      the column and tiles kernels, memcheck, bench_round.py)
#   bash scripts/gpu.sh hook-ab        there, after demo-prepare here, with AB_OLD=DIR (another
#                                      source tree of the project staged in this one, e.g.
#                                      `git archive REV | tar -x -C ab-old`): both packages built,
#                                      then bench_hook.py's PowerSGD hooks timed with each in turn
#                                      (AB_RUNS=2 alternations, HOOK_WIDTHS, HOOK_ONLY): a
#                                      same-machine before/after
#   bash scripts/gpu.sh lm             there, after demo-prepare here: the lm workload at GPT-2
#                                      small's size (124 M parameters), 4 workers simulated on
#                                      the GPU: per-step dense against DiLoCo + sparseloco
#                                      (LM_STEPS=600 steps each; lm-runs: the runs alone, with
#                                      the package on PYTHONPATH, DEVICE and LM_SIZE to try it small)
#   bash scripts/gpu.sh network [ARGS] there, after `python`: bench_network.py (DDP over network
#                                      namespaces, a CPU rank per host) with that package, on the
#                                      machine's 16 cores; ARGS go to it (ip and tc staged by
#                                      demo-prepare where the machine lacks them)
#
# Results go to $REPORT (check, profile: $BUILD/gpu-check; demo: build/gpu-demo-out). A lent
# machine's call brings back only a few files from $OUT: point REPORT below it and tar it there.
set -uo pipefail
cd "$(dirname "$0")/.."
# The machine's own Python (no project venv): the examples', scripts' and benchmarks' modules
# import each other through this path, as scripts/venv.sh arranges in .venv.
export PYTHONPATH=$PWD/examples:$PWD/scripts:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}
# PRESET=default: prepare packs the release build (also sm_90 where nvcc is found) instead of
# building preset gpu beside it.
PRESET=${PRESET:-gpu}
BUILD=${BUILD:-build/$PRESET}
PY=${PYTHON:-python3}
# Not these: the GPU machine has them (or must use its own).
SYSTEM_LIBS='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libresolv'

step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }
failed=()
fail() { failed+=("$1"); printf '*** FAILED: %s\n' "$1" >&2; }
finish() {
  step "summary"
  if [ ${#failed[@]} -eq 0 ]; then
    echo "gpu.sh $1: every step passed"
    exit 0
  fi
  printf 'gpu.sh %s: %d step(s) failed:\n' "$1" "${#failed[@]}" >&2
  printf '  - %s\n' "${failed[@]}" >&2
  exit 1
}
# A build made elsewhere finds its libraries and programs here.
use_build() {
  local b
  b=$(cd "$BUILD" 2>/dev/null && pwd || echo "$PWD/$BUILD")
  for z in "$b"/extra/*.gz; do  # large libraries travel gzipped
    if [ -f "$z" ] && [ ! -f "${z%.gz}" ]; then gunzip -k "$z"; fi
  done
  export LD_LIBRARY_PATH="$b:$b/ps:$b/server:$b/worker:$b/extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # A carry copy (build/gpu-carry) leaves OpenBLAS to the staged deps' copy.
  local deps=$PWD/${DEPS:-build/gpu-demo-deps}
  if [ ! -e "$b/extra/libopenblas.so.0" ] && [ -f "$deps/lib/libopenblas.so.0.gz" ]; then
    [ -f "$deps/lib/libopenblas.so.0" ] || gunzip -k "$deps/lib/libopenblas.so.0.gz"
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$deps/lib"
  fi
  export SKETCHSGD_SERVER_BIN="$b/server/sketchsgd-server"
  export SKETCHSGD_WORKER_BIN="$b/tests/sketchsgd_test_worker"
}

prepare() {
  set -e
  cmake --preset "$PRESET" >/dev/null
  cmake --build --preset "$PRESET"
  mkdir -p "$BUILD/extra"
  for bin in "$BUILD/tests/sketchsgd_tests" "$BUILD/benchmarks/sketchsgd_bench_gpu" \
    "$BUILD/benchmarks/sketchsgd_bench_ps" "$BUILD/server/sketchsgd-server" \
    "$BUILD/tests/sketchsgd_test_worker"; do
    [ -x "$bin" ] || continue  # no server without ZeroMQ
    ldd "$bin" | awk '/=>/ {print $1, $3}' | grep -vE "$SYSTEM_LIBS|libcudart|libcublas|libsketchsgd" |
      while read -r name path; do
        [ -f "$path" ] && cp -L "$path" "$BUILD/extra/$name"
      done
  done
  # OpenBLAS is 36 MB: gzipped to fit what a device call may carry (use_build unpacks it).
  for big in "$BUILD"/extra/libopenblas.so*; do
    if [ -f "$big" ] && [ "${big%.gz}" = "$big" ]; then gzip -9 -f "$big"; fi
  done
  echo "self-contained GPU build in $BUILD ($(du -sh "$BUILD" | cut -f1)); extra libraries: $(ls "$BUILD/extra" | tr '\n' ' ')"
  # What a device call carries beside build/gpu-demo-deps (64 MiB in all): the programs and the
  # libraries, OpenBLAS left to the deps' copy. Run there with BUILD=$BUILD-carry.
  local carry=$BUILD-carry d
  rm -rf "$carry"
  mkdir -p "$carry/tests" "$carry/benchmarks" "$carry/extra"
  cp -a "$BUILD"/tests/sketchsgd_tests "$BUILD"/tests/sketchsgd_test_worker "$carry/tests/"
  cp -a "$BUILD"/benchmarks/sketchsgd_bench_gpu "$BUILD"/libsketchsgd.so* "$carry/" 2>/dev/null || true
  mv "$carry"/sketchsgd_bench_gpu "$carry/benchmarks/"
  for d in server worker ps; do
    mkdir -p "$carry/$d"
    cp -a "$BUILD/$d"/lib*.so* "$carry/$d/" 2>/dev/null || true
    [ -x "$BUILD/$d/sketchsgd-server" ] && cp -a "$BUILD/$d/sketchsgd-server" "$carry/$d/"
  done
  find "$BUILD/extra" -maxdepth 1 -type f ! -name 'libopenblas*' -exec cp -a {} "$carry/extra/" \;
  echo "the same to carry, without OpenBLAS (build/gpu-demo-deps has it): $carry ($(du -sh "$carry" | cut -f1))"
}

# $REPORT (default $BUILD/NAME) made, the build's libraries found, and which device this is.
device_report() {
  REPORT=${REPORT:-$BUILD/$1}
  mkdir -p "$REPORT"
  use_build
  step "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
}

check() {
  device_report gpu-check
  if [ ! -x "$BUILD/tests/sketchsgd_tests" ] || [ ! -x "$BUILD/benchmarks/sketchsgd_bench_gpu" ]; then
    step "build (preset gpu)"
    { cmake --preset gpu && cmake --build --preset gpu; } || { fail "build"; finish check; }
  fi

  step "tests"
  "$BUILD/tests/sketchsgd_tests" --gtest_brief=1 --gtest_output="json:$REPORT/tests.json" \
    --gtest_filter="${TESTS_FILTER:-*}" 2>&1 |
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
    --gtest_filter='CudaBlocked.*:Cuda.AccumulateSkips*:Cuda.TopkBreaksTies*:Cuda.PackingMatches*:Cuda.ZeroBuckets*:Cuda.SelectionRejects*:Cuda.Orthonormalize*:Cuda.RoundHalf*:Cuda.ScalePieces*:Cuda.OuterOptimisers*:CudaSketch.*:CudaCodec.DenseTopk*:CudaCodec.PowerSGDPhases*:CudaCodec.PowerSGDRound*:CudaEngine.*' \
    > "$REPORT/memcheck.log" 2>&1 || fail "compute-sanitizer memcheck (see $REPORT/memcheck.log)"
  tail -n 5 "$REPORT/memcheck.log"

  if [ "${GPU_BENCH:-1}" = 0 ]; then finish check; fi  # tests only (GPU_BENCH=0)
  step "benchmarks"
  "$BUILD/benchmarks/sketchsgd_bench_gpu" --benchmark_out="$REPORT/gpu.json" \
    --benchmark_out_format=json --benchmark_repetitions=3 --benchmark_report_aggregates_only=true ||
    fail "GPU benchmarks"

  step "PyTorch baselines and the table"
  "$PY" benchmarks/gpu_report.py --bench "$REPORT/gpu.json" --markdown "$REPORT/table.md" \
    --json "$REPORT/report.json" --png "$REPORT/gpu.png" || fail "PyTorch baselines and the table"
  finish check
}

profile() {
  REPORT=${REPORT:-$BUILD/gpu-check}
  mkdir -p "$REPORT"
  use_build
  local bench="$BUILD/benchmarks/sketchsgd_bench_gpu --benchmark_min_time=0.001"
  local l2="lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_read.sum,lts__t_requests_srcunit_tex_op_red.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum"
  # name, kernel regex, benchmark filter: the accumulate kernels' L2 traffic, the estimates, TernGrad.
  while read -r name kernel filter; do
    step "ncu $name"
    ncu --clock-control none --kernel-name "regex:$kernel" --launch-count 1 --metrics "$l2" \
      $bench --benchmark_filter="$filter" > "$REPORT/ncu-$name.txt" 2>&1 || fail "ncu $name"
  done <<'CASES'
accumulate accumulate_kernel BM_Accumulate/134217728/5/1048576/0
accumulate-blocked accumulate_groups BM_Accumulate/134217728/5/1048576/2
estimate estimate BM_UnsketchTopk/134217728/5/1048576/1000000/0
estimate-blocked estimate_groups BM_UnsketchTopk/134217728/5/1048576/1000000/2
ternarize ternarize_kernel BM_Ternarize
CASES
  # Every kernel of one top-k and one unsketch (skipping the two warm-up calls' kernels).
  for f in 'BM_Topk/100000000/1000000' 'BM_UnsketchTopk/134217728/5/1048576/1000000/0' \
    'BM_UnsketchTopk/134217728/5/1048576/1000000/2'; do
    step "ncu $f"
    ncu --clock-control none --launch-skip 40 --launch-count 20 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      $bench --benchmark_filter="$f" > "$REPORT/ncu-$(echo "$f" | tr '/' '_').txt" 2>&1 ||
      fail "ncu $f"
  done
  grep -h -E "^  [a-z_]+.*\(|gpu__time_duration|lts__|dram__|sm__" "$REPORT"/ncu-*.txt |
    sed 's/  */ /g' | head -150
  finish profile
}

demo_prepare() {
  set -e
  source scripts/packages.sh
  ensure_packages libzmq3-dev cppzmq-dev zlib1g-dev dataset-fashion-mnist
  local deps=${DEPS:-build/gpu-demo-deps} lib
  lib=/usr/lib/$(gcc -dumpmachine)
  rm -rf "$deps"
  mkdir -p "$deps/include" "$deps/lib" "$deps/share/cmake" "$deps/data"
  cp /usr/include/{zmq.h,zmq_utils.h,zmq.hpp,zmq_addon.hpp,zlib.h,zconf.h} "$deps/include/"
  cp -r /usr/share/cmake/cppzmq "$deps/share/cmake/"
  # Link names for the build, sonames for the loader.
  for so in libzmq.so.5 libz.so.1; do
    cp -L "$lib/$so" "$deps/lib/$so"
    ln -sf "$so" "$deps/lib/${so%.*}"
  done
  # libzmq's own dependencies (libsodium, pgm, norm, Kerberos, …) beyond glibc and libstdc++.
  ldd "$lib/libzmq.so.5" | awk '/=>/ {print $1, $3}' | grep -vE "$SYSTEM_LIBS" |
    while read -r name path; do
      [ -f "$deps/lib/$name" ] || cp -L "$path" "$deps/lib/$name"
    done
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$deps/data/"
  # The transformer workload's text (Python's documentation sources, 11 MB).
  ensure_packages python3.11-doc
  mkdir -p "$deps/text"
  local text
  text=$(cd "$deps/text" && pwd)
  (cd /usr/share/doc/python3.11/html/_sources && find . -name '*.rst.txt' -exec cp --parents {} "$text/" \;)
  # OpenBLAS (the CPU matrix products of powersgd): CBLAS headers, the library and what it needs.
  ensure_packages libopenblas-dev
  cp /usr/include/$(gcc -dumpmachine)/openblas-pthread/*.h "$deps/include/"
  # 36 MB (with LAPACK): gzipped to fit what a device call may carry; unpacked there by use_deps.
  gzip -9 -c "$lib/libopenblas.so.0" > "$deps/lib/libopenblas.so.0.gz"
  ln -sf libopenblas.so.0 "$deps/lib/libopenblas.so"
  ldd "$lib/libopenblas.so.0" | awk '/=>/ {print $1, $3}' | grep -vE "$SYSTEM_LIBS" |
    while read -r name path; do
      [ -f "$deps/lib/$name" ] || cp -L "$path" "$deps/lib/$name"
    done
  # pybind11 (headers + CMake package) and pytest (pure Python) for `gpu.sh python`.
  ensure_packages pybind11-dev python3-pytest
  # Debian's layout under a prefix of its own: the package files find their headers three
  # folders up (pybind11/lib/cmake/pybind11 -> pybind11/include).
  mkdir -p "$deps/pybind11/include" "$deps/pybind11/lib/cmake" "$deps/python"
  cp -r /usr/include/pybind11 "$deps/pybind11/include/"
  cp -r /usr/lib/cmake/pybind11 "$deps/pybind11/lib/cmake/"
  # ip and tc (bench_network.py's namespaces and shaping) with what they load beyond glibc.
  mkdir -p "$deps/bin"
  cp -L "$(command -v ip)" "$(command -v tc)" "$deps/bin/"
  ldd "$deps/bin/ip" "$deps/bin/tc" | awk '/=>/ {print $1, $3}' | grep -vE "$SYSTEM_LIBS" | sort -u |
    while read -r name path; do
      [ -f "$deps/lib/$name" ] || cp -L "$path" "$deps/lib/$name"
    done
  for pkg in pytest _pytest pluggy iniconfig py.py; do
    [ -e "/usr/lib/python3/dist-packages/$pkg" ] && cp -r "/usr/lib/python3/dist-packages/$pkg" "$deps/python/"
  done
  echo "staged $deps ($(du -sh "$deps" | cut -f1)): $(ls "$deps/lib" | tr '\n' ' ')"
}

# The staged libraries ready to link and load (OpenBLAS travels gzipped).
use_deps() {
  local deps=$1
  [ -f "$deps/lib/libopenblas.so.0" ] || gunzip -k "$deps/lib/libopenblas.so.0.gz"
  export LD_LIBRARY_PATH=$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

demo() {
  set -e
  local deps=$PWD/${DEPS:-build/gpu-demo-deps} build=${BUILD_DEMO:-build/gpu-demo}
  REPORT=${REPORT:-build/gpu-demo-out}
  [ -d "$deps/include" ] || { echo "no $deps: run 'scripts/gpu.sh demo-prepare' first" >&2; exit 1; }
  local torch_prefix
  torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  "$PY" -c 'import torch; assert torch.cuda.is_available(), "this PyTorch sees no GPU"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
  use_deps "$deps"
  mkdir -p "$REPORT"
  step "configure + build $build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSKETCHSGD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DSKETCHSGD_SERVER=ON -DSKETCHSGD_DEMO=ON \
    -DSKETCHSGD_TESTS=OFF -DSKETCHSGD_BENCHMARKS=OFF "-DCMAKE_PREFIX_PATH=$deps;$torch_prefix" \
    -DZeroMQ_DIR="$deps" -DZLIB_ROOT="$deps" > "$REPORT/configure.log"
  cmake --build "$build" --target sketchsgd-train
  local train=$build/demo/sketchsgd-train start
  for device in cuda cpu; do
    step "train on $device"
    start=$(date +%s)
    "$train" --device "$device" --data "$deps/data" --out "$REPORT/$device" "$@" 2>&1 |
      tee "$REPORT/train-$device.log"
    echo "$device: $(($(date +%s) - start)) s wall" | tee -a "$REPORT/summary.txt"
    cat "$REPORT/$device/summary.json" >> "$REPORT/summary.txt"
    echo >> "$REPORT/summary.txt"
  done
  step "summaries"
  cat "$REPORT/summary.txt"
}

# Builds the package for the machine's Python and PyTorch into $PYBUILD (its python/ on PYTHONPATH)
# from the source tree $SRC (default: this one).
python_build() {
  local deps=$PWD/${DEPS:-build/gpu-demo-deps} build=${BUILD_PY:-build/gpu-python}
  PYBUILD=$build
  [ -d "$deps/pybind11" ] || { echo "no $deps/pybind11: run 'scripts/gpu.sh demo-prepare' first" >&2; return 1; }
  mkdir -p "$REPORT"
  use_deps "$deps"
  "$PY" -c 'import torch; assert torch.cuda.is_available(), "this PyTorch sees no GPU"; print("torch", torch.__version__, torch.cuda.get_device_name(0))' || return 1
  step "configure + build $build"
  # The machine's compiler (/opt/gcc) links its own libstdc++ statically, and a second copy of
  # the C++ runtime beside the interpreter's (torch's) crashed in locale code: link the
  # libstdc++ that the Python process loads, found -L first.
  local stdcxx
  stdcxx=$("$PY" -c 'import torch; print(next(l.split()[-1] for l in open("/proc/self/maps") if "libstdc++.so" in l))') || return 1
  mkdir -p "$build/stdcxx"
  ln -sf "$stdcxx" "$build/stdcxx/libstdc++.so"
  echo "libstdc++ of $PY: $stdcxx"
  cmake -S "${SRC:-.}" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSKETCHSGD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DSKETCHSGD_SERVER=OFF -DSKETCHSGD_DEMO=OFF \
    -DSKETCHSGD_TESTS=OFF -DSKETCHSGD_BENCHMARKS=OFF -DSKETCHSGD_PYTHON=ON "-DCMAKE_PREFIX_PATH=$deps" \
    "-DCMAKE_SHARED_LINKER_FLAGS=-L$PWD/$build/stdcxx" "-DCMAKE_MODULE_LINKER_FLAGS=-L$PWD/$build/stdcxx" \
    -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$deps/pybind11/lib/cmake/pybind11" > "$REPORT/configure.log" || return 1
  cmake --build "$build" --target sketchsgd_python || return 1
  if ! ldd "$build/libsketchsgd.so" | grep -q 'libstdc++'; then
    echo "libsketchsgd.so carries a static libstdc++ (see configure.log)" >&2
    return 1
  fi
  # The machine's pytest if it has one (the staged Debian one clashes with its plugins).
  "$PY" -c 'import pytest' 2>/dev/null || export PYTHONPATH=$deps/python${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONPATH=$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}
}

python_check() {
  REPORT=${REPORT:-build/gpu-python-out}
  mkdir -p "$REPORT"
  python_build || { fail "build the Python package"; finish python; }
  set -e
  local deps=$PWD/${DEPS:-build/gpu-demo-deps} build=$PYBUILD
  step "Python tests (GPU variants must run)"
  export SKETCHSGD_FASHION=$deps/data SKETCHSGD_TEXT=$deps/text  # the workloads' data (deps is absolute)
  # PYTEST_ARGS narrows the run (default: every Python test).
  "$PY" -m pytest -v -p no:cacheprovider -rs ${PYTEST_ARGS:-tests/python} 2>&1 | tee "$REPORT/pytest.log" || fail "Python tests"
  grep -q "SKIPPED.*no CUDA device" "$REPORT/pytest.log" && fail "GPU Python tests skipped"
  if [ "${GPU_EXTRAS:-1}" = 0 ]; then finish python; fi  # the tests only
  step "DDP example on CUDA (gloo, 4 ranks on one GPU, 1 epoch)"
  "$PY" examples/ddp_train.py --device cuda --backend gloo --epochs 1 --data "$deps/data" \
    --json "$REPORT/ddp-cuda.json" 2>&1 | tee "$REPORT/ddp-cuda.log" || fail "DDP example on CUDA"
  "$PY" examples/ddp_train.py --device cuda --backend gloo --epochs 1 --data "$deps/data" \
    --hook sketchsgd:powersgd:rank=4,momentum=0.9,wire=fp16 --json "$REPORT/ddp-cuda-powersgd.json" 2>&1 |
    tee "$REPORT/ddp-cuda-powersgd.log" || fail "DDP example on CUDA (powersgd)"
  step "a bfloat16 transformer on CUDA: NCCL (a group of one; and int8 sums in fp32) and gloo (4 ranks on one GPU), 100 steps"
  "$PY" examples/ddp_train.py --device cuda --backend nccl --workers 1 --workload transformer --dtype bf16 \
    --epochs 1 --max-steps 100 --hook sketchsgd:powersgd:rank=2,wire=bf16 --json "$REPORT/ddp-cuda-bf16-nccl.json" \
    2>&1 | tee "$REPORT/ddp-cuda-bf16-nccl.log" || fail "bf16 transformer on NCCL"
  "$PY" examples/ddp_train.py --device cuda --backend nccl --workers 1 --workload transformer --epochs 1 \
    --max-steps 100 --hook sketchsgd:powersgd:rank=4,wire=int8 --json "$REPORT/ddp-cuda-int8-nccl.json" \
    2>&1 | tee "$REPORT/ddp-cuda-int8-nccl.log" || fail "int8 sums on NCCL"
  "$PY" examples/ddp_train.py --device cuda --backend gloo --workload transformer --dtype bf16 --epochs 1 \
    --max-steps 100 --hook sketchsgd:powersgd:rank=2,wire=fp16 --json "$REPORT/ddp-cuda-bf16-gloo.json" 2>&1 |
    tee "$REPORT/ddp-cuda-bf16-gloo.log" || fail "bf16 transformer on gloo (CUDA)"
  step "local steps on CUDA: DiLoCo with a PowerSGD pseudo-gradient (gloo, 4 ranks on one GPU), 64 steps"
  "$PY" examples/ddp_train.py --device cuda --backend gloo --workload transformer --epochs 1 --max-steps 64 \
    --local 8 --hook sketchsgd:powersgd:rank=4,wire=fp16 --json "$REPORT/ddp-cuda-diloco.json" 2>&1 | tee "$REPORT/ddp-cuda-diloco.log" ||
    fail "DiLoCo on CUDA"
  step "FSDP on CUDA (gloo, 4 ranks on one GPU; bf16 transformer, 100 steps): FSDP2's compressed reduce-scatter (summable, and gathered per destination), HSDP 2 x 2 with compressed replicas, FSDP2's bf16 reduce_dtype; FSDP1's comm hook (summable, and gathered per destination)"
  for run in "full sketchsgd:powersgd:rank=4,wire=bf16" "full topk:k=16000,wire=bf16,index=delta" \
    "hsdp topk:k=8000,wire=bf16,index=delta" "hsdp sketchsgd:powersgd:rank=4,wire=int8" "full bf16" \
    "fsdp1 sketchsgd:powersgd:rank=4,wire=bf16" "fsdp1 topk:k=16000,wire=bf16,index=delta"; do
    set -- $run
    "$PY" examples/ddp_train.py --device cuda --backend gloo --workload transformer --dtype bf16 --epochs 1 \
      --max-steps 100 --fsdp "$1" --hook "$2" --json "$REPORT/fsdp-cuda-$1-${2%%:*}.json" 2>&1 |
      tee "$REPORT/fsdp-cuda-$1-${2%%:*}.log" || fail "FSDP2 on CUDA ($1, $2)"
  done
  step "a codec's work under FSDP2 against DDP on the GPU (NCCL group of one)"
  "$PY" benchmarks/bench_fsdp.py --device cuda --threads 8 --steps 50 --json "$REPORT/fsdp-work-cuda.json" ||
    fail "FSDP2 codec work (CUDA)"
  step "the hooks' own work per step on the GPU (NCCL group of one; demo MLP, then 4x wider)"
  for width in ${HOOK_WIDTHS:-1024 4096}; do
    "$PY" benchmarks/bench_hook.py --device cuda --width "$width" --steps 100 --threads 8 \
      --python "$build/python" --json "$REPORT/hook-cuda-w$width.json" ${HOOK_ONLY:+--only "$HOOK_ONLY"} \
      --rounds "${HOOK_ROUNDS:-1}" ||
      fail "hook timing (width $width)"
  done
  finish python
}

# The GoogleTest cases matching $1 into $REPORT/tests.log; a CUDA case that skipped fails.
gpu_tests() {
  step "GPU tests ($1)"
  "$BUILD/tests/sketchsgd_tests" --gtest_brief=1 --gtest_filter="$1" 2>&1 |
    tee "$REPORT/tests.log" || fail "GPU tests (see tests.log)"
  grep -q "no CUDA device" "$REPORT/tests.log" && fail "GPU tests skipped: no usable CUDA device"
}

# The GPU benchmarks matching $1, $2 repetitions each, into $REPORT/kernels.json.
gpu_benchmarks() {
  step "GPU kernels' benchmarks"
  "$BUILD/benchmarks/sketchsgd_bench_gpu" --benchmark_filter="$1" --benchmark_repetitions="$2" \
    --benchmark_report_aggregates_only=true --benchmark_out="$REPORT/kernels.json" \
    --benchmark_out_format=json || fail "GPU benchmarks"
}

# The sketch server's round, the accumulate and the PowerSGD hooks at device speed, in one call:
# the C++ GPU tests and memcheck of the kernels they use, the sketch kernels' benchmarks, the
# Python package (built here as `python` builds it) with its CUDA compressor and hook tests,
# bench_round.py at d = 2^27 and bench_hook.py on NCCL (PowerSGD ranks 1-16 against PyTorch's,
# fp16 and bf16 wires, HOOK_WIDTHS, HOOK_ROUNDS; a profile at rank 4), memcheck last
# (MEMCHECK_S caps it). Needs `prepare` and `demo-prepare` (their data and text folders may
# stay behind: none is read). Carry build/gpu-carry and build/gpu-demo-deps, and run it with
# BUILD=build/gpu-carry.
round_check() {
  device_report gpu-round
  gpu_tests 'Cuda*:Crc32c.*:DeltaCoding.*'
  gpu_benchmarks 'BM_CopyDeviceToDevice|BM_Accumulate/134217728/5|BM_AccumulateColumns|BM_Compress/134217728/5/1048576/[23]|BM_UnsketchTopk/134217728/5' 3
  python_build || { fail "build the Python package"; finish round; }
  step "Python: the CUDA compressor and hook tests"
  "$PY" -m pytest -q -p no:cacheprovider -k cuda tests/python/test_compressor.py tests/python/test_hook.py 2>&1 |
    tee "$REPORT/pytest.log" || fail "Python CUDA tests"
  step "the server's round and the accumulate at d = 2^27 (bench_round.py)"
  "$PY" benchmarks/bench_round.py --device cuda --dim 134217728 --rounds 10 --python "$PYBUILD/python" \
    --json "$REPORT/round.json" || fail "bench_round.py"
  step "the hooks on NCCL (a group of one): PowerSGD ranks 1-16 against PyTorch's, fp16 and bf16 wires"
  for width in ${HOOK_WIDTHS:-1024 4096}; do
    "$PY" benchmarks/bench_hook.py --device cuda --width "$width" --steps 50 --threads 8 --rounds "${HOOK_ROUNDS:-3}" \
      --python "$PYBUILD/python" --only 'none,powersgd' --json "$REPORT/hook-cuda-w$width.json" ||
      fail "hook timing (width $width)"
  done
  "$PY" benchmarks/bench_hook.py --device cuda --width 4096 --steps 20 --threads 8 --python "$PYBUILD/python" \
    --only 'powersgd:rank=4' --profile "$REPORT/hook-profile.txt" > /dev/null || fail "hook profile"
  step "compute-sanitizer memcheck (the round's kernels; at most ${MEMCHECK_S:-150} s)"
  timeout "${MEMCHECK_S:-150}" compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check full \
    "$BUILD/tests/sketchsgd_tests" --gtest_brief=1 \
    --gtest_filter='Cuda.DeltaCoding*:Cuda.TopkBreaksTies*:Cuda.AccumulateSkips*:CudaBlocked.*:CudaSketch.ExtractTopK*' \
    > "$REPORT/memcheck.log" 2>&1 || fail "compute-sanitizer memcheck (see memcheck.log)"
  tail -n 3 "$REPORT/memcheck.log"
  finish round
}

# The count sketch's accumulate in one short call: its GPU tests, the kernels' benchmarks (tiles
# against columns, the column path's tile widths), Nsight Compute's counters of the column kernel,
# memcheck, then FetchSGD's encode_sum and the server's round through the Python package
# (bench_round.py). Needs `prepare` and `demo-prepare`, as `round`.
accumulate_check() {
  device_report gpu-accumulate
  gpu_tests 'Cuda*Blocked*:CudaSketch.*:Cuda.Accumulate*'
  gpu_benchmarks 'BM_CopyDeviceToDevice/134217728|BM_Accumulate/134217728/./1048576/[23]|BM_AccumulateColumns|BM_Compress/134217728/5/1048576/[23]' 5
  step "ncu: the column kernel and the tiles kernel"
  local m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_op_red.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active
  for k in columns:BM_Accumulate/134217728/5/1048576/3 tiles:BM_Accumulate/134217728/5/1048576/2; do
    timeout 60 ncu --clock-control none --kernel-name "regex:accumulate_${k%%:*}" --launch-count 1 --metrics "$m" \
      "$BUILD/benchmarks/sketchsgd_bench_gpu" --benchmark_min_time=0.001 --benchmark_filter="${k#*:}" \
      > "$REPORT/ncu-${k%%:*}.txt" 2>&1 || fail "ncu ${k%%:*}"
    grep -E "accumulate_|gpu__|dram__|lts__|sm__|smsp__" "$REPORT/ncu-${k%%:*}.txt" | sed 's/  */ /g'
  done
  step "compute-sanitizer memcheck (the sketch kernels)"
  timeout "${MEMCHECK_S:-120}" compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check full \
    "$BUILD/tests/sketchsgd_tests" --gtest_brief=1 --gtest_filter='Cuda*Blocked*:Cuda.AccumulateSkips*' \
    > "$REPORT/memcheck.log" 2>&1 || fail "compute-sanitizer memcheck (see memcheck.log)"
  tail -n 3 "$REPORT/memcheck.log"
  python_build || { fail "build the Python package"; finish accumulate; }
  step "FetchSGD's encode_sum and the server's round at d = 2^27 (bench_round.py)"
  "$PY" benchmarks/bench_round.py --device cuda --dim 134217728 --rounds 10 --python "$PYBUILD/python" \
    --json "$REPORT/round.json" 2>&1 | tr '\r' '\n' | grep -v "round [0-9]*/" || fail "bench_round.py"
  finish accumulate
}

# Before/after on one machine: the package of $AB_OLD (a source tree inside this one) and this
# tree's, built the same way, and the hooks timed with each in turn.
hook_ab() {
  [ -n "${AB_OLD:-}" ] && [ -f "$AB_OLD/CMakeLists.txt" ] ||
    { echo "hook-ab: set AB_OLD to another source tree of the project inside this one" >&2; exit 2; }
  REPORT=${REPORT:-build/gpu-ab-out}
  mkdir -p "$REPORT"
  local old=$PWD/$AB_OLD/build/gpu-python
  (SRC=$AB_OLD BUILD_PY=$AB_OLD/build/gpu-python python_build) || { fail "build the package of $AB_OLD"; finish hook-ab; }
  python_build || { fail "build this tree's package"; finish hook-ab; }
  local new=$PWD/$PYBUILD
  step "the hooks with each package in turn (${AB_RUNS:-2} runs each)"
  for run in $(seq "${AB_RUNS:-2}"); do
    for width in ${HOOK_WIDTHS:-1024 4096}; do
      for side in old new; do
        local pkg=$old
        [ "$side" = new ] && pkg=$new
        "$PY" benchmarks/bench_hook.py --device cuda --width "$width" --steps 50 --threads 8 \
          --rounds "${HOOK_ROUNDS:-2}" --python "$pkg/python" --only "${HOOK_ONLY:-none,powersgd}" \
          --json "$REPORT/hook-$side-w$width-$run.json" || fail "hook timing ($side, width $width)"
      done
    done
  done
  finish hook-ab
}

# The lm workload's frontier point at GPT-2 small's size: 12 blocks of width 768, 12 heads, a
# window of 1,024 tokens and GPT-2's vocabulary size (50,257 BPE tokens trained here on the staged
# text): 124 M parameters. Four workers simulated on one GPU (ddp_train.py --simulate 4: threads of
# one process, TF32 products), batch 4 windows a worker, 4 x 150 steps: per-step dense averaging
# against DiLoCo with sparseloco's pseudo-gradient every 30 steps (plain averaging outside, as
# SparseLoCo; its codec on the host: --outer-device cpu). The text is 2.6 M tokens, so 600 steps
# are ~4 epochs: the point compares methods at equal steps, not a converged GPT-2.
lm_runs() {
  REPORT=${REPORT:-build/gpu-lm-out}
  mkdir -p "$REPORT"
  local steps=${LM_STEPS:-600} size
  read -r -a size <<< "${LM_SIZE:---width 768 --depth 12 --heads 12 --seq 1024 --vocab 50257 --batch 4}"
  local common=(--workload lm "${size[@]}" --epochs 4 --max-steps $((steps / 4)) --warmup 30 --eval-items 64
                --progress 25 --device "${DEVICE:-cuda}" --simulate 4 --threads "${THREADS:-8}" --timeout 1200)
  [ "${DEVICE:-cuda}" = cuda ] && common+=(--tf32)
  step "lm at GPT-2 small's size, 4 simulated workers: per-step dense"
  "$PY" examples/ddp_train.py "${common[@]}" --hook none --json "$REPORT/lm-dense.json" 2>&1 |
    tee "$REPORT/lm-dense.log" || fail "lm, dense per step"
  step "lm at GPT-2 small's size, 4 simulated workers: DiLoCo + sparseloco every 30 steps"
  "$PY" examples/ddp_train.py "${common[@]}" --local 30 --hook sparseloco:chunk=4096,k=64 --outer-lr 1 \
    --outer-momentum 0 --outer-device cpu --json "$REPORT/lm-sparseloco.json" 2>&1 |
    tee "$REPORT/lm-sparseloco.log" || fail "lm, DiLoCo + sparseloco"
  finish lm
}

lm_point() {
  device_report gpu-lm
  export SKETCHSGD_TEXT=$PWD/${DEPS:-build/gpu-demo-deps}/text
  python_build || { fail "build the Python package"; finish lm; }
  lm_runs
}

network() {
  local deps=$PWD/${DEPS:-build/gpu-demo-deps} build=${BUILD_PY:-build/gpu-python}
  REPORT=${REPORT:-build/gpu-network-out}
  [ -d "$build/python/sketchsgd" ] || { echo "no $build/python: run 'scripts/gpu.sh python' first" >&2; exit 1; }
  mkdir -p "$REPORT"
  use_deps "$deps"
  command -v ip > /dev/null && command -v tc > /dev/null || export PATH=$PATH:$deps/bin
  export SKETCHSGD_FASHION=$deps/data
  step "bench_network.py on $(nproc) cores"
  "$PY" benchmarks/bench_network.py --python "$build/python" --json "$REPORT/network.json" \
    --png "$REPORT/network.png" "$@" 2>&1 | tee "$REPORT/network.log" || fail "bench_network.py"
  finish network
}

cmd=${1:-}
shift || true
case "$cmd" in
  prepare) prepare ;;
  check) check ;;
  profile) profile ;;
  demo-prepare) demo_prepare ;;
  demo) demo "$@" ;;
  python) python_check ;;
  round) round_check ;;
  accumulate) accumulate_check ;;
  hook-ab) hook_ab ;;
  lm) lm_point ;;
  lm-runs) lm_runs ;;
  network) network "$@" ;;
  *)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    [ -z "$cmd" ] || [ "$cmd" = help ] || [ "$cmd" = -h ] || [ "$cmd" = --help ] || exit 2
    ;;
esac
