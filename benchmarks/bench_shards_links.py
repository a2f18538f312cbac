#!/usr/bin/env python3
"""The sharded parameter server over emulated links: S = 1, 2, 4, 8 server hosts, each on a link of
its own shaped by tbf (--rate, both directions), and W lightweight workers on one more host whose
link is left unshaped (as if each worker had a link of its own: the servers' links are where the
incast is). Runs sketchsgd_bench_shards on the workers' host with each shard's server started on
its host; prints its table and appends its JSON lines to --json. With --replicas each shard's
backup runs on a shaped host of its own too (--replicas 0,1: without, then with), and --failover
kills shard 0's primary half-way and times that round. Needs root (ip netns, tc); exits 77 with a
message otherwise. Namespaces are removed on every exit path.

    sudo .venv/bin/python benchmarks/bench_shards_links.py [--rate 100mbit] [--workers 64]
        [--shards 1,2,4,8] [--codecs 'dense;...'] [--dim 100000] [--json out.jsonl]
        [--replicas 0,1 [--failover]]
"""
import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys

from bench_network import BITS, Testbed, log  # noqa: E402
from cli import count, items, positive  # noqa: E402  (examples/cli.py: bench_network put it on the path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="100mbit", choices=list(BITS))
    ap.add_argument("--workers", type=count, default=64)
    ap.add_argument("--shards", default="1,2,4,8", type=items(count), help="comma-separated")
    ap.add_argument("--codecs", default="dense;topk:k=5000;sketch:rows=1,cols=25000,k=5000,fetch=1")
    ap.add_argument("--dim", type=count, default=100000)
    ap.add_argument("--rounds", type=count, default=6)
    ap.add_argument("--replicas", default="0", choices=["0", "1", "0,1"],
                    help="1: a backup per shard, on a host of its own")
    ap.add_argument("--failover", action="store_true", help="kill shard 0's primary half-way (with --replicas)")
    ap.add_argument("--heartbeat-ms", type=count, default=10000,
                    help="a round at S = 1 keeps a worker waiting for seconds; a failover takes 3 of these")
    ap.add_argument("--json", default="")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build/default/benchmarks/sketchsgd_bench_shards"))
    ap.add_argument("--timeout", type=positive, default=1800, help="seconds for the whole benchmark")
    args = ap.parse_args()
    if not os.access(args.bench, os.X_OK):
        ap.error(f"--bench {args.bench}: no such program (build it: cmake --build --preset default)")
    if os.geteuid() != 0:
        print("bench_shards_links.py: needs root (network namespaces, tc)", file=sys.stderr)
        sys.exit(77)
    most = max(args.shards)
    if args.failover and args.replicas == "0":
        ap.error("--failover needs --replicas 1 or 0,1")
    servers = 2 * most if args.replicas != "0" else most

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)

    # hosts 0..S-1: the shards; S..2S-1: their backups (--replicas); the last: the workers
    with Testbed(servers + 1) as bed:
        atexit.register(bed.__exit__, None, None, None)
        bed.shape(BITS[args.rate] and args.rate, hosts=range(servers))
        workers = servers
        log(f"testbed: {servers} server hosts at {args.rate}, {args.workers} workers on host {workers} (unshaped)")
        ip = shutil.which("ip")
        tag = bed.hosts[0][:-1]  # the hosts are TAG0, TAG1, …
        port = 5600 + os.getpid() % 300
        cmd = [args.bench, "--workers", str(args.workers), "--shards", ",".join(map(str, args.shards)), "--codecs", args.codecs,
               "--dim", str(args.dim), "--rounds", str(args.rounds), "--launch", f"{ip} netns exec {tag}{{i}}",
               "--bind", f"tcp://198.18.0.{{i+1}}:{port}", "--label", args.rate,
               "--heartbeat-ms", str(args.heartbeat_ms), "--replicas", args.replicas,
               "--backup-launch", f"{ip} netns exec {tag}{{i+{most}}}",
               "--backup-bind", f"tcp://198.18.0.{{i+{most + 1}}}:{port}"]
        if args.failover:
            cmd += ["--failover"]
        if args.json:
            cmd += ["--out", os.path.abspath(args.json)]
        # One OpenMP thread a process: 64 workers' kernels and S servers share two cores.
        p = bed.start(workers, cmd, None, dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            rc = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            log(f"timed out after {args.timeout:.0f} s")
            rc = 1
        bed.stop()
    sys.exit(rc)


if __name__ == "__main__":
    main()
