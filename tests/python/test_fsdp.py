"""sketchsgd.fsdp: FSDP2 (fully_shard on a CPU mesh, gloo, 4 ranks = 2 replicas × 2 shards) with
the replicas' gradient shards averaged through every codec family."""
import numpy as np
import pytest

import ddp
import fsdp_jobs
import sketchsgd

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except ImportError:
    pytest.skip("FSDP2 (torch.distributed.fsdp.fully_shard) needs PyTorch 2.6 or later", allow_module_level=True)

STEPS = 12


def test_dense_is_fsdp2s_own_hsdp_bit_for_bit():
    """With the dense codec the hook is FSDP2's HSDP all-reduce: the same losses and shards, bit
    for bit (two replicas: a + b and a float32(1/2) scale are exact whichever the order)."""
    native = ddp.run(fsdp_jobs.trains, None, 2, STEPS)
    ours = ddp.run(fsdp_jobs.trains, "dense", 2, STEPS)
    for rank in range(4):
        assert native[rank][0] == ours[rank][0], f"rank {rank}: losses differ"
        assert np.array_equal(native[rank][1], ours[rank][1]), f"rank {rank}: shards differ"


@pytest.mark.parametrize("spec", ["powersgd:rank=2", "sketch:rows=1,cols=2000,k=400,fetch=1", "topk:k=400",
                                  "signsgd:ef=1", "qsgd:bits=4", "terngrad"])
def test_every_family_trains_and_the_replicas_of_a_shard_agree(spec):
    """Each codec family (summable one- and two-phase, gathered): the loss falls, the two
    replicas of each shard (ranks 0 and 2, 1 and 3) hold the same parameters bit for bit, and
    the replicas' traffic is the codec's, not dense fp32's."""
    out = ddp.run(fsdp_jobs.trains, spec, 2, STEPS)
    for rank, (losses, local, stats) in enumerate(out):
        assert np.isfinite(local).all(), (spec, rank)
        assert np.mean(losses[-3:]) < np.mean(losses[:3]), (spec, rank, losses)
        assert stats["steps"] == 3 * STEPS, stats  # a step per FSDP group and backward
        assert stats["payload_bytes"] < stats["dense_bytes"], (spec, stats)
    for shard in (0, 1):
        assert np.array_equal(out[shard][1], out[shard + 2][1]), f"{spec}: replicas of shard {shard} differ"


def test_misuse_is_refused_with_a_clear_error():
    for rank, outcomes in enumerate(ddp.run(fsdp_jobs.refusals)):
        got = {name: (kind, message) for name, kind, message in outcomes}
        assert got["not a module"][0] == "TypeError", got
        assert got["not a state"][0] == "TypeError", got
        assert got["no FSDP"][0] == "ValueError" and "fully_shard" in got["no FSDP"][1], got
        assert got["2-D mesh"][0] == "ValueError" and "mesh['shard']" in got["2-D mesh"][1], got
        assert got["world group"][0] == "ValueError" and "replicate" in got["world group"][1], got
        assert got["a state twice"][0] == "ValueError", got
        assert got["no part of this rank"][0] == "ValueError" and f"rank{rank}" in got["no part of this rank"][1], got
        assert got["another configuration"][0] == "ConfigMismatch", got


def test_the_module_imports_in_a_fresh_interpreter():
    import subprocess
    import sys
    subprocess.run([sys.executable, "-c", "import sketchsgd.fsdp"], check=True)
    import sketchsgd.fsdp
    assert callable(sketchsgd.fsdp.compress_replicas)


@pytest.mark.parametrize("spec", ["powersgd:rank=2", "topk:k=400"])
def test_a_non_finite_shard_raises_on_every_rank_and_training_goes_on(spec):
    """A NaN that reaches one replica group's shard alone: backward() raises NonFiniteError on all
    four ranks (none applies an update, none waits), and the steps after it run and agree."""
    out = ddp.run(fsdp_jobs.non_finite, spec, 6, 2)
    for rank, (errors, local) in enumerate(out):
        assert [e is not None for e in errors] == [False, False, True, False, False, False], (rank, errors)
        assert errors[2][0] == "NonFiniteError", (rank, errors[2])
        assert np.isfinite(local).all(), rank
    assert "another replica group" in out[1][0][2][1], out[1][0][2]
    for shard in (0, 1):
        assert np.array_equal(out[shard][1], out[shard + 2][1]), f"{spec}: replicas of shard {shard} differ"


@pytest.mark.parametrize("spec", ["powersgd:rank=2", "topk:k=400"])
def test_a_dcp_checkpoint_resumes_every_rank_bit_for_bit(spec, tmp_path):
    """Model and compression state saved with torch.distributed.checkpoint; a new model and state
    loaded from it train on exactly as the saved ones did (every rank's error feedback back)."""
    for rank, (continued, resumed) in enumerate(ddp.run(fsdp_jobs.resume, spec, 4, 4, str(tmp_path / "ckpt"))):
        assert continued[0] == resumed[0], (spec, rank, continued[0], resumed[0])
        assert np.array_equal(continued[1], resumed[1]), (spec, rank)


@pytest.mark.parametrize("spec", ["dense", "powersgd:rank=2", "topk:k=400"])
def test_diloco_over_a_sharded_model_syncs_each_shard_across_its_replicas(spec):
    """DiLoCo with FSDP2 inside each replica: after the last sync the replicas of each shard hold
    the same parameters bit for bit (they started apart), the loss falls, and a sync moves a
    shard's pseudo-gradient, not the model's."""
    out = ddp.run(fsdp_jobs.diloco, spec, 4, 24)
    for rank, ((first, last), local, stats) in enumerate(out):
        assert last < first, (spec, rank, first, last)
        assert stats["syncs"] == 6, stats
    for shard in (0, 1):
        assert np.array_equal(out[shard][1], out[shard + 2][1]), f"{spec}: replicas of shard {shard} differ"
    assert not np.array_equal(out[0][1][:100], out[1][1][:100])  # two shards, not one model twice
