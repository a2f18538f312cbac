"""The example's workloads (examples/workloads.py) and short DDP runs of them under the hook
(examples/ddp_train.py): fixed splits and data order, a causal language model, half-precision
models with replicas identical."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
import workloads  # noqa: E402


@pytest.fixture(scope="module")
def text():
    return workloads.make("transformer")


@pytest.fixture(scope="module")
def fashion():
    return workloads.make("resnet8")


def test_the_text_split_holds_out_whole_documents(text):
    files = sorted(p for p in _sources())
    held = b"".join(open(p, "rb").read() for i, p in enumerate(files) if i % 10 == 0)
    assert len(text.val) == len(held) and bytes(text.val[:4096].to(torch.uint8).tolist()) == held[:4096]
    assert len(text.train) + len(text.val) == sum(os.path.getsize(p) for p in files)
    # The validation windows are fixed: two loads give the same starts, inside the held-out text.
    again = workloads.make("transformer")
    assert torch.equal(again.eval_starts, text.eval_starts)
    assert int(text.eval_starts[-1]) + text.seq + 1 <= len(text.val)


def _sources():
    import glob
    return glob.glob(os.path.join(workloads.TEXT, "**", "*.rst.txt"), recursive=True)


@pytest.mark.parametrize("name", ["transformer", "resnet8"])
def test_every_worker_gets_its_own_items_in_a_reproducible_order(name, text, fashion):
    job = text if name == "transformer" else fashion
    W = 4
    orders = [job.order(r, W, epoch=0, seed=1) for r in range(W)]
    seen = torch.cat(orders)
    assert len(seen) == job.items() and len(torch.unique(seen)) == job.items()  # a partition
    assert torch.equal(orders[2], job.order(2, W, epoch=0, seed=1))
    assert not torch.equal(orders[2], job.order(2, W, epoch=1, seed=1))  # reshuffled each epoch
    x, y = job.batch(orders[0][:8], "cpu", torch.float32)
    assert len(x) == len(y) == 8


def test_a_text_batch_is_its_window_shifted_by_one(text):
    x, y = text.batch(torch.tensor([0, 5]), "cpu", torch.float32)
    assert x.shape == y.shape == (2, text.seq)
    assert torch.equal(x[:, 1:], y[:, :-1])
    start = 5 * (text.seq + 1)
    assert torch.equal(x[1], text.train[start:start + text.seq])


def test_the_language_model_is_causal(text):
    """Changing byte t changes no prediction before t."""
    m = text.model(seed=3).eval()
    x = torch.randint(0, 256, (2, text.seq))
    y = x.clone()
    y[:, 40] = (y[:, 40] + 1) % 256
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.equal(a[:, :40], b[:, :40])
    assert not torch.equal(a[:, 40:], b[:, 40:])


def test_the_models_are_seeded_and_of_the_documented_sizes(text, fashion):
    sizes = {"resnet8": 77_754, "resnet20": 272_186, "mlp": 1_863_690}
    for name, n in sizes.items():
        m = (fashion if name == "resnet8" else workloads.make(name)).model(seed=1)
        assert sum(p.numel() for p in m.parameters()) == n, name
        assert m(torch.zeros(3, 784)).shape == (3, 10)
    a, b = text.model(seed=1), text.model(seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert 800_000 < sum(p.numel() for p in a.parameters()) < 900_000


def test_a_limited_evaluation_scores_the_first_items_alone(text, fashion):
    """--eval-items N (quick runs): the metric over the first N held-out items, as scored one by one."""
    m = workloads.make("mlp").model(seed=1)
    acc = fashion.evaluate(m, "cpu", torch.float32, limit=1500)["test_accuracy"]
    with torch.no_grad():
        right = (m(fashion.xte[:1500]).argmax(1) == fashion.yte[:1500]).sum().item()
    assert acc == right / 1500
    assert fashion.evaluate(m, "cpu", torch.float32, limit=10**9) == fashion.evaluate(m, "cpu", torch.float32)
    lm = text.model(seed=1)
    few, every = text.evaluate(lm, "cpu", torch.float32, limit=64), text.evaluate(lm, "cpu", torch.float32)
    assert few["val_loss"] != every["val_loss"] and abs(few["val_loss"] - every["val_loss"]) < 0.5


@pytest.fixture(scope="module")
def lm_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def lm(lm_cache):
    return workloads.LM(cache=lm_cache)


def test_the_lm_tokenizer_is_trained_once_deterministically_and_round_trips(lm, lm_cache, tmp_path):
    """The BPE vocabulary is trained on the training documents alone and cached: a second load
    reads the cache, a training elsewhere gives the same tokens; every training document's
    tokens decode to its text, followed by <|endoftext|>."""
    from tokenizers import Tokenizer
    assert lm.vocab == 8192 and 0 <= lm.eot < lm.vocab
    (cached,) = os.listdir(lm_cache)
    again = workloads.LM(cache=lm_cache)
    assert torch.equal(again.train, lm.train) and torch.equal(again.val, lm.val)
    elsewhere = workloads.LM(cache=str(tmp_path))
    assert torch.equal(elsewhere.train, lm.train) and torch.equal(elsewhere.val, lm.val)
    tok = Tokenizer.from_file(os.path.join(lm_cache, cached, "tokenizer.json"))
    train, val = workloads.documents(workloads.TEXT)
    ends = torch.nonzero(lm.train == lm.eot).reshape(-1)
    assert len(ends) == len(train) and len(torch.nonzero(lm.val == lm.eot)) == len(val)
    for i in (0, 7, len(train) - 1):
        first = 0 if i == 0 else int(ends[i - 1]) + 1
        assert tok.decode(lm.train[first:int(ends[i])].tolist()) == train[i].decode("utf-8", errors="replace")
    # A token's bytes: its byte-level string has one character per byte.
    assert int(lm.token_bytes[lm.eot]) == 0 and int((lm.token_bytes >= 1).sum()) == lm.vocab - 1
    assert len(b"".join(train)) == int(lm.token_bytes[lm.train].sum())


def test_the_lm_is_gpt2_causal_seeded_tied_or_untied_and_scores_bits_per_byte(lm, lm_cache):
    tied, untied = lm.model(seed=1), workloads.LM(cache=lm_cache, untied=True).model(seed=1)
    assert sum(p.numel() for p in tied.parameters()) == 1_850_112
    assert sum(p.numel() for p in untied.parameters()) == 2_898_688  # + its own 8,192 x 128 input embedding
    assert all(torch.equal(p, q) for p, q in zip(tied.parameters(), lm.model(seed=1).parameters()))
    assert len(tied.blocks) == 4
    x = torch.randint(0, lm.vocab, (2, lm.seq))
    y = x.clone()
    y[:, 40] = (y[:, 40] + 1) % lm.vocab
    with torch.no_grad():
        a, b = tied.eval()(x), tied(y)
    assert a.shape == (2, lm.seq, lm.vocab)
    assert torch.equal(a[:, :40], b[:, :40]) and not torch.equal(a[:, 40:], b[:, 40:])
    # The untied input embedding's gradient touches only the rows of the batch's tokens.
    xb, yb = lm.batch(torch.tensor([0, 1]), "cpu", torch.float32)
    lm.loss(untied(xb), yb).backward()
    rows = torch.nonzero(untied.gpt.transformer.wte.weight.grad.abs().sum(1)).reshape(-1)
    assert set(rows.tolist()) == set(xb.unique().tolist())
    q = lm.evaluate(tied, "cpu", torch.float32, limit=16)
    starts = lm.eval_starts[:16, None] + torch.arange(lm.seq + 1)
    targets = lm.val[starts][:, 1:]
    nbytes = int(lm.token_bytes[targets].sum())
    assert abs(q["val_bits_per_byte"] - q["val_loss"] * targets.numel() / nbytes / math.log(2)) < 1e-9
    assert 8.5 < q["val_loss"] < 9.5  # about ln(8192) = 9.01 before training


def test_torchft_fragments_cover_every_parameter_once_in_order():
    import torchft_peer
    lm = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 50))
    lm[2].weight = lm[0].weight  # tied, as GPT-2's output layer
    for n in (1, 2, 3):
        parts = torchft_peer.fragments(lm, n)
        assert len(parts) == n
        got = [p for part in parts for p in part.parameters()]
        assert len(got) == len(list(lm.parameters())) and all(a is b for a, b in zip(got, lm.parameters()))
    assert torchft_peer.options("torchft:streaming:fragments=3,delay=1") == {"fragments": 3, "delay": 1}
    assert torchft_peer.options("torchft:diloco") == {"fragments": 1, "delay": 0}
    assert "multiple" in torchft_peer.problem("torchft:streaming:fragments=3", 16)
    with pytest.raises(ValueError, match="5 parameters"):
        torchft_peer.fragments(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.ReLU(),
                                                   torch.nn.Linear(2, 2, bias=False)), 6)


def test_bad_workloads_are_refused():
    for name in ["resnet9", "resnet", "vgg"]:
        with pytest.raises(ValueError, match="6n\\+2|unknown"):
            workloads.make(name)
    with pytest.raises(FileNotFoundError, match="python3.11-doc"):
        workloads.make("transformer", text="/nonexistent")
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        workloads.make("mlp", fashion="/nonexistent")
    for vocab in (100, 70000):
        with pytest.raises(ValueError, match="512..65536"):
            workloads.make("lm", vocab=vocab)


def _train(tmp_path, *args, env=None):
    out = tmp_path / "summary.json"
    cmd = [sys.executable, os.path.join(ROOT, "examples", "ddp_train.py"), "--workers", "2", "--epochs", "1",
           "--max-steps", "14", "--eval-items", "100", "--progress", "7", "--timeout", "240", "--json", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("workload,dtype,hook", [
    ("resnet8", "fp32", "sketchsgd:powersgd:rank=2,wire=fp16"),
    ("resnet8", "bf16", "topk:k=2000,momentum=0.9"),
    ("transformer", "bf16", "sketchsgd:powersgd:rank=2,wire=fp16"),
    ("transformer", "fp32", "powersgd:rank=2"),
])
def test_a_short_run_of_each_workload_trains_with_replicas_identical(tmp_path, workload, dtype, hook):
    """14 steps on 2 gloo ranks (10 plain all-reduces, then the hook), evaluated on 100 held-out
    items (a model in bfloat16 evaluates slowly on the CPU): the quality figure is there and finite, every replica holds the same parameters bit for bit, a model in bfloat16 too
    (its buckets go through the hook's float32 copy), and the hook's steps moved less than
    dense."""
    r = _train(tmp_path, "--workload", workload, "--dtype", dtype, "--hook", hook)
    assert r["replicas_identical"], r
    assert r["workload"] == workload and r["dtype"] == dtype
    metric = "val_loss" if workload == "transformer" else "test_accuracy"
    assert r["metric"] == metric and r["quality"] == r[metric]
    assert 0 < r[metric] < (8 if metric == "val_loss" else 1)
    assert r["steady_ratio"] > 4, r["steady_ratio"]
    width = 2 if dtype == "bf16" else 4
    assert r["dim"] * width / r["payload_bytes_per_round"] == pytest.approx(r["ratio"])  # dense in the model's dtype


@pytest.mark.parametrize("mode,hook,least", [("full", "sketchsgd:powersgd:rank=2,wire=fp16", 30), ("hsdp", "bf16", 1.99)])
def test_the_transformer_trains_under_fsdp2_with_each_reduction(tmp_path, mode, hook, least):
    """--fsdp full (4 ranks; 4 fp32 warm-up steps, then the codec compresses the reduce-scatter)
    and hsdp (2 × 2, FSDP2's own HSDP with bf16 reduce_dtype): a finite validation loss, every
    rank's model the same, and the gradient bytes a rank sends per step that much below the fp32
    model's (HSDP: a rank's half of it). Compressed replicas: test_fsdp.py."""
    r = _train(tmp_path, "--workload", "transformer", "--fsdp", mode, "--workers", "4", "--hook", hook,
               "--start-iter", "4")
    assert r["replicas_identical"] and r["fsdp"] == mode and r["replicas"] == (2 if mode == "hsdp" else None), r
    assert 0 < r["val_loss"] < 8
    share = 2 if mode == "hsdp" else 1  # under HSDP a rank reduces its half of the model
    assert r["dim"] * 4 / share / r["steady_payload_bytes_per_round"] > least, r


def test_a_simulated_job_is_the_gloo_job(tmp_path):
    """--simulate 3 (three threads of one process) against --workers 3 (gloo processes), a codec
    per step: the same bytes, and the same accuracy to float32's summation order (DiLoCo on a
    simulated group against gloo: tests/python/test_simulate.py)."""
    common = ["--workload", "mlp", "--workers", "3", "--max-steps", "20", "--eval-items", "2000", "--hook",
              "sparseloco:chunk=1024,k=16"]
    gloo = _train(tmp_path, *common)
    sim = _train(tmp_path, *common, "--simulate", "3")
    assert sim["simulated"] and not gloo["simulated"] and sim["workers"] == 3 and sim["replicas_identical"]
    assert sim["payload_bytes_per_round"] == gloo["payload_bytes_per_round"]
    assert sim["steady_link_bytes_per_round"] == gloo["steady_link_bytes_per_round"] > 0
    # sparseloco's messages are gathered (a rank's link carries W − 1 = 2 times them each way), the
    # biases sent whole summed (2(W − 1)/W = 4/3 times)
    link, payload = sim["steady_link_bytes_per_round"], sim["steady_payload_bytes_per_round"]
    assert 2 * 4 / 3 * payload < link < 2 * 2 * payload, (link, payload)
    assert sim["bf16_link_bytes_per_step"] == pytest.approx(2 * 2 * (2 / 3) * sim["dim"] * 2)
    assert abs(sim["test_accuracy"] - gloo["test_accuracy"]) <= 2 / 2000


def test_the_lm_trains_as_simulated_workers_with_sparseloco(tmp_path, lm_cache):
    """The GPT-2 workload, 3 simulated workers, DiLoCo's outer step as plain averaging of
    sparseloco's pseudo-gradients every 4 steps: replicas identical, the loss below its start."""
    r = _train(tmp_path, "--workload", "lm", "--simulate", "3", "--local", "4", "--hook", "sparseloco:chunk=1024,k=16",
               "--outer-lr", "1", "--outer-momentum", "0", "--warmup", "2", "--eval-items", "16", "--width", "64",
               "--depth", "1", "--heads", "2", "--seq", "32", "--lr", "0.01", env={"SKETCHSGD_CACHE": lm_cache})
    assert r["replicas_identical"] and r["metric"] == "val_loss" and r["simulated"], r
    assert r["val_loss"] < math.log(8192) - 0.2 and r["ratio"] > 100, r


