"""Compression under FSDP2 (torch.distributed.fsdp.fully_shard), where the slow links are:

- compress_replicas: hybrid sharding (HSDP). Each replica shards the model over its shard group
  (fast links); each FSDP module's reduce-scattered gradient shard is averaged across the
  replicas through a codec.

      mesh = init_device_mesh("cuda", (replicas, shards), mesh_dim_names=("replicate", "shard"))
      for block in model.blocks:
          fully_shard(block, mesh=mesh["shard"])       # shard within a replica only
      fully_shard(model, mesh=mesh["shard"])
      state = CompressionState("powersgd:rank=4", process_group=mesh["replicate"].get_group())
      sketchsgd.fsdp.compress_replicas(model, state)

  FSDP2 reduce-scatters each module's gradients over the shard group and calls its all-reduce
  hook (FSDPModule.set_all_reduce_hook) with this rank's flat shard; with a 1-D mesh nothing else
  averages across replicas, so the hook does.

- compress_reduce_scatter: full sharding over slow links. FSDP2's reduce-scatter of each module
  (FSDPModule.set_custom_reduce_scatter) is replaced. Summable codecs: every rank's full gradient
  of the module goes through the codec (each parameter whole, its padding rows included; PowerSGD
  reads each matrix's rows where FSDP lays them out), the mean is formed as for a DDP bucket,
  and each rank keeps its shard. Gathered codecs: each
  rank's chunk for rank r is a unit of its own, sent to rank r alone (sketchsgd._scatter).

- compress_fsdp1: FSDP1 (FullyShardedDataParallel, deprecated by PyTorch), its communication
  hook (register_comm_hook) with a sharded strategy (FULL_SHARD, SHARD_GRAD_OP: a compressed
  reduce-scatter, as compress_reduce_scatter) or NO_SHARD (a compressed all-reduce).

Either way a module's tensors (their padded shards under compress_replicas, whole padded
parameters under compress_reduce_scatter, with their shapes) go through the codec like a DDP bucket's — small and 1-D tensors whole, error feedback per rank — through
the C++ round (sketchsgd._rounds). Every FSDP module is a unit of its own; each call is a step of
the state, blocking (in FSDP's reduce stream on a GPU), compressing from the first backward
(or after `warmup` ones in fp32). A tensor
that is not finite on any rank makes backward() raise NonFiniteError on every rank (_Backward).
Checkpoints: state_dict() and load_state_dict() beside the model's in torch.distributed.checkpoint.
"""

import io
import math

import torch
import torch.distributed as dist

try:
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError:  # before FSDP2's custom collectives (PyTorch 2.9): compress_reduce_scatter refuses
    ReduceScatter = object

from . import _core, _hook, _scatter
from ._compressor import gathered
from ._state import CompressionState


def _trained(group):
    """An FSDP parameter group's parameters that take gradients, in FSDP's order: those its
    post-backward reduces (a frozen one, as in LoRA, has none)."""
    return [p for p in group.fsdp_params if p.sharded_param.requires_grad]


