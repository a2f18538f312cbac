"""A compressed FSDP model's codec state in torch.distributed.checkpoint, beside the model's."""

import io

import torch
import torch.distributed as dist

from .._state import CompressionState


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
    if state.driver != "fsdp":
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
