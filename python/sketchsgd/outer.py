"""Local steps with a compressed pseudo-gradient: DiLoCo (Douillard et al. 2023) with any
sketchsgd codec as the pseudo-gradient's compressor, on torch.distributed.

    from sketchsgd.torch import DiLoCo
    outer = DiLoCo(model, spec="powersgd:rank=4,wire=fp16", every=16)   # every rank alike
    for x, y in data:
        loss_fn(model(x), y).backward()
        inner.step(); inner.zero_grad()      # the model is a plain module: no per-step sync
        outer.step()                         # every 16th call: one compressed sync

Every `every` inner steps the pseudo-gradient Δ = θ_anchor − θ (float32) goes through
sketchsgd.torch.average() (the DDP hook's rounds, blocking, the parameters one unit): summable
codecs all-reduce, gathered ones all-gather, and each rank's codec keeps what it did not send
(error feedback) for the next sync. The outer optimizer (SGD, Nesterov momentum 0.9, lr 0.7 by
default; any torch optimizer) applies the mean Δ to the float32 anchor, which every rank then
copies into its model: after a sync, every replica holds the same parameters, bit for bit.
"""

import torch
from . import _core
from ._agree import Outcome, agree
from ._comm import ready
from ._hook import average
from ._state import CompressionState
from ._traffic import ring

__all__ = ["DiLoCo", "nesterov"]


def nesterov(params):
    """DiLoCo's outer optimizer: SGD with Nesterov momentum 0.9 and lr 0.7."""
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


