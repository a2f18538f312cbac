#!/usr/bin/env python3
"""A training job under PyTorch DDP with a gradient-compression hook: sketchsgd's codecs next to
PyTorch's own (fp16, PowerSGD) on the same job.

    .venv/bin/python examples/ddp_train.py --hook "sketch:rows=1,cols=90000,k=18000,fetch=1"
    .venv/bin/python examples/ddp_train.py --hook powersgd:rank=4
    .venv/bin/python examples/ddp_train.py --workload transformer --hook sketchsgd:powersgd:rank=4,wire=fp16
    .venv/bin/python examples/ddp_train.py --workload resnet8 --dtype bf16 --hook none --epochs 1

W worker processes on 127.0.0.1 (gloo; on CUDA, NCCL when every worker has its own GPU), or one
rank per process with --rank and --master (ranks on other hosts or network namespaces). The
workloads (examples/workloads.py): the demo's MLP on Fashion-MNIST (default), a CNN, a ResNet
(resnet8, resnet20) and a byte-level transformer language model on Python's documentation; each
has its optimiser and defaults (--lr, --momentum, --batch per worker override them). Worker r
trains on items r, r+W, … reshuffled every epoch. --dtype bf16|fp16 trains the model in half
precision (half-precision DDP buckets). Link bytes = what one worker's link carries a step, sent +
received, by the ring algorithms (sketchsgd.torch.link_bytes; an all-gather's rank receives and
forwards the W − 1 others' messages), against a bf16 and an fp32 all-reduce of the gradient at
the same W; --interface-bytes DEV also counts what the rank's interface carried (one rank a
network namespace: tests/network/link_bytes_test.py). Payload = bytes one worker hands to a
round's collectives (an all-reduce of n floats counts 4n bytes whatever the algorithm, an
all-gather the worker's own part), kept beside them: no traffic figure. The same accounting for
every hook. --simulate W holds the workload's data once for every simulated worker and refuses,
before it starts, a group that would not fit in memory.

--fsdp full|hsdp shards the model with FSDP2 instead (fully_shard on each transformer block, or
each top-level layer, and the root): full over every rank, --hook compressing the reduce-scatter
(sketchsgd.fsdp.compress_reduce_scatter); hsdp as --replicas R replicas of W/R shards, --hook
compressing the replicas' all-reduce (compress_replicas). --hook none is FSDP2's own fp32
reduction, bf16 or fp16 its MixedPrecisionPolicy(reduce_dtype=...). Payload under FSDP: the
gradient bytes a rank sends over the links being compressed (full: its reduce-scatter input;
hsdp: its shard's all-reduce across the replicas; a codec's: its payload), not the parameter
all-gathers, which no hook changes. --fsdp fsdp1: FSDP1 (FullyShardedDataParallel, FULL_SHARD,
the same modules wrapped), --hook compressing its reduce-scatter through its communication hook
(sketchsgd.fsdp.compress_fsdp1).

Momentum: PyTorch's hooks average the gradient and SGD applies momentum after; sketchsgd codecs
with momentum of their own (momentum=…, or fetch=1) apply it before compressing (where the error
feedback needs it), so SGD's momentum is then 0.
"""

import argparse
import csv
import datetime
import json
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import workloads
from sketchsgd.torch import link_bytes
from cli import count, momentum, natural, nonnegative, one_line, positive

class Payload:
    """Counts what this worker hands to dist.all_reduce / all_gather (PyTorch's hooks call them),
    and what its link carries for them (sent + received, by sketchsgd's ring model)."""

    def __init__(self):
        self.bytes = self.link = 0
        self._reduce, self._gather = dist.all_reduce, dist.all_gather
        dist.all_reduce = self.all_reduce
        dist.all_gather = self.all_gather

    def all_reduce(self, t, *a, **k):
        self._count("all_reduce", t.numel() * t.element_size(), k.get("group"))
        return self._reduce(t, *a, **k)

    def all_gather(self, out, t, *a, **k):
        self._count("all_gather", t.numel() * t.element_size(), k.get("group"))
        return self._gather(out, t, *a, **k)

    def _count(self, kind, n, group):
        self.bytes += n
        self.link += sum(link_bytes(kind, n, dist.get_world_size(group)))

    def __call__(self):
        return self.bytes, self.link


def link_of(state):
    """(payload, link bytes) so far of a sketchsgd CompressionState or DiLoCo."""
    def counts():
        s = state.stats()
        return s["payload_bytes"], s["link_bytes"]
    return counts


def per_step(steps, payload, kind, world):
    """(payload, link bytes) so far of a reduction of `payload` bytes (`kind`) every step."""
    link = sum(link_bytes(kind, payload, world))
    return lambda: (steps["n"] * payload, steps["n"] * link)


class Interface:
    """The bytes a network interface of this rank's namespace sent and received over the steady
    steps (/sys/class/net/DEV/statistics: headers included), to hold stats()'s link bytes against;
    nothing without a device (--interface-bytes)."""

    def __init__(self, dev):
        self.dev, self.at = dev, None

    def _read(self):
        base = f"/sys/class/net/{self.dev}/statistics/"
        got = []
        for name in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets"):
            with open(base + name) as f:
                got.append(int(f.read()))
        return got

    def start(self):
        if self.dev:
            self.at = self._read()

    def stop(self, steps: int):
        """(bytes sent, received, packets sent, received) a step since start(), over `steps` steps."""
        if not self.dev or self.at is None or steps <= 0:
            return 0.0, 0.0, 0.0, 0.0
        return tuple((b - a) / steps for a, b in zip(self.at, self._read()))


def torch_powersgd_options(hook):
    """rank, start and min_rate of PyTorch's PowerSGD hook ("powersgd:rank=4"); anything else is
    refused (sketchsgd's options given to PyTorch's hook by the name both share)."""
    opts = dict(kv.split("=", 1) for kv in hook.partition(":")[2].split(",") if kv)
    unknown = set(opts) - {"rank", "start", "min_rate"}
    if unknown:
        raise ValueError(f"PyTorch's PowerSGD takes rank, start and min_rate, not {', '.join(sorted(unknown))}; "
                         f"sketchsgd's PowerSGD is sketchsgd:{hook}")
    return opts


