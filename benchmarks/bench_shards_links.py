#!/usr/bin/env python3
"""The sharded parameter server over emulated links: S = 1, 2, 4, 8 server hosts, each on a link of
its own shaped by tbf (--rate, both directions), and W lightweight workers on one more host whose
link is left unshaped (as if each worker had a link of its own: the servers' links are where the
incast is). Runs sketchsgd_bench_shards on the workers' host with each shard's server started on
its host; prints its table and appends its JSON lines to --json. Needs root (ip netns, tc); exits
77 with a message otherwise. Namespaces are removed on every exit path.

    sudo .venv/bin/python benchmarks/bench_shards_links.py [--rate 100mbit] [--workers 64]
        [--shards 1,2,4,8] [--codecs 'dense;...'] [--dim 100000] [--json out.jsonl]
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

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)

    with Testbed(most + 1) as bed:  # hosts 0..S-1: the shards; host S: the workers
        atexit.register(bed.__exit__, None, None, None)
        bed.shape(BITS[args.rate] and args.rate, hosts=range(most))
        workers = most
        log(f"testbed: {most} server hosts at {args.rate}, {args.workers} workers on host {workers} (unshaped)")
        ip = shutil.which("ip")
        tag = bed.hosts[0][:-1]  # the hosts are TAG0, TAG1, …
        cmd = [args.bench, "--workers", str(args.workers), "--shards", ",".join(map(str, args.shards)), "--codecs", args.codecs,
               "--dim", str(args.dim), "--rounds", str(args.rounds), "--launch", f"{ip} netns exec {tag}{{i}}",
               "--bind", f"tcp://198.18.0.{{i+1}}:{5600 + os.getpid() % 300}", "--label", args.rate,
               "--heartbeat-ms", "10000"]  # a round at S = 1 keeps a worker waiting for seconds
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
