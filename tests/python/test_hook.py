"""compression_hook under DDP: 4 gloo ranks on 127.0.0.1 (CPU), GPU variants where CUDA is."""

import numpy as np
import pytest
import torch

import ddp
import jobs
import sketchsgd



def _budgeted(spec, budgets={"k": 300, "cols": 1500}):
    """spec with its codec's budget options (k, cols) that it leaves automatic (1 % of the model)
    set for jobs.model()'s 7,104 compressed values, so that 40 steps train."""
    name, _, given = spec.partition(":")
    keys = {o["key"] for c in sketchsgd.codecs() if c["name"] == name for o in c["options"] if o["budget"]}
    extra = [f"{k}={v}" for k, v in budgets.items() if k in keys and f"{k}=" not in given]
    return spec if not extra else spec + ("," if given else ":") + ",".join(extra)


# Every codec's registered examples (the hook gives powersgd its layout), and wire formats that
# only a collective exercises.
SPECS = [_budgeted(spec) for c in sketchsgd.codecs() for spec in c["examples"]] + [
    "powersgd:rank=2,wire=bf16",  # gloo sums bfloat16 from PyTorch 2 on
    "powersgd:rank=2,wire=int8", "dense:wire=int8",  # scales agreed by a max, integers summed
]


def test_a_blocking_call_runs_every_task_and_raises_the_first_error():
    """Scheduler.now (FSDP's calls, average(), DDP's last bucket on the CPU): a task whose phase
    or finish fails leaves the later tasks to run (every rank issues their collectives alike),
    and the first error is raised once all have run."""
    from sketchsgd._schedule import Scheduler, Task
    ran = []

    class Comm:  # each phase's collectives, completed at once
        def issue(self, requests):
            done = torch.futures.Future()
            done.set_result(None)
            return done, lambda: ran.append(("settled", requests[0])), None

    def phase(name, error=None):
        def run():
            ran.append(name)
            if error is not None:
                raise error
            return [name]
        return run

    def finish(name, error=None):
        def run():
            if error is not None:
                raise error
            ran.append(name)
        return run

    tasks = [Task(0, [phase("a1", ValueError("first"))], finish("a done")),
             Task(1, [phase("b1"), phase("b2")], finish("b done")),
             Task(2, [phase("c1")], finish("c done", KeyError("second")))]
    with pytest.raises(ValueError, match="first"):
        Scheduler(Comm()).now(tasks)
    assert ran == ["a1", "b1", ("settled", "b1"), "b2", ("settled", "b2"), "b done", "c1", ("settled", "c1")]
    ran.clear()
    Scheduler(Comm()).now(tasks[1:2])
    assert ran[-1] == "b done"


def test_every_codec_trains_and_every_rank_ends_identical():
    """Two buckets per model (bucket_cap_mb=0.002): the loss falls and all ranks hold the
    same parameters, bit for bit, for every codec."""
    results = ddp.run(jobs.every_codec, SPECS, 40)
    for spec in SPECS:
        first, last, params, stats, buckets = results[0][spec]
        assert buckets >= 2, spec
        assert last < first - 0.05, f"{spec}: loss {first:.3f} -> {last:.3f}"
        for r in range(1, 4):
            assert results[r][spec][2] == params, f"{spec}: rank {r} differs from rank 0"
        assert stats["compressed_steps"] == 38 and stats["steps"] == 40
        if not spec.startswith("dense"):
            assert stats["last_ratio"] > 1.3, f"{spec}: {stats}"


def test_a_bucket_with_no_matrix_worth_factoring_goes_whole():
    """PowerSGD at rank 8 on two buckets: the last layer's (its 10 × 96 weight's factors would outweigh
    it), so that bucket goes whole (fp32, as PyTorch's PowerSGD sends such tensors; it was refused),
    while the 96 × 64 weight is factored. The loss falls, the ranks agree bit for bit, and fewer
    bytes go out than fp32's."""
    results = ddp.run(jobs.every_codec, ["powersgd:rank=8"], 40)
    first, last, params, stats, buckets = results[0]["powersgd:rank=8"]
    assert buckets == 2 and last < first - 0.05, (buckets, first, last)
    assert all(results[r]["powersgd:rank=8"][2] == params for r in range(1, 4))
    assert stats["compressed_steps"] == 38 and stats["payload_bytes"] < stats["dense_bytes"], stats