def register(hook, ddp, args, dim, width=4):
    """Registers the hook; returns (a function giving the (payload, link) bytes so far, SGD momentum).
    width: bytes a gradient value has in the model's dtype (what DDP all-reduces without a hook)."""
    if hook == "none":
        steps = {"n": 0}
        return per_step(steps, dim * width, "all_reduce", dist.get_world_size()), args.momentum, steps
    if hook.startswith("torch:"):  # PyTorch's own hooks, by an explicit name
        hook = hook[len("torch:"):]
    elif hook.startswith("sketchsgd:"):  # a sketchsgd spec whose name PyTorch's hooks share
        return _ours(hook[len("sketchsgd:"):], ddp, args, dim)
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        counter = Payload()
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return counter, args.momentum, None
    wrapped = hook.startswith("fp16:powersgd")  # inside PyTorch's fp16_compress_wrapper: fp16 on the wire
    if wrapped:
        hook = hook[len("fp16:"):]
    if hook.startswith("powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        opts = torch_powersgd_options(hook)
        counter = Payload()
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(opts.get("rank", 1)),
                                   start_powerSGD_iter=int(opts.get("start", args.start_iter)),
                                   min_compression_rate=float(opts.get("min_rate", 2)), use_error_feedback=True,
                                   warm_start=True, random_seed=args.seed)
        ddp.register_comm_hook(state, default_hooks.fp16_compress_wrapper(psgd.powerSGD_hook) if wrapped
                               else psgd.powerSGD_hook)
        return counter, args.momentum, None
    return _ours(hook, ddp, args, dim)


def _ours(hook, ddp, args, dim):
    from sketchsgd.torch import CompressionState, compression_hook
    state = CompressionState(hook, start_iter=args.start_iter, coalesce=args.coalesce)
    ddp.register_comm_hook(state, compression_hook)
    return link_of(state), _sgd_momentum(hook, dim, args), state


def simulated(hook, model, args, dim, group):
    """--simulate, per step: no DDP; after each backward the gradients are averaged through
    sketchsgd.torch.average() on the simulated group (the whole model one unit, as DDP with one
    bucket; the matrices first, then the vectors: the tensors a codec compresses end to end, so
    that each worker's round reads them and writes its step in place, where interleaved with the
    biases it sent whole they took a copy each way), plain fp32 for the first --start-iter steps
    as the hooks warm up. Returns (a
    function giving the (payload, link) bytes so far, SGD momentum, the averaging to run after each
    backward)."""
    from sketchsgd.torch import CompressionState, average
    spec = "dense" if hook == "none" else hook[len("sketchsgd:"):] if hook.startswith("sketchsgd:") else hook
    warm, state = CompressionState("dense", process_group=group), CompressionState(spec, process_group=group)
    params = [p for p in model.parameters() if p.requires_grad]
    params = [p for p in params if p.dim() >= 2] + [p for p in params if p.dim() < 2]  # see above
    steps = {"n": 0, "warm": link_of(warm)}

    def after_backward():
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        means = average(steps["state"] if steps["n"] < args.start_iter else state, grads)
        steps["n"] += 1
        if steps["n"] == args.start_iter:  # the warm-up's buffers freed (W of them), its counts kept
            counted = steps["warm"]()
            steps["state"], steps["warm"] = None, lambda: counted
        for p, m in zip(params, means):
            p.grad = m.to(p.dtype).view_as(p)
    steps["state"] = warm
    del warm
    mine = link_of(state)
    return ((lambda: tuple(map(sum, zip(steps["warm"](), mine())))),
            _sgd_momentum(spec, dim, args) if spec != "dense" else args.momentum, after_backward)


def _sgd_momentum(spec, dim, args):
    """SGD's momentum beside a sketchsgd codec: 0 where the codec has momentum of its own."""
    import sketchsgd
    canonical = sketchsgd.Compressor(spec, dim).spec if _fits(spec, dim) else spec
    opts = dict(kv.split("=") for kv in canonical.partition(":")[2].split(",") if "=" in kv)
    own = float(opts.get("momentum", 0)) > 0 or opts.get("fetch") == "1"
    return 0.0 if own else args.momentum


