#!/usr/bin/env bash
# End to end: sketchsgd-train with a server and 2 workers on a Fashion-MNIST subset. The loss must
# fall, the model must learn, and both workers must end with identical parameters.
#   demo_test.sh TRAIN_BIN      exit 77 = skipped (the data set package is not installed)
set -euo pipefail
bin=$1
# Bad devices are refused with a reason (exit 2) before any process starts.
for bad in tpu cuda:x cuda:99; do
  rc=0
  msg=$("$bin" --device "$bad" --out "$(mktemp -d)" 2>&1) || rc=$?
  [ "$rc" = 2 ] && grep -q -- "--device" <<<"$msg" ||
    { echo "--device $bad: exit $rc, '$msg'"; exit 1; }
done
echo "bad --device values refused"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: dataset-fashion-mnist is not installed"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" --workers 2 --subset 6400 --batch 16 --epochs 2 --out "$out" --dump "$out/params" \
  --codec sketch:rows=5,cols=20000,k=10000,p2=2,momentum=0.9 --lr 0.01
cat "$out/results.csv"
python3 - "$out" <<'PY'
import csv, json, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/results.csv")))
assert len(rows) == 2, rows
l1, l2 = float(rows[0]["train_loss"]), float(rows[1]["train_loss"])
acc = float(rows[1]["test_accuracy"])
s = json.load(open(f"{out}/summary.json"))
assert l2 < l1, f"loss did not fall: {l1} -> {l2}"
assert acc > 0.6, f"test accuracy {acc} after 2 epochs"
assert s["rounds"] == 400 and s["traffic_ratio"] > 10, s
# A worker's push + pull against its link's bytes for a bf16 ring all-reduce: 2 * 2(W - 1)/W * 2d
# a step, where dense fp32 pushes and pulls are 8d (W = 2: half the fp32 ratio).
assert abs(s["link_ratio_bf16"] - s["traffic_ratio"] * (2 * 2 * (2 - 1) / 2 * 2) / 8) < 1e-4 * s["traffic_ratio"], s
print(f"loss {l1:.3f} -> {l2:.3f}, accuracy {acc:.3f}, {s['traffic_ratio']:.1f}x less traffic than dense fp32 pushes "
      f"and pulls, link bytes {s['link_ratio_bf16']:.1f}x fewer than a bf16 all-reduce at W = 2")
PY
cmp "$out/params.rank0" "$out/params.rank1"
echo "workers hold identical parameters"

# Sharded: three servers, each holding a range of the model; dense shards end bit-identical to
# one server.
for s in 1 3; do
  "$bin" --workers 2 --subset 1600 --batch 16 --epochs 1 --codec dense --shards $s \
    --out "$out/shards$s" --dump "$out/shards$s/params" >/dev/null 2>&1
done
cmp "$out/shards1/params.rank0" "$out/shards3/params.rank0"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['shards']==3 and s['rounds']==50, s" \
  "$out/shards3/summary.json"
echo "three shards: bit-identical to one server (dense)"

# Local steps (Downpour's n_push = n_fetch = 8, the server's Nesterov outer step: DiLoCo over the
# parameter server) with 4-bit pseudo-gradients: 50 rounds for 400 steps, the model learns, every
# worker ends on the server's model, and the traffic is counted against per-step dense.
rm -rf "$out/local" && mkdir -p "$out/local"
"$bin" --workers 2 --subset 6400 --batch 16 --epochs 2 --out "$out/local" --dump "$out/local/params" \
  --codec qsgd:bits=4 --lr 0.02 --push-every 8
python3 - "$out/local" <<'PY'
import csv, json, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/results.csv")))
s = json.load(open(f"{out}/summary.json"))
assert len(rows) == 2 and float(rows[1]["test_accuracy"]) > 0.6, rows
assert s["rounds"] == 50 and s["push_every"] == 8 and s["fetch_every"] == 8 and s["steps"] == 400, s
assert s["traffic_ratio"] > 8, s  # 8 steps a push; 4-bit pushes, the update dense (QSGD's)
print(f"local steps: accuracy {float(rows[1]['test_accuracy']):.3f}, {s['traffic_ratio']:.0f}x less traffic than per-step dense")
PY
cmp "$out/local/params.rank0" "$out/local/params.rank1"
echo "local steps: workers hold identical parameters"
# Bad knobs are refused before any process starts.
rc=0
msg=$("$bin" --push-every 0 --out "$(mktemp -d)" 2>&1) || rc=$?
[ "$rc" = 2 ] && grep -q -- "--push-every" <<<"$msg" || { echo "--push-every 0: exit $rc, '$msg'"; exit 1; }
