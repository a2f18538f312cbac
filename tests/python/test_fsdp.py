"""sketchsgd.fsdp: FSDP2 (fully_shard on a CPU mesh, gloo, 4 ranks = 2 replicas × 2 shards) with
the replicas' gradient shards averaged through every codec family."""
import numpy as np
import torch
import pytest

import ddp
import fsdp_jobs
import sketchsgd

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except ImportError:
    pytest.skip("FSDP2 (torch.distributed.fsdp.fully_shard) needs PyTorch 2.6 or later", allow_module_level=True)

STEPS = 12


REPLICA_SPECS = ["powersgd:rank=2", "sketch:rows=1,cols=2000,k=400,fetch=1", "topk:k=400", "signsgd:ef=1",
                 "qsgd:bits=4", "terngrad", "powersgd:rank=2,wire=int8"]


def test_every_fsdp_internal_the_package_reads_is_where_this_torch_has_it(monkeypatch):
    """sketchsgd.fsdp reads FSDP's and autograd's internals through _compat alone; on this torch
    each is where _compat looks (the GPU run checks its torch too). A torch that lays FSDP1's flat
    parameter out otherwise is told by name."""
    from sketchsgd.fsdp import _compat
    from torch.distributed.fsdp._flat_param import FlatParameter
    assert _compat.missing() == []

    def elsewhere(self, *args, **kwargs):
        self._layout = args

    monkeypatch.setattr(FlatParameter, "_init_metadata", elsewhere)
    assert _compat.missing() == ["FlatParameter._shapes", "FlatParameter._numels_with_padding",
                                 "FlatParameter._is_padding_mask"]


def test_compressed_replicas_train_and_dense_is_fsdp2s_own_hsdp():
    """With the dense codec the hook is FSDP2's HSDP all-reduce: the same losses and shards, bit
    for bit (two replicas: a + b and a float32(1/2) scale are exact whichever the order). Every
    other codec family (summable one- and two-phase, gathered): the loss falls, the two replicas
    of each shard (ranks 0 and 2, 1 and 3) hold the same parameters bit for bit, and the replicas'
    traffic is the codec's, not dense fp32's."""
    out = ddp.run(fsdp_jobs.each, "trains", [None, "dense"] + REPLICA_SPECS, 2, STEPS)
    for rank in range(4):
        assert out[rank][None][0] == out[rank]["dense"][0], f"rank {rank}: losses differ"
        assert np.array_equal(out[rank][None][1], out[rank]["dense"][1]), f"rank {rank}: shards differ"
    for spec in REPLICA_SPECS:
        for rank in range(4):
            losses, local, stats = out[rank][spec]
            assert np.isfinite(local).all(), (spec, rank)
            assert np.mean(losses[-3:]) < np.mean(losses[:3]), (spec, rank, losses)
            assert stats["steps"] == 3 * STEPS, stats  # a step per FSDP module and backward
            assert stats["payload_bytes"] < stats["dense_bytes"], (spec, stats)
        for shard in (0, 1):
            assert np.array_equal(out[shard][spec][1], out[shard + 2][spec][1]), f"{spec}: replicas of shard {shard}"


def test_misuse_is_refused_with_a_clear_error():
    for rank, outcomes in enumerate(ddp.run(fsdp_jobs.refusals)):
        got = {name: (kind, message) for name, kind, message in outcomes}
        assert got["not a module"][0] == "TypeError", got
        assert got["not a state"][0] == "TypeError", got
        assert got["negative warm-up"][0] == "ValueError" and "warmup" in got["negative warm-up"][1], got
        assert got["no FSDP"][0] == "ValueError" and "fully_shard" in got["no FSDP"][1], got
        assert got["2-D mesh"][0] == "ValueError" and "mesh['shard']" in got["2-D mesh"][1], got
        assert got["world group"][0] == "ValueError" and "replicate" in got["world group"][1], got
        assert got["a state twice"][0] == "ValueError", got
        assert got["no part of this rank"][0] == "ValueError" and f"rank{rank}" in got["no part of this rank"][1], got
        assert got["another configuration"][0] == "ConfigMismatch", got
        assert "CompressionState('topk:k=11', start_iter=2" in got["another configuration"][1], got
        assert got["another model"][0] == "ConfigMismatch" and "sharded another way" in got["another model"][1], got
        assert got["no model yet"][0] == "ValueError" and "compress_replicas" in got["no model yet"][1], got
        assert got["reduce-scatter over the replicas"][0] == "ValueError", got
        assert got["registered twice"][0] == "ValueError" and "one state per model" in got["registered twice"][1], got
        assert got["its state in a DDP hook"][0] == "ValueError", got
        assert got["a mesh for a group"][0] == "TypeError" and "get_group()" in got["a mesh for a group"][1], got
        assert got["corrupt bytes"][0] == "ValueError" and "corrupt" in got["corrupt bytes"][1], got
        assert got["a state that ran steps"][0] == "ValueError", got
        assert got["an FSDP1 model"][0] == "ValueError" and "compress_fsdp1" in got["an FSDP1 model"][1], got


