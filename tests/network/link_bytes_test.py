#!/usr/bin/env python3
"""stats()'s link bytes against what each rank's network interface counts: W DDP ranks of
examples/ddp_train.py's MLP, one a host in network namespaces on a switch (unshaped veth links),
a codec of each family; every rank's steady steps' bytes sent and received within 10 % of the
ring model's, which counts no header: with headers, or, where many small messages make them
weigh more (PowerSGD's factors at W = 8: +15 % with them), without them (66 bytes a packet the
interface counted: Ethernet, IPv4, TCP with timestamps). Exit 77 (skipped) without root or
network namespaces.

    link_bytes_test.py [--workers 4,8] [--hooks 'none;…'] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from bench_network import Testbed, wait_all  # noqa: E402
from cli import positive  # noqa: E402  (the command-line checks shared with examples/)

# One of each family: dense (DDP's own fp32 all-reduce), low-rank and sketched sums, sparse and
# quantised gathers.
HOOKS = ["none", "sketchsgd:powersgd:rank=4", "sketch:rows=1,cols=90000,k=18000,fetch=1",
         "topk:k=20000,momentum=0.9", "sparseloco:chunk=4096,k=64", "qsgd:bits=4"]
TOLERANCE = 0.10
HEADERS = 14 + 20 + 32  # bytes a packet: Ethernet, IPv4, TCP with its timestamp option


def run(bed, hook, W, tmp, timeout):
    out = os.path.join(tmp, "ddp.json")
    master = f"{bed.address(0)}:{29500 + os.getpid() % 1000}"
    cmd = [sys.executable, os.path.join(ROOT, "examples", "ddp_train.py"), "--hook", hook, "--workers", str(W),
           "--epochs", "1", "--start-iter", "3", "--max-steps", "15", "--progress", "100000", "--eval-items", "100",
           "--master", master, "--json", out]
    with open(os.path.join(tmp, "run.log"), "w") as logf:
        procs = [bed.start(r, cmd + ["--rank", str(r), "--interface-bytes", bed.host_dev[r]], logf,
                           env=dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=bed.host_dev[r]))
                 for r in range(W)]
        codes = wait_all(procs, timeout)
    bed.stop()
    if codes != [0] * W or not os.path.exists(out):
        with open(os.path.join(tmp, "run.log")) as f:
            sys.exit(f"FAIL: {hook} at W = {W}: exit codes {codes}; the log's end:\n{f.read()[-1500:]}")
    with open(out) as f:
        r = json.load(f)
    os.remove(out)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="4,8", help="comma-separated W")
    ap.add_argument("--hooks", help="hooks separated by ';' (default: a codec of each family)")
    ap.add_argument("--timeout", type=positive, default=300, help="seconds a job at most")
    ap.add_argument("--json", help="write every rank's figures here")
    args = ap.parse_args()
    try:
        worlds = [int(w) for w in args.workers.split(",")]
        assert all(w >= 2 for w in worlds)
    except (ValueError, AssertionError):
        ap.error(f"--workers {args.workers!r}: comma-separated ints ≥ 2")
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        print("SKIP: needs root and ip netns", file=sys.stderr)
        sys.exit(77)
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for W in worlds:
            hooks = args.hooks.split(";") if args.hooks else HOOKS
            with Testbed(W) as bed:
                for hook in hooks:
                    r = run(bed, hook, W, tmp, args.timeout)
                    for rank, nic in enumerate(r["interface_bytes_per_step"]):
                        model = nic["model"]  # sent + received, the ring model's
                        assert model > 0, (hook, W, rank, nic)
                        # The ring forms send what they receive: half the model each way.
                        for way in ("tx", "rx"):
                            off = nic[way] / (model / 2) - 1
                            bare = (nic[way] - HEADERS * nic[way + "_packets"]) / (model / 2) - 1
                            worst = max(worst, min(abs(off), abs(bare)))
                            rows.append({"workers": W, "hook": hook, "rank": rank, "way": way, "interface": nic[way],
                                         "packets": nic[way + "_packets"], "model": model / 2, "off": off,
                                         "off_without_headers": bare})
                    mine = [x for x in rows if x["hook"] == hook and x["workers"] == W]
                    off = [x["off"] for x in mine]
                    bare = [x["off_without_headers"] for x in mine]
                    print(f"W = {W}, {hook}: model {r['steady_link_bytes_per_round'] / 1e3:,.0f} kB a step per rank "
                          f"(sent + received), interfaces {min(off):+.1%} .. {max(off):+.1%} "
                          f"({min(bare):+.1%} .. {max(bare):+.1%} without headers); "
                          f"a bf16 all-reduce carries {r['steady_link_ratio_bf16']:.2f}x that "
                          f"(payload ratio {r['steady_ratio']:.1f}x against fp32)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [x for x in rows if abs(x["off"]) > TOLERANCE and abs(x["off_without_headers"]) > TOLERANCE]
    if bad:
        for x in bad:
            print(f"FAIL: W = {x['workers']}, {x['hook']}, rank {x['rank']} {x['way']}: interface {x['interface']:,.0f} "
                  f"B a step in {x['packets']:,.0f} packets, model {x['model']:,.0f} ({x['off']:+.1%}; "
                  f"{x['off_without_headers']:+.1%} without headers)")
        sys.exit(1)
    print(f"every rank within {worst:.1%} of the ring model (tolerance {TOLERANCE:.0%})")


if __name__ == "__main__":
    main()
