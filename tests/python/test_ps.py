"""sketchsgd.ps against sketchsgd-server processes on 127.0.0.1: a sharded job (S servers, one
range each) ends on one server's bits for dense gradients; a client naming the shards in another
order is refused with the reason; a client on the process's shared ZeroMQ context ends where one
with its own does."""
import os
import subprocess

import pytest
import torch

import sketchsgd


def _server_bin():
    path = os.path.join(os.path.dirname(sketchsgd.__file__), "..", "..", "server", "sketchsgd-server")
    return os.path.abspath(path) if os.path.exists(path) else None


def _start(*args):
    """sketchsgd-server on a free port of 127.0.0.1: the process and its endpoint."""
    server = _server_bin()
    if server is None:
        pytest.skip("no sketchsgd-server beside this sketchsgd package (a pip install)")
    p = subprocess.Popen([server, "--bind", "tcp://127.0.0.1:*", "--quiet", "--heartbeat-ms", "200", *args],
                         stdout=subprocess.PIPE, text=True)
    endpoint = p.stdout.readline().strip()
    assert endpoint.startswith("tcp://127.0.0.1:"), endpoint
    return p, endpoint


def _train(endpoints, dim, rounds, spec="dense", shared_io=False):
    from sketchsgd.ps import Client
    g = torch.Generator().manual_seed(3)
    init = torch.randn(dim, generator=g)
    with Client(",".join(endpoints), spec, dim=dim, init=init, quiet=True, timeout=20, shared_io=shared_io) as c:
        assert c.shards == len(endpoints)
        for t in range(rounds):
            r = c.step(c.params() - torch.randn(dim, generator=g))
            assert r["outcome"] == "updated", r
        return c.params()


def test_a_sharded_job_ends_on_one_server_s_bits():
    dim, rounds = 1001, 3
    common = ["--world", "1", "--dim", str(dim), "--codec", "dense", "--rounds", str(rounds)]
    procs = []
    try:
        p, one = _start(*common)
        procs.append(p)
        ref = _train([one], dim, rounds)
        shards = []
        for i in range(3):
            p, e = _start(*common, "--shards", "3", "--shard", str(i))
            procs.append(p)
            shards.append(e)
        got = _train(shards, dim, rounds)
        assert torch.equal(got, ref)
        for p in procs:
            assert p.wait(timeout=30) == 0  # every server ends with its last round
    finally:
        for p in procs:
            p.kill()


def test_shards_named_in_another_order_are_refused():
    from sketchsgd.ps import Client
    common = ["--world", "1", "--dim", "600", "--codec", "topk:k=60", "--rounds", "1"]
    procs = []
    try:
        eps = []
        for i in range(2):
            p, e = _start(*common, "--shards", "2", "--shard", str(i))
            procs.append(p)
            eps.append(e)
        with pytest.raises(sketchsgd.ConfigMismatch, match="shard 1 of 2"):
            Client(f"{eps[1]},{eps[0]}", "topk:k=60", dim=600, init=torch.zeros(600), quiet=True, timeout=5)
        with pytest.raises(sketchsgd.InvalidArgument, match="empty item"):
            Client(f"{eps[0]},,{eps[1]}", "topk:k=60", dim=600, quiet=True, timeout=5)
    finally:
        for p in procs:
            p.kill()


def test_a_client_on_the_shared_context_ends_where_one_with_its_own_does():
    from sketchsgd.ps import Client
    dim, rounds = 500, 3
    common = ["--world", "1", "--dim", str(dim), "--codec", "topk:k=50", "--rounds", str(rounds)]
    procs = []
    try:
        got = []
        for shared in (False, True):
            p, e = _start(*common)
            procs.append(p)
            got.append(_train([e], dim, rounds, spec="topk:k=50", shared_io=shared))
            assert p.wait(timeout=30) == 0
        assert torch.equal(got[0], got[1])
        with pytest.raises(TypeError, match="shared_io"):
            Client("tcp://127.0.0.1:1", "dense", dim=4, shared_io=1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_an_asynchronous_job_applies_each_push_and_reports_its_age():
    """sketchsgd-server --mode async: two clients in one process, rank 1 pushing only after rank
    0's three pushes (a round job would hold rank 0 at its first); a bad --mode is one line and
    exit status 2; a client's weight outside (0, 10^6] a ValueError."""
    from sketchsgd.ps import Client
    dim = 257
    bad = subprocess.run([_server_bin() or "true", "--dim", "4", "--mode", "downpour"],
                         capture_output=True, text=True)
    if _server_bin():
        assert bad.returncode == 2 and "--mode must be rounds or async" in bad.stderr, bad.stderr
    for weight in (0, float("nan"), True):
        with pytest.raises(ValueError, match="weight"):
            Client("tcp://127.0.0.1:1", "dense", dim=dim, weight=weight)
    p, e = _start("--world", "2", "--dim", str(dim), "--codec", "dense", "--mode", "async", "--lr", "0.5")
    try:
        init = torch.randn(dim, generator=torch.Generator().manual_seed(4))
        with Client(e, "dense", dim=dim, rank=0, world=2, init=init, quiet=True, timeout=20) as a, \
                Client(e, "dense", dim=dim, rank=1, world=2, quiet=True, timeout=20, fetch_every=0,
                       weight=2) as b:
            assert a.asynchronous and b.asynchronous
            for t in range(3):
                r = a.step(torch.ones(dim))
                assert (r["outcome"], r["age"], r["version"]) == ("updated", 0, t + 1), r
            r = b.step(torch.ones(dim))
            assert (r["age"], r["version"], r["lr"]) == (3, 4, 0.5 * 2 / 2 / 4), r  # counts twice
            assert not torch.equal(b.params(), a.params())  # b has not fetched since its start
            b.fetch()
            expect = init.clone()
            for step in (0.25, 0.25, 0.25, 0.125):  # lr · weight / world / (1 + age), one at a time
                expect -= step
            assert torch.equal(b.params(), expect)
    finally:
        p.kill()