def sharded(args, model, W, device):
    """--fsdp: model sharded with FSDP2 and its gradients reduced as --hook says. Returns (the
    model, a function giving the (payload, link) bytes so far, SGD momentum, and for FSDP2's own
    reductions a step counter {"n": steps}, their bytes counted per step from its padded shards)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    if args.fsdp == "fsdp1":
        return sharded_fsdp1(args, model, W, device)
    R = args.replicas if args.fsdp == "hsdp" else 1
    mesh = init_device_mesh(device.type, (R, W // R), mesh_dim_names=("replicate", "shard"))
    plain = args.hook[len("torch:"):] if args.hook.startswith("torch:") else args.hook
    spec = None if plain in ("none", "bf16", "fp16") else \
        args.hook[len("sketchsgd:"):] if args.hook.startswith("sketchsgd:") else args.hook
    # FSDP2's own HSDP (a 2-D mesh) where it reduces; the shard dimension alone where a codec
    # averages the replicas, which would otherwise be averaged twice.
    where = mesh["shard"] if spec is not None or R == 1 else mesh
    reduce_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plain)
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    parts = list(model.blocks) if hasattr(model, "blocks") else \
        [m for m in model.children() if any(True for _ in m.parameters())]
    for m in parts:
        fully_shard(m, mesh=where, mp_policy=policy)
    fully_shard(model, mesh=where, mp_policy=policy)
    dim = sum(p.numel() for p in model.parameters())
    # FSDP2's padded shard of a parameter: ceil(rows / S) rows; full sharding reduce-scatters S of
    # them, HSDP all-reduces one across the replicas. What its bf16 reduce_dtype would send over
    # these links is recorded with every run, the baseline a codec's bytes are divided by.
    S = W // R
    padded = sum(-(-p.shape[0] // S) * (p.numel() // p.shape[0]) for p in model.parameters())
    args.fsdp_bf16_bytes = padded * (S if R == 1 else 1) * 2
    if spec is not None:
        import sketchsgd.fsdp
        from sketchsgd.torch import CompressionState
        if R == 1:
            state = CompressionState(spec)
            sketchsgd.fsdp.compress_reduce_scatter(model, state, warmup=args.start_iter)
        else:
            state = CompressionState(spec, process_group=mesh["replicate"].get_group())
            sketchsgd.fsdp.compress_replicas(model, state, warmup=args.start_iter)
        return model, link_of(state), _sgd_momentum(spec, dim, args), None
    each = padded * (S if R == 1 else 1) * (torch.finfo(reduce_dtype).bits // 8 if reduce_dtype else 4)
    steps = {"n": 0}
    return model, per_step(steps, each, "reduce_scatter" if R == 1 else "all_reduce", S if R == 1 else R), \
        args.momentum, steps


def sharded_fsdp1(args, model, W, device):
    """--fsdp fsdp1: sharded() with FSDP1 (FULL_SHARD) around the same modules."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
    plain = args.hook[len("torch:"):] if args.hook.startswith("torch:") else args.hook
    spec = None if plain in ("none", "bf16", "fp16") else \
        args.hook[len("sketchsgd:"):] if args.hook.startswith("sketchsgd:") else args.hook
    reduce_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plain)
    how = dict(sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=device,
               mixed_precision=MixedPrecision(reduce_dtype=reduce_dtype) if reduce_dtype else None)
    if hasattr(model, "blocks"):  # a ModuleList
        for i in range(len(model.blocks)):
            model.blocks[i] = FSDP(model.blocks[i], **how)
    else:
        for name, m in list(model.named_children()):
            if any(True for _ in m.parameters()):
                setattr(model, name, FSDP(m, **how))
    model = FSDP(model, **how)
    dim = sum(m.numel() for m in model.parameters()) * W  # this rank's flat shards: 1/W of each padded unit
    args.fsdp_bf16_bytes = dim * 2  # what FSDP1's bf16 reduce_dtype reduce-scatters, recorded with every run
    if spec is not None:
        import sketchsgd.fsdp
        from sketchsgd.torch import CompressionState
        state = CompressionState(spec)
        sketchsgd.fsdp.compress_fsdp1(model, state, warmup=args.start_iter)
        return model, link_of(state), _sgd_momentum(spec, dim, args), None
    # FSDP1 reduce-scatters each unit's flat gradient padded to W chunks: W times a rank's shard.
    each = dim * (torch.finfo(reduce_dtype).bits // 8 if reduce_dtype else 4)
    steps = {"n": 0}
    return model, per_step(steps, each, "reduce_scatter", W), args.momentum, steps


def local_steps(args, model, group=None):
    """--local H: the model trains without a per-step sync. Every H steps, sketchsgd's DiLoCo (the
    --hook spec compresses the pseudo-gradient; "dense" is DiLoCo itself; Nesterov SGD as the
    outer optimizer) or PyTorch's PeriodicModelAverager (--hook torch:average). Returns ((payload,
    link) bytes so far, what runs after each step and returns whether it synced, the last sync)."""
    if args.hook in ("average", "torch:average"):
        from torch.distributed.algorithms.model_averaging import averagers, utils
        counter = Payload()
        averager = averagers.PeriodicModelAverager(period=args.local, warmup_steps=0)

        def after():
            averaging = averager.step % args.local == 0  # PyTorch's rule: steps 0, H, 2H, …
            averager.average_parameters(model.parameters())
            return averaging

        return counter, after, lambda: utils.average_parameters(iter(model.parameters()), None)
    from sketchsgd.torch import DiLoCo
    spec = args.hook[len("sketchsgd:"):] if args.hook.startswith("sketchsgd:") else args.hook
    if spec == "none" or spec.startswith("torch:"):
        raise ValueError(f"--local with --hook {args.hook}: give a sketchsgd spec (dense: DiLoCo) or torch:average")
    outer = DiLoCo(model, spec, every=args.local, process_group=group, anchor_device=args.outer_device,
                   outer_optimizer=lambda p: torch.optim.SGD(p, lr=args.outer_lr, momentum=args.outer_momentum,
                                                             nesterov=args.outer_momentum > 0))
    return link_of(outer), outer.step, outer.sync


def _fits(spec, dim):
    try:
        import sketchsgd
        sketchsgd.Compressor(spec, dim)
        return True
    except (ValueError, RuntimeError):
        return False


def _exit_with_launcher():
    """A spawned rank ends when its launcher does, however it ended (killed too): an orphan would
    train on alone, holding its cores."""
    import threading
    launcher = os.getppid()

    def watch():
        while os.getppid() == launcher:
            time.sleep(2)
        os._exit(1)
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def make_job(args):
    return workloads.make(args.workload, args.data, args.text, args.width, args.depth, args.vocab, args.untied,
                          args.heads, args.seq)


def optimizer(args, model, momentum):
    if args.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum, weight_decay=args.weight_decay)


