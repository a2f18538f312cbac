"""Rank functions of the DDP tests (module level, so spawned processes can import them)."""

import io
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from sketchsgd.torch import CompressionState, FlatBucket, compression_hook


def each(rank, world, job, specs, *args):
    """job (a function of this module, by name) for each spec in turn in one set of processes:
    {spec: its result} (starting the processes costs more than a small job)."""
    return {spec: globals()[job](rank, world, spec, *args) for spec in specs}


def several(rank, world, calls):
    """Jobs of this module one after the other in one set of processes: calls are (name, args)
    pairs; returns their results in order (each job makes its own models and states)."""
    return [globals()[name](rank, world, *args) for name, args in calls]


_seeding = threading.Lock()  # simulated ranks are threads, and torch's generator is the process's


def model(seed=0, bias=True):
    with _seeding:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, 96, bias=bias), nn.ReLU(), nn.Linear(96, 10, bias=bias))


def batch(rank, step, n=32):
    """A separable 10-class problem; every rank draws its own examples."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 64, generator=g)
    w = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))
    return x, (x @ w).argmax(1)


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def train(ddp_model, opt, rank, steps, first=0, device="cpu"):
    losses = []
    for step in range(first, first + steps):
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(ddp_model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def every_codec(rank, world, specs, steps, device="cpu", bucket_cap_mb=0.002):
    """Trains one model per spec; returns (first loss, mean of the last 5, params bytes, stats)."""
    out = {}
    # DDP caps its first bucket separately (1 MiB): lower it too, so the model spans buckets.
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_cap_mb * 1024 * 1024)
    for spec in specs:
        m = model().to(device)
        ddp = DDP(m, bucket_cap_mb=bucket_cap_mb, device_ids=[torch.device(device).index] if device != "cpu" else None)
        state = CompressionState(spec)
        ddp.register_comm_hook(state, compression_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        losses = train(ddp, opt, rank, steps, device=device)
        out[spec] = (losses[0], sum(losses[-5:]) / 5, flat(m).cpu().numpy().tobytes(), state.stats(),
                     len(state.units.fixed))
    return out


def quarter_integers(shape, seed):
    """Values k/4 with small k: sums in any order are exact, so an all-reduce's sum equals the
    aggregator's sum of messages bit for bit."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-40, 41, shape, generator=g).float() / 4


def hook_rounds(rank, world, specs, rounds, start_iter=2):
    """Per spec, calls the hook on fake buckets (a weight matrix and a bias) for start_iter +
    rounds steps; returns each compressed step's (weight, bias, output) of this rank."""
    out = {}
    for spec in specs:
        state = CompressionState(spec, start_iter=start_iter)
        params = [torch.zeros(48, 40), torch.zeros(40)]
        seen = []
        for step in range(start_iter + rounds):
            w = quarter_integers((48, 40), 10 * step + rank)
            b = quarter_integers((40,), 10 * step + rank + 5)
            result = compression_hook(state, FlatBucket(0, params, [w, b])).wait()
            if step >= start_iter:
                seen.append((w.numpy(), b.numpy(), result.numpy().copy()))
        out[spec] = seen
    return out


def hooked(spec, state=None):
    """A fresh model in DDP with the hook registered (state, or a new one for spec) and SGD with
    momentum: (model, ddp, state, optimizer)."""
    m = model()
    ddp = DDP(m)
    state = state or CompressionState(spec)
    ddp.register_comm_hook(state, compression_hook)
    return m, ddp, state, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)


def resume(rank, world, spec, before, after):
    """Runs before + after steps in one go, and again stopped after `before` and resumed from
    state_dicts in a new DDP model; returns both final parameter vectors."""
    m, ddp, state, opt = hooked(spec)
    train(ddp, opt, rank, before)
    saved = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, saved)
    train(ddp, opt, rank, after, first=before)
    straight = flat(m)

    m2, ddp2, state2, opt2 = hooked(spec)
    saved.seek(0)
    ckpt = torch.load(saved, weights_only=True)  # PyTorch's default since 2.6
    m2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    state2.load_state_dict(ckpt["hook"])
    train(ddp2, opt2, rank, after, first=before)
    return straight.numpy().tobytes(), flat(m2).numpy().tobytes(), state2.iteration


