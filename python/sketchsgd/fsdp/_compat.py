"""Every FSDP and autograd internal sketchsgd.fsdp reads, in one place: FSDP2's parameter groups
(one attribute up to torch 2.11, a list after), their meshes, hooks and reduction settings, its
custom reduce-scatter's base class (torch ≥ 2.9), FSDP1's flat parameter and hook state, and the
autograd engine's end-of-backward callback. The other modules of the package use only these
names and torch's public API; missing() says which of them this torch lacks (tested on every
torch the tests run with)."""

import torch

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


# ---- FSDP2's parameter groups (FSDPParamGroup) ----------------------------------------------------

def shard_shapes(group):
    """The padded shard shape of each parameter of group that takes gradients, in FSDP's order."""
    return [tuple(p.padded_sharded_param_size) for p in _trained(group)]


def device(group):
    return group.device


def is_hsdp(group) -> bool:
    """Whether fully_shard was given a 2-D (HSDP) mesh."""
    return bool(group._is_hsdp)


def shard_group(group):
    """The process group group's parameters are sharded over."""
    return group.mesh_info.shard_process_group


def shard_size(group) -> int:
    return group.mesh_info.shard_mesh_size


def accumulating(group) -> bool:
    """set_requires_all_reduce(False): a micro-batch whose gradient is not all-reduced yet."""
    return not getattr(group, "all_reduce_grads", True)


def divide_factor(group):
    """set_gradient_divide_factor(f)'s f, or None."""
    return getattr(group, "gradient_divide_factor", None)


def all_reduce_hook(group):
    """The all-reduce hook set on group (FSDPModule.set_all_reduce_hook), or None."""
    return getattr(group, "_all_reduce_hook", None)


def reduce_scatter(group):
    """group's reduce-scatter (FSDPModule.set_custom_reduce_scatter's), or None."""
    return getattr(group, "_reduce_scatter_comm", None)


# ---- FSDP1 (FullyShardedDataParallel) -------------------------------------------------------------

def flat_param(module):
    """An FSDP1 instance's flat parameter, or None (an instance with no parameters of its own)."""
    return getattr(module, "_flat_param", None)


def flat_layout(flat):
    """(shapes of its real parameters, every run's numel with the padding, which runs are padding)
    of an FSDP1 flat parameter; AttributeError where this torch lays it out otherwise."""
    return flat._shapes, flat._numels_with_padding, flat._is_padding_mask


def set_hook_state(module, state) -> None:
    """The state FSDP1 hands an instance's communication hook (register_comm_hook gives every
    instance the root's one)."""
    module._comm_hook_state = state


# ---- autograd ---------------------------------------------------------------------------------

def graph_task() -> int:
    """The id of the running backward (−1 outside one)."""
    return torch._C._current_graph_task_id()


def at_backward_end(fn) -> None:
    """fn called once the running backward ends; RuntimeError outside a backward."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def missing() -> list:
    """The internals above that this torch does not have where it is said they are."""
    out = []
    if not hasattr(torch._C, "_current_graph_task_id"):
        out.append("torch._C._current_graph_task_id")
    if not hasattr(torch.autograd.Variable._execution_engine, "queue_callback"):
        out.append("the autograd engine's queue_callback")
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError as e:
        return out + [f"FSDP2's modules ({e})"]
    state = FSDPState.__init__.__code__.co_names + FSDPState._lazy_init.__code__.co_names
    if "_fsdp_param_groups" not in state and "_fsdp_param_group" not in state:
        out.append("FSDPState._fsdp_param_group(s)")
    group = " ".join(map(str, FSDPParamGroup.__init__.__code__.co_names)) + " " + " ".join(dir(FSDPParamGroup))
    for name in ("fsdp_params", "mesh_info", "device", "_is_hsdp", "_all_reduce_hook", "_reduce_scatter_comm",
                 "all_reduce_grads", "gradient_divide_factor"):
        if name not in group:
            out.append(f"FSDPParamGroup.{name}")
    from torch.distributed.fsdp._flat_param import FlatParameter
    flat = " ".join(FlatParameter._init_metadata.__code__.co_names)
    for name in ("_shapes", "_numels_with_padding", "_is_padding_mask"):
        if name not in flat:
            out.append(f"FlatParameter.{name}")
    return out