def _expected(spec, per_rank, start_iter=2):
    """The same rounds through the C++ codecs and aggregator, message by message."""
    W = len(per_rank)
    per_rank = [[tuple(torch.from_numpy(a) for a in step) for step in rank] for rank in per_rank]
    dim = per_rank[0][0][0].numel()
    codecs = [sketchsgd.Compressor(spec, dim) for _ in range(W)]
    agg = codecs[0].make_aggregator(W)
    inv = (torch.tensor(1.0) / W).item()
    out = []
    for i in range(len(per_rank[0])):
        rnd = start_iter + i
        for r in range(W):
            agg.add(codecs[r].encode(per_rank[r][i][0].reshape(-1).contiguous(), rnd, r))
        update = agg.finish()
        if agg.expecting == "answer":
            for r in range(W):
                agg.add(codecs[r].answer(update, r))
            update = agg.finish()
        steps = [c.apply(update) for c in codecs]
        bias = sum(per_rank[r][i][1] for r in range(W)) * inv
        out.append([torch.cat([s, bias]) for s in steps])
    return out


def test_hook_equals_the_cpp_aggregator_on_the_same_inputs():
    # Summed payloads equal the messages' sum bit for bit where no rounding depends on the order
    # (quarter integers, no momentum); gathered codecs' messages are the same bytes on every rank.
    # reduce=sparse keeps at most k of the aggregator's union (test_simulate.py and round_test.cpp
    # hold it against the all-gather): not the aggregator's update.
    gathered = [s for s in sketchsgd.example_specs()
                if sketchsgd.Compressor(s, 1920).sum_size() == 0 and "reduce=sparse" not in s]
    specs = ["dense", "sketch:rows=3,cols=300,k=60,momentum=0", "sketch:rows=3,cols=300,k=60,p2=2,momentum=0",
             "sketch:rows=1,cols=500,k=60,fetch=1"] + gathered
    results = ddp.run(jobs.hook_rounds, specs, 3)
    for spec in specs:
        per_rank = [results[r][spec] for r in range(4)]
        expected = _expected(spec, per_rank)
        for i, want in enumerate(expected):
            for r in range(4):
                got = torch.from_numpy(per_rank[r][i][2])
                assert torch.equal(got, want[r]), f"{spec}: round {i}, rank {r}"


def test_an_error_while_finishing_arrives_through_the_future():
    """The last bucket of a step finishes on the calling thread (no callback), any other in
    gloo's callback: either way the hook returns a future and the error comes out of wait()."""
    specs = ["powersgd:rank=2", "sketch:rows=1,cols=500,k=60,fetch=1", "topk:k=60"]
    for rank, outcomes in enumerate(ddp.run(jobs.finish_errors, specs, world=2)):
        assert len(outcomes) == 2 * len(specs)
        for spec, last, raised, message, here in outcomes:
            assert raised is None, (rank, spec, last, raised)
            assert message is not None and "finish failed on purpose" in message, (rank, spec, last, message)
            if last:
                assert here, (rank, spec)  # the last bucket: finished on the hook's own thread