def test_the_module_imports_in_a_fresh_interpreter():
    import subprocess
    import sys
    subprocess.run([sys.executable, "-c", "import sketchsgd.fsdp"], check=True)
    import sketchsgd.fsdp
    assert callable(sketchsgd.fsdp.compress_replicas)


def test_a_non_finite_shard_raises_on_every_rank_and_training_goes_on():
    """A NaN that reaches one replica group's shard alone: backward() raises NonFiniteError on all
    four ranks (none applies an update, none waits), and the steps after it run and agree. The
    same with the reduce-scatter compressed (every rank shares the failed round)."""
    specs = ["powersgd:rank=2", "topk:k=400"]
    both = ddp.run(fsdp_jobs.several, [("each", ("non_finite", specs, 6, 2)),
                                       ("each", ("non_finite", ["topk:k=400"], 6, 2, "reduce_scatter"))])
    replicas, full = [r[0] for r in both], [r[1] for r in both]
    for out, spec in [(replicas, s) for s in specs] + [(full, "topk:k=400")]:
        for rank in range(4):
            errors, local = out[rank][spec]
            assert [e is not None for e in errors] == [False, False, True, False, False, False], (rank, errors)
            assert errors[2][0] == "NonFiniteError", (rank, errors[2])
            assert np.isfinite(local).all(), rank
    for spec in specs:
        assert "another replica group" in replicas[1][spec][0][2][1], replicas[1][spec][0][2]
        for shard in (0, 1):
            assert np.array_equal(replicas[shard][spec][1], replicas[shard + 2][spec][1]), (spec, shard)


def test_a_dcp_checkpoint_resumes_every_rank_bit_for_bit(tmp_path):
    """Model and compression state saved with torch.distributed.checkpoint; a new model and state
    loaded from it train on exactly as the saved ones did (every rank's error feedback back):
    compressed replicas, and a compressed reduce-scatter past its fp32 warm-up. PowerSGD at rank 8
    sends the last layer's module whole: a unit without a codec resumes too."""
    specs = ["powersgd:rank=2", "topk:k=400", "powersgd:rank=8"]
    (tmp_path / "replicas").mkdir()
    (tmp_path / "full").mkdir()
    both = ddp.run(fsdp_jobs.several, [("each", ("resume", specs, 4, 4, str(tmp_path / "replicas"))),
                                       ("each", ("resume", ["powersgd:rank=2", "signsgd:ef=1"], 4, 4,
                                                 str(tmp_path / "full"), "reduce_scatter", 2))])
    replicas, full = [r[0] for r in both], [r[1] for r in both]
    for rank in range(4):
        for spec, (continued, resumed) in list(replicas[rank].items()) + list(full[rank].items()):
            assert continued[0] == resumed[0], (spec, rank, continued[0], resumed[0])
            assert np.array_equal(continued[1], resumed[1]), (spec, rank)


def test_diloco_over_a_sharded_model_syncs_each_shard_across_its_replicas():
    """DiLoCo with FSDP2 inside each replica: after the last sync the replicas of each shard hold
    the same parameters bit for bit (they started apart), the loss falls, and there are two
    shards, not one model twice."""
    specs = ["dense", "powersgd:rank=2", "topk:k=400"]
    out = ddp.run(fsdp_jobs.each, "diloco", specs, 4, 24)
    for spec in specs:
        for rank in range(4):
            (first, last), local, stats = out[rank][spec]
            assert last < first, (spec, rank, first, last)
            assert stats["syncs"] == 6, stats
        for shard in (0, 1):
            assert np.array_equal(out[shard][spec][1], out[shard + 2][spec][1]), f"{spec}: replicas of shard {shard}"
        assert not np.array_equal(out[0][spec][1][:100], out[1][spec][1][:100])


FULL_SPECS = ["powersgd:rank=1", "sketch:rows=1,cols=4000,k=800,fetch=1", "topk:k=800", "signsgd:ef=1",
              "powersgd:rank=2,wire=int8"]