def pickled(rank, world, spec, before, after):
    """resume() with the whole state pickled (torch.save(state) / torch.load): the process group
    is dropped and the default group bound again; returns both final parameter vectors."""
    m, ddp, state, opt = hooked(spec)
    train(ddp, opt, rank, before)
    saved = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "hook": state}, saved)
    train(ddp, opt, rank, after, first=before)
    straight = flat(m)
    saved.seek(0)
    ckpt = torch.load(saved, weights_only=False)
    assert ckpt["hook"].process_group is None and ckpt["hook"].iteration == before
    m2, ddp2, _, opt2 = hooked(spec, ckpt["hook"])
    m2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    train(ddp2, opt2, rank, after, first=before)
    return straight.numpy().tobytes(), flat(m2).numpy().tobytes()


def rank0_state_everywhere(rank, world, spec, steps, gather):
    """Every rank loads rank 0's state_dict (gather: the collective one, every rank's worker
    state in rank 0's; else rank 0's own alone)."""
    m = model()
    ddp = DDP(m)
    state = CompressionState(spec)
    ddp.register_comm_hook(state, compression_hook)
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), rank, steps)
    shared = [state.state_dict(gather=gather)]
    dist.broadcast_object_list(shared, src=0)
    before = state.state_dict(gather=False)
    try:
        state.load_state_dict(shared[0])
    except Exception as e:  # noqa: BLE001 - reported, so that every rank ends its job alike
        unchanged = repr(state.state_dict(gather=False)) == repr(before)
        return type(e).__name__, str(e), unchanged
    return "loaded", "", repr(state.state_dict(gather=False)) == repr(before)


def rank0_checkpoint(rank, world, spec, before, after, path, tutorial=False):
    """One file for the job, written by rank 0 after `before` steps, then dist.barrier().
    tutorial=False: Accelerate's and Lightning's convention, every rank calls state_dict() (model,
    optimiser and the hook's state); tutorial=True: PyTorch's DDP tutorial word for word, `if
    rank == 0: torch.save(...)` with the hook's state_dict() called there alone. Every rank loads
    that file into a new DDP model and goes on. Returns the parameters of the uninterrupted run
    and of the resumed one, the ranks whose worker state the file holds and the seconds rank 0's
    save took."""
    import time
    m, ddp, state, opt = hooked(spec)
    train(ddp, opt, rank, before)

    def checkpoint():
        return {"model": m.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}

    ckpt, took = None if tutorial else checkpoint(), None
    if rank == 0:
        start = time.monotonic()
        torch.save(ckpt or checkpoint(), path)
        took = time.monotonic() - start
    dist.barrier()
    train(ddp, opt, rank, after, first=before)
    straight = flat(m)

    m2, ddp2, state2, opt2 = hooked(spec)
    loaded = torch.load(path, weights_only=True)
    m2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["opt"])
    state2.load_state_dict(loaded["hook"])
    train(ddp2, opt2, rank, after, first=before)
    return straight.numpy().tobytes(), flat(m2).numpy().tobytes(), sorted(loaded["hook"]["workers"]), took


def save_after_others_moved_on(rank, world, spec, before):
    """Rank 0 saves alone while the other ranks have begun the next step (no barrier): their
    worker state has changed, so rank 0's state_dict() raises at once, naming them; rank 0 then
    takes its step and every rank goes on. Returns (error type, message, seconds) on rank 0."""
    import time
    m, ddp, state, opt = hooked(spec)
    train(ddp, opt, rank, before)
    out = None
    if rank == 0:
        time.sleep(1.0)  # the others are inside the next step's hook by now, waiting for rank 0
        start = time.monotonic()
        try:
            state.state_dict()
            out = ("no error", "", time.monotonic() - start)
        except Exception as e:  # noqa: BLE001 - the test reads it
            out = (type(e).__name__, str(e), time.monotonic() - start)
    train(ddp, opt, rank, 1, first=before)
    return out


def state_before_the_process_group(rank, world, specs, steps):
    """Lightning's order: the CompressionState is made before init_process_group (it binds at
    the first hook call). Per spec: whether it was unbound, the rank it bound to, and whether the
    run's parameters equal those of a state made after."""
    import ddp as harness
    early = {spec: CompressionState(spec) for spec in specs}
    unbound = {spec: s.rank is None and s.world_size is None for spec, s in early.items()}
    harness.init(rank, world)
    result = {}
    for spec in specs:
        out = []
        for state in (early[spec], CompressionState(spec)):
            m = model()
            d = DDP(m)
            d.register_comm_hook(state, compression_hook)
            train(d, torch.optim.SGD(d.parameters(), lr=0.05, momentum=0.9), rank, steps)
            out.append(flat(m).numpy().tobytes())
        result[spec] = (unbound[spec], early[spec].rank, out[0] == out[1])
    return result


