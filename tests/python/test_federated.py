"""The federated job in one process (examples/federated.py): its splits and sampling, stateless
clients, the server's state across a checkpoint, and its refusals."""
import json
import os

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
import federated  # noqa: E402
import workloads  # noqa: E402

import sketchsgd  # noqa: E402


@pytest.fixture(scope="module")
def fashion():
    return workloads.make("mlp")


def _labels(shards, y):
    return [set(y[s].tolist()) for s in shards]


def _disjoint(shards, n):
    seen = torch.cat(shards)
    return len(seen) == len(torch.unique(seen)) and int(seen.min()) >= 0 and int(seen.max()) < n


def test_an_iid_split_gives_equal_disjoint_shards_reproducible_from_the_seed(fashion):
    y = fashion.ytr
    a = federated.split(y, 700, "iid", seed=3)
    assert len(a) == 700 and {len(s) for s in a} == {len(y) // 700} and _disjoint(a, len(y))
    assert all(torch.equal(s, t) for s, t in zip(a, federated.split(y, 700, "iid", seed=3)))
    assert not all(torch.equal(s, t) for s, t in zip(a, federated.split(y, 700, "iid", seed=4)))
    # an iid shard of 85 images holds most of the 10 labels
    assert np.mean([len(l) for l in _labels(a, y)]) > 8


@pytest.mark.parametrize("k", [1, 2])
def test_a_class_split_gives_each_client_k_labels(fashion, k):
    y = fashion.ytr
    shards = federated.split(y, 1000, f"classes:{k}", seed=1)
    # 6,000 images a label cut into pieces of 60 / k: no piece straddles two labels
    assert {len(s) for s in shards} == {60} and _disjoint(shards, len(y))
    labels = _labels(shards, y)
    assert max(len(l) for l in labels) == k
    # two random pieces share a label one time in ten
    assert np.mean([len(l) for l in labels]) >= 1 + 0.8 * (k - 1)


def test_a_dirichlet_split_concentrates_labels_as_alpha_falls(fashion):
    y = fashion.ytr

    def top_share(alpha):
        shards = federated.split(y, 500, f"dirichlet:{alpha}", seed=2)
        assert {len(s) for s in shards} == {120} and _disjoint(shards, len(y))
        return np.mean([np.bincount(y[s].numpy(), minlength=10).max() / len(s) for s in shards])

    # (the last clients take what is left of each label, so even α = 0.05 is not one label each)
    wide, mid, narrow = top_share(100.0), top_share(0.5), top_share(0.05)
    assert wide < 0.25 < mid < narrow and narrow > 0.75
    a = federated.split(y, 500, "dirichlet:0.5", seed=2)
    assert all(torch.equal(s, t) for s, t in zip(a, federated.split(y, 500, "dirichlet:0.5", seed=2)))


@pytest.mark.parametrize("bad", ["", "noniid", "classes", "classes:0", "classes:x", "dirichlet:0",
                                 "dirichlet:-1", "dirichlet:nan", "dirichlet:inf", "iid:2"])
def test_a_bad_split_is_refused(fashion, bad):
    with pytest.raises(ValueError, match="split"):
        federated.split(fashion.ytr, 10, bad, seed=1)


@pytest.mark.parametrize("clients", [0, -1, 60001, 2.5, True])
def test_a_bad_population_is_refused(fashion, clients):
    with pytest.raises(ValueError, match="clients"):
        federated.split(fashion.ytr, clients, "iid", seed=1)


def test_sampling_is_reproducible_from_the_seed_and_differs_by_round():
    rounds = [federated.sample(1000, 100, r, seed=7) for r in range(5)]
    assert rounds == [federated.sample(1000, 100, r, seed=7) for r in range(5)]
    for who in rounds:
        assert len(set(who)) == 100 and who == sorted(who) and 0 <= who[0] and who[-1] < 1000
    assert len({tuple(w) for w in rounds}) == 5
    assert rounds[0] != federated.sample(1000, 100, 0, seed=8)
    with pytest.raises(ValueError, match="clients per round"):
        federated.sample(10, 11, 0, seed=1)


def _args(*extra):
    return federated.parser().parse_args(
        ["--clients", "60", "--per-round", "4", "--batch", "8", "--rounds", "4", *extra])


def _message(job, client):
    return job.codec_of(client).encode(job.upload(client).contiguous(), job.round, 0)


def test_stateless_clients_carry_nothing_between_rounds(fashion):
    job = federated.Job(_args("--codec", "topk:k=500"), fashion)
    first = _message(job, 5)
    assert _message(job, 5) == first and job.kept == {}
    for _ in range(2):
        job.step()
    assert job.kept == {} and job.client_state_bytes() == 0
    # the same client with state keeps its error feedback: its second message differs
    kept = federated.Job(_args("--codec", "topk:k=500", "--client-state"), fashion)
    assert _message(kept, 5) == first and _message(kept, 5) != first
    kept.step()
    assert set(kept.kept) == {5} | set(federated.sample(60, 4, 0, seed=1))
    assert kept.client_state_bytes() >= len(kept.kept) * 4 * kept.dim


@pytest.mark.parametrize("extra", [
    ("--codec", "sketch:fetch=1,rows=1,cols=20000,k=2000"),
    ("--codec", "topk:k=2000", "--client-state", "--server-momentum", "0.9"),
    ("--codec", "powersgd:rank=2,warm=0", "--client-state"),
    ("--codec", "dense", "--local-steps", "2", "--lr", "1"),
])
def test_a_job_resumed_from_its_checkpoint_goes_on_bit_for_bit(fashion, extra, tmp_path):
    extra = ("--clients", "6") + extra  # clients come back within four rounds, with their state
    straight = federated.Job(_args(*extra), fashion)
    for _ in range(4):
        straight.step()
    half = federated.Job(_args(*extra), fashion)
    for _ in range(2):
        half.step()
    torch.save(half.state_dict(), tmp_path / "job.pt")
    resumed = federated.Job(_args(*extra), fashion)
    resumed.load_state_dict(torch.load(tmp_path / "job.pt"))
    assert resumed.round == 2
    for _ in range(2):
        resumed.step()
    assert torch.equal(resumed.w, straight.w) and not torch.equal(resumed.w, half.w)
    assert (resumed.up, resumed.down) == (straight.up, straight.down)
    # without the server's state the job goes elsewhere (FetchSGD: its sketches; others: momentum
    # or the clients' error feedback)
    if "--local-steps" not in extra:
        lost = federated.Job(_args(*extra), fashion)
        d = torch.load(tmp_path / "job.pt")
        d["server"] = lost.agg.state_dict()
        d["clients"] = {}
        if d["m"] is not None:
            d["m"].zero_()
        lost.load_state_dict(d)
        for _ in range(2):
            lost.step()
        assert not torch.equal(lost.w, straight.w)


def test_a_checkpoint_of_another_job_is_refused(fashion, tmp_path):
    job = federated.Job(_args("--codec", "topk:k=500"), fashion)
    job.step()
    other = federated.Job(_args("--codec", "topk:k=500", "--seed", "2"), fashion)
    with pytest.raises(ValueError, match="another job"):
        other.load_state_dict(job.state_dict())


def test_fetchsgd_refuses_a_second_momentum_on_the_server(fashion):
    with pytest.raises(ValueError, match="fetch=1"):
        federated.Job(_args("--codec", "sketch:fetch=1,k=100", "--server-momentum", "0.9"), fashion)


@pytest.mark.parametrize("bad", [["--per-round", "61"], ["--clients", "0"], ["--lr", "nan"], ["--lr", "0"],
                                 ["--server-momentum", "1"], ["--split", "classes:0"], ["--local-steps", "-1"]])
def test_the_command_line_refuses_bad_values(bad):
    with pytest.raises(SystemExit):
        federated.check(_args(*bad))


def test_a_run_writes_its_result_and_a_stopped_run_resumes_to_the_same_end(tmp_path):
    common = ["--codec", "sketch:fetch=1,rows=1,cols=20000,k=2000", "--split", "classes:1", "--clients", "60",
              "--per-round", "4", "--batch", "8", "--rounds", "6", "--eval-every", "3"]
    federated.main(common + ["--out", str(tmp_path / "straight.json")])
    ck = str(tmp_path / "job.pt")
    federated.main(common + ["--checkpoint", ck, "--checkpoint-every", "1", "--stop-after", "3"])
    federated.main(common + ["--checkpoint", ck, "--checkpoint-every", "1", "--out", str(tmp_path / "resumed.json")])
    a, b = (json.load(open(tmp_path / f"{n}.json")) for n in ("straight", "resumed"))
    assert a["rounds"] == b["rounds"] == 6 and a["curve"] == b["curve"] and a["test_accuracy"] == b["test_accuracy"]
    # the table, the biases (sent whole: 2,058 values) and a header
    assert 4 * (20000 + 2058) <= a["upload_bytes_per_participant"] < 4 * (20000 + 2058) + 256
    assert a["upload_bytes"] == b["upload_bytes"] > 0 and a["client_state_bytes"] == 0


def _server_bin():
    """sketchsgd-server of the build whose package is under test (none for a pip install)."""
    import sketchsgd
    path = os.path.join(os.path.dirname(sketchsgd.__file__), "..", "..", "server", "sketchsgd-server")
    return os.path.abspath(path) if os.path.exists(path) else None


@pytest.mark.parametrize("extra", [("--codec", "sketch:fetch=1,rows=1,cols=20000,k=2000"),
                                   ("--codec", "dense", "--server-momentum", "0.9"),
                                   ("--codec", "topk:k=2000", "--local-steps", "2", "--lr", "1")])
def test_the_job_on_the_parameter_server_ends_on_the_simulation_s_bits(fashion, extra):
    server = _server_bin()
    if server is None:
        pytest.skip("no sketchsgd-server beside this sketchsgd package (a pip install)")
    common = ["--clients", "30", "--per-round", "4", "--batch", "8", "--rounds", "3", "--split", "classes:1", *extra]
    sim = federated.Job(_args(*common), fashion)
    for _ in range(3):
        sim.step()
    args = _args(*common, "--server", "auto", "--server-bin", server, "--timeout", "30")
    ps = federated.Job(args, fashion)
    proc, endpoint = federated.start_server(args, ps)
    try:
        for _ in range(3):
            ps.step_ps(endpoint)
        assert proc.wait(timeout=30) == 0  # the server ends with its last round
    finally:
        proc.kill()
    assert torch.equal(ps.w, sim.w) and not torch.equal(ps.w, federated.Job(args, fashion).w)
    assert ps.up == sim.up


def test_a_client_the_server_did_not_sample_is_refused(fashion):
    server = _server_bin()
    if server is None:
        pytest.skip("no sketchsgd-server beside this sketchsgd package (a pip install)")
    from sketchsgd.ps import Client
    args = _args("--codec", "dense", "--server", "auto", "--server-bin", server, "--timeout", "5")
    job = federated.Job(args, fashion)
    proc, endpoint = federated.start_server(args, job)
    try:
        who = federated.sample(60, 4, 0, 1)
        outsider = next(c for c in range(60) if c not in who)
        with pytest.raises(sketchsgd.ConfigMismatch, match=f"client {outsider} is not sampled in round 0"):
            Client(endpoint, "dense", dim=job.dim, rank=outsider, world=4, population=60, quiet=True, timeout=5)
        with pytest.raises(sketchsgd.ConfigMismatch, match="population 0, the job has 60 clients"):
            Client(endpoint, "dense", dim=job.dim, rank=1, world=4, quiet=True, timeout=5)
        with pytest.raises(TypeError):
            Client(endpoint, "dense", dim=job.dim, rank=who[0], world=4, population=60, init=job.w.double())
    finally:
        proc.kill()


def test_local_steps_move_the_participant_s_copy_not_the_server_s_model(fashion):
    job = federated.Job(_args("--codec", "dense", "--local-steps", "3", "--lr", "1"), fashion)
    before = job.w.clone()
    delta = job.upload(7)
    assert torch.equal(job.w, before) and delta.abs().max() > 0
    assert torch.equal(job.upload(7), delta)  # the next participant starts from the same model
