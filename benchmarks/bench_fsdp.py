#!/usr/bin/env python3
"""A codec's own work per training step under FSDP against the same codec under DDP, the demo's
MLP (784-W-W-10), on the CPU (gloo) or a GPU (NCCL).

--ranks 1 (one process, a group of one): under DDP the codec runs in the communication hook on
one bucket; under FSDP2 (fully_shard on each layer and the root) in sketchsgd.fsdp's replica
hook on each layer's gradient (compress_replicas: in a group of one FSDP2 calls no
reduce-scatter, so compress_reduce_scatter's path cannot run).
--ranks W ≥ 2 --replicas R (W processes, R dividing W): HSDP, R replicas of W / R shards, the
replicas averaged by compress_replicas on each layer's shard (a replica group of R ranks;
fully_shard over the shard group), against DDP at W ranks. With R = W each shard group is one
rank: the hook gets each layer's whole gradient and does DDP's work on it.
--ranks W ≥ 2 (W processes): full sharding, FSDP2's compressed reduce-scatter
(compress_reduce_scatter: summable codecs on each layer's whole gradient, PowerSGD and dense
where FSDP2 lays it out and the sketch through a copy into parameter order, only this rank's
chunk of the mean computed; gathered codecs per destination, W chunks encoded and this rank's W
messages decoded) and FSDP1's (compress_fsdp1, FULL_SHARD, each layer an instance), against DDP
at W ranks (one bucket: gathered codecs decode W whole messages there).

Timed, on every rank: the wall time inside the calls that FSDP and DDP make into sketchsgd in a
backward pass (DDP: compression_hook; FSDP2: the replica hook or the custom reduce-scatter;
FSDP1: the communication hook), less the time inside the collectives those calls issue (each
made blocking and timed): what is left is the codec's and the integration's own work. The time
inside collectives includes waiting for the slowest rank, which would otherwise count the other
ranks' work against this one. Of that, the codec's phases alone: the time inside the C++ round's
start, next and finish (sketchsgd._core.Round, wrapped here). Medians over the steps of
interleaved rounds, then the mean over the ranks.

--isolated (with --ranks W ≥ 2): the C++ round's phases of a layout codec (PowerSGD) alone, in
one process, outside DDP and FSDP: rank 0's round with the other ranks' sums taken to be its own
(its payloads times W), for DDP's one unit of the MLP's tensors against FSDP2's units (one a
layer, its W chunks as FSDP2 lays them, blocks=W, this rank's chunk of the step written out).
What running inside a backward pass adds to the phases is then the full runs' difference.
--cold: 64 MB written before each phase of each unit, outside the timing, so that every phase
finds the caches as a backward pass leaves them (FSDP's own work between its calls; autograd's).

    .venv/bin/python benchmarks/bench_fsdp.py [--ranks 1] [--threads 1] [--steps 30] [--rounds 3]
                                              [--json out.json] [--table]   (the docs' table from the run)
    .venv/bin/python benchmarks/bench_fsdp.py --ranks 2 --isolated [--cold] [--only powersgd] [--json out.json] [--table]
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
    ap.add_argument("--ranks", type=count, default=1, help="processes: 1 (FSDP2's replica hook) or W ≥ 2 (full "
                    "sharding over W ranks: FSDP2's and FSDP1's compressed reduce-scatter)")
    ap.add_argument("--replicas", type=count, help="with --ranks W: HSDP, R replicas of W / R shards (FSDP2's "
                    "replica hook, compress_replicas) against DDP at W ranks")
    ap.add_argument("--threads", type=count, default=1, help="threads a rank")
    ap.add_argument("--steps", type=count, default=30)
    ap.add_argument("--rounds", type=count, default=3, help="time every configuration in turn this many times")
    ap.add_argument("--width", type=count, default=1024)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--only", help="comma-separated substrings of the specs to time")
    ap.add_argument("--timeout", type=count, default=1800, help="seconds before the ranks are stopped")
    ap.add_argument("--json")
    ap.add_argument("--table", action="store_true", help="write the docs' table data file (needs --json: its raw data)")
    ap.add_argument("--isolated", action="store_true", help="a layout codec's C++ phases alone, outside DDP and FSDP, "
                    "in DDP's units and FSDP2's (needs --ranks W ≥ 2, --device cpu)")
    ap.add_argument("--cold", action="store_true", help="with --isolated: 64 MB written before each phase of each "
                    "unit, outside the timing (the caches as a backward pass leaves them)")
    args = ap.parse_args()
    if args.table and not args.json:
        ap.error("--table: give --json too (the table's raw data)")
    specs = [s for s in SPECS if s.startswith("powersgd")] if args.isolated else SPECS
    args.specs = [s for s in specs if not args.only or any(o in s for o in args.only.split(","))]
    if not args.specs:
        ap.error(f"--only {args.only}: no spec{' of a layout codec' if args.isolated else ''} has any of these")
    if args.cold and not args.isolated:
        ap.error("--cold: with --isolated")
    if args.replicas and (args.ranks < 2 or args.replicas < 2 or args.ranks % args.replicas or args.isolated):
        ap.error(f"--replicas {args.replicas}: give --ranks W ≥ 2 that it divides, R ≥ 2, and no --isolated")
    if args.isolated and (args.ranks < 2 or args.device != "cpu"):
        ap.error("--isolated: give --ranks W ≥ 2 (the units' chunks) and the CPU")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        ap.error(f"--json {args.json}: no such folder")
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import torch
    try:
        import sketchsgd.fsdp  # noqa: F401
    except ImportError as e:
        ap.error(f"the sketchsgd package does not load ({one_line(e)})")
    if args.device == "cuda" and torch.cuda.device_count() < (1 if args.ranks == 1 else args.ranks):
        ap.error(f"--device cuda --ranks {args.ranks}: this PyTorch sees {torch.cuda.device_count()} GPU(s), one a "
                 "rank is needed")
    if args.isolated:
        return isolated(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.ranks == 1:
        ranks = [rank(0, args, port, None)]
    else:
        ranks = spawn(args, port)
    kinds = ["ddp"] + (["fsdp2"] if args.ranks == 1 or args.replicas else ["fsdp2", "fsdp1"])
    results = []
    print(f"{'spec':45s} " + " ".join(f"{k + ' ms':>9s}" for k in kinds) + " " +
          " ".join(f"{k + '/ddp':>10s}" for k in kinds[1:]))
    for spec in args.specs:
        ms = {k: statistics.mean(r["own"][f"{k} {spec}"] for r in ranks) for k in kinds}
        phases = {k: statistics.mean(r["phases"][f"{k} {spec}"] for r in ranks) for k in kinds}
        row = {"spec": spec, **{f"{k}_ms": ms[k] for k in kinds}, **{f"{k}_phases_ms": phases[k] for k in kinds},
               "per_rank": {k: [r["own"][f"{k} {spec}"] for r in ranks] for k in kinds}}
        for k in kinds[1:]:
            row[f"{k}_ratio"] = ms[k] / ms["ddp"]
        results.append(row)
        print(f"{spec:45s} " + " ".join(f"{ms[k]:9.2f}" for k in kinds) + " " +
              " ".join(f"{ms[k] / ms['ddp']:10.2f}" for k in kinds[1:]) + "   phases " +
              " / ".join(f"{phases[k]:.2f}" for k in kinds))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "replicas": args.replicas, "threads": args.threads, "device": args.device, "width": args.width,
                       "rounds": args.rounds, "steps": args.steps, "results": results}, f, indent=1)
    if args.table:
        table(args, results)


def table(args, results):
    import torch
    import doc_tables
    w = args.width
    if args.ranks == 1:
        name = "fsdp-work"
        head = ["codec", "DDP: ms a step", "FSDP2: ms a step", "FSDP2 / DDP", "codec phases, DDP / FSDP2 (ms)"]
        rows = [[f"`{r['spec']}`", f"{r['ddp_ms']:.2f}", f"{r['fsdp2_ms']:.2f}", f"{r['fsdp2_ratio']:.2f}",
                 f"{r['ddp_phases_ms']:.2f} / {r['fsdp2_phases_ms']:.2f}"] for r in results]
        how = "one process (a group of one); DDP: one bucket; FSDP2: compress_replicas, one call per layer (3)"
    elif args.replicas:
        R, S = args.replicas, args.ranks // args.replicas
        name = f"fsdp-work-hsdp-{R}x{S}" + ("" if w == 1024 else f"-{w}")
        head = ["codec", "DDP: ms a step", f"HSDP {R} × {S}: ms a step", "HSDP / DDP", "codec phases, DDP / HSDP (ms)"]
        rows = [[f"`{r['spec']}`", f"{r['ddp_ms']:.2f}", f"{r['fsdp2_ms']:.2f}", f"{r['fsdp2_ratio']:.2f}",
                 f"{r['ddp_phases_ms']:.2f} / {r['fsdp2_phases_ms']:.2f}"] for r in results]
        how = (f"{args.ranks} processes; DDP: one bucket; FSDP2: HSDP, {R} replicas of {S} shard(s), compress_replicas "
               f"over each replica group of {R}, one call per layer (3)" +
               (": a shard group of one, so each call holds the layer's whole gradient" if S == 1 else ""))
    else:
        name = "fsdp-work-ranks" + ("" if w == 1024 else f"-{w}")
        head = ["codec", "DDP: ms a step", "FSDP2 full: ms a step", "FSDP2 / DDP", "FSDP1: ms a step", "FSDP1 / DDP",
                "codec phases, DDP / FSDP2 / FSDP1 (ms)"]
        rows = [[f"`{r['spec']}`", f"{r['ddp_ms']:.2f}", f"{r['fsdp2_ms']:.2f}", f"{r['fsdp2_ratio']:.2f}",
                 f"{r['fsdp1_ms']:.2f}", f"{r['fsdp1_ratio']:.2f}",
                 f"{r['ddp_phases_ms']:.2f} / {r['fsdp2_phases_ms']:.2f} / {r['fsdp1_phases_ms']:.2f}"]
                for r in results]
        how = (f"{args.ranks} processes; DDP: one bucket; FSDP2: compress_reduce_scatter, FSDP1: compress_fsdp1, "
               "full sharding, each layer a module (3) and the root")
    doc_tables.write(f"docs/data/tables/{name}.json", "benchmarks/bench_fsdp.py " + " ".join(sys.argv[1:]),
                     time.strftime("%Y-%m-%d"), f"the 2-core dev machine, PyTorch {torch.__version__}, {args.device}",
                     head, rows, data=args.json,
                     note=f"MLP 784-{w}-{w}-10, {args.threads} thread(s) a rank, {args.rounds} interleaved rounds of "
                          f"{args.steps} steps; {how}. A rank's median ms a step inside the calls into sketchsgd less "
                          "the collectives they issue, the mean over the ranks; of which the codec's phases: inside the C++ "
                          "round's start, next and finish.")


def isolated(args):
    """--isolated: the phases' medians (ms a step) per spec, printed, and the json and table."""
    import torch
    from sketchsgd import _core
    from sketchsgd._compressor import Compressor
    torch.set_num_threads(args.threads)
    W, w = args.ranks, args.width
    layers = [[(w, 784), (w,)], [(w, w), (w,)], [(10, w), (10,)]]

    def unit(spec, shapes, blocks):
        c = Compressor(spec + (f",blocks={blocks}" if blocks > 1 else ""), layout=shapes)
        pay = torch.empty(_core.Round.payload_size(c._c, 0))
        ans = torch.empty(_core.Round.answer_size(c._c))
        r = _core.Round(c._c, c.make_aggregator(W)._a, 0, 0, pay.data_ptr(), pay.numel(), ans.data_ptr(),
                        ans.numel())
        return {"codec": c, "round": r, "rooms": (pay, ans), "n": c.dim, "x": torch.empty(c.dim),
                "out": torch.empty(c.dim // W)}

    def units(kind, spec):
        if kind == "ddp":
            return [unit(spec, [s for layer in layers for s in layer], 1)]
        shard = [[(-(-s[0] // W), *s[1:]) for s in layer] for layer in layers]  # FSDP2 pads rows to W chunks
        return [unit(spec, chunk * W, W) for chunk in shard]

    junk = torch.empty(16 << 20) if args.cold else None  # 64 MB: more than the caches of a core

    def timed(phase):
        if junk is not None:
            junk.fill_(1.0)
        t = time.perf_counter()
        phase()
        return time.perf_counter() - t

    def step(us, kind):
        for u in us:
            u["x"].copy_(torch.randn(u["n"]))  # a new gradient, outside the timing
        t = 0.0
        for u in us:
            r, n, (pay, ans) = u["round"], u["n"], u["rooms"]
            t += timed(lambda: r.start(u["x"].data_ptr(), n, [(0, n)], [], 0))
            pay.mul_(W)  # the other ranks' payloads taken to be this one's
            t += timed(lambda: r.next([]))
            ans.mul_(W)
            if kind == "ddp":
                t += timed(lambda: r.finish([], u["x"].data_ptr(), n, [(0, n)], []))
            else:
                t += timed(lambda: r.finish_window([], u["out"].data_ptr(), 0, n // W, n, [(0, n)], []))
        return 1e3 * t

    results = []
    for spec in args.specs:
        made = {kind: units(kind, spec) for kind in ("ddp", "fsdp2")}
        times = {kind: [] for kind in made}
        for _ in range(args.rounds):
            for kind in made:
                for i in range(5 + args.steps):
                    t = step(made[kind], kind)
                    if i >= 5:
                        times[kind].append(t)
        ms = {kind: statistics.median(t) for kind, t in times.items()}
        results.append({"spec": spec, "ddp_ms": ms["ddp"], "fsdp2_ms": ms["fsdp2"]})
        print(f"{spec:30s} DDP's unit {ms['ddp']:.2f} ms, FSDP2's {len(made['fsdp2'])} units {ms['fsdp2']:.2f} ms "
              f"({ms['fsdp2'] / ms['ddp']:.2f}×)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": W, "threads": args.threads, "width": w, "rounds": args.rounds, "steps": args.steps,
                       "isolated": True, "cold": args.cold, "results": results}, f, indent=1)
    if args.table:
        import doc_tables
        head = ["codec", "DDP's unit: ms a step", "FSDP2's units: ms a step", "FSDP2 / DDP"]
        rows = [[f"`{r['spec']}`", f"{r['ddp_ms']:.2f}", f"{r['fsdp2_ms']:.2f}", f"{r['fsdp2_ms'] / r['ddp_ms']:.2f}"]
                for r in results]
        doc_tables.write(f"docs/data/tables/fsdp-phases{'' if w == 1024 else f'-{w}'}{'-cold' if args.cold else ''}.json",
                         "benchmarks/bench_fsdp.py " + " ".join(sys.argv[1:]), time.strftime("%Y-%m-%d"),
                         f"the 2-core dev machine, PyTorch {torch.__version__}, cpu", head, rows, data=args.json,
                         note=f"MLP 784-{w}-{w}-10, {args.threads} thread(s), one process: rank 0 of {W}'s C++ round "
                              "(start, next, finish) with the other ranks' sums taken to be its own; DDP: one unit of "
                              "the six tensors, its step written whole; FSDP2: a unit a layer in FSDP2's layout "
                              f"(blocks={W}), this rank's chunk of the step written out (finish_window). Medians of "
                              f"{args.rounds} interleaved rounds of {args.steps} steps"
                              + ("; 64 MB written before each phase of each unit, outside the timing (cold caches)."
                                 if args.cold else "."))


def spawn(args, port):
    """--ranks W: W processes; every rank's medians, in rank order."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank, args=(r, args, port, queue)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    got, deadline = {}, time.time() + args.timeout
    while len(got) < args.ranks and time.time() < deadline:
        try:
            r, medians = queue.get(timeout=5)
            got[r] = medians
        except Exception:  # queue.Empty: is every rank still alive?
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:  # over (or failed): no rank may linger
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()
    if len(got) < args.ranks:
        sys.exit("bench_fsdp: a rank failed" if time.time() < deadline else
                 f"bench_fsdp: no result within --timeout {args.timeout} s")
    return [got[r] for r in range(args.ranks)]


def rank(me, args, port, queue):
    """One rank's medians, {"own" | "phases": {"<kind> <spec>": ms a step}}; put on queue with its rank
    (W ≥ 2) or returned."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy, fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    import sketchsgd._comm
    import sketchsgd._core
    import sketchsgd._hook
    import sketchsgd.fsdp
    from sketchsgd.torch import CompressionState, compression_hook

    W = args.ranks
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device, me) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=me, world_size=W, timeout=datetime.timedelta(seconds=120))
    clock = {"inside": 0.0, "comm": 0.0, "phases": 0.0, "depth": 0}

    def entry(fn):  # a call FSDP or DDP makes into sketchsgd: its wall time, the result complete
        def call(*a, **k):  # (the outermost only: the reduce-scatters call the replica hook's code)
            clock["depth"] += 1
            sync()
            t = time.perf_counter()
            try:
                out = fn(*a, **k)
                if hasattr(out, "wait"):
                    out.wait()
                sync()
            finally:
                clock["depth"] -= 1
            if not clock["depth"]:
                clock["inside"] += time.perf_counter() - t
            return out
        return call

    def collective(fn):  # a collective sketchsgd issues, made blocking: its wall time, waits included
        def call(*a, **k):
            sync()
            t = time.perf_counter()
            work = fn(*a, **k)
            if work is not None:
                work.wait()
            sync()
            clock["comm"] += time.perf_counter() - t
            return work
        return call

    def phase(fn):  # a phase of the C++ round: the codec's own work
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                clock["phases"] += time.perf_counter() - t
        return call

    for name in ("all_reduce", "all_gather", "all_to_all", "reduce_scatter", "broadcast"):
        setattr(sketchsgd._comm._Dist, name, collective(getattr(sketchsgd._comm._Dist, name)))
    for name in ("start", "next", "finish", "finish_window"):
        setattr(sketchsgd._core.Round, name, phase(getattr(sketchsgd._core.Round, name)))
    sketchsgd._hook.reduce_shard = entry(sketchsgd._hook.reduce_shard)
    sketchsgd.fsdp.fsdp2._ReduceScatter.__call__ = entry(sketchsgd.fsdp.fsdp2._ReduceScatter.__call__)
    sketchsgd.fsdp.fsdp1._Fsdp1Unit.__call__ = entry(sketchsgd.fsdp.fsdp1._Fsdp1Unit.__call__)
    ddp_hook = entry(compression_hook)

    def hook(state, bucket):  # DDP reads the hook's parameter names
        return ddp_hook(state, bucket)

    torch.manual_seed(0)
    w = args.width
    base = nn.Sequential(nn.Linear(784, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)).to(dev)
    R = args.replicas
    mesh = (init_device_mesh(dev.type, (R, W // R), mesh_dim_names=("replicate", "shard")) if R else
            init_device_mesh(dev.type, (W,)))
    gen = torch.Generator().manual_seed(100 + me)  # each rank its own batch, as in training
    x = torch.randn(32, 784, generator=gen).to(dev)
    y = torch.randint(0, 10, (32,), generator=gen).to(dev)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30  # one bucket, as FSDP's layers are one unit each

    def ddp(spec):
        m = DDP(copy.deepcopy(base), device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=1024)
        m.register_comm_hook(CompressionState(spec, start_iter=2), hook)
        return m

    def fsdp2(spec):
        m = copy.deepcopy(base)
        shards = mesh["shard"] if R else mesh
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=shards)
        fully_shard(m, mesh=shards)
        if R:
            sketchsgd.fsdp.compress_replicas(
                m, CompressionState(spec, process_group=mesh["replicate"].get_group()))
        elif W == 1:
            sketchsgd.fsdp.compress_replicas(m, CompressionState(spec))
        else:
            sketchsgd.fsdp.compress_reduce_scatter(m, CompressionState(spec))
        return m

    def fsdp1(spec):
        m = copy.deepcopy(base)
        how = dict(sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=dev)
        for i, layer in enumerate(m):
            if isinstance(layer, nn.Linear):
                m[i] = FSDP(layer, **how)
        m = FSDP(m, **how)
        sketchsgd.fsdp.compress_fsdp1(m, CompressionState(spec))
        return m

    makers = {"ddp": ddp, "fsdp2": fsdp2} if W == 1 or R else {"ddp": ddp, "fsdp2": fsdp2, "fsdp1": fsdp1}
    models = {f"{kind} {spec}": make(spec) for kind, make in makers.items() for spec in args.specs}
    times = {key: [] for key in models}
    phases = {key: [] for key in models}
    for rnd in range(args.rounds):
        for key, m in models.items():
            skip = 12 if rnd == 0 else 2
            for step in range(skip + args.steps):
                loss = nn.functional.cross_entropy(m(x), y)
                m.zero_grad()
                clock["inside"] = clock["comm"] = clock["phases"] = 0.0
                loss.backward()
                if step >= skip:
                    times[key].append(1e3 * (clock["inside"] - clock["comm"]))
                    phases[key].append(1e3 * clock["phases"])
        if me == 0:
            print(f"round {rnd + 1}/{args.rounds} timed", flush=True)
    medians = {"own": {key: statistics.median(t) for key, t in times.items()},
               "phases": {key: statistics.median(t) for key, t in phases.items()}}
    dist.destroy_process_group()
    if queue is None:
        return medians
    queue.put((me, medians))


if __name__ == "__main__":
    main()