def test_a_non_finite_gradient_on_one_rank_raises_on_every_rank_and_hangs_none():
    """A NaN in one rank's gradient: that rank's hook raises NonFiniteError, every other rank's
    raises too (told through the collective it issues anyway: none waits for a rank that
    stopped), and the next step goes on alike on every rank."""
    specs = ["powersgd:rank=2", "sketch:rows=1,cols=500,k=60,fetch=1", "topk:k=60", "dense", "powersgd:rank=2,wire=int8"]
    for rank, outcomes in enumerate(ddp.run(jobs.non_finite_on_one_rank, specs, world=3, timeout=90)):
        assert len(outcomes) == len(specs)
        for spec, raised, message, kind, same in outcomes:
            assert raised is None, (rank, spec, raised)
            assert message is not None, (rank, spec)
            # Raised by the call, or through the future (torch re-raises a callback's error as a
            # RuntimeError that names it).
            assert kind == "NonFiniteError" or (kind == "RuntimeError" and "NonFiniteError" in message), \
                (rank, spec, kind, message)
            if rank == 1:
                assert "coordinate 127" in message, (rank, spec, message)
            else:  # gathered codecs know which rank; summed ones that one did
                assert "rank 1" in message or "another rank" in message, (rank, spec, message)
            assert same, (rank, spec)


def test_powersgd_hook_equals_the_cpp_codec_given_the_bucket_as_layout():
    """A layout codec gets the whole bucket (weight and bias) with its shapes. All-reduces sum in
    another order than the aggregator, so the match is to rounding (fp16 on the wire: to fp16's)."""
    specs = ["powersgd:rank=2", "powersgd:rank=3,wire=fp16"]
    results = ddp.run(jobs.hook_rounds, specs, 3)
    for spec in specs:
        per_rank = [[tuple(torch.from_numpy(a) for a in step) for step in results[r][spec]] for r in range(4)]
        codecs = [sketchsgd.Compressor(spec, layout=[(48, 40), (40,)]) for _ in range(4)]
        assert codecs[0].two_rounds
        agg = codecs[0].make_aggregator(4)
        for i in range(3):
            for r in range(4):
                agg.add(codecs[r].encode(torch.cat([per_rank[r][i][0].reshape(-1), per_rank[r][i][1]]), 2 + i, r))
            query = agg.finish()
            for r in range(4):
                agg.add(codecs[r].answer(query, r))
            update = agg.finish()
            for r in range(4):
                want = codecs[r].apply(update)
                got = per_rank[r][i][2]
                assert torch.equal(got, per_rank[0][i][2]), f"{spec}: ranks differ"
                rel = ((got - want).norm() / want.norm()).item()
                assert rel < (2e-2 if "fp16" in spec else 1e-4), f"{spec}: round {i}, rank {r}: {rel}"


def test_state_dict_round_trip_resumes_identically():
    specs = ["sketch:rows=3,cols=1500,k=300,p2=2", "topk:k=400,momentum=0.9", "sketch:rows=1,cols=3000,k=400,fetch=1",
             "powersgd:rank=2"]
    for results in ddp.run(jobs.each, "resume", specs, 5, 4):
        for spec, (straight, resumed, iteration) in results.items():
            assert straight == resumed, spec
            assert iteration == 9


def test_a_pickled_state_resumes_identically():
    """torch.save(state) / torch.load of the CompressionState itself (process group dropped, the
    default one bound on load), each rank its own: the run continues bit for bit."""
    specs = ["sketch:rows=1,cols=2000,k=400,fetch=1", "powersgd:rank=2"]
    for r, results in enumerate(ddp.run(jobs.each, "pickled", specs, 4, 4)):
        for spec, (straight, resumed) in results.items():
            assert straight == resumed, f"{spec}: rank {r}"


def test_a_checkpoint_written_by_rank_0_alone_restores_every_rank(tmp_path):
    """Accelerate's register_for_checkpointing and Lightning: state_dict() on every rank (rank
    0's holds each rank's error feedback and momentum), rank 0 writes,
    every rank loads that file: the job continues bit for bit as the uninterrupted one, also for
    codecs whose worker state differs between ranks."""
    specs = ["topk:k=400,momentum=0.9", "powersgd:rank=2", "sketch:rows=3,cols=1500,k=300,p2=2",
             "sketch:rows=1,cols=2000,k=400,fetch=1"]
    # One file, written and read by each spec's job in turn.
    for r, results in enumerate(ddp.run(jobs.each, "rank0_checkpoint", specs, 4, 4, str(tmp_path / "state.pt"))):
        for spec, (straight, resumed, held, _) in results.items():
            assert held == [0, 1, 2, 3], f"{spec}: rank 0's file holds the worker state of ranks {held}"
            assert straight == resumed, f"{spec}: rank {r} resumed differently"


