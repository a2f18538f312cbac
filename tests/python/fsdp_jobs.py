"""What each rank runs in test_fsdp.py: a small MLP under FSDP2 on a CPU mesh of replicas × shards
(gloo), its replicas averaged by sketchsgd.fsdp or by FSDP2's own HSDP all-reduce."""

import functools

import numpy as np
import torch
import torch.distributed as dist

from sketchsgd.torch import CompressionState


def each(rank, world, job, specs, *args):
    """job (a function of this module, by name) for each spec in turn in one set of processes:
    {spec: its result} (starting processes and groups costs more than a small job)."""
    return {spec: globals()[job](rank, world, spec, *args) for spec in specs}


def several(rank, world, calls):
    """Jobs of this module one after the other in one set of processes: calls are (name, args)
    pairs; returns their results in order."""
    return [globals()[name](rank, world, *args) for name, args in calls]


def _mesh(world, replicas):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (replicas, world // replicas), mesh_dim_names=("replicate", "shard"))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 65), torch.nn.ReLU(), torch.nn.Linear(65, 48),
                               torch.nn.ReLU(), torch.nn.Linear(48, 10))


def _shard(model, mesh):
    """Each Linear layer of a Sequential an FSDP module, and the root; another model: the root alone."""
    from torch.distributed.fsdp import fully_shard
    for layer in model if isinstance(model, torch.nn.Sequential) else []:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _batch(rank, step, n=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 32, generator=g)
    return x, (x[:, :10].sum(1) > 0).long() + 2 * (x[:, 10:20].sum(1) > 0).long()


def _train(model, rank, steps, lr=0.1, first=0):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(first, first + steps):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _local(model):
    """This rank's shards of the parameters, end to end."""
    return np.concatenate([getattr(p, "to_local", lambda: p)().detach().reshape(-1).numpy() for p in model.parameters()])


def trains(rank, world, spec, replicas, steps):
    """Trains with the replicas averaged through spec (None: FSDP2's own HSDP all-reduce on a 2-D
    mesh). Returns (losses, local shards, stats)."""
    from sketchsgd import fsdp
    mesh = _mesh(world, replicas)
    if spec is None:
        model = _shard(_model(), mesh)
        return _train(model, rank, steps), _local(model), None
    model = _shard(_model(), mesh["shard"])
    state = CompressionState(spec, process_group=mesh["replicate"].get_group())
    fsdp.compress_replicas(model, state)
    return _train(model, rank, steps), _local(model), state.stats()