def first_hook_checks_ranks(rank, world, steps):
    """States made before the process group with a start_iter that differs on rank 1: the first
    hook call compares them on every rank and raises on every rank alike."""
    import ddp as harness
    state = CompressionState("topk:k=40", start_iter=3 if rank == 1 else 2)
    harness.init(rank, world)
    params = [torch.zeros(8, 8)]
    try:
        compression_hook(state, FlatBucket(0, params, [torch.ones(8, 8)])).wait()
    except ValueError as e:
        return str(e)
    return None


def no_sync(rank, world, spec, steps):
    """Two micro-batches per step, the first under no_sync(); returns params and the hook's
    iteration count."""
    m = model()
    ddp = DDP(m)
    state = CompressionState(spec)
    ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        opt.zero_grad()
        with ddp.no_sync():
            x, y = batch(rank, 2 * step)
            nn.functional.cross_entropy(ddp(x), y).backward()
        x, y = batch(rank, 2 * step + 1)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return flat(m).numpy().tobytes(), state.iteration


def big_batch(rank, world, steps):
    """The same job as no_sync() with plain DDP and both micro-batches in one backward."""
    m = model()
    ddp = DDP(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        opt.zero_grad()
        x1, y1 = batch(rank, 2 * step)
        x2, y2 = batch(rank, 2 * step + 1)
        (nn.functional.cross_entropy(ddp(x1), y1) + nn.functional.cross_entropy(ddp(x2), y2)).backward()
        opt.step()
    return flat(m).numpy().tobytes()


def half_buckets(rank, world, specs, dtype, steps=4, device="cpu"):
    """Per spec, the hook on the same gradients in a float32 bucket and in a bucket of dtype
    (values a 16-bit float holds exactly): returns both results of each step of this rank."""
    out = {}
    half = getattr(torch, dtype)
    params = [torch.zeros(24, 40, device=device), torch.zeros(24, device=device)]
    for spec in specs:
        wide, narrow = CompressionState(spec), CompressionState(spec)
        got = []
        for step in range(steps):
            grads = [quarter_integers(p.shape, 100 * step + 10 * rank + i).to(device) for i, p in enumerate(params)]
            a = compression_hook(wide, FlatBucket(0, params, grads)).wait()
            b = compression_hook(narrow, FlatBucket(0, params, [g.to(half) for g in grads])).wait()
            got.append((a.cpu().numpy().tobytes(), b.dtype == half, b.float().cpu().numpy().tobytes()))
        out[spec] = got
    return out


def under_fp16_wrapper(rank, world, specs, steps, wrap="fp16"):
    """Per spec, a float32 model trained through PyTorch's fp16_compress_wrapper (wrap="bf16":
    bf16_compress_wrapper) around our hook (the wrapper hands the hook a half-precision bucket);
    returns (first loss, mean of the last 5, params bytes)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    out = {}
    for spec in specs:
        m = model()
        ddp = DDP(m)
        hook = getattr(default_hooks, f"{wrap}_compress_wrapper")(compression_hook) if wrap else compression_hook
        ddp.register_comm_hook(CompressionState(spec), hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        losses = train(ddp, opt, rank, steps)
        out[spec] = (losses[0], sum(losses[-5:]) / 5, flat(m).numpy().tobytes())
    return out


def uneven_inputs(rank, world, spec, steps, coalesce=False):
    """Join with uneven inputs: rank r trains steps + r batches; ranks that finish early shadow
    the others' collectives (DDP runs the hook on zero buckets). coalesce: CompressionState's,
    with a bucket per layer. Returns the final parameters."""
    from torch.distributed.algorithms.join import Join
    m = model()
    if coalesce:
        dist._DEFAULT_FIRST_BUCKET_BYTES = 4_000
    d = DDP(m, bucket_cap_mb=0.004 if coalesce else 25)
    d.register_comm_hook(CompressionState(spec, coalesce=coalesce), compression_hook)
    opt = torch.optim.SGD(d.parameters(), lr=0.05)
    with Join([d]):
        train(d, opt, rank, steps + rank)
    return flat(m).numpy().tobytes()


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.a, self.b = nn.Linear(64, 96), nn.Linear(96, 10), nn.Linear(96, 10)

    def forward(self, x, step):
        h = torch.relu(self.body(x))
        return self.a(h) if step % 2 == 0 else self.b(h)


def unused_parameters(rank, world, spec, steps, coalesce=False):
    """find_unused_parameters=True with a head used every other step: returns the parameters and
    whether every loss was finite. coalesce: CompressionState's, with a bucket per layer."""
    m = _TwoHeads()
    if coalesce:
        dist._DEFAULT_FIRST_BUCKET_BYTES = 4_000
    d = DDP(m, find_unused_parameters=True, bucket_cap_mb=0.004 if coalesce else 25)
    d.register_comm_hook(CompressionState(spec, coalesce=coalesce), compression_hook)
    opt = torch.optim.SGD(d.parameters(), lr=0.05)
    finite = True
    for step in range(steps):
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(d(x, step), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        finite = finite and bool(torch.isfinite(loss))
    return flat(m).numpy().tobytes(), finite and bool(torch.isfinite(flat(m)).all())


def low_precision(rank, world, spec, dtype):
    """A model in a precision the hook does not take (float64): it must refuse its buckets on
    every rank."""
    m = model().to(getattr(torch, dtype))
    ddp = DDP(m)
    ddp.register_comm_hook(CompressionState(spec), compression_hook)
    x, y = batch(rank, 0)
    ddp(x.to(m[0].weight.dtype)).float().sum().backward()


def spec_per_rank(rank, world, specs):
    """Each rank builds the state with its own spec: all must refuse."""
    CompressionState(specs[rank])


def every_codec_on_own_gpu(rank, world, specs, steps):
    torch.cuda.set_device(rank)
    return every_codec(rank, world, specs, steps, device=f"cuda:{rank}")


def finish_errors(rank, world, specs):
    """Per spec, steps of two buckets (the first not the last of the step, then the last): two
    steps as they are, then one with the round's finish failing. Returns (spec, last, raised by
    the call, message from wait, finish ran on this thread) for both buckets of that step."""
    import threading

    from sketchsgd import _rounds

    out, real = [], _rounds.settled
    threads = []

    def failing(self, *a, **k):
        threads.append(threading.get_ident())
        raise RuntimeError("finish failed on purpose")

    for spec in specs:
        state = CompressionState(spec, start_iter=2)
        params = [torch.zeros(48, 40), torch.zeros(40, 40)]
        for step in range(3):
            grads = [quarter_integers(p.shape, 10 * step + rank + i) for i, p in enumerate(params)]
            if step == 2:
                _rounds.settled = failing
            try:
                for i, last in ((0, False), (1, True)):
                    threads.clear()
                    try:
                        fut, raised = compression_hook(state, FlatBucket(i, [params[i]], [grads[i]], last=last)), None
                    except Exception as e:  # noqa: BLE001 - recorded for the test
                        fut, raised = None, str(e)
                    message = None
                    if fut is not None:
                        try:
                            fut.wait()
                        except Exception as e:  # noqa: BLE001 - recorded for the test
                            message = str(e)
                    if step == 2:
                        out.append((spec, last, raised, message, threads == [threading.get_ident()]))
            finally:
                _rounds.settled = real
    return out


def non_finite_on_one_rank(rank, world, specs):
    """Per spec: two warm-up steps, then one where rank 1's gradient holds a NaN, then one where
    every gradient is finite. Returns (spec, raised by the call, message from wait, error type)
    for the NaN step and whether the step after it matched on every rank."""
    out = []
    for spec in specs:
        state = CompressionState(spec, start_iter=2)
        params = [torch.zeros(48, 40), torch.zeros(40)]
        outcome = None
        for step in range(4):
            w = quarter_integers((48, 40), 10 * step + rank)
            b = quarter_integers((40,), 10 * step + rank + 5)
            if step == 2 and rank == 1:
                w[3, 7] = float("nan")
            raised = message = kind = None
            try:
                fut = compression_hook(state, FlatBucket(0, params, [w, b]))
                result = fut.wait()
            except Exception as e:  # noqa: BLE001 - recorded for the test
                message, kind = str(e), type(e).__name__
            if step == 2:
                outcome = (spec, raised, message, kind)
            if step == 3:
                everyone = [torch.empty_like(result) for _ in range(world)]
                dist.all_gather(everyone, result)
                same = all(torch.equal(everyone[0], t) for t in everyone)
        out.append(outcome + (same,))
    return out


# ---- the outer loop (sketchsgd.torch.DiLoCo) ----------------------------------------------------
def local_steps(m, outer, opt, rank, steps, first=0, poison_at=None, device="cpu"):
    """Inner steps on this rank's own batches, outer.step() after each; returns the losses."""
    losses = []
    for step in range(first, first + steps):
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(m(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if poison_at == step:
            with torch.no_grad():
                m[0].weight[3, 5] = float("nan")
        outer.step()
        losses.append(loss.item())
    return losses


def averaged(rank, world):
    """sketchsgd.torch.average() with bad arguments (the errors' texts), then dense and topk on
    rank-dependent tensors over three calls: (errors, dense means, topk outputs, topk stats)."""
    from sketchsgd.torch import average
    state = CompressionState("dense")
    errors = []
    for bad in ([], [torch.ones(3, dtype=torch.int64)], [torch.ones(3), "x"]):
        try:
            average(state, bad)
        except (TypeError, ValueError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    tensors = [torch.full((4, 3), float(rank)), torch.arange(5, dtype=torch.float16) * (rank + 1)]
    dense = [[t.numpy().copy() for t in average(state, tensors)] for _ in range(3)]
    topk = CompressionState("topk:k=2")
    outs = []
    for _ in range(3):
        outs.append(torch.cat([t.reshape(-1) for t in average(topk, [torch.full((6, 4), 1.0 + rank)])]).numpy())
    return errors, dense, outs, topk.stats()


def outer_loop(rank, world, spec, every, steps, group=None):
    """Trains with DiLoCo(spec, every); returns (first loss, mean of the last 5, params after
    the last sync, stats). group: a simulated group's rank (sketchsgd.simulate), else the
    default process group."""
    from sketchsgd.torch import DiLoCo
    m = model(seed=rank)  # different on every rank: DiLoCo starts them from rank 0's
    outer = DiLoCo(m, spec, every=every, process_group=group)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = local_steps(m, outer, opt, rank, steps)
    return losses[0], sum(losses[-5:]) / 5, flat(m).numpy().tobytes(), outer.stats()


def outer_loops(rank, world, specs, every, steps, group=None):
    """outer_loop() for each spec, in one set of processes: spec -> its result."""
    return {spec: outer_loop(rank, world, spec, every, steps, group) for spec in specs}


def outer_error_feedback(rank, world, syncs):
    """DiLoCo with top-10 of a 10x10 weight, plain averaging outside (SGD lr 1): each inner step
    moves this rank's weight by -0.01 (rank + 1) g, g a fixed ramp from 1 to 0.5, so every
    interval's pseudo-gradient is the same and its top 10 always the same coordinates. Returns
    the weight after `syncs` syncs (it starts at zero)."""
    from sketchsgd.torch import DiLoCo
    m = nn.Linear(10, 10, bias=False)
    with torch.no_grad():
        m.weight.zero_()
    outer = DiLoCo(m, "topk:k=10", every=2, outer_optimizer=lambda p: torch.optim.SGD(p, lr=1.0))
    g = (rank + 1) * torch.linspace(1.0, 0.5, 100).view(10, 10)
    for _ in range(2 * syncs):
        with torch.no_grad():
            m.weight.sub_(0.01 * g)
        outer.step()
    return m.weight.detach().reshape(-1).numpy().copy()


def outer_every_step_vs_ddp(rank, world, steps):
    """DiLoCo with H = 1, dense, outer SGD lr 1 without momentum and inner SGD: parameter
    averaging after every step, which is DDP with SGD. Returns both parameter vectors."""
    from sketchsgd.torch import DiLoCo
    m = model()
    outer = DiLoCo(m, "dense", every=1, outer_optimizer=lambda p: torch.optim.SGD(p, lr=1.0))
    local_steps(m, outer, torch.optim.SGD(m.parameters(), lr=0.05), rank, steps)
    m2 = model()
    d = DDP(m2)
    train(d, torch.optim.SGD(d.parameters(), lr=0.05), rank, steps)
    return flat(m).numpy(), flat(m2).numpy()


def outer_resume(rank, world, spec, before, after, folder, per_rank, group=None):
    """Saves model, inner optimizer and outer state after `before` steps and resumes from them
    in a new model. per_rank: each rank its own file (Adam inside, mid-interval); else rank 0's
    file alone, gathered, right after a sync (plain SGD inside). Returns the uninterrupted and
    the resumed parameters."""
    from sketchsgd.torch import DiLoCo

    def fresh():
        m = model()
        opt = torch.optim.Adam(m.parameters(), lr=0.01) if per_rank else torch.optim.SGD(m.parameters(), lr=0.05)
        return m, DiLoCo(m, spec, every=3, process_group=group), opt

    m, outer, opt = fresh()
    local_steps(m, outer, opt, rank, before)
    path = f"{folder}/{rank if per_rank else 0}.pt"
    if per_rank:
        torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "outer": outer.state_dict(gather=False)}, path)
    elif rank == 0:  # PyTorch's tutorial: rank 0 alone saves, the others wait in the barrier
        torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "outer": outer.state_dict()}, path)
    group.barrier() if group is not None else dist.barrier()
    local_steps(m, outer, opt, rank, after, first=before)
    m2, outer2, opt2 = fresh()
    loaded = torch.load(path)
    m2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["opt"])
    outer2.load_state_dict(loaded["outer"])
    local_steps(m2, outer2, opt2, rank, after, first=before)
    return flat(m).numpy().tobytes(), flat(m2).numpy().tobytes()