def test_a_compressed_reduce_scatter_trains_and_dense_is_fsdp2s_own():
    """compress_reduce_scatter with the dense codec on 2 ranks is FSDP2's reduce-scatter, bit for
    bit (a + b, then × float32(1/2), exact in either order). Over 4 ranks, each family trains:
    the loss falls on every rank, the shards stay finite, and fewer bytes go out than the dense
    fp32 gradient."""
    two = ddp.run(fsdp_jobs.each, "full_shard", [None, "dense"], STEPS, world=2)
    for rank in range(2):
        assert two[rank][None][0] == two[rank]["dense"][0], f"rank {rank}: losses differ"
        assert np.array_equal(two[rank][None][1], two[rank]["dense"][1]), f"rank {rank}: shards differ"
    four = ddp.run(fsdp_jobs.each, "full_shard", [None] + FULL_SPECS, STEPS)
    for spec in FULL_SPECS:
        for rank in range(4):
            losses, local, stats = four[rank][spec]
            assert np.isfinite(local).all(), (spec, rank)
            assert np.mean(losses[-3:]) < np.mean(losses[:3]), (spec, rank, losses)
            assert losses[0] == four[rank][None][0][0]  # the same model and data at the start
            assert stats["steps"] == 3 * STEPS and stats["payload_bytes"] < stats["dense_bytes"], (spec, stats)
    # PowerSGD factors each weight whole (its rows padded to a multiple of W, as FSDP pads its
    # shards), not W slices of it: (rows + columns) values a weight, and the biases whole.
    per_step = sum((-(-m.out_features // 4) * 4) * 2 + m.in_features for m in fsdp_jobs._model()
                   if isinstance(m, torch.nn.Linear))
    assert four[0]["powersgd:rank=1"][2]["payload_bytes"] == 4 * per_step * STEPS


def _chunks(world):
    """Per FSDP module of fsdp_jobs' MLP over world ranks: (compressed values, values sent whole)
    of one rank's chunk (its weight rows padded to a multiple of world, as FSDP pads them; its
    bias whole)."""
    out = []
    for m in fsdp_jobs._model():
        if isinstance(m, torch.nn.Linear):
            rows = -(-m.out_features // world)
            out.append((rows * m.in_features, rows))
    return out


def test_a_gathered_codec_sends_each_rank_its_own_chunk():
    """compress_reduce_scatter with a gathered codec exchanges per destination: rank r receives
    every rank's message of chunk r alone (an all-to-all) and decodes only those. With top-k
    sending every value (k = the compressed values: lossless), the step is FSDP2's own
    reduce-scatter: bit for bit on 2 ranks (a + b, then × float32(1/2)), to rounding on 4 (another
    order of the sum). The bytes a rank hands over per step are its messages for every chunk (a
    header, a count and 8 bytes a value each, its own chunk's included, as a reduce-scatter's
    input is counted whole), its 8-byte lengths and the whole biases' input; its link carries
    W − 1 of those messages where a ring all-gather of whole-gradient messages carries W − 1
    whole ones."""
    for world in (2, 4):
        _lossless_per_destination("full_shard", [[(n, d)] * world for n, d in _chunks(world)], world)


def _lossless_per_destination(job, modules, world):
    """fsdp_jobs' job (4 steps) with its own reduction and with top-k sending every value per
    destination: the same steps, bit for bit on 2 ranks (a + b, then × float32(1/2)), to rounding
    on 4 (another order of the sum); and the bytes a rank hands over per step. modules: per FSDP
    module, per chunk (compressed values, values sent whole)."""
    k = sum(c for chunks in modules for c, _ in chunks)
    out = ddp.run(fsdp_jobs.each, job, [None, f"topk:k={k}"], 4, world=world)
    for rank in range(world):
        (plain, shards, _), (losses, local, stats) = out[rank][None], out[rank][f"topk:k={k}"]
        if world == 2:
            assert losses == plain and np.array_equal(local, shards), rank
        else:
            assert np.allclose(losses, plain, rtol=1e-5), (rank, losses, plain)
            assert np.allclose(local, shards, rtol=1e-4, atol=1e-6), rank
        # A message per chunk holding compressed values (a header, a count, 8 bytes a value),
        # 8-byte lengths, and each chunk's whole tensors (4 bytes a value; the reduce-scatter's
        # input where every chunk holds the same, else the all-to-all's).
        sent = sum(sum((sketchsgd._core.header_bytes + 4 + 8 * c if c else 0) + 4 * d for c, d in chunks)
                   + 8 * world for chunks in modules)
        assert stats["payload_bytes"] == 4 * sent, (world, rank, stats, sent)


def test_a_bfloat16_model_trains_through_one_float32_buffer_not_one_per_module():
    """A bfloat16 model under full sharding: the codecs see float32 copies of its gradients, and
    since each module's reduce-scatter is blocking, the state keeps one buffer of each kind the
    size of the largest module's input, not a copy per module (that would hold the whole
    unsharded gradient, the memory FSDP shards the model to save). Summable (PowerSGD: the
    input as FSDP lays it out, read in place through a float32 copy, and this rank's chunk of
    the mean computed into a float32 one; the sketch: the parameter-major copy, in float32 at
    once) and gathered (top-k per destination: the input and this rank's chunk) alike; all
    train."""
    sketch = "sketch:rows=1,cols=4000,k=800,fetch=1"
    out = ddp.run(fsdp_jobs.each, "half_precision", ["powersgd:rank=2", sketch, "topk:k=800"], STEPS, world=2)
    for rank in range(2):
        for spec, names in (("powersgd:rank=2", {"in", "out"}), (sketch, {"whole"}), ("topk:k=800", {"in", "out"})):
            losses, local, kept, largest = out[rank][spec]
            assert np.isfinite(local).all() and np.mean(losses[-3:]) < np.mean(losses[:3]), (spec, rank, losses)
            assert set(kept) == names, (spec, kept)
            sizes = {"whole": largest, "in": largest, "out": largest // 2}
            assert all(kept[k] == sizes[k] for k in kept), (spec, kept, largest)


def test_a_message_that_does_not_decode_fails_the_step_on_every_rank():
    """Per destination only rank 0 reads rank 1's message for its chunk: when a byte of it is
    flipped (its checksum no longer matches), rank 0's decode raises WireError, and the flag at
    the end of the backward makes every other rank raise WireError too, rather than apply its
    update or wait; rank 0 took part in every later module's round, so nobody waits, and the
    steps after it train on."""
    out = ddp.run(fsdp_jobs.each, "corrupt", ["topk:k=800"], 5, 2)
    for rank in range(4):
        errors, local = out[rank]["topk:k=800"]
        assert [e is not None for e in errors] == [False, False, True, False, False], (rank, errors)
        assert errors[2][0] == "WireError" and np.isfinite(local).all(), (rank, errors)
        assert ("another rank" in errors[2][1]) == (rank != 0), (rank, errors[2])


def test_a_failure_is_told_to_its_data_parallel_group_alone():
    """Two data-parallel groups of one job (ranks 0-1 and 2-3, as pipeline stages would be), each
    fully sharded with a gathered codec, whose backward passes end with a flag: the first group
    trains 4 steps and the second 2, so a flag over every rank would wait for backward passes the
    second group never runs. Each group's flag stays within it: rank 1's NaN at step 2 fails
    that step on ranks 0 and 1 alone, and everyone reaches the final barrier."""
    out = ddp.run(fsdp_jobs.each, "two_groups", ["topk:k=800"], 2, timeout=120)
    for rank in range(4):
        errors, local = out[rank]["topk:k=800"]
        expect = [None, None, "NonFiniteError", None] if rank < 2 else [None, None]
        assert [e and e[0] for e in errors] == expect, (rank, errors)
        assert np.isfinite(local).all(), rank


def test_an_oversized_message_fails_the_step_on_every_rank_and_fsdp_goes_on():
    """A length past the codec's largest message, announced by one rank, is seen by every rank in
    the all-gathered lengths: each raises WireError at the end of the backward (an error raised
    inside it would leave FSDP2's parameters unsharded for good), and the steps after it train."""
    out = ddp.run(fsdp_jobs.each, "oversized", ["topk:k=800"], 5, 2)
    for rank in range(4):
        errors, local = out[rank]["topk:k=800"]
        assert [e and e[0] for e in errors] == [None, None, "WireError", None, None], (rank, errors)
        assert "rank 1 sent a message of 1099511627776 bytes" in errors[2][1], (rank, errors[2])
        assert np.isfinite(local).all(), rank


def test_warm_up_steps_average_uncompressed_then_the_codec_takes_over():
    """warmup=2: the first two backward passes are FSDP2's own mean (2 ranks: exact), so the
    losses through step 2 equal uncompressed FSDP2's; from step 3 the codec's; the counters say
    which steps compressed."""
    out = ddp.run(fsdp_jobs.each, "full_shard", [None, "topk:k=200"], 5, 2, world=2)
    for rank in range(2):
        plain, (losses, _, stats) = out[rank][None][0], out[rank]["topk:k=200"]
        assert losses[:3] == plain[:3] and losses[3] != plain[3], (rank, losses, plain)
        assert stats["steps"] == 3 * 5 and stats["compressed_steps"] == 3 * 3, stats


def test_fsdp1_with_the_dense_codec_is_its_own_reduction_under_every_strategy():
    """compress_fsdp1 with the dense codec on 2 ranks is FSDP1's own reduction bit for bit (its
    pre- and post-division by powers of two are exact): FULL_SHARD, NO_SHARD, and with
    use_orig_params (alignment padding inside the flat parameter). warmup=2 with top-k: the first
    two steps are FSDP1's own, the third the codec's."""
    calls = [("each", ("fsdp1", [None, "dense"], 6, strategy, 0, orig))
             for strategy, orig in (("FULL_SHARD", False), ("NO_SHARD", False), ("SHARD_GRAD_OP", True))]
    out = ddp.run(fsdp_jobs.several, calls + [("each", ("fsdp1", ["topk:k=200"], 5, "FULL_SHARD", 2))], world=2)
    for rank in range(2):
        for (_, (_, _, _, strategy, _, orig)), got in zip(calls, out[rank]):
            assert got[None][0] == got["dense"][0], (rank, strategy, orig)
            assert np.array_equal(got[None][1], got["dense"][1]), (rank, strategy, orig)
        plain, (losses, _, stats) = out[rank][0][None][0], out[rank][3]["topk:k=200"]
        assert losses[:3] == plain[:3] and losses[3] != plain[3], (rank, losses, plain)
        assert stats["steps"] == 3 * 5 and stats["compressed_steps"] == 3 * 3, stats


def _flat_chunks(model, world):
    """Per FSDP1 instance of model (each Linear-holding child; FULL_SHARD over world ranks): per
    chunk of its flat gradient (its parameters end to end, padded to world equal chunks),
    (values of matrices, values sent whole: vectors and padding)."""
    out = []
    for child in model:
        params = list(child.parameters())
        if not params:
            continue
        kinds = np.concatenate([np.full(p.numel(), p.dim() > 1) for p in params])
        kinds = np.concatenate([kinds, np.zeros(-len(kinds) % world, dtype=bool)]).reshape(world, -1)
        out.append([(int(c.sum()), int((~c).sum())) for c in kinds])
    return out


def test_fsdp1_a_gathered_codec_sends_each_rank_its_own_chunk():
    """compress_fsdp1 with a gathered codec under FULL_SHARD goes per destination, as under FSDP2:
    each W-th of an instance's flat gradient is a unit sent to the rank that keeps it. The chunk
    boundaries cut weights anywhere, and a chunk may hold whole tensors alone (the first block's
    200-value vector fills its later chunks): with top-k sending every value, the step is FSDP1's
    own reduction, bit for bit on 2 ranks, to rounding on 4. A rank hands over per step a message
    for each chunk holding matrix values (a header, a count, 8 bytes a value), 8-byte lengths,
    and each chunk's vector values, sent to its rank (an all-to-all: no padding)."""
    for world in (2, 4):
        _lossless_per_destination("fsdp1_mixed", _flat_chunks(fsdp_jobs.mixed_model(), world), world)
    # Over 4 ranks the last Linear's fourth chunk holds one value of its weight: a unit shorter
    # than SparseLoCo's k, which sends it as a partial chunk.
    assert _flat_chunks(fsdp_jobs.mixed_model(), 4)[1][3][0] == 1
    out = ddp.run(fsdp_jobs.each, "fsdp1_mixed", ["sparseloco:chunk=256,k=16"], 4, world=4)
    for rank in range(4):
        losses, local, stats = out[rank]["sparseloco:chunk=256,k=16"]
        assert np.isfinite(local).all() and np.isfinite(losses).all(), rank
        assert stats["compressed_steps"] == 2 * 4 and stats["payload_bytes"] > 0, stats  # 2 instances


def test_fsdp1_codecs_train_a_nan_raises_everywhere_and_a_checkpoint_resumes(tmp_path):
    """FSDP1 FULL_SHARD over 4 ranks, each Linear an instance: every codec family trains with
    fewer bytes than dense fp32, PowerSGD factoring each weight whole (the flat gradient holds
    each parameter end to end); a NaN on rank 1 makes backward() raise NonFiniteError on every
    rank and the steps after it run; FSDP1's sharded state dict and each rank's error feedback
    saved with DCP resume bit for bit; every misuse is refused with a clear error."""
    out = ddp.run(fsdp_jobs.several, [("each", ("fsdp1", FULL_SPECS, STEPS)),
                                      ("each", ("fsdp1_non_finite", ["topk:k=400"], 6, 2)),
                                      ("each", ("fsdp1_resume", ["powersgd:rank=2", "topk:k=400"], 4, 4,
                                                str(tmp_path))),
                                      ("fsdp1_refusals", ())])
    for rank in range(4):
        trained, failed, resumed, refused = out[rank]
        for spec in FULL_SPECS:
            losses, local, stats = trained[spec]
            assert np.isfinite(local).all(), (spec, rank)
            assert np.mean(losses[-3:]) < np.mean(losses[:3]), (spec, rank, losses)
            assert stats["steps"] == 3 * STEPS and stats["payload_bytes"] < stats["dense_bytes"], (spec, stats)
        errors, local = failed["topk:k=400"]
        assert [e is not None for e in errors] == [False, False, True, False, False, False], (rank, errors)
        assert errors[2][0] == "NonFiniteError" and np.isfinite(local).all(), (rank, errors)
        for spec, (continued, again) in resumed.items():
            assert continued[0] == again[0] and np.array_equal(continued[1], again[1]), (spec, rank)
        got = {name: (kind, message) for name, kind, message in refused}
        assert got["not FSDP1"][0] == "TypeError" and "root" in got["not FSDP1"][1], got
        assert got["another group"][0] == "ValueError" and "process group" in got["another group"][1], got
        assert got["negative warm-up"][0] == "ValueError", got
        assert got["a hook already"][0] == "ValueError", got
        assert got["hybrid"][0] == "ValueError" and "compress_replicas" in got["hybrid"][1], got
        assert got["a state twice"][0] == "ValueError", got
    # PowerSGD rank 1: (rows + columns) values a weight, its bias and the flat gradient's padding
    # to 4 equal chunks whole, 4 bytes each.
    layers = [m for m in fsdp_jobs._model() if isinstance(m, torch.nn.Linear)]
    per_step = sum(m.out_features + m.in_features + m.out_features + (-(m.weight.numel() + m.out_features)) % 4
                   for m in layers)
    assert out[0][0]["powersgd:rank=1"][2]["payload_bytes"] == 4 * per_step * STEPS


def test_frozen_parameters_and_a_divide_factor_reduce_as_fsdp2_does():
    """A frozen weight beside a trained bias in one FSDP module (requires_grad False, as LoRA
    freezes base weights: FSDP2 reduces the bias alone) and set_gradient_divide_factor(3) (FSDP2 sums over the ranks and divides by 3): with the
    dense codec each mode is FSDP2's own reduction (HSDP's to the bit; full sharding over 4 ranks
    to rounding), and PowerSGD trains with the weight frozen, which stays as it was."""
    runs = ddp.run(fsdp_jobs.several, [
        ("each", ("frozen", [None, "dense", "powersgd:rank=1"], "reduce_scatter", 6)),
        ("each", ("frozen", [None, "dense"], "replicas", 6)),
        ("each", ("divided", [None, "dense"], "reduce_scatter", 4, 3.0)),
        ("each", ("divided", [None, "dense"], "replicas", 4, 3.0))])
    for rank in range(4):
        full, hsdp, full_divided, hsdp_divided = runs[rank]
        assert np.allclose(full[None][1], full["dense"][1], rtol=0, atol=1e-6), rank
        assert np.array_equal(hsdp[None][1], hsdp["dense"][1]), rank
        assert np.allclose(full_divided[None][1], full_divided["dense"][1], rtol=0, atol=1e-6), rank
        assert np.array_equal(hsdp_divided[None][1], hsdp_divided["dense"][1]), rank
        losses, local, stats, unchanged = full["powersgd:rank=1"]
        assert np.isfinite(local).all() and np.mean(losses[-2:]) < np.mean(losses[:2]), (rank, losses)
        assert stats["steps"] == 3 * 6, stats
        assert unchanged and hsdp["dense"][3], rank


def test_a_parameter_without_a_gradient_fails_the_step_on_every_rank_and_training_goes_on():
    """A parameter of an FSDP module left out of one forward (FSDP2 reduces the module without it):
    backward() raises LayoutError on every rank, under full sharding (every rank left it out) and
    under HSDP where only replica 1 did (replica 0's ranks, whose layout was right, are told
    through the flag rather than left waiting in their round, which fails on every rank of it:
    replica 1 spends none of its error feedback, bit for bit under top-k; PowerSGD's settles a
    deferred subtraction, as after a NaN); the steps after it train, and the replicas agree. With
    set_reduce_scatter_unused_params(True) FSDP2 reduces zeros for it and nothing fails."""
    configs = [("powersgd:rank=1", mode, zeros) for mode in ("reduce_scatter", "replicas") for zeros in (False, True)]
    configs.append(("topk:k=40", "replicas", False))
    runs = ddp.run(fsdp_jobs.several, [("unused", (spec, mode, 5, 2, zeros)) for spec, mode, zeros in configs])
    for rank in range(4):
        for (errors, local, same), (spec, mode, zeros) in zip(runs[rank], configs):
            assert np.isfinite(local).all(), (mode, rank)
            if zeros:
                assert errors == [None] * 5, (mode, rank, errors)
                assert not same, (mode, rank)  # a step that ran moved the error feedback
                continue
            if mode == "reduce_scatter" or spec.startswith("topk"):
                # (replica 0's ranks keep their gradient in theirs, as after another rank's NaN)
                assert same == (mode == "reduce_scatter" or rank >= 2), (spec, mode, rank)
            assert [e is None for e in errors] == [True, True, False, True, True], (mode, rank, errors)
            assert errors[2][0] == "LayoutError", (mode, rank, errors[2])
            told = mode == "replicas" and rank < 2  # replica 0: its layout was right
            assert ("another replica group" in errors[2][1]) == told, (mode, rank, errors[2])
            assert told or "set_reduce_scatter_unused_params" in errors[2][1], errors[2]
    for run in (2, 4):
        for shard in (0, 1):
            assert np.array_equal(runs[shard][run][1], runs[shard + 2][run][1]), (run, shard)


def test_hsdp_gradient_accumulation_compresses_once_an_optimizer_step():
    """FSDP2's HSDP accumulation idiom (set_requires_all_reduce(False) but on the last of two
    micro-batches): FSDP2 calls the all-reduce hook after every reduce-scatter, and the hook holds
    the micro-batches' shards and compresses their sum once. The dense codec is FSDP2's own HSDP
    to the bit; the state counts a step per FSDP module and optimizer step, not per micro-batch;
    PowerSGD trains and its replicas agree."""
    out = ddp.run(fsdp_jobs.each, "accumulated", [None, "dense", "powersgd:rank=1"], 4, 2)
    for rank in range(4):
        assert out[rank][None][0] == out[rank]["dense"][0], rank
        assert np.array_equal(out[rank][None][1], out[rank]["dense"][1]), rank
        for spec in ("dense", "powersgd:rank=1"):
            assert out[rank][spec][2]["steps"] == 3 * 4, out[rank][spec][2]
        assert np.isfinite(out[rank]["powersgd:rank=1"][1]).all()
    for shard in (0, 1):
        assert np.array_equal(out[shard]["powersgd:rank=1"][1], out[shard + 2]["powersgd:rank=1"][1]), shard


def test_a_backward_that_raised_leaves_nothing_to_the_next():
    """A backward that raises after a failed round (its end never runs: autograd drops its final
    callbacks) must not leave its failure, nor its queued end, to the next backward: that one
    reduces, and a failure in the one after raises at its end. (Neither FSDP recovers from such a
    backward on this PyTorch; DiLoCo-style callers and later versions may.)"""
    from sketchsgd import fsdp

    class Steps:
        iteration = 0

    backward = fsdp._backward._Backward(Steps(), 0, 1, (None, False))
    plan = {"fail": True, "abort": True, "ran": []}

    def reduce(dense):
        if plan["fail"]:
            raise sketchsgd.NonFiniteError("a NaN")

    def hook(grad):
        plan["ran"].append(backward.run(torch.device("cpu"), reduce))
        if plan["abort"]:
            raise ValueError("the user's error")
        return grad

    def step():
        x = torch.ones(3, requires_grad=True)
        h = x * 2
        h.register_hook(hook)
        h.sum().backward()

    with pytest.raises(ValueError):
        step()
    plan.update(fail=False, abort=False)
    step()  # the failure held from the one before would make this round fail, and nothing raise
    plan.update(fail=True)
    with pytest.raises(sketchsgd.NonFiniteError):
        step()
    assert plan["ran"] == [False, True, False], plan["ran"]


def test_diloco_over_a_sharded_model_refuses_a_group_of_other_shards_and_fails_a_sync_everywhere():
    """DiLoCo over FSDP2 (2 × 2): a process group that holds other shards of the parameters (the
    default group, the shard group) would average unlike shards together, and fully_shard over the
    2-D mesh averages the replicas every step: each refused with ValueError. A NaN in rank 1's
    shard fails that sync with NonFiniteError on all four ranks (replica group 0, whose round
    succeeded, is told by the flag), and no rank's shards change. A rank of shard 1 refuses rank
    0's checkpoint (shard 0's anchor, same shapes)."""
    out = ddp.run(fsdp_jobs.diloco_misuse, "topk:k=200", 3, 2)
    for rank in range(4):
        refused, errors, kept, loaded = out[rank]
        assert [(name, kind) for name, kind, _ in refused] == [
            ("default group", "ValueError"), ("shard group", "ValueError"), ("2-D mesh", "ValueError")], refused
        assert "other shards" in refused[0][2] and "2-D mesh" in refused[2][2], refused
        assert errors[:2] == [None, None] and errors[2][0] == "NonFiniteError", (rank, errors)
        assert ("another replica group" in errors[2][1]) == (rank % 2 == 0), (rank, errors[2])
        assert kept, rank
        if rank % 2:
            assert loaded[1] == "ValueError" and "shard 0" in loaded[2], (rank, loaded)


def test_a_spec_a_module_cannot_take_is_refused_when_the_model_is_registered():
    """A top-k budget past the MLP's 5,803 values is refused by compress_reduce_scatter,
    compress_replicas and compress_fsdp1 on every rank, with a warm-up to come (not at the first
    compressed step): InvalidArgument naming the unit and its share of the spec, before any hook
    is set, so the model trains on with FSDP's own reduction."""
    runs = ddp.run(fsdp_jobs.several, [("refused_unit", ("topk:k=100000", mode, 2, 3))
                                       for mode in ("reduce_scatter", "replicas", "fsdp1")])
    for rank in range(4):
        for (error, message), steps in runs[rank]:
            assert error == "InvalidArgument", (rank, error, message)
            assert "unit" in message and "topk:k=" in message and "exceeds" in message, message
            assert steps == [None, None], (rank, steps)


def test_a_module_with_no_matrix_worth_factoring_goes_whole():
    """PowerSGD at rank 8, whose factors would outweigh the MLP's last layer (10 × 48), sends
    that module whole, as PyTorch's PowerSGD sends such tensors, and factors the others (was:
    the spec refused): under HSDP, full sharding and FSDP1 the loss falls, the shards stay
    finite, and fewer bytes go out than fp32's. On a model where no module is worth factoring
    (6 × 32 and 4 × 6) nothing is compressed: HSDP's replicas are FSDP2's own all-reduce bit for
    bit, and the bytes are fp32's."""
    modes = ("replicas", "reduce_scatter", "fsdp1")
    calls = [("whole_units", (spec, mode, STEPS, False)) for mode in modes for spec in (None, "powersgd:rank=8")]
    calls += [("whole_units", (spec, "replicas", STEPS, True)) for spec in (None, "powersgd:rank=8")]
    runs = ddp.run(fsdp_jobs.several, calls)
    for rank in range(4):
        got = runs[rank]
        for i, mode in enumerate(modes):
            (plain, _, _), (losses, local, stats) = got[2 * i], got[2 * i + 1]
            assert np.isfinite(local).all(), (mode, rank)
            assert losses[0] == plain[0] and np.mean(losses[-3:]) < np.mean(losses[:3]), (mode, rank, losses)
            assert stats["compressed_steps"] > 0 and stats["payload_bytes"] < stats["dense_bytes"], (mode, stats)
        (plain, own, _), (losses, local, stats) = got[-2], got[-1]
        assert losses == plain and np.array_equal(local, own), rank
        assert stats["payload_bytes"] == stats["dense_bytes"], stats


def test_a_nan_in_a_warm_up_step_raises_on_every_rank_too():
    """A NaN on rank 1 in one of the fp32 warm-up backward passes (FSDP's own reduction): under
    full sharding only rank 0's chunk of the mean holds it, under HSDP only replica group {0, 2}
    sees it, yet backward() raises NonFiniteError on all four ranks (the flag goes out after a
    warm-up step), under FSDP2 either way and FSDP1, and no rank's shards turn NaN."""
    runs = ddp.run(fsdp_jobs.several, [("non_finite", ("topk:k=400", 5, 1, mode, 3))
                                       for mode in ("reduce_scatter", "replicas")] +
                   [("fsdp1_non_finite", ("topk:k=400", 5, 1, 3))])
    for rank in range(4):
        for errors, local in runs[rank]:
            assert [e is not None for e in errors] == [False, True, False, False, False], (rank, errors)
            assert errors[1][0] == "NonFiniteError", (rank, errors[1])
            assert np.isfinite(local).all(), rank


def test_one_agreement_names_the_worst_outcome_and_each_error_its_own():
    """sketchsgd._agree: an error's outcome (LayoutError states its own, a NaN is NON_FINITE, a
    refused spec INVALID, any other library error ERROR), and the group's agreement keeps the
    worst (here a group of one: the outcome itself, through the collective)."""
    import torch.distributed as dist
    from sketchsgd import _agree, fsdp
    from sketchsgd._agree import Outcome

    assert _agree.outcome_of(None) == Outcome.OK
    assert _agree.outcome_of(sketchsgd.NonFiniteError("a NaN")) == Outcome.NON_FINITE
    assert _agree.outcome_of(sketchsgd.InvalidArgument("k = 0")) == Outcome.INVALID
    assert _agree.outcome_of(sketchsgd.WireError("truncated")) == Outcome.ERROR
    assert _agree.outcome_of(sketchsgd.Error("other")) == Outcome.ERROR
    assert _agree.outcome_of(fsdp.LayoutError("another layout")) == Outcome.LAYOUT
    assert sorted(Outcome) == [Outcome.OK, Outcome.NON_FINITE, Outcome.ERROR, Outcome.LAYOUT, Outcome.INVALID]
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for o in Outcome:
            assert _agree.agree(o, dist.group.WORLD) == o
    finally:
        dist.destroy_process_group()
