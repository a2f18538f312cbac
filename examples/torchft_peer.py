"""torchft's DiLoCo and Streaming DiLoCo (PyPI torchft) as peers of sketchsgd's DiLoCo in
examples/ddp_train.py --local H, on the same job, data order and byte accounting:

    --hook torchft:diloco                         every H steps, the whole model's fp32 pseudo-gradient
    --hook torchft:streaming:fragments=4,delay=0  F fragments, each synced once every H steps at
                                                  staggered steps (Streaming DiLoCo; delay: the steps
                                                  a fragment's all-reduce overlaps, τ)

Each worker is one torchft replica group of one rank: its own store and torchft Manager, the
replicas meeting through a Lighthouse the launching process runs (lighthouse()). The outer
optimizer is --outer-lr / --outer-momentum's Nesterov SGD, as ours. Payload: the bytes each
worker hands torchft's all-reduce (fp32 pseudo-gradients; its fp8 quantised all-reduce needs
Triton, a GPU, so it is not offered here). torchft binds its servers to every interface; here
they are bound to 127.0.0.1 (wrapped below), and its Rust logging is kept to warnings.
"""

import datetime
import os

import torch
from sketchsgd.torch import link_bytes
import torch.nn as nn

TIMEOUT = datetime.timedelta(seconds=120)


def options(hook: str) -> dict:
    """{"fragments": F, "delay": τ} of a torchft:diloco / torchft:streaming:... hook; raises
    ValueError with what is wrong."""
    name, _, given = hook[len("torchft:"):].partition(":")
    if name not in ("diloco", "streaming"):
        raise ValueError(f"--hook {hook}: torchft:diloco or torchft:streaming[:fragments=F,delay=D]")
    if name == "diloco" and given:
        raise ValueError(f"--hook {hook}: torchft:diloco takes no options (torchft:streaming takes fragments, delay)")
    opts = {"fragments": 1 if name == "diloco" else 4, "delay": 0}
    for item in filter(None, given.split(",")):
        key, eq, value = item.partition("=")
        if key not in ("fragments", "delay") or not eq or not value.isdigit():
            raise ValueError(f"--hook {hook}: {item!r}: fragments=F (≥ 2) and delay=D (≥ 0), integers")
        opts[key] = int(value)
    if name == "streaming" and opts["fragments"] < 2:
        raise ValueError(f"--hook {hook}: Streaming DiLoCo needs fragments ≥ 2 (1 is torchft:diloco)")
    return opts


def problem(hook: str, every: int):
    """What torchft's DiLoCo would refuse of this hook and H, or None."""
    try:
        opts = options(hook)
    except ValueError as e:
        return str(e)
    F, delay = opts["fragments"], opts["delay"]
    if every % F:
        return f"--hook {hook} with --local {every}: torchft needs H a multiple of the fragments ({F})"
    if delay >= every // F:
        return f"--hook {hook} with --local {every}: delay must be below H / fragments ({every // F})"
    return None


def lighthouse(workers: int):
    """The Lighthouse the replicas form their quorum through (127.0.0.1); .address(), .shutdown()."""
    os.environ.setdefault("RUST_LOG", "warn")
    from torchft._torchft import LighthouseServer
    return LighthouseServer(bind="127.0.0.1:0", min_replicas=workers)


class _Params(nn.Module):
    """A fragment: some of the model's parameters (shared, not copied)."""

    def __init__(self, params):
        super().__init__()
        self.params = nn.ParameterList(params)


def fragments(model: nn.Module, n: int):
    """The model's parameters in order, cut into n runs of about equal size (a tied weight once)."""
    if n == 1:
        return [model]
    params = list(model.parameters())
    if len(params) < n:
        raise ValueError(f"{n} fragments of a model of {len(params)} parameters")
    total, cuts, at = sum(p.numel() for p in params), [], 0
    for i, p in enumerate(params):
        at += p.numel()
        if len(cuts) < n - 1 and at >= total * (len(cuts) + 1) / n and len(params) - i - 1 >= n - 1 - len(cuts):
            cuts.append(i + 1)
    bounds = [0, *cuts, len(params)]
    return [_Params(params[a:b]) for a, b in zip(bounds, bounds[1:])]


def local_steps(args, model, opt, rank: int):
    """torchft's (Streaming) DiLoCo on this worker, hooked into opt.step(). Returns ((payload,
    link) bytes so far, what runs after each step and says whether a sync finished, the final averaging)."""
    os.environ.setdefault("RUST_LOG", "warn")
    import torch.distributed as dist
    import torchft.manager
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo
    serve = torchft.manager.ManagerServer
    torchft.manager.ManagerServer = lambda **kw: serve(**{**kw, "bind": kw["bind"].replace("[::]", "127.0.0.1")})
    opts = options(args.hook)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # this replica group's
    sent = {"bytes": 0, "link": 0.0}
    manager = Manager(
        pg=ProcessGroupGloo(timeout=TIMEOUT), min_replica_size=args.workers, use_async_quorum=False,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["opt"])),
        state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
        replica_id=f"rank{rank}", store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
        lighthouse_addr=args.lighthouse, port=0, hostname="127.0.0.1", timeout=TIMEOUT, quorum_timeout=TIMEOUT,
        connect_timeout=TIMEOUT)
    reduce = manager.allreduce

    def counted(t, *a, **k):
        sent["bytes"] += t.numel() * t.element_size()
        sent["link"] += sum(link_bytes("all_reduce", t.numel() * t.element_size(), args.workers))
        return reduce(t, *a, **k)
    manager.allreduce = counted
    parts = fragments(model, opts["fragments"])
    outer = [torch.optim.SGD(p.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                             nesterov=args.outer_momentum > 0) for p in parts]
    diloco = DiLoCo(manager, parts, opt, outer if len(outer) > 1 else outer[0], sync_every=args.local,
                    backup_device=torch.device("cpu"), pin_memory=False, fragment_sync_delay=opts["delay"])
    diloco.__enter__()  # its optimizer hooks stay for the whole run
    seen = {"step": 0, "alive": (store, manager, diloco)}  # the replica group's store must outlive this call

    def after():  # whether the whole model was just synced (never, with fragments synced apart)
        now = manager.current_step()
        synced, seen["step"] = now != seen["step"], now
        return synced and len(parts) == 1

    @torch.no_grad()
    def last_sync():
        """The replicas averaged (fp32, counted) before the evaluation, as ours syncs once more."""
        flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
        sent["bytes"] += flat.numel() * 4
        sent["link"] += sum(link_bytes("all_reduce", flat.numel() * 4, args.workers))
        dist.all_reduce(flat)
        flat /= args.workers
        at = 0
        for p in model.parameters():
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
    return (lambda: (sent["bytes"], sent["link"])), after, last_sync
