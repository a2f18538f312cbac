"""FSDP2 (torch.distributed.fsdp.fully_shard): compress_replicas (HSDP: each module's
reduce-scattered shard averaged across the replicas through the codec) and
compress_reduce_scatter (the module's reduce-scatter itself compressed)."""

import math

import torch
import torch.distributed as dist

from .. import _hook, _scatter
from .._compressor import gathered
from .._state import CompressionState
from ._backward import _build, _layout_error, _per_destination, _register, _units
from . import _compat
from ._compat import ReduceScatter


def compress_replicas(module: torch.nn.Module, state: CompressionState, warmup: int = 0) -> None:
    """Sets an all-reduce hook on every FSDP2 module under module (module included): its
    reduce-scattered gradient shard is averaged over state's process group through state's
    codec. Call it once, after fully_shard and before the first backward, on every rank, with a
    state of its own per model; state's process group is this rank's replica group (the ranks
    holding the same shard), and fully_shard's mesh the shard group alone (1-D: FSDP2's own HSDP
    all-reduce would average the replicas a second time). The first `warmup` backward passes
    average in fp32 uncompressed (state.start_iter is DDP's: FSDP has no buckets to rebuild).
    Every rank of the job calls it, in the same order as its other collectives: it finds each
    rank's data-parallel group with a collective over all of them (with NCCL, after
    torch.cuda.set_device)."""
    groups, backward = _register(
        "compress_replicas", module, state, warmup,
        lambda shard, ranks: None if len(set(shard) & set(ranks)) == 1 else
        f"and the shard group (ranks {shard}) must meet in this rank alone: pass the replica group, "
        "mesh['replicate'].get_group()",
        lambda g: _compat.all_reduce_hook(g) is not None)
    replicas = dist.get_world_size(state.process_group)
    # A replica's layout can fail on its ranks alone (_ReplicaHook): the flag goes out even where
    # the state's group is every rank concerned (shard groups of one; otherwise it does anyway).
    backward.always_flag = True
    hooks = []
    for index, (m, g) in enumerate(groups):
        shapes = _compat.shard_shapes(g)
        _units(state, index, shapes)
        hooks.append(_ReplicaHook(backward, index, shapes, g, replicas))
    _build(state, _compat.device(groups[0][1]))
    for (m, _), hook in zip(groups, hooks):
        m.set_all_reduce_hook(hook)


class _ReplicaHook:
    """FSDP2's all-reduce hook of one FSDP group: its reduce-scattered shard averaged over the
    replicas through the state's codec. As FSDP2's own HSDP all-reduce it honours
    set_requires_all_reduce(False) (gradient accumulation: FSDP2 calls the hook after every
    reduce-scatter, so the shard is held here, its output zeroed, and added to the next shard
    that is all-reduced: one compressed round an optimizer step, not one a micro-batch) and
    set_gradient_divide_factor(f) (FSDP2 divides the shard group's sum by f; across replicas it
    sums, so the replicas' mean is scaled by their count)."""

    def __init__(self, backward, index: int, shapes, group, replicas: int):
        self.backward, self.index, self.shapes, self.group, self.replicas = backward, index, shapes, group, replicas
        self.size = sum(math.prod(s) for s in shapes)
        self.held = None  # the shards of micro-batches not all-reduced yet, summed

    def __call__(self, shard):
        if _compat.accumulating(self.group):
            if self.held is None:
                self.held = shard.clone()
            else:
                self.held += shard
            shard.zero_()  # FSDP2 adds it to the sharded gradient: the sum waits here instead
            return
        if self.held is not None:
            shard += self.held
            self.held = None
        if shard.numel() != self.size:
            # The replicas' round goes on (another replica may have its layout right and be waiting
            # in it), over NaN: every rank's round fails as a non-finite one does, this rank's
            # error feedback kept and the others' gradients kept in theirs (over zeros it would
            # spend them on a step then thrown away). Every rank raises LayoutError at the
            # backward's end.
            nan = _hook.scratch(self.backward.state, "nan", self.size, torch.float32, shard.device)
            self.backward.fail(shard.device, _layout_error(self.index, shard.numel(), self.size),
                               lambda dense: _hook.reduce_shard(self.backward.state, self.index,
                                                                nan.fill_(math.nan), self.shapes, dense, None))
            shard.zero_()
            return
        if not self.backward.reduce(self.index, shard, self.shapes):
            shard.zero_()  # the backward raises at its end on every rank: no update
            return
        if _compat.divide_factor(self.group) is not None:
            shard.mul_(self.replicas)


