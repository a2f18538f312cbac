"""W workers in one process: a group whose ranks are threads, for a job's codecs and averaging
run on one device (one GPU standing in for W workers, or a laptop's CPU).

    from sketchsgd.simulate import LocalGroup
    from sketchsgd.torch import CompressionState, average
    group = LocalGroup(4)

    def worker(rank):                       # rank: what process_group= takes
        state = CompressionState("sparseloco:chunk=4096,k=64", process_group=rank)
        grads = ...                         # this worker's tensors
        return average(state, grads)        # the mean, as the 4 workers' codecs make it

    means = group.run(worker)               # every rank's result, in rank order

A rank is given wherever a process group is (CompressionState, average(), DiLoCo): the
package's collectives then meet the other threads' in memory instead of torch.distributed, so
the codecs, their error feedback, the rounds and the byte counts are the distributed job's
(sums in rank order, in the wire's dtype). Not a process group: DDP, FSDP and torch.distributed's
own functions do not take it. Each rank must make the same calls in the same order, as
processes would; a rank that raises breaks the group's barrier, so the others raise at once
instead of waiting, and run() raises the failing rank's error.

The threads share what a process has one of: torch's default random generator above all. A
worker that seeds it and draws from it (a model's initialisation, dropout) does so under
`group.lock`, or uses a torch.Generator of its own, or its draws interleave with the others'.
"""

import copy
import math
import threading

import torch
import torch.distributed as dist

__all__ = ["LocalGroup", "Rank"]


class _Broken(RuntimeError):
    """A collective another rank left (it failed, or the group timed out)."""


