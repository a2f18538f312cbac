#!/usr/bin/env bash
# Server and workers on two test hosts (network namespaces joined by a veth pair, addresses from
# the 198.18.0.0/15 benchmarking range, inside namespaces this test makes and removes). Rank 1's
# link is cut mid-training: the server counts it dead and closes rounds by quorum; when the link
# comes back, rank 1 reconnects, resynchronises and finishes with the same model as everyone.
#   netns_test.sh SERVER_BIN WORKER_BIN      exit 77 = skipped (no root or no ip netns)
set -euo pipefail
server_bin=$1 worker_bin=$2
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"

a=sksrv$$ b=skwrk$$ tmp=$(mktemp -d)
ip netns add "$a" 2>/dev/null || skip "ip netns add is not permitted here"
cleanup() {
  kill -9 $(jobs -p) 2>/dev/null || true
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$b"
ip -n "$a" link set lo up
ip -n "$b" link set lo up
ip link add "va$$" netns "$a" type veth peer name "vb$$" netns "$b"
ip -n "$a" addr add 198.18.0.1/30 dev "va$$"
ip -n "$b" addr add 198.18.0.2/30 dev "vb$$"
ip -n "$a" link set "va$$" up
ip -n "$b" link set "vb$$" up

rounds=40
# Rank 0 may finish the job while rank 1 is still reconnecting (ZeroMQ backs off up to 4 s after
# the cut): the server lingers after its last round, so rank 1 can still come back and pull the
# final model.
common=(--job 9 --world 2 --dim 4000 --codec sketch:k=40,cols=400)
ip netns exec "$a" "$server_bin" "${common[@]}" --bind tcp://198.18.0.1:5555 --rounds $rounds \
  --policy quorum --min-workers 1 --heartbeat-ms 100 --deadline-ms 5000 --lr 0.2 \
  --finish-grace-ms 15000 \
  --checkpoint "$tmp/ckpt" --checkpoint-every 1000 --metrics "$tmp/metrics" --quiet > "$tmp/server.out" &
server=$!
sleep 0.3
worker=(--server tcp://198.18.0.1:5555 --job 9 --world 2 --dim 4000 --codec sketch:k=40,cols=400
        --rounds $rounds --sleep-ms 40 --timeout-ms 30000)
ip netns exec "$a" "$worker_bin" "${worker[@]}" --rank 0 --out "$tmp/w0" > "$tmp/w0.log" 2>&1 &
w0=$!
ip netns exec "$b" "$worker_bin" "${worker[@]}" --rank 1 --out "$tmp/w1" > "$tmp/w1.log" 2>&1 &
w1=$!

# Let a few rounds run with both, then cut rank 1's link for 1.5 s.
for _ in $(seq 100); do [ "$(wc -l < "$tmp/metrics" 2>/dev/null || echo 0)" -ge 5 ] && break; sleep 0.05; done
ip -n "$b" link set "vb$$" down
echo "link of rank 1 cut at round $(wc -l < "$tmp/metrics")"
sleep 1.5
ip -n "$b" link set "vb$$" up
echo "link restored at round $(wc -l < "$tmp/metrics")"

status=0
wait $w0 || { echo "rank 0 failed:"; cat "$tmp/w0.log"; status=1; }
wait $w1 || { echo "rank 1 failed:"; cat "$tmp/w1.log"; status=1; }
wait $server || { echo "server failed"; status=1; }
[ $status = 0 ] || exit 1

cat "$tmp/w1.log"
grep -q '"contributors":1,' "$tmp/metrics" || { echo "FAIL: no round closed without rank 1"; exit 1; }
grep -q "resynchronised\|registering again\|reconnecting" "$tmp/w1.log" ||
  { echo "FAIL: rank 1 never noticed the cut"; exit 1; }
# Both workers end with the server's final model (the checkpoint written after the last round).
python3 "$(dirname "$0")/same_model.py" "$tmp/ckpt" "$tmp/w0" "$tmp/w1"
