"""sketchsgd.Compressor / Aggregator on tensors: the C++ codecs, their checks and errors."""

import gc
import math

import numpy as np
import pytest
import torch

import sketchsgd

DIM = 4000
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or not sketchsgd.cuda_build,
                               reason="no CUDA device (or a build without CUDA)")


def grad(seed, dim=DIM):
    g = torch.randn(dim, generator=torch.Generator().manual_seed(seed))
    g[:3] += 30.0  # heavy in every worker: every codec must keep their sign
    return g


def test_registry_describes_every_codec_and_option():
    codecs = {c["name"]: c for c in sketchsgd.codecs()}
    assert {"dense", "topk", "terngrad", "signsgd", "sketch", "powersgd", "qsgd"} <= set(codecs)
    for name, c in codecs.items():  # every codec registers a summary and examples that build
        assert c["summary"] and c["examples"], name
        for spec in c["examples"]:
            assert spec.partition(":")[0] == name and "layout=" not in spec, spec
            built = sketchsgd.Compressor(spec, layout=[(40, 90), (400,)]) if c["layout"] == "required" else \
                sketchsgd.Compressor(spec, 4000)
            assert built.dim == 4000
    assert sketchsgd.example_specs() == [s for c in codecs.values() if c["layout"] != "required" for s in c["examples"]]
    keys = {o["key"] for o in codecs["sketch"]["options"]}
    assert {"rows", "cols", "k", "p2", "momentum", "hashing", "fetch"} <= keys
    hashing = next(o for o in codecs["sketch"]["options"] if o["key"] == "hashing")
    assert hashing["names"] == ["random", "precomputed", "blocked"]
    assert "sketch" in sketchsgd.describe() and "topk" in sketchsgd.describe()


def test_errors_are_typed_and_catchable_as_builtin_exceptions():
    for cls in (sketchsgd.InvalidArgument, sketchsgd.NonFiniteError, sketchsgd.ConfigMismatch, sketchsgd.WireError):
        assert issubclass(cls, ValueError) and issubclass(cls, sketchsgd.Error)
    for cls in (sketchsgd.ProtocolError, sketchsgd.CudaError, sketchsgd.JobFinished, sketchsgd.TimeoutError):
        assert issubclass(cls, RuntimeError) and issubclass(cls, sketchsgd.Error)
    with pytest.raises(ValueError, match="unknown codec"):
        sketchsgd.Compressor("nosuch", DIM)
    with pytest.raises(sketchsgd.InvalidArgument, match="k"):
        sketchsgd.Compressor("topk:k=5000", 100)


@pytest.mark.parametrize("spec", sketchsgd.example_specs("40x90+400"))
def test_a_round_through_messages_gives_the_mean_step(spec):
    W = 3
    workers = [sketchsgd.Compressor(spec, DIM) for _ in range(W)]
    agg = workers[0].make_aggregator(W)
    assert agg.world_size == W and agg.expecting == "gradient"
    grads = [grad(r) for r in range(W)]
    for r, (w, g) in enumerate(zip(workers, grads)):
        msg = w.encode(g, round=7, rank=r)
        info = sketchsgd.message_info(msg)
        assert info["kind"] == "gradient" and info["round"] == 7 and info["sender"] == r and info["dim"] == DIM
        agg.add(msg)
    update = agg.finish()
    if agg.expecting == "answer":
        for r, w in enumerate(workers):
            agg.add(w.answer(update, r))
        update = agg.finish()
    steps = [w.apply(update) for w in workers]
    assert all(torch.equal(s, steps[0]) for s in steps)
    mean = sum(grads) / W
    # Every codec keeps the planted heavy coordinates' sign; dense gives the mean itself.
    for r in range(W):
        assert torch.sign(steps[0][r]) == torch.sign(mean[r]), spec
    if spec == "dense":
        torch.testing.assert_close(steps[0], mean)
    params = torch.zeros(DIM)
    sketchsgd.Compressor(spec, DIM).apply_step(update, params, 0.5)  # a server's own codec
    torch.testing.assert_close(params, -0.5 * steps[0])


