"""Whether a step failed on any rank that must act alike, agreed in one 4-byte all-reduce.

Where a failure cannot reach every rank through the step's own collectives (the ranks of other
replica groups share none with a failed one; a rank that cannot decode its own chunk fails alone),
each rank states its outcome, the group agrees on the worst (MAX over Outcome's order), and a rank
whose own step went through raises the error that the agreed outcome names: no rank applies a step
that another could not. The FSDP entry points (fsdp/_backward.py, at a backward's end) and DiLoCo
over a sharded model (outer.py) agree so; within one group the C++ round's own sums carry a
failure to every rank (a NaN payload, a zero length) and need no agreement.
"""

import enum

import torch
import torch.distributed as dist

from . import _core


class Outcome(enum.IntEnum):
    """A step's outcome on one rank, the worse the larger (the agreement keeps the largest)."""
    OK = 0
    NON_FINITE = 1  # a gradient was not finite (NonFiniteError)
    ERROR = 2       # a message was refused (WireError), or another of the library's errors
    LAYOUT = 3      # an FSDP module reduced a gradient of another layout (fsdp.LayoutError)
    INVALID = 4     # a codec refused its unit (InvalidArgument)


def outcome_of(error) -> Outcome:
    """The outcome an error stands for (None: OK). An error class may state its own (`outcome`)."""
    if error is None:
        return Outcome.OK
    own = getattr(type(error), "outcome", None)
    if isinstance(own, Outcome):
        return own
    if isinstance(error, _core.NonFiniteError):
        return Outcome.NON_FINITE
    if isinstance(error, _core.InvalidArgument):
        return Outcome.INVALID
    return Outcome.ERROR


def agree(outcome: Outcome, group, device=None) -> Outcome:
    """The worst outcome of group's ranks (a collective: every rank of group calls it, in the same
    order as its other collectives). device: where an NCCL group's flag lives."""
    on = device if device is not None and dist.get_backend(group) == "nccl" else "cpu"
    flag = torch.tensor([int(outcome)], dtype=torch.int32, device=on)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return Outcome(int(flag.item()))
