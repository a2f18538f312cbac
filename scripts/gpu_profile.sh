#!/usr/bin/env bash
# Nsight Compute profiles behind docs/BENCHMARKS.md's GPU explanations: the accumulate kernel's
# L2 atomic traffic and every kernel of one top-k and one unsketch, with their durations.
#   BUILD=build/gpu bash scripts/gpu_profile.sh  →  $REPORT/ncu-*.txt
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/gpu}
REPORT=${REPORT:-$BUILD/gpu-check}
mkdir -p "$REPORT"
# A build made elsewhere (scripts/gpu_prepare.sh) finds its libraries here.
B=$(cd "$BUILD" && pwd)
export LD_LIBRARY_PATH="$B:$B/ps:$B/server:$B/worker:$B/extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BENCH="$BUILD/benchmarks/sketchsgd_bench_gpu --benchmark_min_time=0.001"
L2="lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_read.sum,lts__t_requests_srcunit_tex_op_red.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum"
ncu --clock-control none --kernel-name regex:accumulate_kernel --launch-count 1 --metrics "$L2" \
  $BENCH --benchmark_filter='BM_Accumulate/134217728/5/1048576/0' > "$REPORT/ncu-accumulate.txt" 2>&1
ncu --clock-control none --kernel-name regex:estimate --launch-count 1 --metrics "$L2" \
  $BENCH --benchmark_filter='BM_UnsketchTopk/134217728/5/1048576/1000000/0' > "$REPORT/ncu-estimate.txt" 2>&1
# Blocked hashing: the vector-atomic accumulate, and the selection passes that recompute estimates.
ncu --clock-control none --kernel-name regex:accumulate_groups --launch-count 1 --metrics "$L2" \
  $BENCH --benchmark_filter='BM_Accumulate/134217728/5/1048576/2' > "$REPORT/ncu-accumulate-blocked.txt" 2>&1
ncu --clock-control none --kernel-name regex:ternarize_kernel --launch-count 1 --metrics "$L2" \
  $BENCH --benchmark_filter='BM_Ternarize' > "$REPORT/ncu-ternarize.txt" 2>&1
for f in 'BM_Topk/100000000/1000000' 'BM_UnsketchTopk/134217728/5/1048576/1000000/0' \
  'BM_UnsketchTopk/134217728/5/1048576/1000000/2'; do
  name=$(echo "$f" | tr '/' '_')
  # Skip the two warm-up calls' kernels: one call is about 20 launches.
  ncu --clock-control none --launch-skip 40 --launch-count 20 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    $BENCH --benchmark_filter="$f" > "$REPORT/ncu-$name.txt" 2>&1
done
grep -h -E "^  [a-z_]+.*\(|gpu__time_duration|lts__|dram__|sm__" "$REPORT"/ncu-*.txt | sed 's/  */ /g' | head -150