def test_summed_payloads_give_the_same_update_as_messages():
    spec, W = "sketch:rows=3,cols=600,k=100,p2=2,momentum=0", 3
    grads = [torch.randint(-20, 21, (DIM,), generator=torch.Generator().manual_seed(r)).float() / 4 for r in range(W)]
    by_msg = [sketchsgd.Compressor(spec, DIM) for _ in range(W)]
    by_sum = [sketchsgd.Compressor(spec, DIM) for _ in range(W)]
    a, b = by_msg[0].make_aggregator(W), by_sum[0].make_aggregator(W)
    for r in range(W):
        a.add(by_msg[r].encode(grads[r], 0, r))
    query = a.finish()
    for r in range(W):
        a.add(by_msg[r].answer(query, r))
    want = a.finish()
    total = sum(c.encode_sum(g) for c, g in zip(by_sum, grads))
    assert total.numel() == by_sum[0].sum_size("gradient") == 3 * 600
    b.add_sum(total, W, 0)
    assert b.finish() == query
    b.add_sum(sum(c.answer_sum(query) for c in by_sum), W, 0)
    assert b.finish() == want


def test_gathered_tells_which_collective_a_codecs_messages_take():
    """Summed codecs' payloads add up in an all-reduce; gathered ones are decoded worker by worker
    (what sketchsgd.fsdp sends per destination). Budgets larger than the probe do not matter."""
    summed = ["dense", "sketch:rows=1,cols=90000,k=18500,fetch=1", "powersgd:rank=8,wire=fp16"]
    apart = ["topk:k=16000,wire=fp16,index=delta", "sparseloco:chunk=4096,k=64", "signsgd:ef=1", "qsgd:bits=4",
             "terngrad"]
    assert [sketchsgd.gathered(s) for s in summed + apart] == [False] * len(summed) + [True] * len(apart)
    with pytest.raises(ValueError, match="unknown codec"):
        sketchsgd.gathered("nosuch:k=1")


def test_a_rounds_requests_name_their_collectives():
    """The C++ Round's requests reach Python as objects: a Sum names its room, format, columns and
    values (equal requests hash alike, so a driver keeps one Sum per request); a Gather's bytes
    are the round's memory (a gathered codec's first: its message length, 8 bytes)."""
    from sketchsgd import _core
    dim, whole, world = 4000, 10, 2
    grad = torch.randn(dim + whole)
    kept, rest = [(0, dim)], [(dim, whole)]

    def round_of(spec):
        codec = _core.Compressor(spec, dim)
        agg = codec.make_aggregator(world)
        payload = torch.zeros(_core.Round.payload_size(codec, whole))
        answer = torch.zeros(max(_core.Round.answer_size(codec), 1))
        rnd = _core.Round(codec, agg, 0, whole, payload.data_ptr(), payload.numel(), answer.data_ptr(),
                          _core.Round.answer_size(codec))
        return rnd, (codec, agg, payload, answer)

    rnd, held = round_of("powersgd:rank=2,wire=int8,layout=50x80")
    first = rnd.start(grad.data_ptr(), grad.numel(), kept, rest, 0)
    assert [r.op for r in first] == ["sum", "sum"]
    own, tail = first
    assert (own.room, own.format, own.offset) == (0, "int8", 0) and own.columns == 2
    assert (tail.room, tail.format, tail.columns) == (0, "int8", 1)
    assert tail.offset == own.count and tail.offset + tail.count == held[2].numel()
    other, other_held = round_of("powersgd:rank=2,wire=int8,layout=50x80")  # its rooms held while it writes them
    again, _ = other.start(grad.data_ptr(), grad.numel(), kept, rest, 0)
    assert again == own and hash(again) == hash(own) and again != tail and len({own, tail, again}) == 2
    with pytest.raises(RuntimeError, match="no bytes"):
        own.bytes

    rnd, held = round_of("topk:k=40")
    (length,) = rnd.start(grad.data_ptr(), grad.numel(), kept, rest, 0)
    assert length.op == "gather" and "gather" in repr(length)
    n = int.from_bytes(bytes(length.bytes), "little")
    assert 0 < n <= held[0].max_message_bytes("gradient")
    padded = rnd.next([bytes(length.bytes)] * world)
    assert [r.op for r in padded] == ["gather", "sum"] and len(padded[0].bytes) == n


