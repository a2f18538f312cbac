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

from .checkpoint import load_state_dict, state_dict
from .fsdp1 import compress_fsdp1
from .fsdp2 import compress_reduce_scatter, compress_replicas
from ._backward import LayoutError

__all__ = ["compress_replicas", "compress_reduce_scatter", "compress_fsdp1", "state_dict", "load_state_dict",
           "LayoutError"]