def test_pytorchs_tutorial_save_from_rank_0_alone_restores_every_rank(tmp_path):
    """`if rank == 0: torch.save({..., "hook": state.state_dict()})` then dist.barrier(), as
    PyTorch's DDP tutorial saves: no collective, so no hang; the other ranks hand their worker
    state over from the barrier, and the file restores every rank bit for bit."""
    specs = ["topk:k=400,momentum=0.9", "powersgd:rank=2", "sketch:rows=3,cols=1500,k=300,p2=2"]
    everyone = ddp.run(jobs.each, "rank0_checkpoint", specs, 4, 3, str(tmp_path / "state.pt"), True, world=3)
    for spec in specs:
        assert everyone[0][spec][3] < 10, f"{spec}: rank 0's save took {everyone[0][spec][3]:.1f} s"
        for r, results in enumerate(everyone):
            straight, resumed, held, _ = results[spec]
            assert held == [0, 1, 2], f"{spec}: the file holds the worker state of ranks {held}"
            assert straight == resumed, f"{spec}: rank {r} resumed differently"


def test_a_save_after_the_others_began_the_next_step_is_refused_at_once():
    """Without the barrier the other ranks start the next step, which changes their worker
    state: rank 0's state_dict() raises ProtocolError within seconds, saying what to do, and the
    job goes on."""
    name, message, took = ddp.run(jobs.save_after_others_moved_on, "topk:k=400,momentum=0.9", 4, world=3)[0]
    assert name == "ProtocolError" and "has begun step" in message and "barrier" in message, (name, message)
    assert took < 10, took


def test_another_ranks_worker_state_is_refused():
    """Rank 0's own state_dict (gather=False) loaded on every rank: the others refuse it (their
    error feedback is not rank 0's) and say which to load; the gathered one loads everywhere."""
    spec = "topk:k=400,momentum=0.9"
    both = ddp.run(jobs.several, [("rank0_state_everywhere", (spec, 4, False)),
                                  ("rank0_state_everywhere", (spec, 4, True))])
    results, gathered = [r[0] for r in both], [r[1] for r in both]
    assert results[0] == ("loaded", "", True)
    for name, message, unchanged in results[1:]:
        assert name == "ConfigMismatch" and "rank 0 only" in message and "gathered" in message, message
        assert unchanged
    assert all(r == ("loaded", "", True) for r in gathered), gathered


def test_a_state_made_before_the_process_group_binds_at_the_first_hook_call():
    """Lightning's DDPStrategy(ddp_comm_state=...) holds the state before the process group
    exists: it binds at the first hook call and trains as one made after, bit for bit."""
    specs = ["powersgd:rank=2", "topk:k=400,momentum=0.9"]
    for r, results in enumerate(ddp.run(jobs.state_before_the_process_group, specs, 4, init=False)):
        for spec in specs:
            unbound, rank, same = results[spec]
            assert unbound and rank == r and same, (spec, r, unbound, rank, same)


def test_a_configuration_that_differs_is_refused_at_the_first_hook_call_on_every_rank():
    for message in ddp.run(jobs.first_hook_checks_ranks, 1, world=3, init=False, timeout=90):
        assert message is not None and "differs from ranks" in message, message