def test_finish_without_a_copy_hands_the_message_as_a_read_only_view_that_owns_it():
    spec, W = "sketch:rows=3,cols=600,k=100,p2=2,momentum=0", 2
    codecs = [sketchsgd.Compressor(spec, DIM) for _ in range(2 * W)]
    a, b = codecs[0].make_aggregator(W), codecs[W].make_aggregator(W)
    a.add_sum(sum(c.encode_sum(grad(r)) for r, c in enumerate(codecs[:W])), W, 0)
    total = sum(c.encode_sum(grad(r)) for r, c in enumerate(codecs[W:]))
    b.add_sum(total, W, 0)
    want, view = a.finish(), b.finish(copy=False)
    assert isinstance(want, bytes) and isinstance(view, memoryview)
    assert view.readonly and view.nbytes == len(want) and view == want
    with pytest.raises(TypeError):
        view[0] = 0
    del b, total
    gc.collect()
    _ = [torch.randn(4096) for _ in range(64)]  # reuse freed memory: a view not owning its bytes changes
    assert view == want
    answers = [c.answer(view, r) for r, c in enumerate(codecs[W:])]
    assert answers == [c.answer(want, r) for r, c in enumerate(codecs[:W])]
    with pytest.raises(TypeError, match="bool"):
        a.finish(copy=1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_float_replies_stay_tensors_and_match_their_messages(device):
    """powersgd's query and update as tensors on the codec's device (finish_values), answered and
    applied as such: the steps of the message path, bit for bit, fp16 rounding included."""
    spec, layout, W = "powersgd:rank=3,wire=fp16", [(40, 30), (30,), (10, 40), (10,)], 2
    by_msg = [sketchsgd.Compressor(spec, layout=layout, device=device) for _ in range(W)]
    by_val = [sketchsgd.Compressor(spec, layout=layout, device=device) for _ in range(W)]
    a, b = by_msg[0].make_aggregator(W), by_val[0].make_aggregator(W)
    assert by_val[0].reply_size("query") == 3 * (40 + 10) and b.replying == "query"
    for i in range(3):
        grads = [grad(10 * i + r, by_msg[0].dim).to(device) for r in range(W)]
        a.add_sum(sum(c.encode_sum(g, i) for c, g in zip(by_msg, grads)), W, i)
        b.add_sum(sum(c.encode_sum(g, i) for c, g in zip(by_val, grads)), W, i)
        assert b.replying == "query"
        query, values = a.finish(), b.finish_values()
        assert values.device.type == device and values.dtype == torch.float32
        assert b.replying == "update"
        a.add_sum(sum(c.answer_sum(query) for c in by_msg), W, i)
        b.add_sum(sum(c.answer_sum(values) for c in by_val), W, i)
        update, values = a.finish(), b.finish_values()
        for c, d in zip(by_msg, by_val):
            want, got = c.apply(update), d.apply(values)
            assert torch.equal(want, got)
    assert by_msg[0].state_dict()["state"].equal(by_val[0].state_dict()["state"])


def test_float_replies_are_checked():
    spec, layout = "powersgd:rank=3", [(40, 30), (30,)]
    c = sketchsgd.Compressor(spec, layout=layout)
    agg = c.make_aggregator(1)
    with pytest.raises(sketchsgd.ProtocolError, match="no gradient"):
        agg.finish_values()
    agg.add_sum(c.encode_sum(grad(1, c.dim)), 1, 0)
    with pytest.raises(ValueError, match="elements"):
        agg.finish_values(torch.empty(5))
    query = agg.finish_values()
    with pytest.raises(TypeError, match="float16"):
        c.answer_sum(query.half())
    with pytest.raises(ValueError, match="elements"):
        c.answer_sum(query[1:])
    bad = query.clone()
    bad[4] = math.nan
    with pytest.raises(sketchsgd.NonFiniteError, match="query value 4"):
        c.answer_sum(bad)
    agg.add_sum(c.answer_sum(query), 1, 0)
    update = agg.finish_values()
    update[-1] = math.inf
    state = c.state_dict()["state"]
    with pytest.raises(sketchsgd.NonFiniteError, match="update value"):
        c.apply(update)
    assert c.state_dict()["state"].equal(state)
    sketch = sketchsgd.Compressor("sketch:rows=3,cols=600,k=100,p2=2", DIM)
    assert sketch.reply_size("query") == 0
    with pytest.raises(sketchsgd.ProtocolError, match="not a float vector"):
        sketch.apply(torch.zeros(10))
    sa = sketch.make_aggregator(1)
    sa.add_sum(sketch.encode_sum(grad(2)), 1, 0)
    with pytest.raises(sketchsgd.ProtocolError, match="not a float vector"):
        sa.finish_values()


@pytest.mark.parametrize("bad, error, match", [
    (torch.zeros(DIM, dtype=torch.float64), TypeError, "float64"),
    (torch.zeros(DIM, dtype=torch.float16), TypeError, "float16"),
    (torch.zeros(2 * DIM)[::2], ValueError, "contiguous"),
    (torch.zeros(DIM - 1), ValueError, "3999 elements"),
    (np.zeros(DIM, np.float32), TypeError, "torch.Tensor"),
    ("gradient", TypeError, "torch.Tensor"),
])
def test_bad_tensors_are_refused_with_the_problem_named(bad, error, match):
    c = sketchsgd.Compressor("topk:k=10", DIM)
    with pytest.raises(error, match=match):
        c.encode(bad)


def test_non_finite_gradients_change_nothing():
    c = sketchsgd.Compressor("topk:k=50,momentum=0.9", DIM)
    c.encode(grad(1))
    before = c.state_dict()
    g = grad(2)
    g[17] = math.nan
    with pytest.raises(sketchsgd.NonFiniteError, match="coordinate 17"):
        c.encode(g)
    g[17] = math.inf
    with pytest.raises(ValueError):
        c.encode(g)
    after = c.state_dict()
    assert after["spec"] == before["spec"] and torch.equal(after["state"], before["state"])


def test_corrupt_truncated_or_foreign_messages_are_refused():
    c = sketchsgd.Compressor("topk:k=50", DIM)
    agg = c.make_aggregator(2)
    msg = c.encode(grad(1), 0, 0)
    with pytest.raises(sketchsgd.WireError):
        agg.add(msg[:-3])
    with pytest.raises(sketchsgd.WireError):
        agg.add(b"\\x00" * 10)
    with pytest.raises(sketchsgd.ConfigMismatch):
        agg.add(sketchsgd.Compressor("topk:k=50", DIM + 1).encode(grad(1, DIM + 1), 0, 0))
    with pytest.raises(TypeError):
        agg.add(12345)
    agg.add(msg)
    with pytest.raises(sketchsgd.ProtocolError, match="duplicate"):
        agg.add(msg)
    assert agg.count == 1
    update = agg.finish()
    corrupt = bytearray(update)
    corrupt[-2] ^= 0xFF
    step = torch.zeros(DIM)
    with pytest.raises(sketchsgd.Error):
        c.apply(bytes(corrupt), step)
    with pytest.raises(ValueError, match="requires grad"):
        c.apply_step(update, torch.zeros(DIM, requires_grad=True), 0.1)
    c.apply_step(update, torch.zeros(DIM, requires_grad=True).detach(), 0.1)


def test_codecs_whose_messages_do_not_sum_say_so():
    c = sketchsgd.Compressor("signsgd", DIM)
    assert c.sum_size() == 0
    with pytest.raises(RuntimeError, match="gather"):
        c.encode_sum(grad(0))
    with pytest.raises(ValueError, match="message kind"):
        c.sum_size("nonsense")


def test_state_dict_resumes_a_codec_bit_for_bit():
    spec = "sketch:rows=3,cols=600,k=100,momentum=0.9"
    a = sketchsgd.Compressor(spec, DIM)
    for r in range(3):
        a.encode(grad(r))
    b = sketchsgd.Compressor(spec, DIM)
    b.load_state_dict(a.state_dict())
    assert a.encode(grad(9)) == b.encode(grad(9))
    with pytest.raises(sketchsgd.ConfigMismatch):
        sketchsgd.Compressor("sketch:rows=3,cols=600,k=100,momentum=0.5", DIM).load_state_dict(a.state_dict())
    saved = a.state_dict()
    assert saved["state"].dtype == torch.uint8  # tensors: torch.load(weights_only=True) reads them
    broken = dict(saved, state=saved["state"].clone())
    broken["state"][-1] ^= 1
    with pytest.raises(sketchsgd.WireError):
        b.load_state_dict(broken)
    as_bytes = dict(saved, state=saved["state"].numpy().tobytes())  # bytes are taken too
    b.load_state_dict(as_bytes)
    with pytest.raises(sketchsgd.ConfigMismatch):
        b.load_state_dict(dict(saved, spec=None))


def test_a_state_saved_under_an_older_canonical_spec_loads():
    """A spec as an earlier build wrote it (PowerSGD before its option blocks) names the same
    codec: its state loads; another codec's does not."""
    layout = [(40, 30), (30,)]
    a = sketchsgd.Compressor("powersgd:rank=3", layout=layout)
    a.encode_sum(torch.randn(1230))
    older = dict(a.state_dict(), spec=a.spec.replace("blocks=1,", ""))
    assert "blocks" not in older["spec"]
    b = sketchsgd.Compressor("powersgd:rank=3", layout=layout)
    b.load_state_dict(older)
    g = torch.randn(1230)
    assert torch.equal(a.encode_sum(g, 1), b.encode_sum(g, 1))
    with pytest.raises(sketchsgd.ConfigMismatch):
        sketchsgd.Compressor("powersgd:rank=2", layout=layout).load_state_dict(older)


def test_bad_constructor_arguments():
    with pytest.raises(TypeError):
        sketchsgd.Compressor(5, DIM)
    with pytest.raises(TypeError):
        sketchsgd.Compressor("dense", 10.5)
    with pytest.raises(sketchsgd.InvalidArgument):
        sketchsgd.Compressor("dense", 0)
    with pytest.raises(ValueError, match="device"):
        sketchsgd.Compressor("dense", DIM, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(Exception):
            sketchsgd.Compressor("dense", DIM, device="cuda:0")



@needs_gpu
def test_cuda_tensors_go_straight_to_the_cuda_codec():
    spec = "sketch:rows=3,cols=600,k=100"
    cpu, gpu = sketchsgd.Compressor(spec, DIM), sketchsgd.Compressor(spec, DIM, device="cuda")
    g = grad(3)
    with pytest.raises(ValueError, match="cuda"):
        gpu.encode(g)
    with pytest.raises(ValueError, match="cpu"):
        cpu.encode(g.cuda())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the caller's current stream is another one: still ordered
        table = gpu.encode_sum(g.cuda())
    torch.cuda.synchronize()
    torch.testing.assert_close(table.cpu(), cpu.encode_sum(g), rtol=1e-5, atol=1e-4)
    agg = gpu.make_aggregator(1)
    agg.add_sum(table, 1, 0)
    step = gpu.apply(agg.finish())
    assert step.device.type == "cuda" and step.abs().sum() > 0


@needs_gpu
@pytest.mark.parametrize("spec", ["sketch:rows=5,cols=3000,k=400", "sketch:rows=5,cols=3000,k=400,index=delta",
                                  "sketch:rows=3,cols=3000,k=400,fetch=1,index=delta"])
def test_sketch_server_round_on_cuda_gives_the_cpus_update(spec):
    """The update built on the device (selection in index order, delta coding, one staged copy)
    is the CPU aggregator's byte for byte, round after round (FetchSGD's sketches carried on)."""
    cpu, gpu = sketchsgd.Compressor(spec, DIM), sketchsgd.Compressor(spec, DIM, device="cuda")
    a, b = cpu.make_aggregator(2), gpu.make_aggregator(2)
    for i in range(3):
        table = cpu.encode_sum(grad(20 + i)) + cpu.encode_sum(grad(40 + i))
        a.add_sum(table, 2, i)
        b.add_sum(table.cuda(), 2, i)
        assert b.finish(copy=i != 1) == a.finish()


@needs_gpu
def test_powersgd_on_cuda_tensors_matches_the_cpu():
    """cuBLAS against OpenBLAS through the two summable phases: the same to float rounding."""
    spec, layout = "powersgd:rank=3,momentum=0.9", [(40, 30), (30,), (10, 40), (10,)]
    cpu, gpu = sketchsgd.Compressor(spec, layout=layout), sketchsgd.Compressor(spec, device="cuda", layout=layout)
    params = torch.randn(cpu.dim, generator=torch.Generator().manual_seed(5))
    dparams = params.cuda()
    agg = cpu.make_aggregator(1)
    for i in range(3):
        g = torch.randn(cpu.dim, generator=torch.Generator().manual_seed(10 + i))
        p_cpu, p_gpu = cpu.encode_sum(g), gpu.encode_sum(g.cuda())
        assert p_gpu.device.type == "cuda"
        torch.testing.assert_close(p_gpu.cpu(), p_cpu, rtol=1e-4, atol=1e-4)
        agg.add_sum(p_cpu, 1, i)
        query = agg.finish()
        q_cpu, q_gpu = cpu.answer_sum(query), gpu.answer_sum(query)
        torch.testing.assert_close(q_gpu.cpu(), q_cpu, rtol=1e-4, atol=1e-4)
        agg.add_sum(q_cpu, 1, i)
        update = agg.finish()
        cpu.apply_step(update, params, 0.5)
        gpu.apply_step(update, dparams, 0.5)
        torch.testing.assert_close(dparams.cpu(), params, rtol=1e-4, atol=1e-4)


def test_layout_codecs_take_tensor_shapes():
    c = sketchsgd.Compressor("powersgd:rank=2", layout=[(30, 20), (5,)])
    assert c.dim == 605 and c.spec.endswith(",layout=30x20+5") and c.two_rounds
    assert c.sum_dtype() == torch.float32
    half = sketchsgd.Compressor("powersgd:rank=2,wire=fp16", layout=[torch.Size([30, 20]), torch.Size([])])
    assert half.sum_dtype() == half.sum_dtype("answer") == torch.float16 and half.dim == 601
    assert half.sum_columns() == 2  # P and Q: a column per rank, whatever the format
    i8 = sketchsgd.Compressor("powersgd:rank=2,wire=int8", layout=[(30, 20), (5,)])
    assert i8.sum_dtype() == i8.sum_dtype("answer") == torch.int8 and i8.sum_columns("answer") == 2
    assert i8.max_message_bytes("gradient") == 48 + 4 * 2 + 30 * 2 + 5  # header, a scale a column, bytes
    assert {e["name"]: e["layout"] for e in sketchsgd.codecs()}.items() >= {
        "dense": "none", "topk": "optional", "terngrad": "optional", "signsgd": "optional", "sketch": "optional",
        "powersgd": "required", "qsgd": "optional"}.items()
    for bad in ([(30, 0)], [], [("a", 2)], 7):
        with pytest.raises(ValueError, match="layout"):
            sketchsgd.Compressor("powersgd:rank=2", layout=bad)
    with pytest.raises(ValueError, match="layout holds 605"):
        sketchsgd.Compressor("powersgd:rank=2", 600, layout=[(30, 20), (5,)])
    with pytest.raises(sketchsgd.InvalidArgument, match="needs the tensors' shapes"):
        sketchsgd.Compressor("powersgd:rank=2", 605)
    with pytest.raises(sketchsgd.InvalidArgument, match="does not use a layout"):
        sketchsgd.Compressor("dense", layout=[(4, 5)])
    # Optional: a sketch sends the 1-D tensor whole beside its table.
    s = sketchsgd.Compressor("sketch:rows=3,cols=100,k=10", layout=[(30, 20), (5,)])
    assert s.spec.endswith(",layout=30x20+5") and s.sum_size("gradient") == 300 + 5


@pytest.mark.parametrize("module", ["sketchsgd", "sketchsgd.torch", "sketchsgd.outer", "sketchsgd.ps"])
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    """No import cycle: each module is the first one imported in a new process
    (sketchsgd.ps needs the build with the server; without it, it says so)."""
    import subprocess
    import sys
    code = f"import {module}; from sketchsgd.torch import DiLoCo; from sketchsgd.outer import nesterov"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 or (module == "sketchsgd.ps" and "server" in done.stderr), done.stderr


@pytest.mark.parametrize("version,ok", [("2.13.0+cpu", True), ("2.4.0", True), ("2.11.0a0+git123", True),
                                        ("10.0", True), ("1.13.1", False), ("2.3.1+cu121", False), ("nonsense", False)])
def test_the_supported_torch_versions(version, ok):
    from sketchsgd import _version
    if ok:
        _version.check(version)
    else:
        with pytest.raises(ImportError, match=r"PyTorch >= 2\.4"):
            _version.check(version)