class DiLoCo:
    """The outer loop of one model. Build it on every rank with the same arguments, after
    torch.distributed is initialised and before training (it broadcasts rank 0's parameters, so
    every replica starts alike).

    model:           the module trained locally (a plain module, DDP used under no_sync(), or
                     a model sharded by FSDP2 within each replica: each rank then syncs its
                     shard with the ranks of process_group, the replicas of that shard).
    process_group:   the ranks that sync (None: every rank; or a simulated group's rank,
                     sketchsgd.simulate: W workers in one process).
    anchor_device:   where the anchor, the outer optimizer's state, the pseudo-gradient and its
                     codec live (None: the parameters' device). "cpu" for a model on a GPU keeps
                     three float32 copies of the model off the GPU (as torchft keeps its backup
                     on the host) and lets a CPU-only codec (sparseloco) compress it, at the cost
                     of a copy of the parameters to the host each sync; not with NCCL, which
                     moves device tensors only.
    spec:            any sketchsgd codec spec for the pseudo-gradient ("dense" is DiLoCo itself).
    every:           inner steps between syncs (H).
    outer_optimizer: a function of the anchor parameters that returns a torch optimizer.
    warmup:          first inner steps after each of which the parameters are averaged (dense).
    Small tensors (biases, norms) travel uncompressed, as in the hook; compress_1d and
    dense_below are the hook's options.
    """

    def __init__(self, model, spec: str = "dense", every: int = 16, outer_optimizer=nesterov, warmup: int = 0,
                 process_group=None, compress_1d: bool = False, dense_below: int = 0, anchor_device=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        for name, value, low in (("every", every, 1), ("warmup", warmup, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r}: must be an int ≥ {low}")
        if not callable(outer_optimizer):
            raise TypeError("outer_optimizer: expected a function of the parameters returning a torch optimizer")
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("model: no parameters that require gradients")
        bad = {p.dtype for p in self._params} - {torch.float32, torch.float16, torch.bfloat16}
        if bad:
            raise TypeError(f"model: parameters of dtype {sorted(map(str, bad))}; float32, float16 or bfloat16 expected")
        if len({p.device for p in self._params}) != 1:
            raise ValueError("model: parameters on more than one device")
        if not ready(process_group):
            raise RuntimeError("DiLoCo needs torch.distributed initialised (dist.init_process_group) first, or a "
                               "simulated group's rank as process_group (sketchsgd.simulate)")
        self.state = CompressionState(spec, process_group, compress_1d=compress_1d, dense_below=dense_below)
        self.every, self.warmup, self.process_group = every, warmup, process_group
        self._shard, self._flag = self._sharding()
        with torch.no_grad():
            flat = self._flat([p.float() for p in self.params])
            self.state.comm.broadcast(flat, root=0)
            self._unflatten(flat, self.params)
        try:
            where = torch.device(anchor_device) if anchor_device is not None else self._params[0].device
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"anchor_device={anchor_device!r}: not a device ({e})") from None
        self.anchor = [p.detach().float().to(where, copy=True) for p in self.params]
        self.outer = outer_optimizer(self.anchor)
        if not isinstance(self.outer, torch.optim.Optimizer):
            raise TypeError(f"outer_optimizer returned {type(self.outer).__name__}, not a torch optimizer")
        self.inner_steps = self.syncs = 0
        self._warmup_bytes = 0
        self._width = self._params[0].element_size()

    def _sharding(self):
        """(this rank's place in its shard group, the flag's (group, whether it reaches ranks the
        state's group lacks)) for a model sharded by FSDP2 (DTensor parameters); (None, None)
        for a plain model. The state's group must be the replicas of this rank's shard: it
        meets each shard group in this rank alone (a group that also held another shard of the
        same parameters would average unlike shards together, and corrupt the model). A failed
        sync is told to every replica group over the ranks the groups join (sketchsgd.fsdp's
        flag: those groups share no collective in a sync)."""
        import torch.distributed as dist
        meshes = {id(p.device_mesh): p for p in self._params if hasattr(p, "device_mesh")}
        if not meshes:
            return None, None
        from .fsdp._backward import _flag_group
        ours = dist.get_process_group_ranks(self.state.process_group or dist.group.WORLD)
        shard_ranks, place = set(), None
        for p in meshes.values():
            mesh, placements = p.device_mesh, p.placements
            for dim, placement in enumerate(placements):
                if mesh.size(dim) > 1 and placement.is_replicate():
                    raise ValueError("DiLoCo: the model's parameters are replicated across a mesh dimension (FSDP2 "
                                     "given a 2-D mesh averages those replicas every step): shard with "
                                     "fully_shard(..., mesh=mesh['shard']) and give DiLoCo mesh['replicate']'s group")
                if not placement.is_shard() or mesh.size(dim) == 1:
                    continue
                group = mesh.get_group(dim)
                ranks = dist.get_process_group_ranks(group)
                if len(set(ranks) & set(ours)) != 1:
                    raise ValueError(f"DiLoCo: the process group (ranks {ours}) holds other shards of the model's "
                                     f"parameters (shard group: ranks {ranks}): give it this rank's replicas alone, "
                                     "mesh['replicate'].get_group()")
                shard_ranks |= set(ranks)
                place = dist.get_rank(group) if place is None else place
        return place, _flag_group(self.state, shard_ranks) if shard_ranks else None

    @property
    def params(self):
        """The parameters this rank trains and syncs: each one itself, or of a sharded model
        (FSDP2: DTensors) this rank's shard, which its replicas in the process group hold too.
        Looked up at each use: FSDP2 may give a parameter a new local tensor (its lazy init)."""
        with torch.no_grad():
            return [p.to_local() if hasattr(p, "to_local") else p for p in self._params]

    # ---- flat vectors ---------------------------------------------------------------------------
    def _flat(self, tensors):
        return torch.cat([t.reshape(-1) for t in tensors])

    @staticmethod
    def _unflatten(flat, into):
        at = 0
        for t in into:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()

    # ---- the loop ---------------------------------------------------------------------------------
    def step(self) -> bool:
        """Call after every inner optimizer step; syncs when one is due (on every rank alike).
        Returns whether this call synced."""
        self.inner_steps += 1
        if self.inner_steps <= self.warmup:
            self._average()
            return True
        if (self.inner_steps - self.warmup) % self.every:
            return False
        self.sync()
        return True

    @torch.no_grad()
    def _average(self):
        """A warm-up step: the replicas' parameters averaged (fp32), which becomes the anchor."""
        flat = self._flat([p.float() for p in self.params])
        self.state.comm.sum(flat)
        flat.mul_(1.0 / self.state.world_size)
        self._warmup_bytes += flat.numel() * 4
        self._unflatten(flat, self.params)
        self._unflatten(flat, self.anchor)

    @torch.no_grad()
    def sync(self):
        """One outer step now: the mean compressed pseudo-gradient applied to the anchor by the
        outer optimizer, the anchor copied into the model. A non-finite pseudo-gradient on any
        rank raises NonFiniteError on every rank and changes neither anchor nor model."""
        deltas = [a - p.to(a.device, torch.float32) for a, p in zip(self.anchor, self.params)]
        if self._flag is not None and self._flag[1]:
            means = self._flagged(deltas)
        else:
            means = average(self.state, deltas)
        for a, mean in zip(self.anchor, means):
            a.grad = mean.clone()
        self.outer.step()
        for a in self.anchor:
            a.grad = None
        for p, a in zip(self.params, self.anchor):
            p.copy_(a)
        self.syncs += 1

    def _flagged(self, deltas):
        """average() of a sharded model's shard, its failure told to the other replica groups
        (one 4-byte all-reduce: sketchsgd._agree): each raises, none applies its shard's step."""
        failed = None
        try:
            means = average(self.state, deltas)
        except _core.Error as e:  # any of the library's, seen alike by the group's ranks
            failed = e
        mine = Outcome.OK if failed is None else Outcome.NON_FINITE \
            if isinstance(failed, _core.NonFiniteError) else Outcome.ERROR
        agreed = agree(mine, self._flag[0], deltas[0].device)
        if failed is not None:
            raise failed
        if agreed != Outcome.OK:
            kind = _core.NonFiniteError if agreed == Outcome.NON_FINITE else _core.Error
            raise kind("DiLoCo: another replica group's sync failed (its ranks raised saying why): no shard took "
                       "this outer step")
        return means

    # ---- statistics and checkpoints --------------------------------------------------------------
    def stats(self) -> dict:
        """This rank's bytes over the syncs and warm-up steps so far, against per-step DDP's for
        the same inner steps.

        Link bytes (what the rank's link carries, sent + received: CompressionState.stats()):
        link_bytes, link_bytes_per_sync (the syncs' mean, warm-up aside); per_step_bf16_link_bytes
        and per_step_fp32_link_bytes, what a ring all-reduce of the gradient every inner step would
        have carried at this world size; link_ratio_bf16 and link_ratio_fp32, those over
        link_bytes. Payload (handed to the collectives, no traffic figure: an all-gather's link
        carries W − 1 times it): payload_bytes, bytes_per_sync, bytes_per_inner_step, against
        per_step_dense_bytes (the gradient in the model's dtype each inner step); ratio."""
        dim = sum(p.numel() for p in self.params)
        codec = self.state.stats()
        W = codec["world"]
        payload = codec["payload_bytes"] + self._warmup_bytes
        per_step = dim * self._width * self.inner_steps
        link = codec["link_bytes"] + sum(ring("all_reduce", self._warmup_bytes, W))
        bf16, fp32 = (sum(ring("all_reduce", dim * w, W)) * self.inner_steps for w in (2, 4))
        return {"inner_steps": self.inner_steps, "syncs": self.syncs, "world": W, "payload_bytes": payload,
                "per_step_dense_bytes": per_step, "ratio": per_step / payload if payload else 0.0,
                "bytes_per_inner_step": payload / self.inner_steps if self.inner_steps else 0.0,
                "bytes_per_sync": codec["payload_bytes"] / self.syncs if self.syncs else 0.0,
                "link_bytes": round(link), "link_bytes_per_sync": codec["link_bytes"] / self.syncs if self.syncs else 0.0,
                "per_step_bf16_link_bytes": round(bf16), "per_step_fp32_link_bytes": round(fp32),
                "link_ratio_bf16": bf16 / link if link else 0.0, "link_ratio_fp32": fp32 / link if link else 0.0}

    def state_dict(self, gather: bool = True) -> dict:
        """The anchor, the outer optimizer, the counters and the codec state (error feedback).
        gather=True, as CompressionState.state_dict(): rank 0's dict holds every rank's codec
        state, with no collective (rank 0 may save alone while the others wait in a barrier);
        gather=False: this rank's alone.

        Between syncs each rank's model and inner optimizer are its own, so a checkpoint that
        must resume exactly is a file per rank (model, inner optimizer, state_dict(gather=False)),
        or rank 0's file written right after a sync (every model equals the anchor) when the
        inner optimizer keeps no state (plain SGD). A model sharded by FSDP2: every rank's anchor
        is its shard's, so a file per rank (or torch.distributed.checkpoint); a rank refuses
        another shard's anchor."""
        return {"version": 1, "every": self.every, "warmup": self.warmup, "inner_steps": self.inner_steps,
                "shard": self._shard,
                "syncs": self.syncs, "warmup_bytes": self._warmup_bytes,
                "anchor": [a.clone() for a in self.anchor], "outer": self.outer.state_dict(),
                "codec": self.state.state_dict(gather=gather)}

    @torch.no_grad()
    def load_state_dict(self, d: dict) -> None:
        """Restores state_dict(). The model's own parameters are the caller's (model.state_dict())."""
        if not isinstance(d, dict) or d.get("version") != 1:
            raise ValueError("not a sketchsgd DiLoCo state_dict")
        missing = {"every", "warmup", "inner_steps", "syncs", "warmup_bytes", "anchor", "outer", "codec"} - set(d)
        if missing:
            raise ValueError(f"DiLoCo state_dict without {sorted(missing)}")
        if (d["every"], d["warmup"]) != (self.every, self.warmup):
            raise ValueError(f"state_dict of every={d['every']}, warmup={d['warmup']} loaded into every={self.every}, "
                             f"warmup={self.warmup}")
        if d.get("shard") != self._shard:
            raise ValueError(f"state_dict of shard {d.get('shard')} of the model's parameters loaded on a rank that "
                             f"holds shard {self._shard}: under FSDP2 each rank saves and loads its own "
                             "(state_dict(gather=False) per rank, or torch.distributed.checkpoint)")
        shapes = [tuple(a.shape) for a in d["anchor"]]
        if shapes != [tuple(a.shape) for a in self.anchor]:
            raise ValueError("state_dict: its anchor's shapes differ from this model's parameters")
        self.state.load_state_dict(d["codec"])
        for a, saved in zip(self.anchor, d["anchor"]):
            a.copy_(saved)
        self.outer.load_state_dict(d["outer"])
        self.inner_steps, self.syncs, self._warmup_bytes = int(d["inner_steps"]), int(d["syncs"]), int(d["warmup_bytes"])