def outer_non_finite(rank, world, spec, group=None):
    """Rank 1's model turns NaN before the second sync: every rank raises NonFiniteError there,
    its anchor unchanged; after each rank restores its model the next sync goes on alike."""
    from sketchsgd import NonFiniteError
    from sketchsgd.torch import DiLoCo
    m = model()
    outer = DiLoCo(m, spec, every=2, process_group=group)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    local_steps(m, outer, opt, rank, 2)
    anchor = flat(m).clone()
    raised = None
    try:
        local_steps(m, outer, opt, rank, 2, first=2, poison_at=3 if rank == 1 else None)
    except NonFiniteError as e:
        raised = str(e)
    kept = torch.equal(torch.cat([a.reshape(-1) for a in outer.anchor]), anchor)
    with torch.no_grad():  # start the interval again from the anchor
        for p, a in zip(outer.params, outer.anchor):
            p.copy_(a)
    local_steps(m, outer, opt, rank, 2, first=4)
    return raised, kept, flat(m).numpy().tobytes()


def outer_bad_arguments(rank, world):
    """Each bad argument: (what, the error's type name), or None where nothing was raised."""
    from sketchsgd.torch import DiLoCo
    cases = {
        "every=0": lambda: DiLoCo(model(), every=0),
        "warmup=-1": lambda: DiLoCo(model(), warmup=-1),
        "every=2.5": lambda: DiLoCo(model(), every=2.5),
        "no module": lambda: DiLoCo([torch.zeros(3)]),
        "no parameters": lambda: DiLoCo(nn.ReLU()),
        "float64": lambda: DiLoCo(model().double()),
        "outer not an optimizer": lambda: DiLoCo(model(), outer_optimizer=lambda p: p),
        "bad spec": lambda: DiLoCo(model(), spec="topk:k=-3"),
        "foreign state_dict": lambda: DiLoCo(model()).load_state_dict({"version": 7}),
        "truncated state_dict": lambda: DiLoCo(model()).load_state_dict({"version": 1, "every": 16}),
        "anchor_device=nowhere": lambda: DiLoCo(model(), anchor_device="nowhere"),
    }
    out = {}
    for what, make in cases.items():
        try:
            make()
            out[what] = None
        except Exception as e:  # noqa: BLE001 - the test checks the type
            out[what] = type(e).__name__
    return out


