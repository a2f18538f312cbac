#!/usr/bin/env python3
"""The DDP hooks' own work per step — compression, aggregation and decompression, without
communication (one process, a group of one: gloo on the CPU, NCCL on a GPU) — for sketchsgd's hook and PyTorch's
PowerSGD and fp16 hooks (specs torch:powersgd:rank=R, fp16), on the gradient of the demo's MLP (784-1024-1024-10), one bucket.

    .venv/bin/python benchmarks/bench_hook.py [--threads 1] [--steps 30] [--rounds 4]
                                              [--json out.json] [--png out.png]
    python3 benchmarks/bench_hook.py --device cuda      (a CUDA build of the package; times
                                                        with the device synchronised)

Every hook sees the same fresh gradients. Reports the median milliseconds per call and the
payload of one step. --rounds R times the hooks in turn R times (steps each, one state per
hook throughout), so a slow spell of a shared machine falls on all of them. Set --threads for both torch and the library's OpenMP (same for all hooks).
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time

# The command-line checks shared with examples/ (examples/cli.py).
from cli import count, one_line  # noqa: E402

HOOKS = [
    ("allreduce (no hook)", "none"),
    ("fp16_compress_hook", "fp16"),
    ("powerSGD rank 1", "torch:powersgd:rank=1"),
    ("powerSGD rank 2", "torch:powersgd:rank=2"),
    ("powerSGD rank 4", "torch:powersgd:rank=4"),
    ("powerSGD rank 8", "torch:powersgd:rank=8"),
    ("powerSGD rank 16", "torch:powersgd:rank=16"),
    ("sketchsgd PowerSGD rank 1", "powersgd:rank=1"),
    ("sketchsgd PowerSGD rank 2", "powersgd:rank=2"),
    ("sketchsgd PowerSGD rank 4", "powersgd:rank=4"),
    ("sketchsgd PowerSGD rank 8", "powersgd:rank=8"),
    ("sketchsgd PowerSGD rank 16", "powersgd:rank=16"),
    ("sketchsgd PowerSGD rank 4, fp16 wire", "powersgd:rank=4,wire=fp16"),
    ("sketchsgd PowerSGD rank 4, bf16 wire", "powersgd:rank=4,wire=bf16"),
    ("sketchsgd PowerSGD rank 4, int8 wire", "powersgd:rank=4,wire=int8"),
    ("sketchsgd PowerSGD rank 16, int8 wire", "powersgd:rank=16,wire=int8"),
    ("sketchsgd FetchSGD", "sketch:rows=1,cols=90000,k=18000,fetch=1"),
    ("sketchsgd sketch p2", "sketch:rows=1,cols=60000,k=12000,p2=2"),
    ("sketchsgd topk", "topk:k=20000,momentum=0.9"),
    ("sketchsgd EF-signSGD", "signsgd:ef=1,momentum=0.9"),
    ("sketchsgd dense", "dense"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=count, default=1)
    ap.add_argument("--steps", type=count, default=30)
    ap.add_argument("--python", default="build/default/python", help="where the sketchsgd package is")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--width", type=count, default=1024, help="hidden width of the MLP (the demo's: 1024)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="the model's and so the bucket's precision (sketchsgd widens half buckets)")
    ap.add_argument("--rounds", type=count, default=1, help="time all hooks in turn this many times")
    ap.add_argument("--only", help="comma-separated substrings: time just the hooks whose spec has one")
    ap.add_argument("--json")
    ap.add_argument("--profile", help="also profile 20 steps of each hook (torch.profiler) into this text file: "
                    "where a step's host time goes (launches, synchronisations, copies)")
    ap.add_argument("--png", help="also draw the medians as bars here (needs matplotlib)")
    args = ap.parse_args()
    if args.png:  # before minutes of timing, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("--png needs matplotlib (the project environment has it: scripts/venv.sh)")
    if args.only and not any(o in h for _, h in HOOKS for o in args.only.split(",")):
        ap.error(f"--only {args.only}: no hook's spec has any of these")
    for name in ("json", "profile", "png"):
        path = getattr(args, name)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            ap.error(f"--{name} {path}: no such folder {os.path.dirname(os.path.abspath(path))}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # torch's and our matrix products alike
    sys.path.insert(0, os.path.abspath(args.python))
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    try:
        from sketchsgd.torch import CompressionState, FlatBucket, compression_hook
    except ImportError as e:
        ap.error(f"--python {args.python}: the sketchsgd package does not load ({one_line(e)})")

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda: this PyTorch sees no GPU")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(784, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)).to(
        dev, getattr(torch, args.dtype))
    params = list(model.parameters())
    grads = [(torch.randn(sum(p.numel() for p in params), generator=torch.Generator().manual_seed(s)) * 0.01).to(dev)
             for s in range(4)]
    results = []
    hooks = [(l, h) for l, h in HOOKS if not args.only or any(o in h for o in args.only.split(","))]
    setups = {h: make(h, params, psgd, default_hooks, CompressionState, compression_hook, FlatBucket)
              for _, h in hooks}
    times = {h: [] for _, h in hooks}
    counted = {"bytes": 0}
    reduce = dist.all_reduce

    def counting(t, *a, **k):
        counted["bytes"] += t.numel() * t.element_size()
        return reduce(t, *a, **k)

    dist.all_reduce = counting
    for rnd in range(args.rounds):
        for label, hook in hooks:
            state, fn, bucket = setups[hook]
            warm = 12 if rnd == 0 else 2
            for step in range(warm + args.steps):
                bucket.buffer().copy_(grads[step % len(grads)])
                counted["bytes"] = 0
                sync()
                t = time.perf_counter()
                fut = fn(state, bucket)
                fut.wait()
                sync()
                if step >= warm:
                    times[hook].append(1e3 * (time.perf_counter() - t))
            if rnd == args.rounds - 1:
                t = times[hook]
                r = {"hook": label, "spec": hook, "ms_median": statistics.median(t), "ms_min": min(t),
                     "payload_bytes": counted["bytes"] if state is None or not hasattr(state, "stats")
                     else state.stats()["last_payload_bytes"]}
                results.append(r)
                print(f"{label:27s} {r['ms_median']:8.2f} ms/step (min {r['ms_min']:.2f})  "
                      f"payload {r['payload_bytes']:>10,} B", flush=True)
    if args.profile:
        with open(args.profile, "w") as out:
            for label, hook in hooks:
                state, fn, bucket = setups[hook]
                acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
                with torch.profiler.profile(activities=acts) as prof:
                    for step in range(20):
                        bucket.buffer().copy_(grads[step % len(grads)])
                        sync()
                        fn(state, bucket).wait()
                        sync()
                out.write(f"==== {label} ({hook}): 20 steps\n")
                out.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
        print(f"profiles: {args.profile}")
    dist.all_reduce = reduce
    dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "device": str(dev), "width": w, "rounds": args.rounds,
                       "dtype": args.dtype,
                       "gpu": torch.cuda.get_device_name(0) if cuda else None, "results": results}, f, indent=1)
    if args.png:
        draw(results, args.png, f"DDP hooks' own work per step: MLP 784-{w}-{w}-10 (d = {sum(p.numel() for p in params):,}, "
             f"{args.dtype})\n"
             f"{dev.type}, {args.threads} thread(s), {args.rounds} round(s) of {args.steps} steps")


def draw(results, path, title):
    """Horizontal bars: median ms per step of every hook, its minimum as a tick."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [r["hook"] for r in results][::-1]
    med = [r["ms_median"] for r in results][::-1]
    low = [r["ms_min"] for r in results][::-1]
    colors = ["tab:orange" if l.startswith("sketchsgd") else "tab:blue" for l in labels]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(labels) + 1.2))
    ax.barh(range(len(labels)), med, color=colors)
    ax.plot(low, range(len(labels)), "k|", markersize=10, label="min")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("ms per step (median; tick: min)  —  blue: PyTorch, orange: sketchsgd")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


def make(hook, params, psgd, default_hooks, CompressionState, compression_hook, FlatBucket):
    """(state, hook function, bucket) of one spec; every hook has its own bucket and state."""
    if hook == "none":
        state, fn = None, default_hooks.allreduce_hook
    elif hook == "fp16":
        state, fn = None, default_hooks.fp16_compress_hook
    elif hook.startswith("torch:powersgd"):
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(hook.split("=")[1]),
                                   start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=True,
                                   warm_start=True)
        fn = psgd.powerSGD_hook
    else:
        state, fn = CompressionState(hook, start_iter=2), compression_hook
    return state, fn, FlatBucket(0, params)


if __name__ == "__main__":
    main()
