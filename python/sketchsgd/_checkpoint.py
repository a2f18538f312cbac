"""A CompressionState's state_dict and its restoration; every rank's worker state gathered into
rank 0's without a collective (sketchsgd._exchange)."""

import ast
import time

import torch

from . import _core


def save(state, gather: bool) -> dict:
    """CompressionState.state_dict() (its docstring says what it holds)."""
    if not isinstance(gather, bool):
        raise TypeError(f"gather={gather!r}: expected True or False")
    state.bind()
    warm, units = state.units.state_dict()
    d = {"version": 1, "config": state.configuration, "rank": state.rank, "world_size": state.world_size,
         "iteration": state.iteration, "warm": warm, "units": units, "stats": state.counts()}
    if gather:
        mine = worker_states(units or {})
        if state.exchange is None:
            d["workers"] = {state.rank: mine}
        elif state.rank == 0:
            d["workers"] = state.exchange.collect(mine, state.iteration)
        else:
            state.exchange.offer(mine, state.iteration)
            d["workers"] = {state.rank: mine}
    return d


def worker_states(units: dict) -> dict:
    """unit index -> this rank's worker state (uint8) from a state_dict's units."""
    return {i: u["codec"]["state"].reshape(-1).cpu() if u["codec"] is not None else torch.empty(0, dtype=torch.uint8)
            for i, u in units.items()}


def snapshot(state, iteration: int, timeout: float):
    """This rank's worker states at the end of step `iteration` (for rank 0's checkpoint, called
    from the exchange's thread): waits while this rank is still in an earlier step; a string
    saying why when it has begun a later one."""
    deadline = time.monotonic() + timeout
    while True:
        with state.held() as (now, open_):
            if now == iteration and not open_:
                state.wait_inflight()
                return worker_states(save(state, gather=False)["units"] or {})
            if now > iteration or (now == iteration and open_):
                return (f"state_dict() on rank 0 at step {iteration}: rank {state.rank} has begun step "
                        f"{now + int(open_) - 1} (its worker state has changed). Let every "
                        "rank wait until rank 0 has saved (dist.barrier() after the save, as in PyTorch's "
                        "tutorial), or call state_dict() on every rank before the next step")
        if time.monotonic() > deadline:
            return (f"state_dict() on rank 0 at step {iteration}: rank {state.rank} is still at step "
                    f"{state.iteration} after {timeout:g} s")
        time.sleep(0.005)


def _told(config: str) -> str:
    """A state's configuration (CompressionState.configuration: the repr of its arguments' tuple) as
    the arguments that made it."""
    try:
        spec, start_iter, compress_1d, dense_below = ast.literal_eval(config)
    except (ValueError, SyntaxError, TypeError):
        return f" {config}"
    return f"({spec!r}, start_iter={start_iter}, compress_1d={compress_1d}, dense_below={dense_below})"


def load(state, d: dict) -> None:
    """CompressionState.load_state_dict()."""
    if not isinstance(d, dict) or d.get("version") != 1:
        raise ValueError("not a sketchsgd CompressionState state_dict")
    state.bind()
    if d["config"] != state.configuration:
        raise _core.ConfigMismatch(f"state_dict of a CompressionState{_told(d['config'])} loaded into "
                                   f"CompressionState{_told(state.configuration)}")
    if "world_size" in d and d["world_size"] != state.world_size:
        raise _core.ConfigMismatch(f"state_dict of a state whose process group held {d['world_size']} ranks loaded "
                                   f"into one over {state.world_size}")
    units = d["units"] or {}
    # Worker state (error feedback, momentum) belongs to its rank: this rank's part of a gathered
    # state_dict, or a state_dict this rank saved. Older state_dicts carry no rank and are taken
    # as they are.
    workers = d.get("workers")
    if workers is not None and state.rank in workers:
        mine = workers[state.rank]
        missing = [i for i, u in units.items() if u["codec"] is not None and i not in mine]
        if missing:
            raise ValueError(f"state_dict: no worker state of rank {state.rank} for units {missing}")
        units = {i: dict(u, codec=None if u["codec"] is None else dict(u["codec"], state=mine[i]))
                 for i, u in units.items()}
    elif "rank" in d and d["rank"] != state.rank and any(
            u["codec"] is not None and u["codec"]["state"].numel() for u in units.values()):
        held = f"ranks {sorted(workers)}" if workers is not None else f"rank {d['rank']} only"
        raise _core.ConfigMismatch(
            f"rank {state.rank} given a state_dict holding the worker state of {held}: load the group's rank 0's "
            "state_dict() (gathered: it holds every rank's) or each rank its own state_dict")
    state.units.check(d["warm"], units if d["units"] is not None else None)
    state.iteration = int(d["iteration"])
    state.units.load(d["warm"], units if d["units"] is not None else None)
    state.load_counts(d["stats"])
