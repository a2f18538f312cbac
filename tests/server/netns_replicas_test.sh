#!/usr/bin/env bash
# A replicated server on three test hosts (network namespaces on one bridge, addresses from the
# 198.18.0.0/15 benchmarking range, in namespaces this test makes and removes): the primary, its
# backup, and the workers. The primary's link is cut mid-training (it stays alive, isolated): the
# workers move to the backup, which takes over and finishes the job; when the link comes back the
# old primary learns it was deposed and exits with status 4. Everyone ends on the backup's model.
#   netns_replicas_test.sh SERVER_BIN WORKER_BIN      exit 77 = skipped (no root or no ip netns)
set -euo pipefail
server_bin=$1 worker_bin=$2
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"

sw=sksw$$ tmp=$(mktemp -d)
hosts=(skp$$ skb$$ skw$$)
ip netns add "$sw" 2>/dev/null || skip "ip netns add is not permitted here"
cleanup() {
  kill -9 $(jobs -p) 2>/dev/null || true
  for n in "$sw" "${hosts[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for i in 0 1 2; do
  h=${hosts[$i]}
  ip netns add "$h"
  ip -n "$h" link set lo up
  ip link add "h$i$$" netns "$h" type veth peer name "s$i$$" netns "$sw"
  ip -n "$sw" link set "s$i$$" master br0
  ip -n "$sw" link set "s$i$$" up
  ip -n "$h" addr add "198.18.1.$((i + 1))/24" dev "h$i$$"
  ip -n "$h" link set "h$i$$" up
done
primary=tcp://198.18.1.1:5555 backup=tcp://198.18.1.2:5555

rounds=80
common=(--job 9 --world 2 --dim 4000 --codec sketch:k=40,cols=400,fetch=1 --rounds $rounds)
server=(--policy wait --heartbeat-ms 100 --deadline-ms 20000 --lr 0.2 --quiet)
ip netns exec "${hosts[0]}" "$server_bin" "${common[@]}" "${server[@]}" --bind $primary \
  --metrics "$tmp/p.jsonl" > "$tmp/p.out" 2> "$tmp/p.err" &
p=$!
sleep 0.3
ip netns exec "${hosts[1]}" "$server_bin" "${common[@]}" "${server[@]}" --bind $backup \
  --replica-of $primary --metrics "$tmp/b.jsonl" --checkpoint "$tmp/ckpt" \
  --checkpoint-every 1000 > "$tmp/b.out" 2> "$tmp/b.err" &
b=$!
sleep 0.3
for r in 0 1; do
  ip netns exec "${hosts[2]}" "$worker_bin" "${common[@]}" --server "$primary|$backup" --rank $r \
    --sleep-ms 40 --timeout-ms 30000 --out "$tmp/w$r" > "$tmp/w$r.log" 2>&1 &
  eval "w$r=\$!"
done

lines() { wc -l < "$1" 2>/dev/null || echo 0; }
for _ in $(seq 200); do [ "$(lines "$tmp/p.jsonl")" -ge 5 ] && break; sleep 0.05; done
ip -n "$sw" link set "s0$$" down
echo "primary's link cut after $(lines "$tmp/p.jsonl") rounds"
for _ in $(seq 300); do [ "$(lines "$tmp/b.jsonl")" -ge 3 ] && break; sleep 0.05; done
[ "$(lines "$tmp/b.jsonl")" -ge 3 ] || { echo "FAIL: the backup never took over"; exit 1; }
ip -n "$sw" link set "s0$$" up
echo "link restored; the backup has run $(lines "$tmp/b.jsonl") rounds"

status=0
for _ in $(seq 300); do kill -0 $p 2>/dev/null || break; sleep 0.05; done
if kill -0 $p 2>/dev/null; then
  echo "FAIL: the old primary still runs 15 s after its link came back"; status=1
else
  set +e; wait $p; rc=$?; set -e
  [ $rc = 4 ] || { echo "FAIL: the old primary exited with $rc, not 4 (deposed)"; status=1; }
fi
cat "$tmp/p.err"
wait $w0 || { echo "rank 0 failed:"; cat "$tmp/w0.log"; status=1; }
wait $w1 || { echo "rank 1 failed:"; cat "$tmp/w1.log"; status=1; }
wait $b || { echo "backup failed:"; cat "$tmp/b.err"; status=1; }
[ $status = 0 ] || exit 1
grep -q "reconnecting to $backup" "$tmp/w0.log" || { echo "FAIL: rank 0 never moved:"; cat "$tmp/w0.log"; exit 1; }

# Both workers end with the backup's final model (its checkpoint after the last round).
python3 "$(dirname "$0")/same_model.py" "$tmp/ckpt" "$tmp/w0" "$tmp/w1"
