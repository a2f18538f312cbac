"""The drivers of a CompressionState's rounds: compression_hook (DDP's communication hook: warm-up,
overlap or coalescing, half-precision buckets) and average() (blocking, for a caller's own
tensors: the outer loop's pseudo-gradient) and reduce_shard() (FSDP2's all-reduce hook,
sketchsgd.fsdp). Each cuts a buffer into units and runs each unit's round (sketchsgd._rounds)
through the state's scheduler."""

import math

import torch
import torch.distributed as dist

from . import _comm, _core, _rounds
from ._schedule import combined
from ._state import CompressionState


def _rounds_of(state, index: int, ids, tensors, buf, window=None):
    """The rounds of the units a buffer holds (its tensors: ids and views, in buffer order);
    window: _rounds.round_of's."""
    return [_rounds.round_of(state.comm, u, buf, kept, whole, state.iteration, window)
            for u, kept, whole in _held(state, index, ids, tensors, buf)]


def _held(state, index: int, ids, tensors, buf):
    """(unit, its compressed runs, its whole runs) for each unit a buffer holds."""
    units = state.units
    entries, where = units.entries(ids, tensors, buf.numel(), index)
    units.fix(index, entries)
    return [(u, u.segments(where, True), u.segments(where, False))
            for u in units.held(index, entries, buf.device, state.comm.world)]


def _shard_rounds(state, index: int, shapes, buf, window):
    """_rounds_of for FSDP group index's buffer, whose tensors are the same at every call (keys
    (index, j), these shapes): its units and runs, found at the first call of a book of units
    (state.units.fixed: a load_state_dict() makes another), are kept. FSDP calls once per module
    a backward, where DDP calls once per bucket: what a call costs in Python counts as many
    times."""
    held = state.units.plan(index, buf.numel(),
                            lambda: _held(state, index, [(index, j) for j in range(len(shapes))], views_of(buf, shapes),
                                          buf))
    return [_rounds.round_of(state.comm, u, buf, kept, whole, state.iteration, window) for u, kept, whole in held]


def _widened(state, index, buf):
    """A float32 copy of a half-precision DDP bucket, the same tensor every step (a bucket's own:
    DDP's buckets are in flight together): the codecs and the collectives see float32 whatever
    the model's precision."""
    return state.buffer(("bucket", index), buf.numel(), torch.float32, buf.device).copy_(buf)


def scratch(state, name: str, n: int, dtype, device):
    """n values of dtype on device that every blocking call of the state reuses (sketchsgd.fsdp:
    one FSDP module's call ends before the next begins, so one buffer the size of the largest
    serves them all, where one per module would keep a copy of the whole unsharded gradient
    alive: the memory FSDP shards the model to save)."""
    return state.buffer(name, n, dtype, device)


def float32_of(state, name: str, t):
    """t as float32: itself, or a copy of a half-precision t in the scratch buffer `name`."""
    if t.dtype == torch.float32:
        return t
    return scratch(state, name, t.numel(), torch.float32, t.device).copy_(t.reshape(-1))


def _compressed(state, bucket, buf):
    ids = [id(p) for p in bucket.parameters()]
    rounds = _rounds_of(state, bucket.index(), ids, bucket.gradients(), buf)
    if state.coalesce and not state.blocking:
        futures = state.scheduler.hold(rounds, bucket.is_last())
    elif state.blocking or (bucket.is_last() and not buf.is_cuda):
        # The last bucket of a step on the CPU finishes on this thread (Scheduler.now says why).
        out = torch.futures.Future()
        try:
            state.scheduler.now(rounds)
            out.set_result(buf)
        except Exception as e:  # noqa: BLE001 - handed on through the future, as DDP expects
            out.set_exception(e)
        return out
    else:
        futures = [state.scheduler.run(task) for task in rounds]
    return combined(futures, buf)


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's averaged gradient through the state's codec. A
    float16 or bfloat16 bucket (a model in half precision) goes through a float32 copy, and the
    averaged result is rounded back into it."""
    if state.driver == "fsdp":
        raise ValueError("sketchsgd.torch.compression_hook: this CompressionState serves an FSDP model "
                         "(sketchsgd.fsdp); give the DDP model a state of its own")
    state.claim("ddp")
    buf = bucket.buffer()
    state.begin(buf)
    wide = buf if buf.dtype == torch.float32 else _widened(state, bucket.index(), buf)
    warm = state.iteration < state.start_iter
    try:
        if warm:  # plain all-reduces past DDP's bucket rebuild; they fix each bucket's layout
            ids = [id(p) for p in bucket.parameters()]
            state.units.warm[bucket.index()] = state.units.entries(ids, bucket.gradients(), buf.numel(),
                                                                   bucket.index())[0]
            fut = state.comm.all_reduce_mean(wide)
        else:
            fut = _compressed(state, bucket, wide)
        state.track(fut)
    finally:
        if bucket.is_last():
            state.end_step(not warm)
    if wide is buf:
        return fut

    def narrowed(f):
        buf.copy_(f.value())
        if buf.is_cuda:
            torch.cuda.current_stream(buf.device).synchronize()
        return buf

    return fut.then(narrowed)


def average(state: CompressionState, tensors) -> list:
    """The mean over the process group's ranks of each of tensors (float32, float16 or bfloat16,
    on one device), through the state's codec, as float32 tensors of their shapes; blocking.
    Each call is a step of the state: it compresses from the first call (no warm-up: the
    tensors are the same every call), the tensors are one unit, error feedback is carried to
    the next call. Every
    rank calls it with tensors of the same shapes. A non-finite value on any rank raises
    NonFiniteError on every rank, with no result (that rank's codec state as before)."""
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("average(): expected a non-empty list of tensors")
    if len({t.device for t in tensors}) != 1:
        raise ValueError("average(): tensors on more than one device")
    for t in tensors:
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"average(): a tensor of dtype {t.dtype}; float32, float16 or bfloat16 expected")
    buf = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    state.begin(buf)
    try:
        views, at = [], 0
        for t in tensors:
            views.append(buf[at:at + t.numel()].view(t.shape))
            at += t.numel()
        state.scheduler.now(_rounds_of(state, 0, list(range(len(tensors))), views, buf))
    finally:
        state.end_step(True)
    return views


