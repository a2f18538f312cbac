"""sketchsgd.torch.DiLoCo: local steps with a compressed pseudo-gradient, 4 gloo ranks."""
import numpy as np

import ddp
import jobs
import sketchsgd

# Each codec's first registered example: every family (summable, gathered), every codec.
SPECS = [c["examples"][0] for c in sketchsgd.codecs()]


def test_every_codec_syncs_replicas_bit_for_bit_and_trains():
    """Models that start different (DiLoCo takes rank 0's), train on different data and sync
    every 4 steps through each codec family (summable and gathered): identical after the last
    sync, the loss falls, and the traffic is at most a quarter of per-step DDP's."""
    everyone = ddp.run(jobs.outer_loops, SPECS, 4, 24)
    for spec in SPECS:
        results = [r[spec] for r in everyone]
        first, last, params, stats = results[0]
        assert last < first, f"{spec}: loss {first:.3f} -> {last:.3f}"
        assert all(r[2] == params for r in results), f"{spec}: replicas differ after a sync"
        assert stats["syncs"] == 6 and stats["inner_steps"] == 24, stats
        assert stats["ratio"] >= 4.0, (spec, stats)
        # No warm-up here: every byte was a sync's.
        assert abs(stats["bytes_per_sync"] * stats["syncs"] - stats["payload_bytes"]) <= 1e-9 * stats["payload_bytes"]


def test_one_step_intervals_with_dense_and_plain_sgd_are_ddp():
    for rank, (outer, ddp_params) in enumerate(ddp.run(jobs.outer_every_step_vs_ddp, 8)):
        np.testing.assert_allclose(outer, ddp_params, rtol=1e-5, atol=1e-6, err_msg=f"rank {rank}")


def test_error_feedback_keeps_what_a_sync_did_not_send():
    """Every interval's pseudo-gradient is the same, so without error feedback top-10 would send
    the same 10 of 100 coordinates forever. With it every coordinate moves, none by more than it
    was given, and what is still owed is bounded by one threshold of the selection (the mean
    interval's sum over k), not growing with the number of syncs."""
    syncs, world = 40, 4
    results = ddp.run(jobs.outer_error_feedback, syncs, world=world)
    assert all(np.array_equal(r, results[0]) for r in results), "replicas differ after a sync"
    ramp = np.linspace(1.0, 0.5, 100, dtype=np.float64)
    given = syncs * 0.02 * np.mean(np.arange(1, world + 1)) * ramp  # the mean pseudo-gradients' sum
    moved = -results[0].astype(np.float64)
    assert (moved > 0).all(), f"coordinates never sent: {np.flatnonzero(moved <= 0).tolist()}"
    owed = given - moved
    assert (owed > -1e-4).all(), f"sent more than was given: {owed.min()}"
    threshold = 0.02 * np.mean(np.arange(1, world + 1)) * ramp.sum() / 10
    assert owed.max() <= 2 * threshold, (owed.max(), threshold)


def test_a_checkpoint_per_rank_resumes_identically_mid_interval(tmp_path):
    """Adam inside, syncs every 3 steps, the checkpoint at step 4 (between syncs, models and
    Adam's moments differ per rank): each rank's file restores it bit for bit."""
    specs = ["topk:k=300", "powersgd:rank=2", "dense"]
    for r, results in enumerate(ddp.run(jobs.each, "outer_resume", specs, 4, 5, str(tmp_path), True)):
        for spec in specs:
            straight, resumed = results[spec]
            assert straight == resumed, f"{spec}: rank {r}"


def test_rank_0s_checkpoint_after_a_sync_resumes_every_rank_identically(tmp_path):
    """Plain SGD inside, the checkpoint right after a sync (step 6): rank 0's file, with every
    rank's error feedback gathered into it, restores every rank."""
    specs = ["topk:k=300", "powersgd:rank=2"]
    for r, results in enumerate(ddp.run(jobs.each, "outer_resume", specs, 6, 5, str(tmp_path), False)):
        for spec in specs:
            straight, resumed = results[spec]
            assert straight == resumed, f"{spec}: rank {r}"


def test_a_nan_on_one_rank_stops_the_sync_on_every_rank_without_a_hang():
    specs = ["powersgd:rank=2", "topk:k=300", "dense"]
    everyone = ddp.run(jobs.each, "outer_non_finite", specs, world=3, timeout=150)
    for spec in specs:
        results = [r[spec] for r in everyone]
        for rank, (raised, kept, _) in enumerate(results):
            assert raised is not None, (spec, rank)
            assert kept, f"{spec}: rank {rank}'s anchor changed"
        assert all(r[2] == results[0][2] for r in results), f"{spec}: replicas differ after the next sync"


def test_bad_arguments_are_refused():
    got = ddp.run(jobs.outer_bad_arguments, world=2)[0]
    assert got == {"every=0": "ValueError", "warmup=-1": "ValueError", "every=2.5": "ValueError",
                   "no module": "TypeError", "no parameters": "ValueError", "float64": "TypeError",
                   "outer not an optimizer": "TypeError", "bad spec": "InvalidArgument",
                   "foreign state_dict": "ValueError", "truncated state_dict": "ValueError",
                   "anchor_device=nowhere": "ValueError"}, got


def test_average_is_the_mean_through_the_codec_and_refuses_bad_tensors():
    """sketchsgd.torch.average(), DiLoCo's entry: the dense mean of each tensor as float32 of its
    shape (a float16 one widened), the same on every rank; top-k with error feedback sends what a
    call left over in the next ones; bad arguments are refused with a clear error."""
    results = ddp.run(jobs.averaged)
    for errors, dense, outs, stats in results:
        assert len(errors) == 3 and all("average()" in e for e in errors), errors
        for call in dense:
            np.testing.assert_array_equal(call[0], np.full((4, 3), 1.5, dtype=np.float32))  # mean of 0..3
            np.testing.assert_array_equal(call[1], np.arange(5, dtype=np.float32) * 2.5)
            assert call[0].dtype == np.float32 and call[1].dtype == np.float32
        # 24 equal values, k=2 a call: each call sends 2 coordinates (the mean 2.5 plus what
        # earlier calls owed there), and the ones sent are zeroed in the error: after 3 calls 6
        # coordinates have moved.
        assert all(np.count_nonzero(o) == 2 for o in outs), outs
        assert np.count_nonzero(sum(outs)) == 6
        assert stats["compressed_steps"] == 3 and stats["ratio"] > 1
    assert all(np.array_equal(r[2][-1], results[0][2][-1]) for r in results)