def worker(rank, args, port, queue, group=None, job=None):
    """One rank: a process of its own (torch.distributed), or with --simulate a thread whose
    collectives are `group`'s (sketchsgd.simulate), every rank on the one device. job: the
    workload, shared read-only by a simulated group's ranks (its data is most of a rank's memory
    otherwise: 485 MB of Fashion-MNIST each); None: this rank loads its own."""
    W = args.workers
    cuda = args.device == "cuda"
    if group is None:
        os.environ.update(MASTER_ADDR=args.master_addr, MASTER_PORT=str(port))
        torch.set_num_threads(args.threads)
        if args.rank is None:
            _exit_with_launcher()
    device = torch.device("cuda", (0 if group else rank) % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        if args.tf32:
            torch.set_float32_matmul_precision("high")
    backend = "local" if group else args.backend or ("nccl" if cuda and torch.cuda.device_count() >= W else "gloo")
    if group is None:
        dist.init_process_group(backend, rank=rank, world_size=W, timeout=datetime.timedelta(minutes=10))
    after_backward = None
    try:
        job = job or make_job(args)
        dtype = workloads.DTYPES[args.dtype]
        if group is not None:
            with group.lock:  # torch's generator is the process's: one rank at a time seeds and draws
                model = job.model(args.seed).to(device, dtype)
        else:
            model = job.model(args.seed).to(device, dtype)
        dim = sum(p.numel() for p in model.parameters())
        # DDP caps its first bucket at 1 MiB apart from the others; by default here that cap is
        # the others' too, so the models are one bucket: PyTorch's PowerSGD hook on gloo fails
        # when two buckets' collectives interleave (every time in 1.13, at times in 2.13; sketchsgd's hook
        # works with any number).
        dist._DEFAULT_FIRST_BUCKET_BYTES = int((args.first_bucket_mb or args.bucket_cap_mb) * 1024 * 1024)
        width = torch.finfo(dtype).bits // 8
        synced, after_step = True, None
        opt = None
        if args.local and args.hook.startswith("torchft:"):  # torchft's DiLoCo hooks into the optimizer
            import torchft_peer
            ddp, momentum, extra = model, args.momentum, None
            opt = optimizer(args, model, momentum)
            payload, after_step, last_sync = torchft_peer.local_steps(args, model, opt, rank)
        elif args.local:  # trained locally, synced every --local steps
            ddp, momentum, extra = model, args.momentum, None
            payload, after_step, last_sync = local_steps(args, model, group)
        elif group is not None:
            ddp, extra = model, None
            payload, momentum, after_backward = simulated(args.hook, model, args, dim, group)
        elif args.fsdp:
            ddp, payload, momentum, extra = sharded(args, model, W, device)
        else:
            ddp = DDP(model, device_ids=[device.index] if cuda else None, bucket_cap_mb=args.bucket_cap_mb)
            payload, momentum, extra = register(args.hook, ddp, args, dim, width)
        opt = opt or optimizer(args, ddp, momentum)
        per_epoch = job.items() // W // args.batch
        if args.max_steps:
            per_epoch = min(per_epoch, args.max_steps)
        if per_epoch < 1:
            raise ValueError(f"{job.items()} items over {W} workers at batch {args.batch}: no step in an epoch")
        # --total-steps: as many epochs as it takes, the last cut short (at W = 256 and batch 32 an
        # epoch of the MLP is 7 steps)
        epochs = -(-args.total_steps // per_epoch) if args.total_steps else args.epochs
        lengths = [per_epoch] * epochs
        if args.total_steps:
            lengths[-1] = args.total_steps - (epochs - 1) * per_epoch
        total = sum(lengths)

        def factor(s):  # linear warm-up, then constant or a cosine decay to 0 at the last step
            up = min(1.0, (s + 1) / args.warmup) if args.warmup else 1.0
            return up * (0.5 * (1 + math.cos(math.pi * s / total)) if args.schedule == "cosine" else 1.0)

        warm = torch.optim.lr_scheduler.LambdaLR(opt, factor) if args.warmup or args.schedule == "cosine" else None
        rows, step, t0, hook_bytes_before = [], 0, time.time(), (0, 0)
        steady, step_ms = [], []
        nic, wire = Interface(args.interface_bytes), (0.0, 0.0, 0.0, 0.0)
        for epoch in range(epochs):
            order = job.order(rank, W, epoch, args.seed)
            loss_sum = 0.0
            for i in range(lengths[epoch]):
                x, y = job.batch(order[i * args.batch:(i + 1) * args.batch], device, dtype)
                began = time.perf_counter()
                loss = job.loss(ddp(x), y)
                opt.zero_grad()
                loss.backward()
                if after_backward is not None:
                    after_backward()
                if args.clip and args.fsdp == "fsdp1":  # the norm over every rank's flat shards
                    ddp.clip_grad_norm_(args.clip)
                elif args.clip:
                    nn.utils.clip_grad_norm_(ddp.parameters(), args.clip)
                opt.step()
                if after_step is not None:
                    synced = after_step()
                if warm is not None:
                    warm.step()
                if cuda:
                    torch.cuda.synchronize(device)
                if step >= args.start_iter + 1:  # the steady state: past the hooks' warm-up
                    step_ms.append(1e3 * (time.perf_counter() - began))
                if step == args.start_iter:
                    nic.start()  # the steady steps' interface bytes from here
                if isinstance(extra, dict):
                    extra["n"] += 1
                step += 1
                now = payload()
                if step > args.start_iter + 1:
                    steady.append((now[0] - hook_bytes_before[0], now[1] - hook_bytes_before[1]))
                hook_bytes_before = now
                if epoch == epochs - 1 and i == lengths[epoch] - 1 and step > args.start_iter + 1:
                    wire = nic.stop(step - args.start_iter - 1)  # before the evaluation's collectives
                loss_sum += loss.item()
                if not math.isfinite(loss.item()):
                    raise FloatingPointError(f"step {step}: the training loss is {loss.item()}")
                if rank == 0 and (i + 1) % args.progress == 0:
                    rate = step / (time.time() - t0)
                    print(f"  epoch {epoch + 1}/{epochs} step {i + 1}/{lengths[epoch]} loss {loss_sum / (i + 1):.4f} "
                          f"({rate:.1f} steps/s, link {now[1] / step / 1e3:.1f} kB/round)", flush=True)
            if not synced and epoch == epochs - 1:  # the replicas agree before the evaluation
                with torch.no_grad():
                    last_sync()
                synced = True
            # A sharded model's forward gathers its parameters: every rank evaluates.
            # FSDP1 wraps the model in a new module (FSDP2 shards it in place).
            quality = job.evaluate(ddp if args.fsdp == "fsdp1" else model, device, dtype, args.eval_items) \
                if rank == 0 or args.fsdp else {}
            rows.append({"epoch": epoch + 1, "loss": loss_sum / lengths[epoch], job.metric: quality.get(job.metric),
                         "payload_bytes_per_round": payload()[0] / step, "link_bytes_per_round": payload()[1] / step,
                         "seconds": time.time() - t0})
            if rank == 0:
                print(f"epoch {epoch + 1}: loss {loss_sum / lengths[epoch]:.4f}, {job.describe(quality[job.metric])}",
                      flush=True)
        if args.fsdp and args.fsdp != "fsdp1":
            model.reshard()  # the root keeps its parameters gathered after a forward without backward
        # Under FSDP a rank's digest is of its own shards (to_local: DTensor.full_tensor's gloo
        # all-gather of CUDA tensors died with a bus error on torch 2.11), summed below per replica.
        flat = torch.cat([(p.to_local() if hasattr(p, "to_local") else p).detach().reshape(-1).cpu()
                          for p in ddp.parameters()])
        # Each rank's steady steps as its interface counted them and as the ring model says, to
        # rank 0 beside the digest.
        model_link = float(np.mean([b for _, b in steady])) if steady else 0.0
        digest = torch.tensor([float(flat.double().sum()), float(flat.abs().double().sum()), *wire, model_link])
        gathered = [torch.zeros(7, dtype=torch.float64) for _ in range(W)]
        if group is not None:
            group.all_gather(gathered, digest.double())
        else:
            dist.all_gather(gathered, digest.double().to(device) if backend == "nccl" else digest.double())
        per_rank = [g.cpu()[2:].tolist() for g in gathered]  # (tx, rx, packets, model) a steady step, each rank
        gathered = [g.cpu()[:2] for g in gathered]
        if args.fsdp:  # mesh (replicate, shard) in rank order: a replica's ranks are consecutive
            per = W // (args.replicas if args.fsdp == "hsdp" else 1)
            gathered = [sum(g.cpu() for g in gathered[i:i + per]) for i in range(0, W, per)]
        same = all(torch.equal(g.cpu(), gathered[0].cpu()) for g in gathered)
        if group is None:
            dist.barrier()  # gloo's shutdown can hang unless every rank got here
        if rank == 0:
            dense = dim * width  # DDP's all-reduce of the gradient in the model's dtype
            mean = payload()[0] / step
            steady_mean = float(np.mean([a for a, _ in steady])) if steady else mean
            link_mean = payload()[1] / step
            steady_link = float(np.mean([b for _, b in steady])) if steady else link_mean
            # What the rank's link would carry for a ring all-reduce of the gradient (the field's
            # baseline in bf16, fp32 beside it), at this W.
            bf16, fp32 = (sum(link_bytes("all_reduce", dim * w, W)) for w in (2, 4))
            queue.put({"hook": args.hook, "workload": args.workload, "dtype": args.dtype, "workers": W,
                       "epochs": epochs, "steps_per_epoch": per_epoch, "dim": dim, "metric": job.metric,
                       "quality": quality[job.metric], **quality, "payload_bytes_per_round": mean,
                       "steady_payload_bytes_per_round": steady_mean, "ratio": dense / mean,
                       "link_bytes_per_round": link_mean, "steady_link_bytes_per_round": steady_link,
                       "bf16_link_bytes_per_step": bf16, "fp32_link_bytes_per_step": fp32,
                       "steady_link_ratio_bf16": bf16 / steady_link if steady_link else 0.0,
                       "steady_link_ratio_fp32": fp32 / steady_link if steady_link else 0.0,
                       "interface_bytes_per_step": [{"tx": t, "rx": r, "tx_packets": tp, "rx_packets": rp, "model": m}
                                                    for t, r, tp, rp, m in per_rank]
                       if args.interface_bytes else None,
                       "steady_ratio": dense / steady_mean, "seconds": time.time() - t0, "steps": step, "lr": args.lr,
                       "optimizer": args.optimizer, "batch": args.batch, "schedule": args.schedule,
                       "local": args.local, "fsdp": args.fsdp, "replicas": args.replicas,
                       "fsdp_bf16_bytes_per_step": getattr(args, "fsdp_bf16_bytes", None),
                       "simulated": group is not None,
                       "replicas_identical": same, "sgd_momentum": momentum, "epochs_log": rows, "seed": args.seed,
                       "backend": backend, "device": str(device), "torch": torch.__version__,
                       "step_ms_median": float(np.median(step_ms)) if step_ms else None,
                       "step_ms_p10": float(np.percentile(step_ms, 10)) if step_ms else None,
                       "step_ms_p90": float(np.percentile(step_ms, 90)) if step_ms else None})
    except BaseException:
        if group is not None:  # a thread: LocalGroup.run() ends the other ranks and raises this
            raise
        import traceback
        traceback.print_exc()
        os._exit(1)
    if group is not None:
        return
    # Results out, then leave without Python's teardown: in torch 1.13 a gloo process group freed
    # at exit can deadlock (its destructor joins a worker thread, holding the GIL, while that
    # thread frees a tensor that needs the GIL).
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    os._exit(0)


def check(p, args):
    """Every option checked before any rank starts: a bad one ends the run with one line
    (p.error: exit status 2). Fills in the workload's defaults."""
    try:
        given = workloads.defaults(args.workload)
    except KeyError:
        p.error(f"--workload {args.workload!r}: mlp, cnn, resnet<6n+2>, transformer or lm")
    for key, value in given.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.master_addr = "127.0.0.1"
    if args.simulate is not None:
        if args.rank is not None or args.master:
            p.error("--simulate: the workers are threads of this process; --rank and --master are for processes")
        if args.fsdp or args.backend:
            p.error(f"--simulate with --{'fsdp' if args.fsdp else 'backend'}: the simulated group has collectives of "
                    "its own (no torch.distributed process group, so no FSDP2)")
        args.workers = args.simulate
        try:
            args.job = make_job(args)
        except (OSError, ValueError) as e:
            p.error(f"--workload {args.workload}: {e}")
        _check_fits(p, args, args.job)
    if args.rank is not None:
        if not args.master or not 0 <= args.rank < args.workers:
            p.error("--rank needs --master ADDR:PORT and 0 <= rank < --workers")
        args.master_addr, _, port = args.master.rpartition(":")
        if not args.master_addr or not port.isdigit() or not 1 <= int(port) <= 65535:
            p.error(f"--master {args.master!r}: expected ADDR:PORT (PORT in 1..65535)")
    elif args.master:
        p.error("--master is for one rank of a job (with --rank)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    if args.backend == "nccl" and args.device != "cuda":
        p.error("--backend nccl: needs --device cuda")
    for name in ("json", "csv"):
        path = getattr(args, name)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            p.error(f"--{name} {path}: no such folder {os.path.dirname(os.path.abspath(path))}")
    if args.interface_bytes and not os.path.exists(f"/sys/class/net/{args.interface_bytes}/statistics/tx_bytes"):
        p.error(f"--interface-bytes {args.interface_bytes}: no such network interface here")
    if args.interface_bytes and args.simulate is not None:
        p.error("--interface-bytes: a simulated group's ranks meet in memory, no interface carries them")
    if args.outer_device and not args.local:
        p.error("--outer-device: DiLoCo's, with --local H")
    if args.outer_device == "cuda" and args.device != "cuda":
        p.error("--outer-device cuda: needs --device cuda")
    if args.outer_device == "cpu" and args.device == "cuda" and (args.backend == "nccl" or (
            not args.simulate and args.backend is None and torch.cuda.device_count() >= args.workers)):
        p.error("--outer-device cpu: not with NCCL, which moves device tensors only (--backend gloo)")
    if args.replicas is not None and args.fsdp != "hsdp":
        p.error("--replicas: with --fsdp hsdp")
    if args.fsdp == "hsdp" and args.replicas is None:
        args.replicas = 2
    if args.fsdp:
        if args.local:
            p.error("--fsdp with --local: DiLoCo over a sharded model is sketchsgd.outer.DiLoCo with the replica "
                    "group (docs/PYTORCH.md); this example runs FSDP per step")
        if args.fsdp == "hsdp" and not (2 <= args.replicas <= args.workers and args.workers % args.replicas == 0):
            p.error(f"--replicas {args.replicas}: 2..--workers, dividing --workers {args.workers}")
        if args.fsdp in ("full", "fsdp1") and args.workers < 2:
            p.error(f"--fsdp {args.fsdp}: 2 workers at least")
    problem = hook_problem(args)
    if problem:
        p.error(problem)
    try:  # the data is there and the workload's name is right, before any rank starts
        job = workloads.make(args.workload, args.data, args.text, args.width, args.depth, args.vocab, args.untied,
                             args.heads, args.seq)
        if args.workload in ("transformer", "lm"):
            job.model(args.seed)  # the width must suit the heads
    except FileNotFoundError as e:
        p.error(f"--{'text' if args.workload in ('transformer', 'lm') else 'data'}: {one_line(e)}")
    except ValueError as e:
        p.error(f"--workload {args.workload}: {one_line(e)}")
    if job.items() // args.workers // args.batch < 1:
        p.error(f"--batch {args.batch}: {job.items()} items over {args.workers} workers make no step per epoch")


def hook_problem(args):
    """What is wrong with --hook (with --local and --start-iter), or None: what register() or
    local_steps() would raise on every rank."""
    hook = args.hook
    if args.simulate and (hook.startswith(("torch:", "torchft:", "powersgd", "fp16:")) or
                          hook in ("fp16", "bf16", "average")):
        return (f"--hook {hook}: under --simulate, none or a sketchsgd spec (sketchsgd:powersgd:...): PyTorch's "
                "hooks and its averager need torch.distributed's processes")
    if args.fsdp:
        plain = hook[len("torch:"):] if hook.startswith("torch:") else hook
        if plain in ("none", "bf16", "fp16"):
            return None
        if hook.startswith("torch:") or plain.startswith(("powersgd", "fp16:", "average")):
            return (f"--hook {hook}: under --fsdp, none, bf16 or fp16 (FSDP2's reduce_dtype) or a sketchsgd spec "
                    "(sketchsgd:powersgd:...): PyTorch's hooks are DDP's")
        return _spec_problem(args, hook[len("sketchsgd:"):] if hook.startswith("sketchsgd:") else hook)
    if hook.startswith("torchft:"):
        if not args.local:
            return f"--hook {hook}: torchft's DiLoCo trains with local steps: give --local H"
        if args.rank is not None or args.fsdp:
            return f"--hook {hook}: run by this launcher (no --rank: it starts the replicas' Lighthouse), without --fsdp"
        import torchft_peer
        return torchft_peer.problem(hook, args.local)
    if args.local:
        if hook in ("average", "torch:average"):
            return None
        spec = hook[len("sketchsgd:"):] if hook.startswith("sketchsgd:") else hook
        if spec == "none" or spec.startswith("torch:"):
            return f"--hook {hook}: with --local, a sketchsgd spec (dense: DiLoCo) or torch:average"
        return _spec_problem(args, spec)
    if hook == "none":
        return None
    if hook in ("average", "torch:average"):
        return f"--hook {hook}: PyTorch's PeriodicModelAverager needs --local H"
    if hook.startswith("torch:"):
        hook = hook[len("torch:"):]
    elif hook.startswith("sketchsgd:"):
        return _spec_problem(args, hook[len("sketchsgd:"):])
    if hook == "fp16":
        return None
    if hook == "bf16":
        return "--hook bf16: FSDP2's reduce_dtype, with --fsdp (under DDP: fp16, PyTorch's hook, or a sketchsgd spec)"
    if hook.startswith("fp16:powersgd"):
        hook = hook[len("fp16:"):]
    if not hook.startswith("powersgd"):
        return _spec_problem(args, hook)
    try:
        opts = torch_powersgd_options(hook)
        rank, rate = int(opts.get("rank", 1)), float(opts.get("min_rate", 2))
        start = int(opts.get("start", args.start_iter))
    except ValueError as e:
        return f"--hook {args.hook}: {one_line(e)}"
    if rank < 1 or not math.isfinite(rate):
        return f"--hook {args.hook}: rank must be an integer >= 1 and min_rate a finite number"
    if start < 2:  # PyTorch's PowerSGD, with error feedback and warm start
        return (f"--hook {args.hook}: " if "start" in opts else f"--start-iter {start}: ") + \
            "PyTorch's PowerSGD starts at step 2 at the earliest"
    return None


def _spec_problem(args, spec):
    """A sketchsgd spec's problem as CompressionState would raise it on every rank, or None."""
    if not args.local and not args.fsdp and args.start_iter < 2:
        return f"--start-iter {args.start_iter}: sketchsgd's hooks start at step 2 at the earliest " \
               "(DDP rebuilds its buckets after the first)"
    try:
        from sketchsgd.torch import CompressionState
    except ImportError as e:
        return f"--hook {args.hook}: the sketchsgd package does not load ({one_line(e)}; PYTHONPATH=build/default/python)"
    try:
        CompressionState(spec, coalesce=args.coalesce)
    except Exception as e:  # the package's errors (InvalidArgument is a ValueError), TypeError
        return f"--hook {args.hook}: {one_line(e)}"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hook", default="sketch:rows=1,cols=90000,k=18000,fetch=1",
                   help="none | fp16 | powersgd:rank=R[,start=N] | fp16:powersgd:rank=R (PyTorch's; the last inside fp16_compress_wrapper; also as torch:fp16, torch:powersgd:...) | "
                        "any sketchsgd spec, prefixed sketchsgd: where the name is PyTorch's too "
                        "(sketchsgd:powersgd:rank=4) (default: %(default)s)")
    p.add_argument("--workload", default="mlp", help="mlp | cnn | resnet8 | resnet20 (any 6n+2) | transformer | lm")
    p.add_argument("--dtype", default="fp32", choices=sorted(workloads.DTYPES), help="the model's parameters")
    p.add_argument("--local", type=natural, default=0, help="H > 0: local steps, synced every H (--hook: a sketchsgd spec "
                   "for DiLoCo's pseudo-gradient, dense for DiLoCo itself, or torch:average for PyTorch's "
                   "PeriodicModelAverager); 0: DDP, synced every step")
    p.add_argument("--fsdp", choices=["full", "hsdp", "fsdp1"], help="shard with FSDP2 instead of DDP: full (over "
                   "every rank; --hook compresses the reduce-scatter) or hsdp (--replicas R; --hook compresses the "
                   "replicas' all-reduce); --hook none, bf16 or fp16: FSDP2's own reduction in that dtype. fsdp1: "
                   "FSDP1, FULL_SHARD over every rank, --hook compressing its reduce-scatter")
    p.add_argument("--replicas", type=count, help="--fsdp hsdp: replicas, each sharded over W/R ranks (default 2)")
    p.add_argument("--outer-lr", type=positive, default=0.7, help="--local: DiLoCo's outer learning rate")
    p.add_argument("--outer-momentum", type=momentum, default=0.9, help="--local: its Nesterov momentum")
    p.add_argument("--outer-device", choices=["cpu", "cuda"], help="--local: where DiLoCo's anchor, outer optimizer "
                   "and codec live (default: the model's device; cpu: off the GPU, and CPU-only codecs such as "
                   "sparseloco)")
    p.add_argument("--tf32", action="store_true", help="on CUDA: float32 matrix products in TF32 "
                   "(torch.set_float32_matmul_precision('high'))")
    p.add_argument("--workers", type=count, default=4)
    p.add_argument("--simulate", type=count, metavar="W", help="W workers as threads of this one process on one "
                   "device (sketchsgd.simulate; sets --workers): none or a sketchsgd spec per step, or --local")
    p.add_argument("--epochs", type=count, default=3)
    p.add_argument("--batch", type=count, help="per worker (default: the workload's)")
    p.add_argument("--optimizer", choices=["sgd", "adamw"], help="default: the workload's")
    p.add_argument("--lr", type=positive, help="default: the workload's")
    p.add_argument("--momentum", type=momentum, help="SGD's (default: the workload's)")
    p.add_argument("--weight-decay", type=nonnegative, default=0.0)
    p.add_argument("--warmup", type=natural, help="steps of linear learning-rate warm-up (default: the workload's)")
    p.add_argument("--clip", type=nonnegative, help="clip the averaged gradient's norm (default: the workload's; 0: off)")
    p.add_argument("--schedule", choices=["constant", "cosine"], help="the learning rate after the warm-up "
                   "(default: the workload's; cosine decays to 0 at the run's last step)")
    p.add_argument("--width", type=count, default=128, help="the language models' width (transformer, lm)")
    p.add_argument("--depth", type=count, default=4, help="the language models' blocks")
    p.add_argument("--heads", type=count, default=4, help="the language models' attention heads")
    p.add_argument("--seq", type=count, default=64, help="the language models' window (tokens)")
    p.add_argument("--vocab", type=count, default=8192, help="lm: the BPE vocabulary (512..65536 tokens)")
    p.add_argument("--untied", action="store_true", help="lm: an input embedding of its own (row-sparse gradients)")
    p.add_argument("--seed", type=natural, default=1)
    p.add_argument("--start-iter", type=natural, default=10, help="plain all-reduce steps first (hooks that warm up; "
                   "under --fsdp a codec's fp32 warm-up)")
    p.add_argument("--bucket-cap-mb", type=positive, default=25)
    p.add_argument("--first-bucket-mb", type=nonnegative, default=0, help="DDP's first bucket cap (0: --bucket-cap-mb)")
    p.add_argument("--coalesce", action="store_true", help="sketchsgd hooks: a step's collectives go out together at "
                   "its last bucket (CompressionState(coalesce=True))")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", choices=["gloo", "nccl"], help="default: nccl on CUDA with a GPU per worker, else gloo")
    p.add_argument("--threads", type=count, default=1, help="torch threads per worker")
    p.add_argument("--data", default=workloads.FASHION, help="Fashion-MNIST's folder")
    p.add_argument("--text", default=workloads.TEXT, help="the language models' text: a folder of *.rst.txt")
    p.add_argument("--max-steps", type=natural, default=0, help="steps per epoch at most (quick runs)")
    p.add_argument("--total-steps", type=natural, default=0, help="train this many steps in all, over as many "
                   "epochs as it takes, the last cut short (in place of --epochs)")
    p.add_argument("--eval-items", type=natural, default=0, help="evaluate on the first N held-out items (quick runs; "
                   "0: all)")
    p.add_argument("--progress", type=count, default=100, help="a progress line every N steps")
    p.add_argument("--timeout", type=positive, default=3600, help="give up after this many seconds")
    p.add_argument("--interface-bytes", metavar="DEV", help="also count the steady steps' bytes on this network "
                   "interface of each rank's namespace (headers included), against the ring model's link bytes")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--csv", help="write one row per epoch here")
    p.add_argument("--rank", type=natural, help="run only this rank in this process (with --master)")
    p.add_argument("--master", help="ADDR:PORT of rank 0's rendezvous (with --rank; default: 127.0.0.1, a free port)")
    args = p.parse_args()
    check(p, args)
    plain = args.hook[len("torch:"):] if args.hook.startswith("torch:") else args.hook
    if args.device == "cpu" and plain.startswith(("powersgd", "fp16:powersgd")):
        # PyTorch's powerSGD_hook (2.x) synchronises CUDA wherever a GPU exists, whatever the
        # tensors' device, and fails on CPU tensors: a CPU run hides the GPUs from its ranks.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if args.simulate:
        simulate(args)
        return
    if args.rank is not None:  # one rank of a job spread over hosts; worker() exits the process
        print(f"ddp_train: rank {args.rank} of {args.workers}, {args.workload}, hook {args.hook}", flush=True)
        worker(args.rank, args, int(args.master.rpartition(":")[2]), _Report(args))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lighthouse = None
    if args.hook.startswith("torchft:"):  # the replicas' quorum server, for the job's length
        import torchft_peer
        lighthouse = torchft_peer.lighthouse(args.workers)
        args.lighthouse = lighthouse.address()
    print(f"ddp_train: {args.workers} workers, {args.workload} ({args.dtype}), hook {args.hook}, {args.epochs} epochs", flush=True)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, queue)) for r in range(args.workers)]
    for proc in procs:
        proc.start()
    summary, deadline = None, time.time() + args.timeout
    while summary is None and time.time() < deadline:
        try:
            summary = queue.get(timeout=5)
        except Exception:  # queue.Empty: is everyone still alive?
            if any(proc.exitcode not in (None, 0) for proc in procs):
                break
    for proc in procs:  # the job is over (or failed): nobody may linger
        proc.join(timeout=30)
        if proc.is_alive():
            print(f"worker pid {proc.pid} did not exit; killed", file=sys.stderr)
            proc.kill()
            proc.join()
    if lighthouse is not None:
        lighthouse.shutdown()
    if summary is None:
        sys.exit("a worker failed" if time.time() < deadline else f"no result within --timeout {args.timeout} s")
    report(summary, args)


