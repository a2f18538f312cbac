"""The FSDP internals whose place differs across the supported torch versions: FSDP2's parameter
groups (one attribute up to torch 2.11, a list after) and its custom reduce-scatter's base class
(torch ≥ 2.9). The entry points read the groups' other private attributes (mesh_info, _is_hsdp,
the hooks they set) directly."""

try:
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError:  # before FSDP2's custom collectives (PyTorch 2.9): compress_reduce_scatter refuses
    ReduceScatter = object


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