def half_precision(rank, world, spec, steps):
    """The MLP in bfloat16 under full sharding with its reduce-scatter through spec. Returns
    (losses, this rank's shards as float32, {scratch buffer: its values} that the state keeps,
    the largest FSDP group's reduce-scatter input in values)."""
    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    model = _shard(_model().to(torch.bfloat16), init_device_mesh("cpu", (world,)))
    state = CompressionState(spec)
    fsdp.compress_reduce_scatter(model, state)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    local = np.concatenate([p.to_local().detach().float().reshape(-1).numpy() for p in model.parameters()])
    largest = max(sum(-(-p.shape[0] // world) * world * (p.numel() // p.shape[0]) for p in m.parameters())
                  for m in model.modules() if isinstance(m, torch.nn.Linear))  # its rows padded to W
    kept = state.buffer_sizes()
    return losses, local, kept, largest


def _attempt(out, name, fn):
    """fn() recorded in out as (name, error type or None, message)."""
    try:
        fn()
        out.append((name, None, ""))
    except Exception as e:  # noqa: BLE001 - recorded for the test
        out.append((name, type(e).__name__, str(e)))


def refusals(rank, world):
    """Every misuse compress_replicas() refuses, each as (name, error type, message)."""
    from sketchsgd import fsdp
    mesh = _mesh(world, 2)
    out = []
    attempt = functools.partial(_attempt, out)

    replicas = mesh["replicate"].get_group()
    attempt("not a module", lambda: fsdp.compress_replicas("model", CompressionState("topk:k=10", replicas)))
    attempt("no FSDP", lambda: fsdp.compress_replicas(_model(), CompressionState("topk:k=10", replicas)))
    hsdp = _shard(_model(), mesh)
    attempt("2-D mesh", lambda: fsdp.compress_replicas(hsdp, CompressionState("topk:k=10", replicas)))
    sharded = _shard(_model(), mesh["shard"])
    attempt("world group", lambda: fsdp.compress_replicas(sharded, CompressionState("topk:k=10")))
    attempt("not a state", lambda: fsdp.compress_replicas(sharded, "topk:k=10"))
    attempt("negative warm-up", lambda: fsdp.compress_replicas(sharded, CompressionState("topk:k=10", replicas), -1))
    state = CompressionState("topk:k=10", replicas)
    fsdp.compress_replicas(sharded, state)
    attempt("a state twice", lambda: fsdp.compress_replicas(_shard(_model(), mesh["shard"]), state))
    attempt("no part of this rank", lambda: fsdp.load_state_dict(state, {"rank99": b""}))
    other = CompressionState("topk:k=11", replicas)
    fsdp.compress_replicas(_shard(_model(), mesh["shard"]), other)
    attempt("another configuration", lambda: fsdp.load_state_dict(state, fsdp.state_dict(other)))
    narrower = torch.nn.Sequential(torch.nn.Linear(32, 20), torch.nn.ReLU(), torch.nn.Linear(20, 10))
    elsewhere = CompressionState("topk:k=10", replicas)
    fsdp.compress_replicas(_shard(narrower, mesh["shard"]), elsewhere)
    attempt("another model", lambda: fsdp.load_state_dict(elsewhere, fsdp.state_dict(state)))
    attempt("no model yet", lambda: fsdp.load_state_dict(CompressionState("topk:k=10", replicas),
                                                         fsdp.state_dict(state)))
    attempt("reduce-scatter over the replicas", lambda: fsdp.compress_reduce_scatter(
        _shard(_model(), mesh["shard"]), CompressionState("topk:k=10", replicas)))
    attempt("registered twice", lambda: fsdp.compress_replicas(sharded, CompressionState("topk:k=10", replicas)))
    from sketchsgd.torch import compression_hook
    attempt("its state in a DDP hook", lambda: compression_hook(state, None))
    attempt("a mesh for a group", lambda: CompressionState("topk:k=10", mesh["replicate"]))
    attempt("corrupt bytes", lambda: fsdp.load_state_dict(state, {f"rank{rank}": b"\x80not a state"}))
    used = CompressionState("topk:k=10", replicas)
    from sketchsgd.torch import average
    average(used, [torch.ones(4)])
    attempt("a state that ran steps", lambda: fsdp.compress_replicas(_shard(_model(), mesh["shard"]), used))
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    old = FSDP(_model(), device_id=torch.device("cpu"))
    attempt("an FSDP1 model", lambda: fsdp.compress_reduce_scatter(old, CompressionState("topk:k=10")))
    dist.barrier()
    return out


def non_finite(rank, world, spec, steps, bad_step, mode="replicas", warmup=0):
    """At bad_step, rank 1's gradient is NaN in rows 0-7 of the first layer: after the shard
    group's reduce-scatter only rank 0's shard holds them, so only replica group {0, 2} sees them
    in its round. Returns (per step: the error backward() raised, by type and message, or None;
    this rank's shards at the end). mode "reduce_scatter": full sharding over every rank, the
    reduce-scatter compressed (every rank shares the failed round). warmup: fp32 backward passes
    first."""
    from sketchsgd import fsdp
    if mode == "replicas":
        mesh = _mesh(world, 2)
        model = _shard(_model(), mesh["shard"])
        state = CompressionState(spec, process_group=mesh["replicate"].get_group())
        fsdp.compress_replicas(model, state, warmup=warmup)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        model = _shard(_model(), init_device_mesh("cpu", (world,)))
        state = CompressionState(spec)
        fsdp.compress_reduce_scatter(model, state, warmup=warmup)
    return _steps_with_a_nan(model, model[0], rank, steps, bad_step), _local(model)


def corrupt(rank, world, spec, steps, bad_step):
    """Full sharding with a gathered codec (per destination): at bad_step rank 1's message for
    rank 0's chunk of the first FSDP module arrives with a byte flipped. Returns per step the
    error backward() raised (type and message) or None, and this rank's shards at the end."""
    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    model = _shard(_model(), init_device_mesh("cpu", (world,)))
    state = CompressionState(spec)
    fsdp.compress_reduce_scatter(model, state)
    exchange, at = state.comm.exchange, {"step": 0, "calls": 0}

    def flipped(parts, sizes, like):
        at["calls"] += 1
        if rank == 1 and at["step"] == bad_step and at["calls"] == 1:
            parts = [p.clone() for p in parts]
            parts[0][-1] ^= 0xFF
        return exchange(parts, sizes, like)

    state.comm.exchange = flipped
    return _steps_with_errors(model, rank, steps, lambda step: at.update(step=step, calls=0)), _local(model)


def oversized(rank, world, spec, steps, bad_step):
    """Full sharding with a gathered codec (per destination): at bad_step rank 1 announces a
    message for rank 0's chunk of the first FSDP module longer than the codec's largest, which
    every rank sees in the all-gathered lengths. Returns per step the error backward() raised
    (type and message) or None, and this rank's shards at the end."""
    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    model = _shard(_model(), init_device_mesh("cpu", (world,)))
    state = CompressionState(spec)
    fsdp.compress_reduce_scatter(model, state)
    gather, at = state.comm.gather_lengths, {"step": 0, "calls": 0}

    def lengths(mine, like):
        at["calls"] += 1
        if rank == 1 and at["step"] == bad_step and at["calls"] == 1:
            mine = [1 << 40] + list(mine[1:])
        return gather(mine, like)

    state.comm.gather_lengths = lengths
    return _steps_with_errors(model, rank, steps, lambda step: at.update(step=step, calls=0)), _local(model)


def two_groups(rank, world, spec, bad_step):
    """Ranks 0-1 and 2-3 as the two data-parallel groups of a 2 × 2 mesh (as two pipeline stages
    or tensor-parallel ranks would have them), each sharding its own model over its 2 ranks with
    spec: the first trains 4 steps, rank 1's gradient NaN at bad_step; the second 2 steps. Then a
    barrier over every rank. Returns per step the error backward() raised (or None), and this
    rank's shards."""
    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", "dp"))
    model = _shard(_model(), mesh["dp"])
    state = CompressionState(spec, process_group=mesh["dp"].get_group())
    fsdp.compress_reduce_scatter(model, state)
    errors = _steps_with_a_nan(model, model[0], rank, 4 if rank < 2 else 2, bad_step if rank < 2 else -1)
    dist.barrier()
    return errors, _local(model)


def _steps_with_a_nan(model, first, rank, steps, bad_step):
    """Trains `steps` steps; at bad_step rank 1's gradient of first's output is NaN in columns
    0-7. Returns per step the error backward() raised (type and message) or None."""
    poisoned = {"on": False}

    def poison(grad):
        grad = grad.clone()
        grad[:, :8] = float("nan")
        return grad

    def arm(module, inputs, output):  # returns None: the output stays as it is
        if poisoned["on"]:
            output.register_hook(poison)

    first.register_forward_hook(arm)
    return _steps_with_errors(model, rank, steps, lambda step: poisoned.update(on=rank == 1 and step == bad_step))


def _steps_with_errors(model, rank, steps, before):
    """Trains `steps` steps, calling before(step) first in each. Returns per step the error
    backward() raised (type and message) or None."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    errors = []
    for step in range(steps):
        before(step)
        x, y = _batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        try:
            loss.backward()
        except Exception as e:  # noqa: BLE001 - recorded for the test
            errors.append((type(e).__name__, str(e)))
            opt.zero_grad()
            continue
        errors.append(None)
        opt.step()
    return errors


def resume(rank, world, spec, before, after, path, mode="replicas", warmup=0):
    """Trains `before` steps, saves model and state with torch.distributed.checkpoint, trains
    `after` more; then a new model and state load the checkpoint and train the same `after`
    steps. Returns (losses, shards) of both continuations. mode: compressed replicas (2 × 2) or
    reduce-scatter (a 1-D mesh), after `warmup` uncompressed steps."""
    import torch.distributed.checkpoint as dcp

    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    mesh = _mesh(world, 2) if mode == "replicas" else None
    flat = init_device_mesh("cpu", (world,)) if mode != "replicas" else None

    def build():
        if mode == "replicas":
            model = _shard(_model(), mesh["shard"])
            state = CompressionState(spec, process_group=mesh["replicate"].get_group())
            fsdp.compress_replicas(model, state, warmup=warmup)
        else:
            model = _shard(_model(), flat)
            state = CompressionState(spec)
            fsdp.compress_reduce_scatter(model, state, warmup=warmup)
        return model, state

    model, state = build()
    _train(model, rank, before)
    path = f"{path}/{spec.replace(':', '_').replace(',', '_').replace('=', '_')}"
    dcp.save({"model": model.state_dict(), "sketchsgd": fsdp.state_dict(state)}, checkpoint_id=path)
    continued = _train(model, rank, after, first=before), _local(model)
    model, state = build()
    _train(model, rank, 1, first=1000)  # the new state's codecs built and moved: the load must replace it all
    sd = {"model": model.state_dict(), "sketchsgd": fsdp.state_dict(state)}
    dcp.load(sd, checkpoint_id=path)
    model.load_state_dict(sd["model"])
    fsdp.load_state_dict(state, sd["sketchsgd"])
    resumed = _train(model, rank, after, first=before), _local(model)
    return continued, resumed


def diloco(rank, world, spec, every, steps):
    """DiLoCo over a sharded model (torchft's pattern): FSDP2 within each replica (a 1-D shard
    mesh), every `every` inner steps each rank's shard of the pseudo-gradient compressed across
    its replica group. Returns (first and last losses, this rank's shards, stats)."""
    from sketchsgd.torch import DiLoCo
    mesh = _mesh(world, 2)
    torch.manual_seed(rank)  # the replicas start apart: DiLoCo takes each shard's first replica's
    model = _shard(torch.nn.Sequential(torch.nn.Linear(32, 65), torch.nn.ReLU(), torch.nn.Linear(65, 48),
                                       torch.nn.ReLU(), torch.nn.Linear(48, 10)), mesh["shard"])
    outer = DiLoCo(model, spec, every=every, process_group=mesh["replicate"].get_group())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        outer.step()
        losses.append(loss.item())
    return (np.mean(losses[:every]), np.mean(losses[-every:])), _local(model), outer.stats()


def full_shard(rank, world, spec, steps, warmup=0):
    """Full sharding over every rank (a 1-D mesh), the reduce-scatter through spec (None: FSDP2's
    own) after `warmup` uncompressed steps. Returns (losses, this rank's shards, stats)."""
    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    model = _shard(_model(), mesh)
    state = None
    if spec is not None:
        state = CompressionState(spec)
        fsdp.compress_reduce_scatter(model, state, warmup=warmup)
    return _train(model, rank, steps), _local(model), state.stats() if state else None


def _fsdp1(strategy="FULL_SHARD", orig=False, model=None):
    """The MLP (or model, a Sequential) under FSDP1 on the CPU: each Linear an instance, the root
    another (it holds no parameter of its own)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    model = _model() if model is None else model
    how = dict(sharding_strategy=getattr(ShardingStrategy, strategy), device_id=torch.device("cpu"),
               use_orig_params=orig)
    for i, layer in enumerate(model):
        if isinstance(layer, torch.nn.Linear):
            model[i] = FSDP(layer, **how)
    return FSDP(model, **how)


def _fsdp1_local(model):
    """This rank's part of every flat parameter (FSDP1: the sharded flat parameters), end to end."""
    return np.concatenate([p.detach().reshape(-1).numpy() for p in model.parameters()])


def fsdp1(rank, world, spec, steps, strategy="FULL_SHARD", warmup=0, orig=False):
    """FSDP1 with its gradients reduced through spec (None: FSDP1's own reduction). Returns
    (losses, this rank's flat parameters, stats)."""
    from sketchsgd import fsdp
    model = _fsdp1(strategy, orig)
    state = None
    if spec is not None:
        state = CompressionState(spec)
        fsdp.compress_fsdp1(model, state, warmup=warmup)
    return _train(model, rank, steps), _fsdp1_local(model), state.stats() if state else None


class _Scale(torch.nn.Module):
    """A 1-D parameter of 200 values (sent whole by the small-tensor rule) scaling 4 features."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.linspace(-0.5, 0.5, 200))

    def forward(self, x):
        return x * (1 + self.p.view(50, 4).mean(0))


def mixed_model():
    """An MLP whose first block, a 32 × 4 weight (128 values) and _Scale's 200, is one FSDP1 flat
    parameter whose later chunks hold whole tensors alone: over 2 ranks chunk 1 is 164 values of
    _Scale; over 4, chunks 2 and 3."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(32, 4, bias=False), _Scale()), torch.nn.ReLU(),
                               torch.nn.Linear(4, 10))


def fsdp1_mixed(rank, world, spec, steps):
    """mixed_model() under FSDP1 FULL_SHARD (the block and the last Linear instances of their own)
    with its gradients reduced through spec (None: FSDP1's own). Returns (losses, this rank's
    flat parameters, stats)."""
    from sketchsgd import fsdp
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    model = mixed_model()
    how = dict(sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"))
    model[0], model[2] = FSDP(model[0], **how), FSDP(model[2], **how)
    model = FSDP(model, **how)
    state = None
    if spec is not None:
        state = CompressionState(spec)
        fsdp.compress_fsdp1(model, state)
    return _train(model, rank, steps), _fsdp1_local(model), state.stats() if state else None


def fsdp1_non_finite(rank, world, spec, steps, bad_step, warmup=0):
    """At bad_step rank 1's gradient of the first layer is NaN. Returns (per step: the error
    backward() raised, by type and message, or None; this rank's flat parameters at the end)."""
    from sketchsgd import fsdp
    model = _fsdp1()
    state = CompressionState(spec)
    fsdp.compress_fsdp1(model, state, warmup=warmup)
    return _steps_with_a_nan(model, model.module[0], rank, steps, bad_step), _fsdp1_local(model)


def fsdp1_resume(rank, world, spec, before, after, path):
    """FSDP1's sharded state dict and the compression state saved with DCP after `before` steps;
    a new model and state loaded from it train the same `after` steps as the saved ones. Returns
    (losses, flat parameters) of both continuations."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

    from sketchsgd import fsdp

    def build():
        model, state = _fsdp1(), CompressionState(spec)
        fsdp.compress_fsdp1(model, state)
        return model, state

    def sd(model, state):
        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            return {"model": model.state_dict(), "sketchsgd": fsdp.state_dict(state)}

    model, state = build()
    _train(model, rank, before)
    path = f"{path}/{spec.replace(':', '_').replace(',', '_').replace('=', '_')}"
    dcp.save(sd(model, state), checkpoint_id=path)
    continued = _train(model, rank, after, first=before), _fsdp1_local(model)
    model, state = build()
    _train(model, rank, 1, first=1000)  # the new state's codecs built and moved: the load must replace it all
    loaded = sd(model, state)
    dcp.load(loaded, checkpoint_id=path)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        model.load_state_dict(loaded["model"])
    fsdp.load_state_dict(state, loaded["sketchsgd"])
    resumed = _train(model, rank, after, first=before), _fsdp1_local(model)
    return continued, resumed


def fsdp1_refusals(rank, world):
    """Every misuse compress_fsdp1() refuses, each as (name, error type, message)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from sketchsgd import fsdp
    out = []
    attempt = functools.partial(_attempt, out)

    # Every rank makes every group: pairs of ranks {0, 1}, {2, 3} and {0, 2}, {1, 3}.
    shards = [dist.new_group(g) for g in ([0, 1], [2, 3])][rank // 2]
    replicas = [dist.new_group(g) for g in ([0, 2], [1, 3])][rank % 2]
    attempt("not FSDP1", lambda: fsdp.compress_fsdp1(_model(), CompressionState("topk:k=10")))
    attempt("another group", lambda: fsdp.compress_fsdp1(_fsdp1(), CompressionState("topk:k=10", shards)))
    attempt("negative warm-up", lambda: fsdp.compress_fsdp1(_fsdp1(), CompressionState("topk:k=10"), -1))
    hooked = _fsdp1()
    hooked.register_comm_hook(None, lambda state, grad, output=None: None)
    attempt("a hook already", lambda: fsdp.compress_fsdp1(hooked, CompressionState("topk:k=10")))
    from torch.distributed.fsdp import ShardingStrategy
    hybrid = FSDP(_model(), sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_id=torch.device("cpu"),
                  process_group=(shards, replicas))
    attempt("hybrid", lambda: fsdp.compress_fsdp1(hybrid, CompressionState("topk:k=10", shards)))
    state = CompressionState("topk:k=10")
    fsdp.compress_fsdp1(_fsdp1(), state)
    attempt("a state twice", lambda: fsdp.compress_fsdp1(_fsdp1(), state))
    dist.barrier()
    return out


class _Branches(torch.nn.Module):
    """One FSDP module of three layers, `other` used in the forward only while use_other is set
    (a parameter that takes gradients but gets none in some steps: an MoE expert, a branch)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.other, self.out = torch.nn.Linear(32, 65), torch.nn.Linear(32, 65), torch.nn.Linear(65, 10)
        self.use_other = True

    def forward(self, x):
        h = self.inp(x) + self.other(x) if self.use_other else self.inp(x)
        return self.out(torch.relu(h))


def _build(rank, world, spec, mode, model):
    """model sharded by fully_shard (its Linear layers and the root) under mode: "replicas" (2 × 2,
    the replicas through spec, or FSDP2's own HSDP where spec is None) or "reduce_scatter" (a 1-D
    mesh; spec None: FSDP2's own reduce-scatter). Returns (model, state or None)."""
    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    if mode == "replicas":
        mesh = _mesh(world, 2)
        if spec is None:
            return _shard(model, mesh), None
        model, state = _shard(model, mesh["shard"]), CompressionState(spec, mesh["replicate"].get_group())
        fsdp.compress_replicas(model, state)
    else:
        model, state = _shard(model, init_device_mesh("cpu", (world,))), CompressionState(spec) if spec else None
        if spec:
            fsdp.compress_reduce_scatter(model, state)
    return model, state


def _narrow():
    """An MLP whose layers PowerSGD would not factor at rank 8 (6 × 32 and 4 × 6: their factors
    outweigh them)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))


def whole_units(rank, world, spec, mode, steps, narrow):
    """fsdp_jobs' MLP (or _narrow's, narrow=True) under mode (replicas, reduce_scatter or fsdp1)
    with spec (None: FSDP's own reduction). Returns (losses, this rank's shards, stats or None)."""
    from sketchsgd import fsdp
    model = _narrow() if narrow else _model()
    if mode == "fsdp1":
        model, state = _fsdp1(model=model), CompressionState(spec) if spec else None
        if state:
            fsdp.compress_fsdp1(model, state)
        return _train(model, rank, steps), _fsdp1_local(model), state.stats() if state else None
    model, state = _build(rank, world, spec, mode, model)
    return _train(model, rank, steps), _local(model), state.stats() if state else None


def frozen(rank, world, spec, mode, steps):
    """fsdp_jobs' MLP with its first layer's weight frozen and its bias trained (requires_grad
    False, as LoRA freezes a layer's base weight: FSDP2 reduces that module's bias alone).
    Returns (losses, this rank's shards, stats or None, whether the frozen weight's shard is as
    it was)."""
    model = _model()
    model[0].weight.requires_grad_(False)
    model, state = _build(rank, world, spec, mode, model)
    before = model[0].weight.to_local().detach().clone()
    losses = _train(model, rank, steps)
    return (losses, _local(model), state.stats() if state else None,
            torch.equal(before, model[0].weight.to_local().detach()))


def unused(rank, world, spec, mode, steps, skip_step, zeros=False):
    """_Branches (one FSDP module) sharded under mode with spec; at skip_step `other` is left out of the forward
    (on every rank under "reduce_scatter", on replica 1's ranks 2 and 3 alone under "replicas").
    zeros: set_reduce_scatter_unused_params(True) first (FSDP2 reduces zeros for it). Returns per
    step the error backward() raised (or None), this rank's shards, and whether its worker state
    (error feedback) came out of skip_step as it went in."""
    from sketchsgd._checkpoint import worker_states
    model, state = _build(rank, world, spec, mode, _Branches())
    if zeros:
        model.set_reduce_scatter_unused_params(True)
    leave_out = rank >= 2 if mode == "replicas" else True
    kept = {}

    def before(step):
        model.use_other = not (step == skip_step and leave_out)
        if step in (skip_step, skip_step + 1):
            kept[step] = worker_states(state.state_dict(gather=False)["units"])
    errors = _steps_with_errors(model, rank, steps, before)
    same = all(torch.equal(a, b) for a, b in zip(kept[skip_step].values(), kept[skip_step + 1].values()))
    return errors, _local(model), same


def divided(rank, world, spec, mode, steps, factor):
    """set_gradient_divide_factor(factor) on every FSDP module under mode with spec (None: FSDP2's
    own reduction). FSDP2 reduces float32 with ReduceOp.PREMUL_SUM(1 / factor), which gloo lacks:
    its own collectives (spec None, and the reduce-scatter under HSDP) are made sums divided
    after (set_force_sum_reduction_for_comms); a compressed reduce-scatter is handed the
    PREMUL_SUM. Returns (losses, this rank's shards)."""
    from torch.distributed.fsdp import FSDPModule
    model, _ = _build(rank, world, spec, mode, _model())
    for m in model.modules():  # (it sets a module's own parameter group alone)
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(factor)
            m.set_force_sum_reduction_for_comms(spec is None or mode == "replicas")
    return _train(model, rank, steps, lr=0.02), _local(model)


def accumulated(rank, world, spec, steps, micro):
    """HSDP (2 × 2) with FSDP2's gradient accumulation idiom: `micro` micro-batches a step, the
    replicas' all-reduce on the last alone (set_requires_all_reduce). spec None: FSDP2's own HSDP.
    Returns (losses, this rank's shards, stats or None)."""
    model, state = _build(rank, world, spec, "replicas", _model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            model.set_requires_all_reduce(m == micro - 1)
            x, y = _batch(rank, step * micro + m)
            loss = torch.nn.functional.cross_entropy(model(x), y) / micro
            loss.backward()
            losses.append(loss.item())
        opt.step()
    return losses, _local(model), state.stats() if state else None


def diloco_misuse(rank, world, spec, every, bad_sync):
    """DiLoCo over the MLP sharded 2 × 2. Refusals, each (name, error type, message): the default
    group and the shard group (each holds another shard of the parameters), and fully_shard given
    the 2-D mesh (FSDP2 averages the replicas itself). Then training where rank 1's shard turns
    NaN in the last inner step before sync bad_sync: per sync the error outer.step() raised (or
    None), whether this rank's shards were left as they were by the failed sync, and the outcome
    of loading rank 0's state_dict(gather=False) on this rank."""
    from sketchsgd.torch import DiLoCo
    mesh = _mesh(world, 2)
    out = []
    attempt = functools.partial(_attempt, out)
    attempt("default group", lambda: DiLoCo(_shard(_model(), mesh["shard"]), spec, every=every))
    attempt("shard group", lambda: DiLoCo(_shard(_model(), mesh["shard"]), spec, every=every,
                                          process_group=mesh["shard"].get_group()))
    attempt("2-D mesh", lambda: DiLoCo(_shard(_model(), mesh), spec, every=every,
                                       process_group=mesh["replicate"].get_group()))
    model = _shard(_model(), mesh["shard"])
    outer = DiLoCo(model, spec, every=every, process_group=mesh["replicate"].get_group())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    errors, kept = [], None
    for step in range(every * (bad_sync + 1)):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 1 and step == every * (bad_sync + 1) - 1:
            with torch.no_grad():
                model[0].weight.to_local()[0, 0] = float("nan")
        before = _local(model)
        try:
            if outer.step():
                errors.append(None)
        except Exception as e:  # noqa: BLE001 - recorded for the test
            errors.append((type(e).__name__, str(e)))
            kept = np.array_equal(before, _local(model), equal_nan=True)
    saved = [outer.state_dict(gather=False) if rank == 0 else None]
    dist.broadcast_object_list(saved, src=0)
    loaded = []
    _attempt(loaded, "rank 0's state", lambda: outer.load_state_dict(saved[0]))
    return out, errors, kept, loaded[0]


def refused_unit(rank, world, spec, mode, steps, warmup):
    """The MLP under mode (reduce_scatter, replicas or fsdp1) registered with spec, one that a
    module's unit refuses, and `warmup` fp32 backward passes to come. Returns the registration's
    (error type, message), or (None, ""), and per step the error backward() raised, or None:
    the model trains on with FSDP's own reduction."""
    from sketchsgd import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    registered = []
    if mode == "replicas":
        mesh = _mesh(world, 2)
        model, state = _shard(_model(), mesh["shard"]), CompressionState(spec, mesh["replicate"].get_group())
        _attempt(registered, mode, lambda: fsdp.compress_replicas(model, state, warmup=warmup))
    elif mode == "fsdp1":
        model, state = _fsdp1(), CompressionState(spec)
        _attempt(registered, mode, lambda: fsdp.compress_fsdp1(model, state, warmup=warmup))
    else:
        model, state = _shard(_model(), init_device_mesh("cpu", (world,))), CompressionState(spec)
        _attempt(registered, mode, lambda: fsdp.compress_reduce_scatter(model, state, warmup=warmup))
    return registered[0][1:], _steps_with_errors(model, rank, steps, lambda step: None)