class _Collected(list):
    """What rank 0 of a simulated job puts: the summary."""
    put = list.append


def simulate(args):
    """--simulate W: the W ranks as threads of this process (sketchsgd.simulate.LocalGroup)."""
    from sketchsgd.simulate import LocalGroup
    torch.set_num_threads(args.threads)
    _return_large_frees()
    print(f"ddp_train: {args.workers} simulated workers (threads of one process on {args.device}), {args.workload} "
          f"({args.dtype}), hook {args.hook}, {args.epochs} epochs", flush=True)
    out = _Collected()
    job = args.job  # check()'s: one copy of the data, read by every rank
    try:
        LocalGroup(args.workers, timeout=args.timeout).run(lambda rank: worker(rank.rank, args, None, out, rank, job))
    except Exception:  # noqa: BLE001 - the failing rank's error, once (the others ended with it)
        import traceback
        traceback.print_exc()
        sys.exit("a simulated worker failed")
    report(out[0], args)


# Bytes a simulated worker holds at its peak, in copies of its model's float32 values (model,
# gradient, the mean, the codec's buffers, error feedback and momentum): the largest of the
# families' measured on the MLP from W = 32 to 64, rounded up (docs/BENCHMARKS.md "A simulated
# group's memory"). Gathered codecs hold no more: the group reduces their messages once.
WORKER_COPIES = 9.0


