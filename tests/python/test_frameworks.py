"""The hook in the real frameworks (docs/PYTORCH.md's recipes, as written there): Hugging Face
Accelerate and Lightning on 2 gloo CPU ranks on 127.0.0.1, resuming from their own checkpoints
bit for bit, and torch.compile on a DDP model with the hook."""

import os

import numpy as np
import pytest
import torch

import ddp
import frameworks_jobs as jobs

SPECS = ["powersgd:rank=2,wire=fp16", "topk:k=50"]


def _workers_in(d, save_at):
    """The hook's state_dict that the main process wrote holds every rank's worker state, at
    the step of the save, and that state is not all zeros (error feedback to carry over)."""
    assert d["iteration"] == save_at
    assert sorted(d["workers"]) == [0, 1]
    assert any(t.numel() and t.any() for w in d["workers"].values() for t in w.values())


def _check_resumed(straight, resumed, specs, steps):
    for spec in specs:
        for r in range(2):
            assert resumed[r][spec][0] == straight[r][spec][0], f"{spec}: rank {r} resumed differs"
        assert straight[0][spec][0] == straight[1][spec][0], f"{spec}: replicas differ"
        stats = resumed[0][spec][1]
        assert stats["steps"] == steps and stats["compressed_steps"] == steps - 2, (spec, stats)


def test_accelerate_save_state_and_load_state_resume_bit_for_bit(tmp_path):
    """Accelerator(cpu=True) under a launcher's environment picks up the existing gloo group;
    prepare() makes a DistributedDataParallel, the hook goes on it and its state into
    register_for_checkpointing; save_state() after step 5 of 8 (every process calls the hook's
    state_dict(), the main one writes, and none waits for another after it), and a new job
    load_state()s it, skips the 5 batches and trains on: every rank's parameters equal the
    uninterrupted job's bit for bit."""
    pytest.importorskip("accelerate")
    folder = str(tmp_path)
    straight = ddp.run(jobs.accelerate_job, SPECS, 8, 5, folder, False, world=2, timeout=180)
    for spec in SPECS:
        _, _, kind, distributed, processes = straight[0][spec]
        assert (kind, distributed, processes) == ("DistributedDataParallel", "DistributedType.MULTI_CPU", 2)
    for i, _ in enumerate(SPECS):
        saved = os.listdir(f"{folder}/{i}")
        assert "custom_checkpoint_0.pkl" in saved and "random_states_1.pkl" in saved, saved
        _workers_in(torch.load(f"{folder}/{i}/custom_checkpoint_0.pkl", weights_only=True), 5)
    resumed = ddp.run(jobs.accelerate_job, SPECS, 8, 5, folder, True, world=2, timeout=180)
    _check_resumed(straight, resumed, SPECS, 8)


def test_lightning_modelcheckpoint_and_fit_ckpt_path_resume_bit_for_bit(tmp_path):
    """Trainer(accelerator="cpu", devices=2, strategy="ddp") under a launcher's environment
    (LOCAL_RANK set: Lightning starts no processes and uses the existing group); the SketchSGD
    callback registers the hook on trainer.strategy.model in on_fit_start and checkpoints its
    state; ModelCheckpoint every 4 steps over 16 steps (2 epochs, a shuffling
    DistributedSampler), then a new job fit(ckpt_path=) from the end of the first epoch: every
    rank's parameters equal the uninterrupted fit's bit for bit."""
    pytest.importorskip("lightning")
    folder = str(tmp_path)
    straight = ddp.run(jobs.lightning_job, SPECS, 16, 4, folder, world=2, timeout=240)
    for i, spec in enumerate(SPECS):
        assert straight[0][spec][2] == "DistributedDataParallel"
        names = sorted(os.listdir(f"{folder}/{i}/ckpt"))
        assert names == ["epoch=0-step=4.ckpt", "epoch=0-step=8.ckpt", "epoch=1-step=12.ckpt",
                         "epoch=1-step=16.ckpt"], names
        ckpt = torch.load(f"{folder}/{i}/ckpt/epoch=0-step=8.ckpt", weights_only=False)
        [key] = [k for k in ckpt["callbacks"] if "SketchSGD" in k]
        _workers_in(ckpt["callbacks"][key], 8)
    resumed = ddp.run(jobs.lightning_job, SPECS, 16, 4, folder, "epoch=0-step=8.ckpt", world=2, timeout=240)
    _check_resumed(straight, resumed, SPECS, 16)
    for spec in SPECS:
        assert resumed[0][spec][3] == 16  # the hook ran the resumed steps 8..16 itself


def test_lightning_ddpstrategy_registers_no_hook_on_cpu(tmp_path):
    """DDPStrategy(ddp_comm_state=, ddp_comm_hook=) registers the hook only when the root device
    is CUDA: on CPU the fit trains with plain all-reduces and never calls the hook (hence the
    callback of docs/PYTORCH.md)."""
    pytest.importorskip("lightning")
    for stats, iteration in ddp.run(jobs.lightning_strategy_hook_on_cpu, SPECS[1], 4, str(tmp_path), world=2,
                                    timeout=180):
        assert iteration == 0 and stats["steps"] == 0, stats


def test_torch_compile_equals_eager():
    """torch.compile of the DDP module with the hook registered (and of the model before
    wrapping): the hook runs on the gradients of the compiled backward. With the bucket layout
    held (find_unused_parameters=True), aot_eager (the same ATen kernels as eager) ends bit for
    bit where eager does; inductor's generated kernels round the gradients differently in the
    last bits, so its parameters differ from eager's by a few ulps, and replicas stay
    identical."""
    ways = [("eager", None), ("outer", "aot_eager"), ("inner", "aot_eager"), ("outer", "inductor")]
    results = ddp.run(jobs.compiled_job, SPECS, 8, ways, world=2, timeout=240)
    for spec in SPECS:
        eager = results[0][spec, "eager", None]
        for how, backend in ways:
            params, losses, stats, graphs, _ = results[0][spec, how, backend]
            assert results[1][spec, how, backend][0] == params, f"{spec} {how} {backend}: replicas differ"
            assert stats["compressed_steps"] == 6, (spec, how, backend, stats)
            assert graphs == (0 if how == "eager" else 1), (spec, how, backend, graphs)
            if backend == "inductor":
                got, want = np.frombuffer(params, np.float32), np.frombuffer(eager[0], np.float32)
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"{spec} {how} inductor")
                np.testing.assert_allclose(losses, eager[1], rtol=1e-5, err_msg=f"{spec} {how} inductor")
            else:
                assert params == eager[0] and losses == eager[1], f"{spec} {how} {backend}: differs from eager"


def test_torch_compile_with_the_layout_ddp_rebuilds():
    """Without find_unused_parameters, DDP lays its bucket out again after the first step in the
    order the gradients became ready, and a compiled backward hands them over in another order
    than eager's: top-k selects the same coordinates whatever their order (bit for bit with
    aot_eager); PowerSGD draws its first Q by position in the bucket, so it trains another
    trajectory, with replicas still identical."""
    ways = [("eager", None), ("outer", "aot_eager")]
    results = ddp.run(jobs.compiled_job, SPECS, 8, ways, False, world=2, timeout=240)
    for spec in SPECS:
        for how, backend in ways:
            assert results[1][spec, how, backend][0] == results[0][spec, how, backend][0], (spec, how)
            assert results[0][spec, how, backend][2]["compressed_steps"] == 6
    topk = SPECS[1]
    assert results[0][topk, "outer", "aot_eager"][0] == results[0][topk, "eager", None][0]