def test_join_with_uneven_inputs_ends_with_every_rank_identical():
    """Ranks with fewer batches join early and shadow the others' collectives: no rank hangs,
    gathered and summable codecs alike, and every rank ends with the same parameters."""
    specs = ["powersgd:rank=2", "topk:k=400,momentum=0.9", "sketch:rows=1,cols=2000,k=400,fetch=1"]
    both = ddp.run(jobs.several, [("each", ("uneven_inputs", specs, 6, coalesce)) for coalesce in (False, True)],
                   timeout=240)
    for coalesce in (0, 1):
        results = [r[coalesce] for r in both]
        for spec in specs:
            assert all(r[spec] == results[0][spec] for r in results), (spec, coalesce)


def test_unused_parameters_train_finite_and_identical():
    """find_unused_parameters=True, a head used every other step (PyTorch's PowerSGD turns such
    parameters to NaN): finite losses and parameters, every rank identical."""
    specs = ["powersgd:rank=2", "topk:k=400,momentum=0.9"]
    both = ddp.run(jobs.several, [("each", ("unused_parameters", specs, 16, coalesce)) for coalesce in (False, True)])
    for coalesce in (0, 1):
        for spec in specs:
            results = [r[coalesce][spec] for r in both]
            assert all(finite for _, finite in results), (spec, coalesce)
            assert all(params == results[0][0] for params, _ in results), (spec, coalesce)


def test_no_sync_accumulates_like_one_big_batch():
    both = ddp.run(jobs.several, [("no_sync", ("dense", 5)), ("big_batch", (5,))])
    with_hook, plain = [r[0] for r in both], [r[1] for r in both]
    for (params, iteration), reference in zip(with_hook, plain):
        assert iteration == 5  # the hook fires once per synchronised step
        assert params == with_hook[0][0]
        np.testing.assert_allclose(np.frombuffer(params, np.float32), np.frombuffer(reference, np.float32),
                                   rtol=1e-5, atol=1e-6)


def test_a_float64_bucket_is_refused_on_every_rank():
    with pytest.raises(ddp.RankErrors) as e:
        ddp.run(jobs.low_precision, "sketch:k=100", "float64", timeout=120)
    assert sorted(e.value.errors) == [0, 1, 2, 3]
    for name, message, _ in e.value.errors.values():
        assert "float64" in message and "float32" in message, message


HALF_SPECS = ["dense", "sketch:rows=3,cols=300,k=60,p2=2", "powersgd:rank=2,wire=fp16", "topk:k=60,momentum=0.9"]


def _check_half(results, dtype, steps):
    half = getattr(torch, dtype)
    for spec in HALF_SPECS:
        for r in range(len(results)):
            assert len(results[r][spec]) == steps
            for i, (wide, is_half, narrow) in enumerate(results[r][spec]):
                want = torch.from_numpy(np.frombuffer(wide, np.float32).copy()).to(half).float()
                got = torch.from_numpy(np.frombuffer(narrow, np.float32).copy())
                assert is_half and torch.equal(got, want), f"{spec} {dtype}: rank {r}, step {i}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_buckets_average_as_float32_ones(dtype):
    """A model in float16 or bfloat16: the bucket is widened, compressed and averaged as a
    float32 one, and the result rounded back into it (warm-up steps and compressed ones)."""
    _check_half(ddp.run(jobs.half_buckets, HALF_SPECS, dtype), dtype, 4)


def test_a_spec_that_differs_between_ranks_is_refused_on_every_rank():
    specs = ["topk:k=10", "topk:k=10", "topk:k=11", "topk:k=10"]
    with pytest.raises(ddp.RankErrors) as e:
        ddp.run(jobs.spec_per_rank, specs, timeout=120)
    assert sorted(e.value.errors) == [0, 1, 2, 3]
    for name, message, _ in e.value.errors.values():
        assert name == "ValueError" and "same spec" in message


def test_bad_states_are_refused_before_training():
    with pytest.raises(ddp.RankErrors) as e:
        ddp.run(jobs.spec_per_rank, ["nosuchcodec"] * 4, timeout=120)
    assert all(name == "InvalidArgument" for name, _, _ in e.value.errors.values())


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_a_coalesce_that_is_not_a_bool_is_refused(bad):
    from sketchsgd.torch import CompressionState
    with pytest.raises(TypeError, match="coalesce"):
        CompressionState("powersgd:rank=2", coalesce=bad)