def views_of(buf, shapes):
    """Views of buf's values end to end, of these shapes."""
    views, at = [], 0
    for s in shapes:
        n = math.prod(s)
        views.append(buf[at:at + n].view(s))
        at += n
    return views


def reduce_shard(state: CompressionState, index: int, shard, shapes, dense: bool = False, part=None) -> None:
    """FSDP2's all-reduce hook (sketchsgd.fsdp): FSDP group `index`'s reduce-scattered shard (flat;
    its parameters' padded shards end to end, of the given shapes) averaged in place over the
    state's process group through its codec (dense: an fp32 all-reduce, a warm-up step), blocking;
    a half-precision shard through a float32 copy. A step of the state, as average() is.
    part = (out, lo): only the mean's values [lo, lo + out.numel()) are kept, written into out
    (a compressed reduce-scatter: this rank's chunk), shard left as it was; the codec computes
    only those where it can (the round's finish_window)."""
    if shard.numel() != sum(math.prod(s) for s in shapes):
        raise RuntimeError(f"sketchsgd.fsdp: FSDP group {index} reduced {shard.numel()} values, its parameters' "
                           f"shards hold {sum(math.prod(s) for s in shapes)}")
    buf = float32_of(state, "in", shard)
    window = None
    if part is not None:
        out, lo = part
        wide = out if out.dtype == torch.float32 else scratch(state, "out", out.numel(), torch.float32, out.device)
        window = (wide, lo)
    state.begin(buf)
    try:
        if dense:
            state.comm.all_reduce_mean(buf).wait()
        else:
            state.scheduler.now(_shard_rounds(state, index, shapes, buf, window))
    finally:
        state.end_step(not dense)
    if dense:
        _finite_mean(buf, index)
    if part is None:
        if buf is not shard:
            shard.copy_(buf)
        return
    out, lo = part
    if dense:
        out.copy_(buf[lo:lo + out.numel()])
    elif window[0] is not out:
        out.copy_(window[0])


def reduce_scatter_mean(state: CompressionState, index: int, full, out) -> None:
    """An fp32 reduce-scatter of FSDP group index's gradient (sketchsgd.fsdp's warm-up steps,
    FSDP2's own reduction): out = this rank's chunk of the mean of full (W chunks end to end)
    over the state's group; half-precision tensors through float32 copies. A step of the state,
    counted as the all-reduce of full it stands for (payload and dense alike)."""
    buf = float32_of(state, "in", full)
    state.begin(buf)
    try:
        mean = float32_of(state, "out", out)
        state.comm.count("reduce_scatter", buf.numel() * 4)
        state.comm.count_dense(buf.numel())
        state.comm.reduce_scatter_sum(mean, buf)
        mean.mul_(_comm.mean_factor(state.comm.world))
        _finite_mean(mean, index)
        if mean is not out:
            out.copy_(mean)
    finally:
        state.end_step(False)


def _finite_mean(mean, index: int) -> None:
    """NonFiniteError where a warm-up step's fp32 mean is not finite: a rank's NaN or Inf spreads
    into the sum, so its round's ranks see it alike (those that keep that part of the mean: a
    reduce-scatter's others learn it from sketchsgd.fsdp's flag), as a compressed round would."""
    if not bool(torch.isfinite(mean).all()):
        raise _core.NonFiniteError(f"sketchsgd.fsdp: FSDP group {index}'s gradient is not finite on some rank (a "
                                   "warm-up step, averaged in fp32); this step has no update")


class FlatBucket:
    """What a DDP hook reads of a dist.GradBucket, over given parameters: one flat buffer with a
    gradient view per parameter. For calling a hook outside DDP (benchmarks, tests, a training
    loop of one's own); pass the same parameter objects every step, as DDP does."""

    def __init__(self, index: int, params, grads=None, last: bool = True):
        self._index, self._last, self._params = index, last, list(params)
        sources = list(grads) if grads is not None else None
        n = sum(p.numel() for p in self._params)
        like = sources[0] if sources else self._params[0]
        self._buf = torch.zeros(n, dtype=like.dtype, device=like.device)
        self._grads, at = [], 0
        for i, p in enumerate(self._params):
            view = self._buf[at:at + p.numel()].view(p.shape)
            if sources is not None:
                view.copy_(sources[i])
            self._grads.append(view)
            at += p.numel()

    def index(self):
        return self._index

    def buffer(self):
        return self._buf

    def gradients(self):
        return self._grads

    def parameters(self):
        return self._params

    def is_last(self):
        return self._last
