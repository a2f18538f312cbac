"""FSDP1 (FullyShardedDataParallel, deprecated by PyTorch): compress_fsdp1, its communication
hook (register_comm_hook) with a sharded strategy (a compressed reduce-scatter) or NO_SHARD (a
compressed all-reduce)."""

import math

import torch
import torch.distributed as dist

from .. import _hook, _scatter
from .._compressor import gathered
from .._state import CompressionState
from . import _compat
from ._backward import _Backward, _build, _check, _flag_group, _per_destination, _units


class _Fsdp1Unit:
    """What FSDP1 hands its communication hook as the state of one FullyShardedDataParallel
    instance: its flat parameter's layout. FSDP1 calls the hook with the instance's full flat
    gradient (its parameters end to end, with FSDP's alignment padding, then padded to W equal
    chunks) and, under a sharded strategy, the chunk this rank keeps; the flat layout needs no
    copy for the codec to see each parameter whole with its shape. chunks (a gathered codec
    under a sharded strategy): the tensors of each chunk, sent per destination as under FSDP2;
    otherwise the codec reduces the whole gradient, as unit `whole`. The warm-up's steps are
    FSDP1's own reduction in fp32 (a reduce-scatter; NO_SHARD: an all-reduce)."""

    def __init__(self, backward, index: int, shapes, world: int, rank: int, chunks=None, whole=None):
        self.backward, self.index, self.shapes, self.world, self.rank = backward, index, shapes, world, rank
        self.chunks, self.whole = chunks, index if whole is None else whole

    def __call__(self, grad, output):
        if grad.numel() != sum(math.prod(s) for s in self.shapes):
            raise RuntimeError(f"sketchsgd.fsdp: FSDP1 unit {self.index} reduced {grad.numel()} values; its flat "
                               f"parameter holds {sum(math.prod(s) for s in self.shapes)} (padded to {self.world} "
                               "chunks)")
        state = self.backward.state
        if output is not None and (self.chunks is not None or self.backward.dense()):
            def reduce(dense):
                if dense:  # a warm-up step: FSDP1's own reduction, an fp32 reduce-scatter
                    _hook.reduce_scatter_mean(state, self.whole, grad, output)
                else:
                    _per_destination(state, self.index, grad, self.chunks, output)
            if not self.backward.run(grad.device, reduce):
                output.zero_()  # the backward raises at its end on every rank: no update
            return
        # A sharded strategy keeps this rank's chunk of the mean: only that computed, into output.
        part = None if output is None else (output, self.rank * output.numel())
        if not self.backward.reduce(self.whole, grad, self.shapes, part):
            if output is not None:
                output.zero_()  # the backward raises at its end on every rank: no update
            return


def _fsdp1_hook(unit, grad, output=None):
    """The one hook FSDP1 registers for all its instances; each passes its own _Fsdp1Unit."""
    unit(grad, output)


def _fsdp1_shapes(flat, world: int, sharded: bool):
    """The tensors of an FSDP1 flat parameter's unsharded gradient, in order: each parameter with
    its shape, FSDP's alignment padding (use_orig_params) as 1-D runs, and under a sharded strategy
    the padding to `world` equal chunks."""
    try:
        real, numels, padding = _compat.flat_layout(flat)
        real = iter(real)
        shapes = [(n,) if pad else tuple(next(real)) for n, pad in zip(numels, padding)]
    except AttributeError as e:  # FlatParameter's layout, unchanged from PyTorch 2.0 to 2.13
        raise TypeError(f"sketchsgd.fsdp.compress_fsdp1: this PyTorch's FSDP1 flat parameter has no layout "
                        f"sketchsgd knows ({e})") from None
    total = sum(math.prod(s) for s in shapes)
    if sharded and total % world:
        shapes.append((world - total % world,))
    return shapes


