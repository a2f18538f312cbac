"""sketchsgd.simulate: W workers as threads of one process, their codecs' rounds meeting in memory,
against the same jobs on W gloo processes."""
import threading

import numpy as np
import pytest
import torch

import ddp
import jobs
import sketchsgd
from sketchsgd import NonFiniteError
from sketchsgd.simulate import LocalGroup
from sketchsgd import _int8
from sketchsgd.torch import CompressionState, average

# Each codec's first registered example: every family (summable, gathered), every codec.
SPECS = [c["examples"][0] for c in sketchsgd.codecs()]


def test_diloco_on_a_simulated_group_is_the_gloo_job():
    """DiLoCo with every codec, 4 workers, 24 steps, syncs every 4: the simulated group's
    replicas agree, and their bytes, losses and parameters are the gloo job's (to float32's
    summation order: gloo's all-reduce adds the ranks in an order of its own, where the
    simulated group adds them in rank order)."""
    procs = ddp.run(jobs.outer_loops, SPECS, 4, 24)
    sim = LocalGroup(4).run(lambda r: jobs.outer_loops(r.rank, 4, SPECS, 4, 24, group=r))
    for spec in SPECS:
        gloo, local = [r[spec] for r in procs], [r[spec] for r in sim]
        assert all(r[2] == local[0][2] for r in local), f"{spec}: simulated replicas differ"
        assert [r[3] for r in local] == [r[3] for r in gloo], f"{spec}: statistics differ"
        a, b = (np.frombuffer(x[0][2], np.float32) for x in (gloo, local))
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=spec)
        np.testing.assert_allclose([r[1] for r in local], [r[1] for r in gloo], rtol=1e-5, err_msg=spec)


def test_average_is_the_mean_in_rank_order_on_every_rank():
    world = 3

    def job(rank):
        state = CompressionState("dense", process_group=rank)
        x = torch.arange(12, dtype=torch.float32).view(3, 4) * (rank.rank + 1) + 0.1
        return average(state, [x, torch.full((5,), float(rank.rank))]), state.stats()
    results = LocalGroup(world).run(job)
    inv = torch.tensor(1.0) / world
    want = (sum(torch.arange(12, dtype=torch.float32).view(3, 4) * (r + 1) + 0.1 for r in range(world))) * inv
    for (m, w), stats in results:
        assert torch.equal(m, want) and torch.equal(w, torch.full((5,), 1.0))
        assert stats["payload_bytes"] == 17 * 4 and stats["steps"] == 1


def test_a_nan_on_one_rank_raises_on_every_rank_and_the_group_goes_on():
    for spec in ["powersgd:rank=2", "topk:k=300", "dense", "sparseloco:chunk=256,k=16"]:
        results = LocalGroup(3).run(lambda r: jobs.outer_non_finite(r.rank, 3, spec, group=r))
        for rank, (raised, kept, _) in enumerate(results):
            assert raised is not None, (spec, rank)
            assert kept, f"{spec}: rank {rank}'s anchor changed"
        assert all(r[2] == results[0][2] for r in results), f"{spec}: replicas differ after the next sync"


def test_once_hands_rank_0s_result_or_its_error_to_every_rank_and_the_group_goes_on():
    calls = []

    def job(r):
        got = r.once(lambda: calls.append(r.rank) or 10 * r.rank + 1)

        def bad():
            raise sketchsgd.WireError(f"rank {r.rank}'s bytes")
        with pytest.raises(sketchsgd.WireError, match="rank 0's bytes") as e:
            r.once(bad)
        return got, e.value, r.once(lambda: r.rank + 7)
    results = LocalGroup(3).run(job)
    assert calls == [0]
    assert [(g, after) for g, _, after in results] == [(1, 7)] * 3
    assert len({id(err) for _, err, _ in results}) == 3  # a copy each: no traceback shared by threads