# ---- overlap: the hook hands a bucket's later collectives to its first one's callback ------------
def deep_model(seed=0):
    torch.manual_seed(seed)
    layers = [nn.Linear(64, 48), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(48, 48), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(48, 10))


def many_buckets(rank, world, specs, steps, mode, device="cpu"):
    """Trains deep_model() under DDP with about a bucket per layer. mode: "overlap" (the
    default: later phases issued from callbacks), "blocking" (every bucket finishes inside its
    hook call, collectives issued from the autograd thread alone: the order before the overlap)
    or "coalesce" (CompressionState(coalesce=True)). Returns per spec (parameters as bytes,
    units, collectives the hook issued in the last step)."""
    dist._DEFAULT_FIRST_BUCKET_BYTES = 4_000
    out = {}
    for spec in specs:
        m = deep_model().to(device)
        ddp = DDP(m, bucket_cap_mb=0.004, device_ids=[torch.device(device).index] if device != "cpu" else None)
        state = CompressionState(spec, coalesce=mode == "coalesce")
        state.blocking = mode == "blocking"
        ddp.register_comm_hook(state, compression_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        train(ddp, opt, rank, steps - 1, device=device)
        with counting_collectives() as issued:
            train(ddp, opt, rank, 1, first=steps - 1, device=device)
        out[spec] = (flat(m).cpu().numpy().tobytes(), len(state.units.fixed), issued[0])
    return out


class counting_collectives:
    """Counts the all-reduces and all-gathers called through torch.distributed meanwhile (the
    hook's; DDP's own reducer calls the backend directly)."""

    def __enter__(self):
        self.saved = dist.all_reduce, dist.all_gather
        issued = self.issued = [0]

        def counted(f):
            def call(*args, **kwargs):
                issued[0] += 1
                return f(*args, **kwargs)
            return call
        dist.all_reduce, dist.all_gather = (counted(f) for f in self.saved)
        return issued

    def __exit__(self, *exc):
        dist.all_reduce, dist.all_gather = self.saved


def returns_before_its_collectives_complete(rank, world, specs, path, device="cpu"):
    """Per spec, two buckets a step (the first not the last). From the first compressed step on,
    rank 1 calls the hook for the first bucket only once rank 0's call for it has returned (a
    key in a FileStore): a hook that waited there for the bucket's first collective would wait
    for rank 1, which waits for it (the store gives up after 60 s). Then the same steps with the
    state blocking (every bucket finished in its call). Returns per spec the outputs of both
    runs, as bytes, per step."""
    from datetime import timedelta
    store = dist.FileStore(path, world)
    out = {}
    for spec in specs:
        runs = []
        for blocking in (False, True):
            state = CompressionState(spec, start_iter=2)
            state.blocking = blocking
            params = [torch.zeros(48, 40, device=device), torch.zeros(40, 40, device=device)]
            got = []
            for step in range(5):
                grads = [quarter_integers(p.shape, 10 * step + rank + i).to(device) for i, p in enumerate(params)]
                key = f"{spec}:{step}"
                handshake = not blocking and step >= 2
                if handshake and rank == 1:
                    store.wait([key], timedelta(seconds=60))
                first = compression_hook(state, FlatBucket(0, [params[0]], [grads[0]], last=False))
                if handshake and rank == 0:
                    store.set(key, "returned")
                last = compression_hook(state, FlatBucket(1, [params[1]], [grads[1]], last=True))
                got.append(torch.cat([first.wait(), last.wait()]).cpu().numpy().tobytes())
            runs.append(got)
        out[spec] = runs
    return out


def non_finite_in_an_early_bucket(rank, world, specs, device="cpu", coalesce=False):
    """Per spec, two buckets a step; in the first compressed step rank 1's first bucket (not the
    last of the step) holds a NaN. Returns (spec, error of the first bucket's future or None,
    the last bucket's output or None, whether the next step ends identical on every rank)."""
    out = []
    for spec in specs:
        state = CompressionState(spec, start_iter=2, coalesce=coalesce)
        params = [torch.zeros(48, 40, device=device), torch.zeros(40, 40, device=device)]
        for step in range(4):
            grads = [quarter_integers(p.shape, 10 * step + rank + i).to(device) for i, p in enumerate(params)]
            if step == 2 and rank == 1:
                grads[0][3, 7] = float("nan")
            futures, errors = [], []
            for i, last in ((0, False), (1, True)):
                try:
                    futures.append(compression_hook(state, FlatBucket(i, [params[i]], [grads[i]], last=last)))
                except Exception as e:  # noqa: BLE001 - recorded for the test
                    futures.append(None)
                    errors.append(f"{type(e).__name__}: {e}")
            results = []
            for f in futures:
                try:
                    results.append(f.wait() if f is not None else None)
                    errors.append(None)
                except Exception as e:  # noqa: BLE001 - recorded for the test
                    results.append(None)
                    errors.append(f"{type(e).__name__}: {e}")
            if step == 2:
                outcome = (spec, [e for e in errors if e], results[1] is not None)
            if step == 3:
                mine = torch.cat(results).cpu()
                everyone = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(everyone, mine)
                same = all(torch.equal(everyone[0], t) for t in everyone)
        out.append(outcome + (same,))
    return out