def _fsdp1_chunks(shapes, world: int):
    """The tensors of each of a sharded FSDP1 flat gradient's W equal chunks (shapes: the flat
    gradient's, end to end, padded to W chunks), which cut its parameters anywhere: a matrix's
    part in a chunk (cut or whole) as one row (1, n), so that the small-tensor rule still
    compresses it, a 1-D tensor's 1-D. (Only per-matrix codecs read the shapes, and they are
    summable: never per destination.)"""
    n = sum(math.prod(s) for s in shapes) // world
    chunks, at = [[] for _ in range(world)], 0
    for s in shapes:
        end = at + math.prod(s)
        while at < end:
            stop = min(end, (at // n + 1) * n)
            chunks[at // n].append((1, stop - at) if len(s) > 1 else (stop - at,))
            at = stop
    return chunks


def compress_fsdp1(module: torch.nn.Module, state: CompressionState, warmup: int = 0) -> None:
    """FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel): registers a communication hook on
    the root instance `module` that reduces every instance's gradient through state's codec:
    under FULL_SHARD and SHARD_GRAD_OP each rank's full flat gradient of an instance is compressed,
    the mean over the group formed as for a DDP bucket, and each rank keeps its shard (as
    compress_reduce_scatter); under NO_SHARD the mean is all of it. Each instance is a unit with
    its own error feedback, each parameter compressed whole with its shape. A gathered codec
    under a sharded strategy goes per destination, as under compress_reduce_scatter: each rank's
    W chunks of the flat gradient (chunk r the shard rank r keeps) are units of their own, chunk
    r's message sent to rank r alone (a piece of a matrix that a chunk boundary cuts is
    compressed as one row). state's process group is the instances' (FSDP1 refuses hooks under
    the hybrid strategies: use FSDP2 and compress_replicas). Call it once, after wrapping and
    before the first forward, on every rank of the job (a collective over all of them, as
    compress_replicas says). The first `warmup` backward passes average in fp32
    uncompressed."""
    _check("compress_fsdp1", module, state, warmup)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    if not isinstance(module, FSDP) or not module.check_is_root():
        raise TypeError("sketchsgd.fsdp.compress_fsdp1: module must be the root FullyShardedDataParallel instance "
                        f"(got {type(module).__name__}); for FSDP2 (fully_shard) use compress_reduce_scatter or "
                        "compress_replicas")
    ranks = dist.get_process_group_ranks(state.process_group or dist.group.WORLD)
    units = []
    for m in FSDP.fsdp_modules(module):
        if m.sharding_strategy not in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP,
                                       ShardingStrategy.NO_SHARD):
            raise ValueError(f"sketchsgd.fsdp.compress_fsdp1: {m.sharding_strategy.name}: FSDP1 takes no communication "
                             "hook under a hybrid strategy; shard with FSDP2 over a replicas × shards mesh and use "
                             "compress_replicas")
        if dist.get_process_group_ranks(m.process_group) != ranks:
            raise ValueError(f"sketchsgd.fsdp.compress_fsdp1: the state's process group (ranks {ranks}) is not "
                             f"FSDP's (ranks {dist.get_process_group_ranks(m.process_group)})")
        if getattr(m, "_comm_hook", None) is not None:
            raise ValueError("sketchsgd.fsdp.compress_fsdp1: the model has a communication hook already")
        flat = _compat.flat_param(m)
        if flat is not None:
            units.append((m, _fsdp1_shapes(flat, len(ranks), m.sharding_strategy != ShardingStrategy.NO_SHARD)))
    if not units:
        raise ValueError("sketchsgd.fsdp.compress_fsdp1: no FSDP1 instance with parameters under this module")
    state.bind()
    state.claim("fsdp")
    if any(m.sharding_strategy != ShardingStrategy.NO_SHARD for m, _ in units):
        state.replaces = "reduce_scatter"  # the baseline of its link bytes (stats())
    backward = _Backward(state, warmup, len(units), _flag_group(state, ranks))
    world, rank = len(ranks), ranks.index(dist.get_rank())
    per_destination = gathered(state.spec)
    hooks = []
    for index, (m, shapes) in enumerate(units):
        chunks = whole = None
        if per_destination and m.sharding_strategy != ShardingStrategy.NO_SHARD:
            chunks = _fsdp1_chunks(shapes, world)
            _scatter.register(state, index, chunks)  # units index · W + r
            backward.always_flag = True  # a decode fails on its rank alone
        else:
            # Past the per-destination units' numbers where some instances have them.
            whole = index + len(units) * world if per_destination else index
            _units(state, whole, shapes)
        hooks.append(_Fsdp1Unit(backward, index, shapes, world, rank, chunks, whole))
    _build(state, getattr(units[0][0], "compute_device", None) or _compat.flat_param(units[0][0]).device)
    module.register_comm_hook(None, _fsdp1_hook)
    for (m, _), hook in zip(units, hooks):
        # FSDP1 gives every instance the root's one hook state; each is told which unit it is,
        # so that error feedback follows the instance, not the order of the hook calls.
        _compat.set_hook_state(m, hook)
