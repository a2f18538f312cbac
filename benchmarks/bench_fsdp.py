#!/usr/bin/env python3
"""A codec's own work per training step under FSDP2 against the same codec under DDP: one
process, a group of one (gloo on the CPU, NCCL on a GPU), the demo's MLP (784-W-W-10). Under DDP
the codec runs in the communication hook on one bucket; under FSDP2 (fully_shard on each layer
and the root) in sketchsgd.fsdp's hook on each layer's gradient (compress_replicas: in a group
of one FSDP2 calls no reduce-scatter, so compress_reduce_scatter's path, which adds a copy into
parameter order and one out, cannot be timed alone). Timed: the wall time inside the hook calls
of a backward pass (DDP: compression_hook, through a wrapper; FSDP2: sketchsgd._hook.reduce_shard,
which both FSDP entry points drive, wrapped here for the measurement), medians over the steps
of interleaved rounds. Timing a whole backward with the codec less one without it mixes in
FSDP2's and DDP's own reductions, which differ.

    .venv/bin/python benchmarks/bench_fsdp.py [--threads 1] [--steps 30] [--rounds 3] [--json out.json]
                                              [--table]   (docs/data/tables/fsdp-work.json from the run)
"""
import argparse
import copy
import datetime
import json
import os
import socket
import statistics
import sys
import time

from cli import count, one_line  # noqa: E402

SPECS = ["dense", "powersgd:rank=4", "powersgd:rank=4,wire=fp16", "sketch:rows=1,cols=90000,k=18000,fetch=1",
         "topk:k=20000,wire=fp16,index=delta", "signsgd:ef=1", "qsgd:bits=4"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=count, default=1)
    ap.add_argument("--steps", type=count, default=30)
    ap.add_argument("--rounds", type=count, default=3, help="time every configuration in turn this many times")
    ap.add_argument("--width", type=count, default=1024)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--only", help="comma-separated substrings of the specs to time")
    ap.add_argument("--json")
    ap.add_argument("--table", action="store_true", help="write the docs' table data file (needs --json: its raw data)")
    args = ap.parse_args()
    if args.table and not args.json:
        ap.error("--table: give --json too (the table's raw data)")
    specs = [s for s in SPECS if not args.only or any(o in s for o in args.only.split(","))]
    if not specs:
        ap.error(f"--only {args.only}: no spec has any of these")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        ap.error(f"--json {args.json}: no such folder")
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    try:
        import sketchsgd._hook
        import sketchsgd.fsdp
        from sketchsgd.torch import CompressionState, compression_hook
    except ImportError as e:
        ap.error(f"the sketchsgd package does not load ({one_line(e)})")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this PyTorch sees no GPU")
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    w = args.width
    base = nn.Sequential(nn.Linear(784, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)).to(dev)
    mesh = init_device_mesh(dev.type, (1,))
    x, y = torch.randn(32, 784, device=dev), torch.randint(0, 10, (32,), device=dev)

    dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30  # one bucket, as FSDP2's layers are one unit each
    inside = {"ms": 0.0}

    def timed(fn):
        def call(*a, **k):
            sync()
            t = time.perf_counter()
            out = fn(*a, **k)
            if hasattr(out, "wait"):
                out.wait()
            sync()
            inside["ms"] += 1e3 * (time.perf_counter() - t)
            return out
        return call

    sketchsgd._hook.reduce_shard = timed(sketchsgd._hook.reduce_shard)
    ddp_hook = timed(compression_hook)

    def hook(state, bucket):  # DDP reads the hook's parameter names
        return ddp_hook(state, bucket)

    def ddp(spec):
        m = DDP(copy.deepcopy(base), bucket_cap_mb=1024)
        m.register_comm_hook(CompressionState(spec, start_iter=2), hook)
        return m

    def fsdp(spec):
        m = copy.deepcopy(base)
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        sketchsgd.fsdp.compress_replicas(m, CompressionState(spec))
        return m

    models = {(kind, spec): make(spec) for kind, make in (("ddp", ddp), ("fsdp", fsdp)) for spec in specs}
    times = {key: [] for key in models}
    for rnd in range(args.rounds):
        for key, m in models.items():
            for step in range((12 if rnd == 0 else 2) + args.steps):
                loss = nn.functional.cross_entropy(m(x), y)
                m.zero_grad()
                inside["ms"] = 0.0
                loss.backward()
                if step >= (12 if rnd == 0 else 2):
                    times[key].append(inside["ms"])
        print(f"round {rnd + 1}/{args.rounds} timed", flush=True)
    med = {key: statistics.median(t) for key, t in times.items()}
    results = []
    print(f"{'spec':45s} {'DDP ms':>8s} {'FSDP2 ms':>9s} {'FSDP2/DDP':>9s}")
    for spec in specs:
        d, f = med[("ddp", spec)], med[("fsdp", spec)]
        results.append({"spec": spec, "ddp_ms": d, "fsdp_ms": f, "ratio": f / d})
        print(f"{spec:45s} {d:8.2f} {f:9.2f} {f / d:9.2f}")
    dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "device": str(dev), "width": w, "rounds": args.rounds,
                       "steps": args.steps, "results": results}, f, indent=1)
    if args.table:
        import doc_tables
        rows = [[f"`{r['spec']}`", f"{r['ddp_ms']:.2f}", f"{r['fsdp_ms']:.2f}", f"{r['ratio']:.2f}"] for r in results]
        doc_tables.write("docs/data/tables/fsdp-work.json", "benchmarks/bench_fsdp.py " + " ".join(sys.argv[1:]),
                         time.strftime("%Y-%m-%d"), f"the 2-core dev machine, PyTorch {torch.__version__}, {dev.type}",
                         ["codec", "DDP: ms a step", "FSDP2: ms a step", "FSDP2 / DDP"], rows, data=args.json,
                         note=f"MLP 784-{w}-{w}-10, {args.threads} thread(s), {args.rounds} interleaved rounds of "
                              f"{args.steps} steps; median ms a step inside the hook calls (DDP: one bucket; "
                              "FSDP2: one call per layer, 3 layers).")


if __name__ == "__main__":
    main()