def _return_large_frees():
    """Large blocks from mmap, always (glibc's M_MMAP_THRESHOLD fixed at 1 MiB): W threads free and
    reallocate model-sized buffers every step, which glibc's growing threshold would keep in its
    arenas (docs/BENCHMARKS.md "A simulated group's memory")."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc: its own allocator's rules


def _check_fits(p, args, job):
    """p.error (status 2) before a simulated group that would not fit in memory."""
    with torch.random.fork_rng():
        dim = sum(t.numel() for t in job.model(args.seed).parameters())
    copies = WORKER_COPIES
    need = args.workers * dim * 4 * copies
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        free = info["MemAvailable"]
    except (OSError, KeyError, ValueError):
        return
    if need > 0.9 * free:
        most = int(0.9 * free // (dim * 4 * copies))
        p.error(f"--simulate {args.workers}: about {need / 2**30:.1f} GiB for {args.workers} workers of "
                f"{dim:,} parameters ({copies:g} float32 copies of the model each), {free / 2**30:.1f} GiB "
                f"available: at most {most} workers fit")


def report(summary, args):
    print(f"summary: {args.hook}: {summary['metric']} {summary['quality']:.4f}, link "
          f"{summary['steady_link_bytes_per_round'] / 1e3:.1f} kB a steady step per rank (sent + received; a bf16 "
          f"all-reduce at W = {summary['workers']} {summary['bf16_link_bytes_per_step'] / 1e3:.1f} kB: "
          f"{summary['steady_link_ratio_bf16']:.2f}x this, fp32 {summary['steady_link_ratio_fp32']:.2f}x; payload "
          f"{summary['steady_payload_bytes_per_round'] / 1e3:.1f} kB), {summary['seconds']:.0f} s, replicas identical: "
          f"{summary['replicas_identical']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(summary["epochs_log"][0]))
            w.writeheader()
            w.writerows(summary["epochs_log"])


class _Report:
    """The queue of a one-rank process (--rank): rank 0's summary is reported where it is put."""

    def __init__(self, args):
        self.args = args

    def put(self, summary):
        report(summary, self.args)

    def close(self):
        pass

    def join_thread(self):
        pass

if __name__ == "__main__":
    main()