@pytest.mark.parametrize("hook,least", [("sketchsgd:powersgd:rank=2,wire=fp16", 20.0), ("torch:average", 2.7),
                                       ("torchft:streaming:fragments=2", 2.5)])
def test_local_steps_sync_every_h_and_end_identical(tmp_path, hook, least):
    """--local 4 for 14 steps: DiLoCo with a codec (syncs after steps 4, 8, 12), PyTorch's
    PeriodicModelAverager (after 1, 5, 9, 13) or torchft's Streaming DiLoCo (fp32 pseudo-gradients
    of a half of the model at a time, after steps 2, 4, 6, ...; with one fragment it is torchft's
    DiLoCo); the example syncs once more before evaluating (torchft's: an fp32 average), so the
    replicas end identical, with the traffic of those syncs against 14 per-step DDP all-reduces."""
    r = _train(tmp_path, "--workload", "resnet8", "--local", "4", "--hook", hook)
    assert r["replicas_identical"] and r["local"] == 4, r
    assert r["ratio"] > least, r["ratio"]


def test_total_steps_run_over_as_many_epochs_as_they_take(tmp_path):
    """--total-steps 7 with 3-step epochs (--max-steps 3): epochs of 3, 3 and 1 steps, the steady
    link bytes counted over the steps past the warm-up, each epoch evaluated."""
    r = _train(tmp_path, "--simulate", "2", "--max-steps", "3", "--total-steps", "7", "--start-iter", "2",
               "--hook", "topk:k=1000,momentum=0.9")
    assert r["steps"] == 7 and r["epochs"] == 3 and len(r["epochs_log"]) == 3, r
    assert r["steady_link_bytes_per_round"] > 0