_AVG = dist.ReduceOp.AVG


class _ReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter of one FSDP group, compressed. Its input is every rank's full
    gradient of the group in FSDP's order: W chunks, chunk r the parameters' padded shards r end to
    end.

    A summable codec forms the mean over the group through the state's codec, and this rank
    keeps its chunk. A per-matrix codec (PowerSGD) takes the input as it lies, its option blocks
    = W saying that parameter j's W shards are the row blocks of one matrix: each weight is
    factored whole, as under DDP, rather than as W slices at W times the factors' bytes. The
    dense codec takes it as it lies too (its mean is the same whatever the order). Either way
    nothing is copied in, and the round writes only this rank's chunk of the mean, straight
    into FSDP's output (Round finish_window: PowerSGD expands the other chunks' rows only for
    its error feedback, or not at all where it defers that). The sketch sees the input
    parameter by parameter (one strided copy), as under DDP: its hashing and top-k budget are
    those of the parameters, and as the input lies the 1-D shards between a chunk's matrices
    would cut its values into W runs that the round gathers and scatters in full.

    A gathered codec (per_destination) compresses each chunk as a unit of its own and sends it
    to the rank that keeps it (sketchsgd._scatter): W times fewer bytes a rank than gathering
    whole-gradient messages, and only its own chunk decoded."""

    def __init__(self, backward, index: int, shapes, world: int, per_destination: bool, per_tensor: bool,
                 elementwise: bool, group=None):
        self.backward, self.index, self.world, self.group = backward, index, world, group
        self._seen = self._ranks = None
        self.sizes = [math.prod(s) for s in shapes]  # a parameter's padded shard, in values
        self.chunks = [[tuple(s) if s else (1,) for s in shapes]] * world  # per destination: every chunk alike
        self.per_destination = per_destination
        self.in_place = (per_tensor or elementwise) and not per_destination
        self.blocks = world if self.in_place and per_tensor else 1  # the units' option blocks
        if self.in_place:  # the units' tensors: each chunk's shards, as the input lies
            self.shapes = [s for chunk in self.chunks for s in chunk]
        else:
            self.shapes = [(world * s[0], *s[1:]) if s else (world,) for s in shapes]

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if group is not self._seen:  # FSDP's group: the same every call
            self._seen, self._ranks = group, (dist.get_world_size(group), dist.get_rank(group))
        world, rank = self._ranks
        if op is _AVG or op == _AVG:  # `is` first: the enum's == is slow on cold caches (bench_fsdp.py --cold)
            scale = None
        elif op == dist.ReduceOp.SUM:
            scale = float(world)
        elif _compat.divide_factor(self.group) is not None:
            # set_gradient_divide_factor(f): FSDP2's PREMUL_SUM(1 / f), the sum over f
            scale = world / _compat.divide_factor(self.group)
        else:
            raise NotImplementedError(f"sketchsgd.fsdp: a reduce-scatter with op {op}; the compressed reduce-scatter "
                                      "computes the mean (AVG), the sum, or the sum over set_gradient_divide_factor's")
        if world != self.world:
            raise RuntimeError(f"sketchsgd.fsdp: FSDP group {self.index} reduce-scattered over {world} ranks; it was "
                               f"registered over {self.world}")
        if input_tensor.numel() != world * sum(self.sizes):
            # Every rank of the group sees it alike (FSDP2's own reduce-scatter needs as much):
            # no round, and backward() raises at its end, FSDP2 left as after any step.
            output_tensor.zero_()
            self.backward.fail(input_tensor.device, _layout_error(self.index, input_tensor.numel() // world,
                                                                  sum(self.sizes)))
            return None
        reduce = None
        if self.backward.dense():  # a warm-up step: FSDP2's own reduction, in fp32
            def reduce(dense):
                _hook.reduce_scatter_mean(self.backward.state, self.index, input_tensor, output_tensor)
        elif self.per_destination:
            def reduce(dense):
                _per_destination(self.backward.state, self.index, input_tensor, self.chunks, output_tensor)
        if reduce is not None:
            if not self.backward.run(input_tensor.device, reduce):
                output_tensor.zero_()  # the backward raises at its end on every rank: no update
            elif scale is not None:
                output_tensor.mul_(scale)
            return None
        if self.in_place:
            # FSDP's own buffer (float32) read as it lies, and only this rank's chunk of the mean
            # computed, straight into FSDP's output.
            part = (output_tensor, rank * output_tensor.numel())
            if not self.backward.reduce(self.index, input_tensor, self.shapes, part):
                output_tensor.zero_()  # the backward raises at its end on every rank: no update
                return None
            if scale is not None:
                output_tensor.mul_(scale)
            return None
        # Parameter-major, in float32 (the codec's dtype): one strided copy per parameter, which
        # also widens a half-precision gradient.
        chunks = input_tensor.view(world, -1).split(self.sizes, dim=1)  # [j]: (W, n_j), parameter j's shards
        whole = _hook.scratch(self.backward.state, "whole", input_tensor.numel(), torch.float32, input_tensor.device)
        blocks = whole.split([world * n for n in self.sizes])
        for block, chunk in zip(blocks, chunks):
            block.view(chunk.shape).copy_(chunk)
        if not self.backward.reduce(self.index, whole, self.shapes):
            output_tensor.zero_()  # the backward raises at its end on every rank: no update
            return None
        # This rank's chunk: row `rank` of each parameter's (W, n_j) block of the mean.
        for out, block, n in zip(output_tensor.split(self.sizes), blocks, self.sizes):
            out.copy_(block.view(world, n)[rank])
        if scale is not None:
            output_tensor.mul_(scale)
        return None


def compress_reduce_scatter(module: torch.nn.Module, state: CompressionState, warmup: int = 0) -> None:
    """Replaces FSDP2's reduce-scatter of every FSDP2 module under module by a compressed one,
    for a model sharded over slow links. Summable codecs: each rank's full gradient of the
    module goes through state's codec, one all-reduce sums the payloads, and each rank decodes
    the mean and keeps its shard of it. Gathered codecs: each rank compresses the module's W
    chunks (chunk r what rank r keeps) as units of their own and sends chunk r's message to
    rank r alone (one all-to-all), which decodes and averages its own chunk's W messages.
    state's process group is fully_shard's shard group; error feedback covers each rank's full
    gradient of a module (as under DDP), not its shard. Call it once, after fully_shard and
    before the first backward, on every rank of the job (a collective over all of them, as
    compress_replicas says). The first `warmup` backward passes average in fp32 uncompressed."""
    if ReduceScatter is object or not hasattr(torch.distributed.fsdp.FSDPModule, "set_custom_reduce_scatter"):
        raise TypeError("sketchsgd.fsdp.compress_reduce_scatter needs FSDP2's custom reduce-scatter "
                        "(FSDPModule.set_custom_reduce_scatter, PyTorch ≥ 2.9)")
    groups, backward = _register(
        "compress_reduce_scatter", module, state, warmup,
        lambda shard, ranks: None if shard == ranks else
        f"is not the shard group (ranks {shard}, in this order: a rank's chunk is the one at its place in it): "
        "pass mesh['shard'].get_group() (or the default group for a 1-D mesh over every rank)",
        lambda g: isinstance(_compat.reduce_scatter(g), _ReduceScatter))
    per_destination = backward.always_flag = gathered(state.spec)
    state.replaces = "reduce_scatter"  # the baseline of its link bytes (stats())
    # The dense codec's mean is the same in any order, and which tensors it sends whole (1-D
    # ones) too, unless a size threshold (dense_below) tells a shard from its parameter.
    elementwise = state.spec.partition(":")[0] == "dense" and not state.dense_below
    scatters = []
    for index, (m, g) in enumerate(groups):
        world = _compat.shard_size(g)
        scatter = _ReduceScatter(backward, index, _compat.shard_shapes(g),
                                 world, per_destination, state.units.per_tensor, elementwise, g)
        if per_destination:
            _scatter.register(state, index, scatter.chunks)
        else:
            _units(state, index, scatter.shapes, scatter.blocks)
        scatters.append(scatter)
    _build(state, _compat.device(groups[0][1]))
    for (m, _), scatter in zip(groups, scatters):
        m.set_custom_reduce_scatter(scatter)
