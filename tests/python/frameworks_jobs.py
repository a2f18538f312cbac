"""Rank functions of test_frameworks.py (module level, so spawned processes can import them): the
hook under Hugging Face Accelerate, Lightning and torch.compile, on the ranks ddp.run() starts
(gloo on 127.0.0.1, its process group already initialised)."""

import os

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from sketchsgd.torch import CompressionState, compression_hook


class MLP(nn.Module):
    """A model class of the user's (torch.compile skips frames of torch's own modules, such as
    nn.Sequential's forward, when it meets them outside a traced frame)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def net():
    torch.manual_seed(0)
    return MLP()


def dataset(n=256):
    """A separable 10-class problem, the same on every rank and in every process."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 32, generator=g)
    w = torch.randn(32, 10, generator=torch.Generator().manual_seed(7))
    return torch.utils.data.TensorDataset(x, (x @ w).argmax(1))


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().tobytes()


def launcher_env(rank, world):
    """What torchrun / `accelerate launch --cpu` put in each process's environment (ddp.run sets
    MASTER_ADDR and MASTER_PORT and initialises the process group; both tools then use it)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      NODE_RANK="0", OMP_NUM_THREADS="1")


# ---- Hugging Face Accelerate -------------------------------------------------------------------

def accelerate_job(rank, world, specs, steps, save_at, folder, resume):
    """Per spec, trains `steps` steps of one epoch under Accelerate: prepare(), the hook
    registered on the DDP module prepare() returns, its state registered for checkpointing.
    resume=False: save_state(folder/<i>) after step save_at, every process going on at once (no
    barrier after it); resume=True: a new job that load_state()s it and trains steps
    save_at..steps. Returns {spec: (parameters, the hook's stats,
    the prepared model's class, the distributed type, the number of processes)}."""
    launcher_env(rank, world)
    from accelerate import Accelerator

    out = {}
    for i, spec in enumerate(specs):
        accelerator = Accelerator(cpu=True)
        model = net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loader = torch.utils.data.DataLoader(dataset(), batch_size=16)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        state = CompressionState(spec)
        model.register_comm_hook(state, compression_hook)
        accelerator.register_for_checkpointing(state)

        step, batches = 0, loader
        if resume:
            accelerator.load_state(f"{folder}/{i}")
            step, batches = save_at, accelerator.skip_first_batches(loader, save_at)
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == save_at and not resume:
                accelerator.save_state(f"{folder}/{i}")
            if step == steps:
                break
        assert step == steps, step
        out[spec] = (flat(accelerator.unwrap_model(model)), state.stats(), type(model).__name__,
                     str(accelerator.distributed_type), accelerator.num_processes)
    return out


# ---- Lightning ---------------------------------------------------------------------------------

def _lightning_classes():
    import lightning.pytorch as pl

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net()

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def on_train_start(self):
            self.wrapped_in = type(self.trainer.strategy.model).__name__

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        def train_dataloader(self):  # Lightning puts a DistributedSampler in (shuffled, seeded per epoch)
            return torch.utils.data.DataLoader(dataset(), batch_size=16, shuffle=True)

    class SketchSGD(pl.Callback):
        """The recipe of docs/PYTORCH.md: registers the hook on the DDP module and checkpoints its
        state with the Trainer's checkpoints (Callback.state_dict runs on every rank)."""

        def __init__(self, spec):
            self.state = CompressionState(spec)

        def on_fit_start(self, trainer, pl_module):
            trainer.strategy.model.register_comm_hook(self.state, compression_hook)

        def state_dict(self):
            return self.state.state_dict()

        def load_state_dict(self, state_dict):
            self.state.load_state_dict(state_dict)

    return pl, Net, SketchSGD


def _trainer(pl, folder, callbacks, max_steps, strategy="ddp"):
    return pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=strategy, max_steps=max_steps,
                      callbacks=callbacks, default_root_dir=folder, logger=False, enable_progress_bar=False,
                      enable_model_summary=False)


def lightning_job(rank, world, specs, steps, every, folder, resume_from=None):
    """Per spec, fit() for `steps` steps with the SketchSGD callback and ModelCheckpoint every
    `every` steps (all kept) under folder/<i>; resume_from (a checkpoint's file name): a new job
    that resumes from folder/<i>/ckpt/<resume_from> with fit(ckpt_path=) and writes under
    folder/<i>/resumed. Returns {spec: (parameters, the hook's stats, the class of the strategy's
    model in training, the hook's iteration)}."""
    launcher_env(rank, world)
    pl, Net, SketchSGD = _lightning_classes()
    from lightning.pytorch.callbacks import ModelCheckpoint

    out = {}
    for i, spec in enumerate(specs):
        base = f"{folder}/{i}"
        root, ckpt_path = (f"{base}/resumed", f"{base}/ckpt/{resume_from}") if resume_from else (base, None)
        module, hook = Net(), SketchSGD(spec)
        checkpoints = ModelCheckpoint(dirpath=f"{root}/ckpt", every_n_train_steps=every, save_top_k=-1)
        trainer = _trainer(pl, root, [hook, checkpoints], steps)
        trainer.fit(module, ckpt_path=ckpt_path)
        assert trainer.global_step == steps, trainer.global_step
        out[spec] = (flat(module), hook.state.stats(), module.wrapped_in, hook.state.iteration)
    return out


def lightning_strategy_hook_on_cpu(rank, world, spec, steps, folder):
    """DDPStrategy(ddp_comm_state=, ddp_comm_hook=), Lightning's own registration: it registers
    only when the root device is CUDA. Returns the hook's stats and iteration after a CPU fit."""
    launcher_env(rank, world)
    pl, Net, _ = _lightning_classes()
    from lightning.pytorch.strategies import DDPStrategy

    state = CompressionState(spec)
    trainer = _trainer(pl, folder, [], steps, DDPStrategy(ddp_comm_state=state, ddp_comm_hook=compression_hook))
    trainer.fit(Net())
    return state.stats(), state.iteration


# ---- torch.compile -----------------------------------------------------------------------------

def compiled_job(rank, world, specs, steps, ways, find_unused_parameters=True):
    """Per spec and per (how, backend) in ways, trains `steps` steps of a DDP model with the
    hook: how="eager" (backend ignored), "outer" (torch.compile of the DDP module, the recipe) or
    "inner" (the model compiled, then wrapped). find_unused_parameters=True keeps the bucket
    layout DDP starts with; otherwise DDP lays its bucket out again after the first step in the
    order the gradients became ready, which differs between an eager and a compiled backward.
    Returns {(spec, how, backend): (parameters, losses, the hook's stats, graphs compiled,
    seconds)}."""
    import time

    from torch._dynamo.utils import counters
    out = {}
    x_all, y_all = dataset().tensors
    for spec in specs:
        for how, backend in ways:
            torch._dynamo.reset()
            counters.clear()
            m = net()
            ddp = DDP(torch.compile(m, backend=backend) if how == "inner" else m,
                      find_unused_parameters=find_unused_parameters)
            state = CompressionState(spec)
            ddp.register_comm_hook(state, compression_hook)
            model = torch.compile(ddp, backend=backend) if how == "outer" else ddp
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
            losses, start = [], time.monotonic()
            for step in range(steps):
                i = (step * world + rank) * 16
                loss = nn.functional.cross_entropy(model(x_all[i:i + 16]), y_all[i:i + 16])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            out[spec, how, backend] = (flat(m), losses, state.stats(), counters["stats"]["unique_graphs"],
                                       time.monotonic() - start)
    return out
