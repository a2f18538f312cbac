#!/usr/bin/env python3
"""Where a gathered codec's round goes, phase by phase, through the Python API on one thread: W
workers' encode (each its own codec and state), the padding a hook's all-gather needs, the
aggregator's add of the W messages and its finish, and one worker's apply of the update. No
collectives: the cost a DDP rank pays for the codec itself. --python points at another build of
the package, to compare two builds in alternating runs.

    .venv/bin/python benchmarks/bench_codec_phases.py --spec topk:k=20000,momentum=0.9 --workers 4
    .venv/bin/python benchmarks/bench_codec_phases.py --python /tmp/before/build/python --json before.json
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from cli import count, one_line  # noqa: E402  (the command-line checks shared with examples/)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="topk:k=20000,momentum=0.9")
    ap.add_argument("--workers", type=count, default=4)
    ap.add_argument("--dim", type=count, default=1863690, help="default: the demo's MLP")
    ap.add_argument("--rounds", type=count, default=30, help="timed rounds (after 2 warm-up rounds)")
    ap.add_argument("--python", default=os.path.join(ROOT, "build/default/python"), help="where the sketchsgd package is")
    ap.add_argument("--json", help="write the medians here")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.python))
    import torch
    try:
        import sketchsgd
    except ImportError as e:
        ap.error(f"--python {args.python}: the sketchsgd package does not load ({one_line(e)})")
    torch.set_num_threads(1)
    try:
        codecs = [sketchsgd.Compressor(args.spec, args.dim) for _ in range(args.workers)]
    except (sketchsgd.Error, ValueError) as e:
        ap.error(f"--spec {args.spec}: {one_line(e)}")
    if codecs[0].sum_size("gradient") > 0:
        ap.error(f"--spec {args.spec}: sums its payload (an all-reduce, no messages to gather): this benchmark is "
                 "for gathered codecs")
    agg = codecs[0].make_aggregator(args.workers)
    times = {k: [] for k in ("encode", "pad", "add", "finish", "apply")}
    step = torch.empty(args.dim)
    g = torch.Generator().manual_seed(1)
    for it in range(args.rounds + 2):
        grads = [torch.randn(args.dim, generator=g) for _ in range(args.workers)]
        t = time.perf_counter()
        msgs = [c.encode(x, it, r) for r, (c, x) in enumerate(zip(codecs, grads))]
        t1 = time.perf_counter()
        longest = max(len(m) for m in msgs)  # what the hook does before its all-gather
        padded = []
        for m in msgs:
            p = torch.zeros(longest, dtype=torch.uint8)
            p[:len(m)] = torch.frombuffer(bytearray(m), dtype=torch.uint8)
            padded.append(p)
        t2 = time.perf_counter()
        for m, p in zip(msgs, padded):
            agg.add(p[:len(m)].numpy())
        t3 = time.perf_counter()
        update = agg.finish()
        t4 = time.perf_counter()
        codecs[0].apply(update, step)
        t5 = time.perf_counter()
        if it >= 2:
            for k, v in zip(times, (t1 - t, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                times[k].append(v * 1e3)
        print(f"\rround {it + 1}/{args.rounds + 2}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    out = {"spec": args.spec, "workers": args.workers, "dim": args.dim, "rounds": args.rounds,
           "ms_median": {k: statistics.median(v) for k, v in times.items()}}
    out["ms_median"]["encode"] /= args.workers  # per worker: what one rank pays
    print(f"{args.spec}, W = {args.workers}, d = {args.dim}: median ms per round, one thread")
    for k, v in out["ms_median"].items():
        print(f"  {k:7s} {v:7.2f}" + ("  (per worker)" if k == "encode" else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