def test_int8_sums_average_within_their_rounding_on_every_rank_alike():
    """dense:wire=int8 over 4 simulated ranks: every value of the mean within half a unit of its
    group's scale (every rank's largest magnitude there over 127 // 4), the same bits on every
    rank; a byte a value and 4 a group's scale counted; a NaN on one rank raises on every rank."""
    world, n = 4, 1000  # groups of _int8.ROWS values, the last one short
    rows = _int8.ROWS
    assert n % rows, "the last group should be short"

    def values(rank):  # a matrix: a vector would go whole, in float32
        g = torch.Generator().manual_seed(rank)
        return (torch.randn(n, generator=g) * torch.linspace(0.01, 10, n)).view(40, 25)

    def job(rank, nan=False):
        state = CompressionState("dense:wire=int8", process_group=rank)
        x = values(rank.rank)
        if nan and rank.rank == 1:
            x[12, 0] = float("nan")
        try:
            return average(state, [x])[0], state.stats()
        except NonFiniteError as e:
            return e, None
    results = LocalGroup(world).run(job)
    exact = (sum(values(r) for r in range(world)) / world).view(-1)
    largest = torch.stack([values(r).abs() for r in range(world)]).amax(0).view(-1)
    unit = torch.cat([largest[i:i + rows].amax().expand(len(largest[i:i + rows])) for i in range(0, n, rows)]) / (127 // world)
    mean, stats = results[0]
    assert stats["payload_bytes"] == n + 4 * -(-n // rows), stats
    mean = mean.view(-1)
    assert all(torch.equal(m.view(-1), mean) for m, _ in results)
    err = (mean - exact).abs()
    assert (err <= 0.5 * unit * 1.0001 + 1e-6).all(), (err / unit).max()
    assert err.max() > 0  # really rounded
    for raised, _ in LocalGroup(world).run(lambda r: job(r, nan=True)):
        assert isinstance(raised, NonFiniteError), raised


def test_int8_scales_go_by_column():
    """_int8's groups: with a scale per column (PowerSGD's rank) a column 1000 times smaller than
    its neighbour keeps three digits; with one per row run it rounds to nothing. A group too large
    for 8-bit sums is refused."""
    from sketchsgd import _int8
    x = torch.randn(300, 2) * torch.tensor([1.0, 1e-3])
    for columns, worst in ((2, 0.01), (1, None)):
        g = _int8.Groups(x.reshape(-1), columns)
        largest = g.largest()
        assert largest.numel() == _int8.groups(600, columns)
        q = g.quantize(largest, 127, torch.empty(_int8.padded(600, columns), dtype=torch.int8))
        back = torch.empty(600)
        g.dequantize(q, largest, 127, back)
        rel = ((back.view(300, 2)[:, 1] - x[:, 1]).norm() / x[:, 1].norm()).item()
        assert (rel < worst) if worst else rel > 0.5, (columns, rel)
    assert _int8.levels(127) == 1
    with pytest.raises(ValueError, match="127"):
        _int8.levels(128)


def test_a_failing_rank_ends_every_rank_at_once_and_run_raises_its_error():
    group = LocalGroup(4, timeout=120)
    seen = {}

    def job(rank):
        if rank.rank == 2:
            raise KeyError("rank 2's own failure")
        try:
            rank.barrier()
        except RuntimeError as e:
            seen[rank.rank] = str(e)
            raise
    with pytest.raises(KeyError, match="rank 2's own failure"):
        group.run(job)
    assert sorted(seen) == [0, 1, 3] and all("another rank failed" in m for m in seen.values()), seen
    assert group.run(lambda r: r.rank * 2) == [0, 2, 4, 6]  # the group is whole again


def test_a_rank_that_never_comes_times_the_group_out():
    group = LocalGroup(2, timeout=0.5)
    gate = threading.Event()

    def job(rank):
        if rank.rank == 1:
            gate.wait(5)
            return None
        rank.barrier()
    with pytest.raises(RuntimeError, match="did not come within 0.5 s"):
        group.run(job)
    gate.set()


def test_rank_0s_gathered_checkpoint_resumes_every_simulated_rank(tmp_path):
    """Rank 0 alone saves right after a sync (the others wait in the group's barrier, their
    error feedback handed over from their exchange threads); every rank resumes from that file
    bit for bit. Per-rank files mid-interval likewise."""
    for spec, per_rank in [("topk:k=300", False), ("sparseloco:chunk=256,k=16", False), ("powersgd:rank=2", True)]:
        folder = tmp_path / f"{spec.partition(':')[0]}-{per_rank}"
        folder.mkdir()
        before = 4 if per_rank else 6
        results = LocalGroup(3).run(lambda r: jobs.outer_resume(r.rank, 3, spec, before, 5, str(folder), per_rank,
                                                                group=r))
        for r, (straight, resumed) in enumerate(results):
            assert straight == resumed, f"{spec}: rank {r}"


def test_bad_arguments_are_refused():
    for world in [0, -1, 2.0, True, "4"]:
        with pytest.raises(ValueError, match="world="):
            LocalGroup(world)
    for timeout in [0, -1, float("inf"), float("nan"), "5", True]:
        with pytest.raises(ValueError, match="timeout="):
            LocalGroup(2, timeout=timeout)
    group = LocalGroup(2)

    def job(rank):
        out = [torch.empty(3)]
        rank.all_gather(out, torch.zeros(3))
    with pytest.raises(ValueError, match="1 outputs for 2 ranks"):
        group.run(job)
    # A rank's CompressionState whose spec differs from the others': refused on every rank.
    with pytest.raises(ValueError, match="differs from ranks"):
        group.run(lambda r: CompressionState("topk:k=10" if r.rank else "topk:k=20", process_group=r))
    with pytest.raises(NonFiniteError):
        group.run(lambda r: average(CompressionState("topk:k=2", process_group=r),
                                    [torch.full((4, 4), float("nan") if r.rank else 1.0)]))


@pytest.mark.skipif(not torch.cuda.is_available() or not sketchsgd.cuda_build, reason="needs a GPU")
def test_models_on_the_gpu_with_the_anchor_and_a_cpu_only_codec_on_the_host():
    """DiLoCo(anchor_device="cpu"): the model trains on the GPU, the anchor, the outer optimizer
    and sparseloco (a CPU codec) stay on the host; the replicas end identical and train."""
    from sketchsgd.torch import DiLoCo

    def job(rank):
        with rank.lock:
            m = jobs.model(seed=rank.rank).cuda()
        outer = DiLoCo(m, "sparseloco:chunk=256,k=32", every=4, process_group=rank, anchor_device="cpu")
        assert all(a.device.type == "cpu" for a in outer.anchor)
        losses = jobs.local_steps(m, outer, torch.optim.SGD(m.parameters(), lr=0.05), rank.rank, 16, device="cuda")
        return losses, jobs.flat(m).cpu().numpy().tobytes()
    results = LocalGroup(3).run(job)
    assert all(r[1] == results[0][1] for r in results)
    assert all(sum(r[0][-4:]) < sum(r[0][:4]) for r in results)


@pytest.mark.parametrize("world", [1, 3, 4])
def test_link_bytes_follow_each_collective_on_a_ring(world):
    """stats()'s link bytes: an all-reduce's link carries 2(W − 1)/W of what the rank hands it each
    way, an all-gather's W − 1 times the rank's message; the baselines are a ring all-reduce of the
    same values in bf16 and fp32; a group of one moves nothing."""
    n = 64 * 50

    def job(rank, spec):
        state = CompressionState(spec, process_group=rank)
        g = torch.Generator().manual_seed(rank.rank)
        for _ in range(2):
            average(state, [torch.randn(64, 50, generator=g)])
        return state.stats()
    for spec, kind in [("dense", "all_reduce"), ("powersgd:rank=2", "all_reduce"), ("topk:k=100", "all_gather"),
                       ("sketch:rows=1,cols=500,k=50", "all_reduce")]:
        for s in LocalGroup(world).run(lambda r: job(r, spec)):
            ring = 2 * (world - 1) / world
            assert s["world"] == world and s["steps"] == 2, s
            assert s["dense_bytes"] == 2 * n * 4, s
            assert s["bf16_link_bytes"] == round(2 * 2 * ring * n * 2), s
            assert s["fp32_link_bytes"] == round(2 * 2 * ring * n * 4), s
            if world == 1:
                assert s["link_bytes"] == 0 and s["link_ratio_bf16"] == 0.0, s
                continue
            by = s["by_collective"]
            assert kind in by, (spec, by)
            for k, c in by.items():
                per = {"all_reduce": ring, "all_gather": world - 1}[k]
                assert c["sent"] == c["received"] == round(per * c["payload"]), (spec, k, c)
            assert s["link_bytes"] == s["sent_bytes"] + s["received_bytes"], s
            assert s["sent_bytes"] == pytest.approx(sum(c["sent"] for c in by.values()), abs=len(by)), s
            assert s["link_ratio_bf16"] == pytest.approx(s["bf16_link_bytes"] / s["link_bytes"], rel=1e-4), s
            assert s["last_link_bytes"] * 2 == pytest.approx(s["link_bytes"], abs=2), s  # two like steps
            if spec == "dense":  # fp32 on the wire: the fp32 baseline itself
                assert s["link_bytes"] == pytest.approx(s["fp32_link_bytes"], abs=2), s
                assert s["link_ratio_fp32"] == pytest.approx(1.0, rel=1e-4), s


def test_a_gathered_codecs_link_grows_with_the_group_and_a_summed_ones_does_not():
    """The reason the wire's bytes matter: top-k's link bytes per rank grow as W − 1, a sketch's
    stay under twice its payload at any W."""
    def link(world, spec):
        def job(rank):
            state = CompressionState(spec, process_group=rank)
            average(state, [torch.randn(64, 50, generator=torch.Generator().manual_seed(rank.rank))])
            return state.stats()
        return LocalGroup(world).run(job)[0]
    top = [link(w, "topk:k=100") for w in (2, 8)]
    sketch = [link(w, "sketch:rows=1,cols=500,k=50") for w in (2, 8)]
    assert top[1]["link_bytes"] == pytest.approx(7 * top[0]["link_bytes"], rel=1e-6)
    assert sketch[1]["link_bytes"] == pytest.approx(sketch[0]["link_bytes"] * (2 * 7 / 8) / (2 * 1 / 2), rel=1e-6)
    assert sketch[1]["link_bytes"] < 2 * 2 * sketch[1]["payload_bytes"]


def _averages(world, spec, same, steps=3, shape=(100, 200)):
    """average() of each rank's random tensor (the same on every rank where same), steps times:
    every rank's results and stats()."""
    def job(rank):
        state = CompressionState(spec, process_group=rank)
        g = torch.Generator().manual_seed(0 if same else rank.rank)
        return [average(state, [torch.randn(*shape, generator=g)])[0].clone() for _ in range(steps)], state.stats()
    return LocalGroup(world).run(job)


@pytest.mark.parametrize("codec,k", [("topk:k=200", 200), ("topk:k=200,index=delta,wire=fp16", 200),
                                     ("sparseloco:chunk=500,k=10", 20000 // 500 * 10)])
def test_a_sparse_reduce_is_the_all_gather_where_the_lists_coincide_and_keeps_k_where_not(codec, k):
    """reduce=sparse (compress/sparse_reduce.hpp): where every rank sends the same list nothing is
    dropped and each step is the all-gather's bit for bit; where they differ every rank holds the
    same update of at most k values (a rank's budget: sparseloco's k a chunk; the union's
    largest), its link bytes in an all-to-all, two all-reduces of counts and two all-gathers."""
    world = 4
    for same in (True, False):
        gather = _averages(world, codec, same)
        sparse = _averages(world, codec + ",reduce=sparse", same)
        for r in range(world):
            assert all(torch.equal(a, b) for a, b in zip(sparse[0][0], sparse[r][0])), "ranks differ"
        for a, b in zip(gather[0][0], sparse[0][0]):
            if same:
                assert torch.equal(a, b)
            else:
                assert 0 < int((b != 0).sum()) <= k < int((a != 0).sum())
        assert set(sparse[0][1]["by_collective"]) == {"all_to_all", "all_reduce", "all_gather"}
        c = sparse[0][1]["by_collective"]["all_to_all"]
        assert c["sent"] == c["received"] == c["payload"] * (world - 1) / world, c  # equal parts


def test_the_sparse_reduces_link_bytes_do_not_grow_with_the_group():
    """Top-k at 1 % (index=delta, fp16): at W = 64 a rank's link carries at least 8 times less with
    the sparse all-reduce than with the all-gather, and about as much as at W = 16."""
    spec, got = "topk:k=1000,index=delta,wire=fp16", {}
    for world in (16, 64):
        for reduce in ("gather", "sparse"):
            s = _averages(world, f"{spec},reduce={reduce}", False, steps=2, shape=(200, 500))[0][1]
            got[world, reduce] = s["received_bytes"]
    assert got[64, "gather"] >= 8 * got[64, "sparse"], got
    assert got[64, "sparse"] < 1.5 * got[16, "sparse"], got


def test_all_to_all_hands_each_rank_every_ranks_part_for_it():
    def job(rank):
        parts = torch.arange(3 * 2, dtype=torch.int64) + 100 * rank.rank  # two values for each rank
        out = torch.empty(6, dtype=torch.int64)
        rank.all_to_all(out, parts, [2, 2, 2], [2, 2, 2])
        with pytest.raises(ValueError, match="sizes"):
            rank.all_to_all(out, parts, [2, 2], [2, 2, 2])
        return out.tolist()
    results = LocalGroup(3).run(job)
    for r, got in enumerate(results):
        assert got == [100 * s + 2 * r + j for s in range(3) for j in range(2)]