class _Store:
    """The keys and values a simulated group's ranks leave for each other (what torch.distributed's
    store is to processes: the checkpoints' exchange of worker states goes through it). Plain
    Python: its users include daemon threads, which must not be inside C++ when the interpreter
    exits."""

    def __init__(self):
        self._kv, self._lock = {}, threading.Lock()

    def set(self, key: str, value):
        with self._lock:
            self._kv[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        with self._lock:
            return self._kv[key]

    def check(self, keys) -> bool:
        with self._lock:
            return all(k in self._kv for k in keys)

    def delete_key(self, key: str) -> bool:
        with self._lock:
            return self._kv.pop(key, None) is not None


class _Done:
    """A completed collective, as torch.distributed's async work looks."""

    def __init__(self, t):
        self._future = torch.futures.Future()
        self._future.set_result([t])

    def get_future(self):
        return self._future

    def wait(self):
        return True


class Rank:
    """One rank of a LocalGroup: its place in the group and its collectives (blocking until every
    rank has made the same call)."""

    backend = "local"

    def __init__(self, group: "LocalGroup", rank: int):
        self.group, self.rank, self.world = group, rank, group.world
        self.store, self.lock = group.store, group.lock
        self.name = f"local-{id(group):x}"

    def __repr__(self):
        return f"Rank({self.rank} of {self.world})"

    def barrier(self):
        """Returns once every rank has called it."""
        self.group._meet(self.rank, None, lambda xs: None)

    def all_reduce(self, t, async_op=True, op=None):
        """t becomes the sum over the ranks (in t's dtype, rank 0's value first), or with op
        torch.distributed.ReduceOp.MAX their largest."""
        largest = op is not None and op == dist.ReduceOp.MAX

        def total(ts):
            acc = ts[0].clone()
            for x in ts[1:]:
                if largest:
                    torch.maximum(acc, x, out=acc)
                else:
                    acc += x
            return acc
        t.copy_(self.group._meet(self.rank, t, total))
        return _Done(t)

    def all_gather(self, out, t, async_op=True):
        """out[r] becomes rank r's t."""
        if len(out) != self.world:
            raise ValueError(f"all_gather: {len(out)} outputs for {self.world} ranks")
        everyone = self.group._meet(self.rank, t, lambda ts: [x.clone() for x in ts])
        for o, x in zip(out, everyone):
            o.copy_(x)
        return _Done(out)

    def all_to_all(self, out, t, out_sizes, in_sizes, async_op=False):
        """out: from each rank r, in rank order, its part for this rank (t split by in_sizes, part
        s for rank s; out split by out_sizes)."""
        if len(out_sizes) != self.world or len(in_sizes) != self.world:
            raise ValueError(f"all_to_all: {len(out_sizes)} and {len(in_sizes)} sizes for {self.world} ranks")
        mine = list(t.split(list(in_sizes)))
        everyone = self.group._meet(self.rank, mine, lambda ranks: [[p.clone() for p in ps] for ps in ranks])
        if out.numel():
            torch.cat([everyone[r][self.rank] for r in range(self.world)], out=out)
        return _Done(out)

    def gathered(self, t):
        """(every rank's t in rank order, a completed work): one copy of each, shared read-only by
        every rank, where all_gather() copies W messages into each of W ranks (at W = 256 a top-k
        round's W² messages, gigabytes, for what a process holds once)."""
        everyone = self.group._meet(self.rank, t, lambda ts: [x.clone() for x in ts])
        return everyone, _Done(t)

    def once(self, fn):
        """Rank 0's fn(), handed to every rank: for what every rank would compute alike from the
        same inputs (a gathered round's update from every rank's message: W decodes a group where
        each rank's own would be W² at W ranks). Each rank passes its fn; only rank 0's runs. What
        it raises, every rank raises (a copy each), and the group goes on."""
        def run(fns):
            try:
                return True, fns[0]()
            except Exception as e:  # noqa: BLE001 - raised again on every rank below
                return False, e
        ok, out = self.group._meet(self.rank, fn, run)
        if not ok:
            raise copy.copy(out)
        return out

    def broadcast(self, t, root: int = 0):
        """t becomes rank root's t."""
        t.copy_(self.group._meet(self.rank, t, lambda ts: ts[root].clone()))
        return _Done(t)


class LocalGroup:
    """`world` ranks that are threads of this process (run() starts them). timeout: seconds a
    collective waits for the other ranks before the group gives up (every rank raises)."""

    def __init__(self, world: int, timeout: float = 600.0):
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world={world!r}: an int ≥ 1")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"timeout={timeout!r}: seconds, a finite number > 0")
        self.world, self.timeout = world, float(timeout)
        self.store = _Store()
        self._barrier = threading.Barrier(world, timeout=self.timeout)
        self._slots, self._result = [None] * world, None
        self._failed = False  # a rank raised: the others' collectives say so, not "timed out"
        self.lock = threading.Lock()  # for the ranks' work that must not interleave (seeding torch)
        self.ranks = [Rank(self, r) for r in range(world)]

    def _meet(self, rank: int, item, combine):
        """Every rank hands in item; once all have, rank 0 combines them (nobody changes theirs
        meanwhile) and every rank gets the result. The next meeting's writes wait for its first
        barrier, which a rank reaches only after reading this one's result."""
        self._slots[rank] = item
        self._wait(rank)
        if rank == 0:
            self._result = combine(self._slots)
        self._wait(rank)
        return self._result

    def _wait(self, rank: int):
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise _Broken(f"simulated rank {rank}: " + ("another rank failed" if self._failed else
                          f"the other ranks did not come within {self.timeout:g} s")) from None

    def run(self, fn, *args):
        """fn(rank, *args) on every rank, each in a thread of its own; their results in rank
        order. When a rank raises, the others' collectives raise too, and run() raises that
        rank's error (the lowest such rank's, if several failed on their own)."""
        self._barrier.reset()
        self._failed = False
        results, errors = [None] * self.world, [None] * self.world

        def body(r):
            try:
                results[r] = fn(self.ranks[r], *args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                errors[r] = e
                if not isinstance(e, _Broken):
                    self._failed = True
                self._barrier.abort()
        threads = [threading.Thread(target=body, args=(r,), name=f"sketchsgd-rank{r}") for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        own = [e for e in errors if e is not None and not isinstance(e, _Broken)]
        if own:
            raise own[0]
        if any(e is not None for e in errors):
            raise next(e for e in errors if e is not None)
        return results
