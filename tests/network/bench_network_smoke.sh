#!/bin/bash
# benchmarks/bench_network.py end to end, small: two hosts in network namespaces on a 100 Mbit/s
# link, a few DDP steps of dense (no hook) and of a codec, and a few parameter-server rounds.
# The codec's step must be the shorter one at that rate (it moves 86x fewer bytes), the hosts run
# the TCP congestion control asked for (--tcp reno: every kernel allows it), and no namespace of
# the run may survive it, nor of a run refused for a congestion control the kernel does not allow. Exit 77 (skipped) without root or network namespaces.
#   bench_network_smoke.sh PYTHON PACKAGE_DIR DEMO_BINARY
set -euo pipefail
python=$1 package=$2 demo=$3
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
set +e
"$python" "$src/benchmarks/bench_network.py" --workers 2 --rates 100mbit --buckets one --steps 6 \
  --hooks 'none;sketchsgd:powersgd:rank=4,wire=fp16' --ps --ps-rounds 4 --ps-codecs 'powersgd:rank=4,momentum=0.9,wire=fp16' \
  --timeout 240 --python "$package" --demo "$demo" --json "$out/net.json" --tcp reno > "$out/log" 2>&1
rc=$?
set -e
cat "$out/log"
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || { echo "FAIL: bench_network.py exited $rc"; exit 1; }
if ip netns list 2>/dev/null | grep -q "^skn[0-9]*\(sw\|h[0-9]\)"; then
  echo "FAIL: namespaces left behind: $(ip netns list)"; exit 1
fi
"$python" - "$out/net.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
step = {d["hook"]: d["step_ms"]["100mbit"] for d in r["ddp"]}
assert set(step) == {"none", "sketchsgd:powersgd:rank=4,wire=fp16"}, step
assert r["floor_ms"] and r["floor_ms"] > 0, r
assert r["tcp"] == "reno", r["tcp"]
assert step["sketchsgd:powersgd:rank=4,wire=fp16"] < step["none"], f"the codec is not faster at 100 Mbit/s: {step}"
assert r["ps"] and r["ps"][0]["round_ms"]["100mbit"] > 0, r["ps"]
print(f"100 Mbit/s, 2 hosts: no hook {step['none']:.0f} ms a step, powersgd "
      f"{step['sketchsgd:powersgd:rank=4,wire=fp16']:.0f} ms; floor {r['floor_ms']:.0f} ms")
PY
if "$python" "$src/benchmarks/bench_network.py" --workers 2 --rates 100mbit --hooks none --tcp no-such-tcp \
    > "$out/bad" 2>&1; then
  echo "FAIL: --tcp no-such-tcp was accepted"; cat "$out/bad"; exit 1
fi
grep -q "^--tcp no-such-tcp: " "$out/bad" || { echo "FAIL: no clear refusal:"; cat "$out/bad"; exit 1; }
if ip netns list 2>/dev/null | grep -q "^skn[0-9]*\(sw\|h[0-9]\)"; then
  echo "FAIL: namespaces left behind by the refused run: $(ip netns list)"; exit 1
fi
echo "a refused --tcp: $(tail -1 "$out/bad")"