@pytest.mark.parametrize("spec,option", [("powersgd:rank=2,layout=10x10", "layout="),
                                         ("powersgd:rank=2,blocks=2", "blocks=")])
def test_what_the_hook_gives_the_codec_is_refused_in_a_spec(spec, option):
    """The layout and FSDP's row blocks come from the model, never from the spec."""
    from sketchsgd.torch import CompressionState
    with pytest.raises(ValueError, match=f"leave {option}"):
        CompressionState(spec)
    CompressionState("powersgd:rank=2,blocks=1")  # the default, as a canonical spec writes it


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or not sketchsgd.cuda_build,
                               reason="no CUDA device (or a build without CUDA)")


@needs_gpu
def test_gloo_with_cuda_tensors_on_one_gpu():
    specs = ["dense", "sketch:rows=1,cols=2000,k=400", "sketch:rows=3,cols=1500,k=300,p2=2", "topk:k=400", "signsgd:ef=1",
             "powersgd:rank=2", "powersgd:rank=2,wire=fp16", "topk:k=400,wire=fp16,index=delta",
             "sketch:rows=1,cols=2000,k=400,fetch=1,wire=fp16"]
    results = ddp.run(jobs.every_codec, specs, 30, "cuda:0", world=2)
    for spec in specs:
        first, last, params, _, _ = results[0][spec]
        assert last < first and results[1][spec][2] == params, spec


@pytest.mark.parametrize("wrap", ["fp16"])
def test_our_hook_inside_pytorchs_compress_wrappers(wrap):
    """fp16_compress_wrapper casts each bucket to float16 before our hook and back after: the
    model trains as it does without the wrapper (to the gradients' rounding), and every rank
    ends identical. (DDP refuses bf16_compress_wrapper without CUDA and NCCL.)"""
    specs = ["sketch:rows=1,cols=2000,k=400", "powersgd:rank=2"]
    both = ddp.run(jobs.several, [("under_fp16_wrapper", (specs, 30, wrap)), ("under_fp16_wrapper", (specs, 30, None))])
    wrapped, plain = [r[0] for r in both], [r[1] for r in both]
    for spec in specs:
        first, last, params = wrapped[0][spec]
        assert last < first - 0.04, f"{spec}: loss {first:.3f} -> {last:.3f}"
        assert abs(last - plain[0][spec][1]) < 0.01, f"{spec}: {last:.4f} wrapped, {plain[0][spec][1]:.4f} not"
        assert all(wrapped[r][spec][2] == params for r in range(1, 4)), spec


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_buckets_on_cuda(dtype):
    _check_half(ddp.run(jobs.half_buckets, HALF_SPECS, dtype, 4, "cuda:0", world=2), dtype, 4)


@pytest.mark.skipif(torch.cuda.device_count() < 2 or not sketchsgd.cuda_build, reason="NCCL needs two GPUs")
def test_nccl_on_two_gpus():
    specs = ["sketch:rows=1,cols=2000,k=400", "topk:k=400"]
    results = ddp.run(jobs.every_codec_on_own_gpu, specs, 30, world=2, backend="nccl")
    for spec in specs:
        assert results[1][spec][2] == results[0][spec][2], spec


OVERLAPPED = ["powersgd:rank=2", "sketch:rows=3,cols=500,k=100,p2=2", "topk:k=200,momentum=0.9",
              "powersgd:rank=2,wire=int8"]


