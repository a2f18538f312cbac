"""Every sketchsgd codec on torch.distributed (gloo or NCCL; CPU or CUDA tensors): a DDP
communication hook, a blocking average() of one's own tensors, and DiLoCo's outer loop.

    from sketchsgd.torch import CompressionState, compression_hook
    state = CompressionState(spec="sketch:rows=1,cols=200000,k=40000", process_group=None)
    ddp_model.register_comm_hook(state, compression_hook)

    mean = average(CompressionState("topk:k=1000"), [t1, t2])   # blocking, error feedback kept

The modules behind it: _state (CompressionState: configuration, statistics; _checkpoint its
checkpoints), _units (which tensors a bucket holds, each unit's codec), _rounds (a unit's C++
round on the communicator), _comm (the collectives), _schedule (their order: overlapped, inline or
coalesced), _hook (the drivers), outer (DiLoCo).

Per bucket, the gradients of tensors with two or more dimensions are compressed; 1-D tensors
(biases) and tensors below `dense_below` elements travel uncompressed in the same collective.
Codecs that work per tensor (powersgd) get the whole bucket with its tensors' shapes (a layout)
and choose themselves which tensors to factor; their result is written straight into the bucket.
Codecs whose payload sums (dense, sketch, powersgd) all-reduce it and every rank's copy of the C++
aggregator takes the sum in place of W messages; the others (topk, signsgd, terngrad, qsgd)
all-gather their messages and every rank aggregates all W. Every rank therefore ends with the
same averaged bucket, bit for bit.

Backward never waits for a bucket's collectives, except for the step's last bucket, when there is
no backward left to overlap. The hook issues a bucket's first collective and returns; a
collective that depends on an earlier one (the second all-reduce of sketch p2 and powersgd, a
gathered codec's messages after their lengths) is issued from the earlier one's completion
callback, in a chain the hook waits for before its next collective, so every rank issues them in
the same order. So the next bucket's backward overlaps the first collective (and the hook for
that bucket waits only if the collective took longer than that bucket's backward).

CompressionState(coalesce=True) trades that overlap for fewer collectives: each bucket is encoded
in its own call, and the step's last bucket issues every unit's collectives of a phase at once,
laid end to end (one all-reduce per wire dtype, one all-gather per dtype), so a step issues as
many collectives as with the model in one bucket. Where every collective costs latency and CPU
time on busy cores, that is faster (docs/BENCHMARKS.md); with 2 ranks the results are those of
the overlapped hook bit for bit (with more, the sums' order in the ring differs).

Budget rule: options `k` and `cols` in the spec are budgets for the whole model. Bucket b, holding
n_b of the model's N compressed coordinates, gets round(value · n_b / N) (at least 1); 0
(automatic) stays automatic per bucket. Other options apply to every bucket as written.

Warm-up: the first `start_iter` (≥ 2) synchronised steps are plain fp32 all-reduces, past DDP's
bucket rebuild after the first step; they also fix each bucket's layout and N.

A NaN or ±Inf in a rank's compressed gradients: that rank's hook raises NonFiniteError (naming
the coordinate; its codec state as before), and it still joins the step's first collective, so
that every other rank's hook raises NonFiniteError too instead of waiting for it; the step has
no update anywhere, and the next one goes on alike on every rank.
"""

from ._hook import FlatBucket, average, compression_hook
from ._state import CompressionState
from ._traffic import link_bytes
from .outer import DiLoCo, nesterov

__all__ = ["CompressionState", "DiLoCo", "FlatBucket", "average", "compression_hook", "link_bytes", "nesterov"]