def _groups(module):
    """(FSDP module, its parameter group) for every FSDP2 module under module that holds
    parameters taking gradients, in module order."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6
        raise TypeError("sketchsgd.fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, PyTorch ≥ 2.6)") from None
    found = []
    for m in module.modules():
        if isinstance(m, FSDPModule):
            fsdp = m._get_fsdp_state()
            groups = getattr(fsdp, "_fsdp_param_groups", None)
            if groups is None:  # torch ≤ 2.11: one group or none, and no list of them
                groups = [g for g in [fsdp._fsdp_param_group] if g is not None]
            if len(groups) > 1:
                raise ValueError(f"{type(m).__name__}: several FSDP parameter groups (a per-parameter mesh); "
                                 "sketchsgd.fsdp takes one mesh per module")
            if groups and _trained(groups[0]):
                found.append((m, groups[0]))
    return found


class LayoutError(RuntimeError):
    """An FSDP module reduced a gradient of another layout than its parameters' at registration:
    a parameter without a gradient in this backward (unused in the forward: call
    set_reduce_scatter_unused_params(True) on the model, so that FSDP2 reduces zeros for it), or
    requires_grad changed after compress_replicas / compress_reduce_scatter (freeze first)."""


class _Backward:
    """The hook calls of one backward. A rank whose shard is not finite cannot tell the ranks of
    other replica groups through its round (those share no collective with it), and they would go
    on to apply their shards' updates, or wait for it at the next collective: so a failure is held
    until the backward ends, when one all-reduce of a flag makes every rank concerned raise
    NonFiniteError (no update anywhere). Its replica group saw it in the round and skips the
    backward's later rounds alike. The flag goes over the ranks that the state's and FSDP's
    groups join (_flag_group: the data-parallel ranks, not every rank of a job also split by
    tensor or pipeline parallelism, whose other data-parallel groups run their backward passes
    on their own schedule). Where the state's group is all of them (full sharding), all saw it
    in the round, and no flag is sent, unless rounds can fail on one rank alone
    (per_destination: a rank decodes only the messages of its own chunk, so a message it cannot
    decode is its failure alone; it goes on with the backward's later rounds, so as to leave no
    rank waiting, and the flag at the end tells the others)."""

    def __init__(self, state, warmup: int, groups: int, flag):
        self.state, self.failed, self.queued, self.device = state, None, False, None
        self.task = None  # the autograd graph task whose end() is queued
        self.warmup, self.groups = warmup, groups
        self.flag_group, self.beyond = flag  # the flag's group; whether it holds ranks the state's lacks
        self.alone = None         # a failure this rank's round saw alone (per destination)
        self.warm = False         # this backward ran a warm-up step (its reduce-scatter's check is per chunk)
        self.always_flag = False  # set where rounds can fail on one rank alone

    def dense(self) -> bool:
        """Whether this backward is one of the first `warmup` ones, averaged in fp32 uncompressed.
        Counted from the state's calls (one per FSDP group a backward), so a resumed state knows."""
        return self.state.iteration // self.groups < self.warmup

    def reduce(self, index, shard, shapes, part=None) -> bool:
        """shard averaged in place over the state's group (part = (out, lo): only the mean's values
        [lo, lo + out.numel()), into out); False where this backward has failed (shard as it was;
        the end of the backward raises)."""
        return self.run(shard.device,
                        lambda dense: _hook.reduce_shard(self.state, index, shard, shapes, dense, part))

    def run(self, device, reduce) -> bool:
        """reduce(dense) (a call of the state on tensors on device); False where this backward
        has failed (nothing reduced; the end of the backward raises)."""
        self.device = device
        task = torch._C._current_graph_task_id()
        if self.queued and task != self.task:
            # The backward that queued end() raised (its callbacks never run): what it held
            # belongs to no step, and this backward needs an end() of its own.
            self.failed = self.alone = None
            self.queued = self.warm = False
        if not self.queued:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self.end)
                self.queued, self.task = True, task
            except RuntimeError:  # not inside a backward (FSDP reduced outside one): raise at once
                try:
                    reduce(self.dense())
                except _scatter.Alone as e:
                    raise e.error from None
                return True
        if self.failed is not None:
            return False
        dense = self.dense()
        self.warm |= dense
        try:
            reduce(dense)
        except (_core.NonFiniteError, _core.WireError, _core.InvalidArgument) as e:
            # Failures every rank of the round saw alike (a NaN, a length past the codec's
            # largest message, a spec its unit cannot take, found when its codec is built),
            # raised at the end: an error raised inside the backward would leave FSDP2's
            # parameters unsharded for good (its post-backward never runs).
            self.failed = e
            return False
        except _scatter.Alone as e:
            if self.alone is None:
                self.alone = e.error
            return False
        return True

    def fail(self, device, error, spoil=None) -> None:
        """error (a LayoutError) raised at the end of this backward, as a failed round's; at
        once outside a backward. spoil(dense): this rank's round over NaN, where this backward has
        not failed yet, so that its other ranks fail in it as well (here error stands for it)."""
        if not self.run(device, lambda dense: None):
            return  # failed already: that error is the one raised
        if spoil is not None:
            try:
                self.run(device, spoil)
            except _core.NonFiniteError:  # outside a backward it raises at once
                pass
        if not self.queued:
            raise error
        self.failed = error

    def end(self):
        failed, self.failed, self.queued = self.failed, None, False
        alone, self.alone = self.alone, None
        warm, self.warm = self.warm, False
        if not self.beyond and not self.always_flag and not warm:
            # The state's group is every rank concerned: each saw the failure in its round.
            if failed is not None:
                raise failed
            return
        wire = alone is not None or isinstance(failed, _core.WireError)
        if failed is None or isinstance(failed, _core.NonFiniteError):  # (an InvalidArgument too)
            code = 2 if wire else int(failed is not None)
        else:
            code = 3 if isinstance(failed, LayoutError) else 4 if isinstance(failed, _core.InvalidArgument) else 2
        flag = torch.tensor([code], dtype=torch.int32,
                            device=self.device if dist.get_backend(self.flag_group) == "nccl" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.flag_group)
        if flag.item() == 3 and isinstance(failed, _core.NonFiniteError):
            failed = None  # a round another replica group spoiled (see _Replicas): told below
        if failed is not None:
            raise failed
        if alone is not None:
            raise alone
        if flag.item() == 4:
            raise _core.InvalidArgument("sketchsgd.fsdp: another replica group's codec refused its unit (its ranks "
                                        "raised InvalidArgument saying why); this step has no update")
        if flag.item() == 3:
            raise LayoutError("sketchsgd.fsdp: an FSDP module of another replica group reduced a gradient of another "
                              "layout than its parameters' (its ranks raised LayoutError saying which); this step "
                              "has no update")
        if flag.item() == 2:
            raise _core.WireError("sketchsgd.fsdp: another rank refused a message of its round (it raised "
                                  "WireError saying why); this step has no update")
        if flag.item():
            raise _core.NonFiniteError("sketchsgd.fsdp: a gradient shard of another replica group was not finite "
                                       "(its ranks raised NonFiniteError with the coordinate); this step has no "
                                       "update")