def test_many_buckets_end_bit_identical_to_finishing_each_bucket_in_its_call():
    """About a bucket per layer: with later collectives issued from callbacks (the default) the
    model ends bit for bit where finishing every bucket inside its hook call takes it, on every
    rank, for two-round, gathered and one-round codecs."""
    specs = OVERLAPPED + ["signsgd:ef=1", "dense", "sketch:rows=1,cols=800,k=100,fetch=1"]
    both = ddp.run(jobs.several, [("many_buckets", (specs, 8, "overlap")), ("many_buckets", (specs, 8, "blocking"))])
    overlapped, blocking = [r[0] for r in both], [r[1] for r in both]
    for spec in specs:
        params, units, _ = overlapped[0][spec]
        assert units >= 4, (spec, units)
        for r in range(4):
            assert overlapped[r][spec][0] == params, f"{spec}: rank {r} differs from rank 0"
            assert blocking[r][spec][0] == params, f"{spec}: rank {r}: blocking run differs"


def test_the_hook_returns_before_its_first_collective_completes(tmp_path):
    """Rank 1 calls the hook for a step's first bucket only after rank 0's call returned: the
    hook hands the bucket's second phase (powersgd's Q, sketch p2's answers, a gathered codec's
    messages after their lengths) to the first collective's callback instead of waiting for it.
    The outputs equal those of a state that finishes every bucket in its call, bit for bit.
    int8 sums too: their integers wait for their scales' max all-reduce in a callback."""
    specs = OVERLAPPED
    results = ddp.run(jobs.returns_before_its_collectives_complete, specs, str(tmp_path / "store"),
                      world=2, timeout=150)
    for spec in specs:
        overlapped, blocking = results[0][spec]
        assert len(overlapped) == 5
        assert overlapped == blocking, spec
        assert results[1][spec][0] == overlapped, f"{spec}: the ranks differ"


# Collectives a coalesced step of deep_model() issues (5 units: 10-15 when each issues its own):
# one a phase for summable codecs (int8: the scales' max, then the integers, the factors' and
# the biases' laid end to end); a gathered codec's lengths, then its messages beside the
# all-reduce of the biases (sent whole).
COALESCED = {"powersgd:rank=2": 2, "powersgd:rank=2,wire=int8": 4, "dense:wire=int8": 2, "sketch:rows=3,cols=500,k=100,p2=2": 2, "dense": 1,
             "sketch:rows=1,cols=800,k=100,fetch=1": 1, "topk:k=200,momentum=0.9": 3, "signsgd:ef=1": 3}


def test_a_coalesced_step_issues_one_collective_a_phase_and_ends_where_the_overlapped_one_does():
    """coalesce=True with about a bucket per layer: the step issues the collectives of one bucket
    instead of each unit's, and with 2 ranks (a sum of two is the same in either order) the
    model ends bit for bit where the overlapped hook takes it, on both ranks."""
    overlapped = ddp.run(jobs.many_buckets, list(COALESCED), 6, "overlap", world=2)
    coalesced = ddp.run(jobs.many_buckets, list(COALESCED), 6, "coalesce", world=2)
    for spec, collectives in COALESCED.items():
        params, units, per_unit = overlapped[0][spec]
        assert units >= 4, (spec, units)
        assert per_unit >= units, (spec, per_unit)
        for r in range(2):
            assert coalesced[r][spec][0] == params, f"{spec}: rank {r} differs from the overlapped run"
            assert coalesced[r][spec][2] == collectives, (spec, coalesced[r][spec][2])


@pytest.mark.parametrize("coalesce", [False, True])
def test_a_non_finite_gradient_in_an_early_bucket_reaches_every_rank(coalesce):
    """A NaN in rank 1's first bucket (its second phase runs in a callback, or with the step's
    other units at its last bucket): that bucket's future raises NonFiniteError on every rank,
    the step's last bucket still completes, no rank hangs, and the next step ends identical
    everywhere."""
    specs = OVERLAPPED + ["sketch:rows=1,cols=500,k=60,fetch=1", "dense"]
    for rank, outcomes in enumerate(ddp.run(jobs.non_finite_in_an_early_bucket, specs, "cpu", coalesce, world=3,
                                            timeout=120)):
        assert len(outcomes) == len(specs)
        for spec, errors, last_done, same in outcomes:
            assert len(errors) == 1 and "NonFiniteError" in errors[0], (rank, spec, errors)
            assert last_done, (rank, spec)
            assert same, (rank, spec)


