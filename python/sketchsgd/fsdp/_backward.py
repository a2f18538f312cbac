"""What the FSDP entry points share: the checks of their arguments, the registration of a model's
FSDP groups as units of the state, and the hook calls of one backward (_Backward), where a failure
on any rank becomes an error on every rank at the backward's end."""

import torch
import torch.distributed as dist

from .. import _core, _hook, _scatter
from .._agree import Outcome, agree, outcome_of
from .._state import CompressionState
from . import _compat
from ._compat import _groups


class LayoutError(RuntimeError):
    """An FSDP module reduced a gradient of another layout than its parameters' at registration:
    a parameter without a gradient in this backward (unused in the forward: call
    set_reduce_scatter_unused_params(True) on the model, so that FSDP2 reduces zeros for it), or
    requires_grad changed after compress_replicas / compress_reduce_scatter (freeze first)."""

    outcome = Outcome.LAYOUT


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
        task = _compat.graph_task()
        if self.queued and task != self.task:
            # The backward that queued end() raised (its callbacks never run): what it held
            # belongs to no step, and this backward needs an end() of its own.
            self.failed = self.alone = None
            self.queued = self.warm = False
        if not self.queued:
            try:
                _compat.at_backward_end(self.end)
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
        mine = outcome_of(failed)
        if alone is not None and mine in (Outcome.OK, Outcome.NON_FINITE):
            mine = Outcome.ERROR  # a message only this rank could not decode
        agreed = agree(mine, self.flag_group, self.device)
        if agreed == Outcome.LAYOUT and isinstance(failed, _core.NonFiniteError):
            failed = None  # a round another replica group spoiled (see _Replicas): told below
        if failed is not None:
            raise failed
        if alone is not None:
            raise alone
        if agreed == Outcome.INVALID:
            raise _core.InvalidArgument("sketchsgd.fsdp: another replica group's codec refused its unit (its ranks "
                                        "raised InvalidArgument saying why); this step has no update")
        if agreed == Outcome.LAYOUT:
            raise LayoutError("sketchsgd.fsdp: an FSDP module of another replica group reduced a gradient of another "
                              "layout than its parameters' (its ranks raised LayoutError saying which); this step "
                              "has no update")
        if agreed == Outcome.ERROR:
            raise _core.WireError("sketchsgd.fsdp: another rank refused a message of its round (it raised "
                                  "WireError saying why); this step has no update")
        if agreed == Outcome.NON_FINITE:
            raise _core.NonFiniteError("sketchsgd.fsdp: a gradient shard of another replica group was not finite "
                                       "(its ranks raised NonFiniteError with the coordinate); this step has no "
                                       "update")


def _layout_error(index: int, got: int, want: int) -> LayoutError:
    return LayoutError(f"sketchsgd.fsdp: FSDP group {index} reduced {got} values per rank, where its parameters "
                       f"that take gradients hold {want}: a parameter without a gradient in this backward (unused "
                       "in the forward: call model.set_reduce_scatter_unused_params(True)), or requires_grad "
                       "changed after the model was registered (freeze parameters first)")


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
    if state.driver == "fsdp":
        raise ValueError(f"sketchsgd.fsdp.{what}: this CompressionState already serves a model")
    if state.driver == "ddp" or state.iteration:
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


def _register(what: str, module, state, warmup, wrong_group, hooked):
    """The checks both FSDP2 entry points share; wrong_group(shard ranks, state's ranks) says what
    is wrong with the state's group, or None; hooked(group) whether the entry point's hook is on
    the group already. Returns module's FSDP groups and the state's _Backward."""
    _check(what, module, state, warmup)
    groups = _groups(module)
    if not groups and any(type(m).__name__ == "FullyShardedDataParallel" for m in module.modules()):
        raise ValueError(f"sketchsgd.fsdp.{what}: the model is sharded by FSDP1 (FullyShardedDataParallel): "
                         "use sketchsgd.fsdp.compress_fsdp1")
    if not groups:
        raise ValueError(f"sketchsgd.fsdp.{what}: no FSDP2 module with parameters that take gradients under this "
                         "module (apply torch.distributed.fsdp.fully_shard first)")
    state.bind()
    for m, g in groups:
        if hooked(g):
            raise ValueError(f"sketchsgd.fsdp.{what}: {type(m).__name__} has a hook of it already (the model was "
                             "registered before): one state per model")
        if _compat.is_hsdp(g):
            raise ValueError(f"{type(m).__name__}: fully_shard was given a 2-D (HSDP) mesh, whose own all-reduce "
                             "averages the replicas; give it the shard dimension alone (mesh['shard'])")
        ranks = dist.get_process_group_ranks(state.process_group or dist.group.WORLD)
        shard = dist.get_process_group_ranks(_compat.shard_group(g))
        problem = wrong_group(shard, ranks)  # each group's ranks in its own order
        if problem:
            raise ValueError(f"{type(m).__name__}: the state's process group (ranks {ranks}) {problem}")
    shards = {r for _, g in groups for r in dist.get_process_group_ranks(_compat.shard_group(g))}
    backward = _Backward(state, warmup, len(groups), _flag_group(state, shards))
    state.claim("fsdp")
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


def _per_destination(state, index: int, full, chunks, out) -> None:
    """out = this rank's chunk of the mean of full (W equal chunks end to end, chunk r holding
    tensors of the shapes chunks[r]) over the state's group, each chunk sent to the rank that
    keeps it (sketchsgd._scatter); half-precision tensors through float32 copies."""
    src, dst = _hook.float32_of(state, "in", full), _hook.float32_of(state, "out", out)
    _scatter.reduce_scatter(state, index, src.view(len(chunks), -1), chunks, dst)
    if dst is not out:
        out.copy_(dst)