def _check(what: str, module, state, warmup) -> None:
    """The checks every entry point makes of its arguments."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r}: must be an int ≥ 0 (backward passes averaged uncompressed first)")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(state, CompressionState):
        raise TypeError(f"state: expected a sketchsgd CompressionState, got {type(state).__name__}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"sketchsgd.fsdp.{what}: initialise torch.distributed first")
    if getattr(state, "_fsdp", False):
        raise ValueError(f"sketchsgd.fsdp.{what}: this CompressionState already serves a model")
    if getattr(state, "_ddp", False) or state.iteration:
        raise ValueError(f"sketchsgd.fsdp.{what}: this CompressionState has run steps already (a DDP hook's, or "
                         "average()'s): give the FSDP model a state of its own")


def _flag_group(state, shard_ranks):
    """(process group, whether it holds ranks the state's group lacks) over which a failed
    backward is told: the ranks that this rank's state group and FSDP shard group join, and theirs
    in turn (HSDP: every replica of every shard; full sharding and FSDP1: the shard group). Where
    tensor or pipeline parallelism splits the job, each data-parallel group gets a group of its
    own: a flag over every rank would wait for the other groups' backward passes (a pipeline
    stage's come at other times), or hang. A collective over every rank (new_group's rule)."""
    ours = sorted(dist.get_process_group_ranks(state.process_group or dist.group.WORLD))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted(set(ours) | set(shard_ranks)))
    parent = list(range(len(everyone)))

    def root(r):
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for ranks in everyone:
        for r in ranks[1:]:
            parent[root(r)] = root(ranks[0])
    joined = {}
    for r in range(len(everyone)):
        joined.setdefault(root(r), []).append(r)
    components = sorted(joined.values())
    here = next(c for c in components if dist.get_rank() in c)
    if len(components) == 1:
        return None, here != ours
    group, _ = dist.new_subgroups_by_enumeration(components)
    return group, here != ours


def _register(what: str, module, state, warmup, wrong_group):
    """The checks both FSDP2 entry points share; wrong_group(shard ranks, state's ranks) says what
    is wrong with the state's group, or None. Returns module's FSDP groups and the state's
    _Backward."""
    _check(what, module, state, warmup)
    groups = _groups(module)
    if not groups and any(type(m).__name__ == "FullyShardedDataParallel" for m in module.modules()):
        raise ValueError(f"sketchsgd.fsdp.{what}: the model is sharded by FSDP1 (FullyShardedDataParallel): "
                         "use sketchsgd.fsdp.compress_fsdp1")
    if not groups:
        raise ValueError(f"sketchsgd.fsdp.{what}: no FSDP2 module with parameters that take gradients under this "
                         "module (apply torch.distributed.fsdp.fully_shard first)")
    state._bind()
    for m, g in groups:
        if what == "compress_replicas" and getattr(g, "_all_reduce_hook", None) is not None or \
                what == "compress_reduce_scatter" and isinstance(getattr(g, "_reduce_scatter_comm", None),
                                                                 _ReduceScatter):
            raise ValueError(f"sketchsgd.fsdp.{what}: {type(m).__name__} has a hook of it already (the model was "
                             "registered before): one state per model")
        if g._is_hsdp:
            raise ValueError(f"{type(m).__name__}: fully_shard was given a 2-D (HSDP) mesh, whose own all-reduce "
                             "averages the replicas; give it the shard dimension alone (mesh['shard'])")
        ranks = dist.get_process_group_ranks(state.process_group or dist.group.WORLD)
        shard = dist.get_process_group_ranks(g.mesh_info.shard_process_group)
        problem = wrong_group(shard, ranks)  # each group's ranks in its own order
        if problem:
            raise ValueError(f"{type(m).__name__}: the state's process group (ranks {ranks}) {problem}")
    shards = {r for _, g in groups for r in dist.get_process_group_ranks(g.mesh_info.shard_process_group)}
    backward = _Backward(state, warmup, len(groups), _flag_group(state, shards))
    state._fsdp = True
    return groups, backward


def _units(state, index: int, shapes, blocks: int = 1) -> None:
    """FSDP group index's tensors become a unit before the first call, as a DDP warm-up fixes its
    buckets (keys (group, position), shapes and sizes known up front; blocks: Units.register)."""
    state.units.register(index, [(index, j) for j in range(len(shapes))], shapes, blocks)


def _build(state, device) -> None:
    """Every unit's codec built on device now (Units.build_registered), before any hook is set:
    a spec that a module's unit cannot take is refused when the model is registered, with the
    unit and its share of the budget named, not at its first compressed step."""
    state.units.build_registered(device, state.comm.world)


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
        "mesh['replicate'].get_group()")
    replicas = dist.get_world_size(state.process_group)
    # A replica's layout can fail on its ranks alone (_ReplicaHook): the flag goes out even where
    # the state's group is every rank concerned (shard groups of one; otherwise it does anyway).
    backward.always_flag = True
    hooks = []
    for index, (m, g) in enumerate(groups):
        shapes = [tuple(p.padded_sharded_param_size) for p in _trained(g)]
        _units(state, index, shapes)
        hooks.append(_ReplicaHook(backward, index, shapes, g, replicas))
    _build(state, groups[0][1].device)
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
        if not getattr(self.group, "all_reduce_grads", True):
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
        if getattr(self.group, "gradient_divide_factor", None) is not None:
            shard.mul_(self.replicas)


def _layout_error(index: int, got: int, want: int) -> LayoutError:
    return LayoutError(f"sketchsgd.fsdp: FSDP group {index} reduced {got} values per rank, where its parameters "
                       f"that take gradients hold {want}: a parameter without a gradient in this backward (unused "
                       "in the forward: call model.set_reduce_scatter_unused_params(True)), or requires_grad "
                       "changed after the model was registered (freeze parameters first)")


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
        if op is _AVG or op == _AVG:  # `is` first: the enum compare costs ~20 µs on cold caches
            scale = None
        elif op == dist.ReduceOp.SUM:
            scale = float(world)
        elif getattr(self.group, "gradient_divide_factor", None) is not None:
            # set_gradient_divide_factor(f): FSDP2's PREMUL_SUM(1 / f), the sum over f
            scale = world / self.group.gradient_divide_factor
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


def _per_destination(state, index: int, full, chunks, out) -> None:
    """out = this rank's chunk of the mean of full (W equal chunks end to end, chunk r holding
    tensors of the shapes chunks[r]) over the state's group, each chunk sent to the rank that
    keeps it (sketchsgd._scatter); half-precision tensors through float32 copies."""
    src, dst = _hook.float32_of(state, "in", full), _hook.float32_of(state, "out", out)
    _scatter.reduce_scatter(state, index, src.view(len(chunks), -1), chunks, dst)
    if dst is not out:
        out.copy_(dst)


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
        "pass mesh['shard'].get_group() (or the default group for a 1-D mesh over every rank)")
    per_destination = backward.always_flag = gathered(state.spec)
    state.replaces = "reduce_scatter"  # the baseline of its link bytes (stats())
    # The dense codec's mean is the same in any order, and which tensors it sends whole (1-D
    # ones) too, unless a size threshold (dense_below) tells a shard from its parameter.
    elementwise = state.spec.partition(":")[0] == "dense" and not state.dense_below
    scatters = []
    for index, (m, g) in enumerate(groups):
        world = g.mesh_info.shard_mesh_size
        scatter = _ReduceScatter(backward, index, [tuple(p.padded_sharded_param_size) for p in _trained(g)],
                                 world, per_destination, state.units.per_tensor, elementwise, g)
        if per_destination:
            _scatter.register(state, index, scatter.chunks)
        else:
            _units(state, index, scatter.shapes, scatter.blocks)
        scatters.append(scatter)
    _build(state, groups[0][1].device)
    for (m, _), scatter in zip(groups, scatters):
        m.set_custom_reduce_scatter(scatter)


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
        real = iter(flat._shapes)
        shapes = [(n,) if pad else tuple(next(real)) for n, pad in zip(flat._numels_with_padding,
                                                                      flat._is_padding_mask)]
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
        flat = getattr(m, "_flat_param", None)
        if flat is not None:
            units.append((m, _fsdp1_shapes(flat, len(ranks), m.sharding_strategy != ShardingStrategy.NO_SHARD)))
    if not units:
        raise ValueError("sketchsgd.fsdp.compress_fsdp1: no FSDP1 instance with parameters under this module")
    state._bind()
    state._fsdp = True
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
    _build(state, getattr(units[0][0], "compute_device", None) or units[0][0]._flat_param.device)
    module.register_comm_hook(None, _fsdp1_hook)
    for (m, _), hook in zip(units, hooks):
        # FSDP1 gives every instance the root's one hook state; each is told which unit it is,
        # so that error feedback follows the instance, not the order of the hook calls.
        m._comm_hook_state = hook


def state_dict(state: CompressionState) -> dict:
    """The state's part of a torch.distributed.checkpoint (DCP) state_dict, beside the model's:
    {"rank<r>": bytes} with r this rank's global rank. Error feedback belongs to a rank and its
    shards, so each rank's is a key of its own, which DCP neither deduplicates across ranks nor
    needs a tensor of known size to load into. Every rank calls it (no collective):

        sd = {"model": model.state_dict(), "sketchsgd": sketchsgd.fsdp.state_dict(state)}
        dcp.save(sd, checkpoint_id=path)
        ...
        dcp.load(sd, checkpoint_id=path)          # sd made as above, from the new model and state
        sketchsgd.fsdp.load_state_dict(state, sd["sketchsgd"])
    """
    if not isinstance(state, CompressionState):
        raise TypeError(f"state: expected a sketchsgd CompressionState, got {type(state).__name__}")
    out = io.BytesIO()
    torch.save(state.state_dict(gather=False), out)
    return {f"rank{dist.get_rank()}": out.getvalue()}


def load_state_dict(state: CompressionState, d: dict) -> None:
    """Restores this rank's part of state_dict() (after compress_replicas, compress_reduce_scatter
    or compress_fsdp1, before the next backward); ConfigMismatch when it was saved by another
    configuration or for a model cut into other units, ValueError when it holds no part of this
    rank or the state serves no model yet."""
    if not isinstance(state, CompressionState):
        raise TypeError(f"state: expected a sketchsgd CompressionState, got {type(state).__name__}")
    if not getattr(state, "_fsdp", False):
        raise ValueError("sketchsgd.fsdp.load_state_dict: the state serves no model yet: call compress_replicas, "
                         "compress_reduce_scatter or compress_fsdp1 first, then load (the model's units are "
                         "checked against the checkpoint's)")
    key = f"rank{dist.get_rank()}"
    if not isinstance(d, dict) or not isinstance(d.get(key), (bytes, bytearray)):
        raise ValueError(f"sketchsgd.fsdp.load_state_dict: no '{key}' entry (a dict from sketchsgd.fsdp.state_dict() "
                         "of a job with this rank expected)")
    try:
        saved = torch.load(io.BytesIO(d[key]), weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch.load's many errors for bytes that are not its own
        raise ValueError(f"sketchsgd.fsdp.load_state_dict: '{key}' is not a sketchsgd state (truncated or corrupt: "
                         f"{type(e).__name__})") from None
    state.load_state_dict(saved)