@needs_gpu
def test_many_buckets_on_cuda_overlap_as_finishing_each_bucket_in_its_call():
    """gloo with CUDA tensors, two ranks on one GPU: later phases are issued from callbacks whose
    streams differ from the autograd thread's, so a missing stream wait would show as ranks that
    drift apart or a model that moves away from the blocking run. The ranks agree bit for bit;
    overlapped and blocking runs agree to rounding (the sketch's GPU table sums with float
    atomics, so its last bits vary from run to run), the deterministic codecs bit for bit."""
    specs = OVERLAPPED + ["dense", "sketch:rows=1,cols=800,k=100,fetch=1"]
    overlapped = ddp.run(jobs.many_buckets, specs, 8, "overlap", "cuda:0", world=2)
    blocking = ddp.run(jobs.many_buckets, specs, 8, "blocking", "cuda:0", world=2)
    for spec in specs:
        params, units, _ = overlapped[0][spec]
        assert units >= 4, (spec, units)
        assert overlapped[1][spec][0] == params and blocking[1][spec][0] == blocking[0][spec][0], spec
        a, b = (torch.frombuffer(bytearray(run[0][spec][0]), dtype=torch.float32) for run in (overlapped, blocking))
        assert torch.isfinite(a).all(), spec
        if spec.startswith("sketch"):
            assert (a - b).norm() <= 1e-4 * b.norm(), spec
        else:
            assert torch.equal(a, b), spec


@needs_gpu
def test_a_coalesced_step_on_cuda_ends_where_the_overlapped_one_does():
    """coalesce=True with CUDA buckets over gloo, two ranks on one GPU: the phases run on the
    autograd thread at the last bucket; the ranks agree bit for bit, and the model agrees with
    the overlapped hook's (to rounding for the sketch, whose GPU table sums with float atomics)."""
    overlapped = ddp.run(jobs.many_buckets, list(COALESCED), 6, "overlap", "cuda:0", world=2)
    coalesced = ddp.run(jobs.many_buckets, list(COALESCED), 6, "coalesce", "cuda:0", world=2)
    for spec, collectives in COALESCED.items():
        assert coalesced[1][spec][0] == coalesced[0][spec][0], spec
        assert coalesced[0][spec][2] == collectives, (spec, coalesced[0][spec][2])
        a, b = (torch.frombuffer(bytearray(run[0][spec][0]), dtype=torch.float32) for run in (coalesced, overlapped))
        assert torch.isfinite(a).all(), spec
        if spec.startswith("sketch"):
            assert (a - b).norm() <= 1e-4 * b.norm(), spec
        else:
            assert torch.equal(a, b), spec


@needs_gpu
def test_the_hook_returns_before_its_first_collective_completes_on_cuda(tmp_path):
    """The FileStore handshake with CUDA buckets (quarter integers: every sum exact, so the GPU's
    summation order does not matter and the runs agree bit for bit)."""
    results = ddp.run(jobs.returns_before_its_collectives_complete, OVERLAPPED, str(tmp_path / "store"), "cuda:0",
                      world=2, timeout=150)
    for spec in OVERLAPPED:
        overlapped, blocking = results[0][spec]
        assert overlapped == blocking, spec
        assert results[1][spec][0] == overlapped, f"{spec}: the ranks differ"


@needs_gpu
def test_a_non_finite_gradient_in_an_early_cuda_bucket_reaches_every_rank():
    specs = OVERLAPPED + ["dense"]
    for rank, outcomes in enumerate(ddp.run(jobs.non_finite_in_an_early_bucket, specs, "cuda:0", world=3,
                                            timeout=120)):
        for spec, errors, last_done, same in outcomes:
            assert len(errors) == 1 and "NonFiniteError" in errors[0], (rank, spec, errors)
            assert last_done and same, (rank, spec)
