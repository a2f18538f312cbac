"""Runs a function on W torch.distributed ranks (gloo on 127.0.0.1 or NCCL), each in its own
process, bounded in time; returns every rank's result or raises with every rank's error."""

import datetime
import faulthandler
import multiprocessing as mp
import os
import socket
import traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank, world, backend="gloo"):
    """The process group of a rank that run(..., init=False) started (the function's own call)."""
    import torch.distributed as dist
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def _rank_main(rank, world, port, backend, fn, args, queue, timeout, start):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    faulthandler.dump_traceback_later(max(timeout - 5, 1), exit=False)  # a hung rank shows where
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if start:
            init(rank, world, backend)
        result = fn(rank, world, *args)
        dist.barrier()  # gloo's shutdown can hang unless every rank got here
        queue.put((rank, True, result))
        code = 0
    except BaseException as e:  # reported to the parent, which decides
        queue.put((rank, False, (type(e).__name__, str(e), traceback.format_exc())))
        code = 1
    # Report, then leave without Python's teardown: in torch 1.13 a gloo process group freed at
    # exit can deadlock (its destructor joins a worker thread, holding the GIL, while that thread
    # frees a tensor that needs the GIL).
    queue.close()
    queue.join_thread()
    os._exit(code)


def run(fn, *args, world=4, backend="gloo", timeout=240, init=True):
    """fn(rank, world, *args) on each rank (a module-level function: processes are spawned; it
    returns plain data, NumPy arrays or bytes, not tensors, which would travel as shared memory
    that dies with the process).
    Returns [result of rank 0, …]; raises RuntimeError naming every rank's failure. A rank that
    does not report within timeout seconds is killed and reported. init=False: fn creates the
    process group itself (ddp.init), to test what happens before it exists."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, backend, fn, args, queue, timeout, init))
             for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    try:
        for _ in range(world):
            rank, ok, value = queue.get(timeout=timeout)
            (results if ok else errors)[rank] = value
    except Exception as e:  # queue.Empty after the timeout, or a result that did not unpickle
        missing = sorted(set(range(world)) - set(results) - set(errors))
        why = f"no report within {timeout} s" if type(e).__name__ == "Empty" else f"{type(e).__name__}: {e}"
        errors.update({r: ("NoReport", why, "") for r in missing})
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RankErrors(errors, results)
    return [results[r] for r in range(world)]


class RankErrors(RuntimeError):
    """Failures of some ranks: errors maps rank → (exception type name, message, traceback)."""

    def __init__(self, errors, results):
        self.errors, self.results = errors, results
        text = "\n".join(f"rank {r}: {t}: {m}\n{tb}" for r, (t, m, tb) in sorted(errors.items()))
        super().__init__(text)
