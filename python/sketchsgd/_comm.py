"""The communicator: a round's collectives on torch.distributed (gloo or NCCL) or on a simulated
group's threads (sketchsgd.simulate), the only module of the package that calls them. A round
asks for Sum (an all-reduce, in a wire dtype of its own), Gather (an all-gather) and Exchange
(an all-to-all of equal parts: the sparse all-reduce's); the
communicator issues them alone or, coalesced, laid end to end in one collective per kind and
dtype, casts, counts the bytes, and knows the backends' rules (where NCCL and gloo want a
tensor)."""

import hashlib
import threading

import torch
import torch.distributed as dist

from . import _int8
from ._traffic import Tally, ring


class Sum:
    """An all-reduce: t becomes the sum over the ranks; on the wire in dtype `wire` through
    `cast` (a tensor like t of that dtype, the round's own) when that is not t's dtype. int8:
    the scaled integers of _int8 (cast: int8, _int8.padded(n, columns) values), their groups' scales
    taken over `columns`."""

    def __init__(self, t, wire=None, cast=None, columns: int = 1):
        self.t, self.wire, self.cast, self.columns = t, wire if wire is not None else t.dtype, cast, columns
        self.kind, self.n = (Sum, self.wire, t.device), t.numel()  # read once: a round reuses its sums
        self.cast_needed = self.wire != t.dtype


class Gather:
    """An all-gather: afterwards `everyone` holds every rank's t, in rank order."""

    def __init__(self, t, everyone=None):
        self.t, self.everyone = t, everyone
        self.kind, self.n = (Gather, t.dtype, t.device), t.numel()


class Exchange:
    """An all-to-all of equal parts: parts[r] (uint8, all of one length) goes to rank r;
    afterwards `everyone` holds each rank's part for this one, in rank order. Always issued
    alone."""

    def __init__(self, parts):
        self.parts, self.everyone = parts, None
        self.kind, self.n = (Exchange, torch.uint8, parts[0].device), sum(p.numel() for p in parts)


def settled(buf):
    """Ends a callback that wrote buf on a GPU: waits for its stream. DDP gets the bucket through
    futures combined by collect_all, which carry no CUDA events, so nothing else would order
    DDP's reads of the bucket after this work (replicas drifted apart on a GPU without it)."""
    if buf.is_cuda:
        torch.cuda.current_stream(buf.device).synchronize()


def mean_factor(world: int) -> float:
    """float32(1/W), what the C++ aggregators multiply by, so every path averages alike."""
    return (torch.tensor(1.0, dtype=torch.float32) / world).item()


def simulated(group) -> bool:
    """Whether group is a rank of a simulated group (sketchsgd.simulate), not a process group."""
    from .simulate import Rank
    return isinstance(group, Rank)


def ready(group) -> bool:
    """Whether collectives over group can run now (torch.distributed initialised, or simulated)."""
    return simulated(group) or (dist.is_available() and dist.is_initialized())


class _Dist:
    """torch.distributed's collectives over one process group, as a simulated rank offers them."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.backend = dist.get_backend(group)
        self.name = "all" if group is None else ",".join(str(r) for r in dist.get_process_group_ranks(group))

    @property
    def store(self):
        return dist.distributed_c10d._get_default_store()

    def all_reduce(self, t, async_op=True, op=dist.ReduceOp.SUM):
        return dist.all_reduce(t, op=op, group=self.group, async_op=async_op)

    def all_gather(self, out, t, async_op=True):
        return dist.all_gather(out, t, group=self.group, async_op=async_op)

    def broadcast(self, t, root: int = 0):
        dist.broadcast(t, src=dist.get_global_rank(self.group, root) if self.group is not None else root,
                       group=self.group)

    def all_to_all(self, out, t, out_sizes, in_sizes, async_op=False):
        return dist.all_to_all_single(out, t, out_sizes, in_sizes, group=self.group, async_op=async_op)

    def reduce_scatter(self, out, t):
        # reduce_scatter_single since PyTorch 2.13, which deprecates reduce_scatter_tensor
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, t, group=self.group)


class Communicator:
    """Collectives over one process group (None: the default one; or a simulated group's rank),
    and the current step's bytes (a _traffic.Tally): what this rank handed to each collective,
    what its link carried for it, and the values the dense reduction it stands for would have
    reduced."""

    def __init__(self, group=None):
        if not ready(group):
            raise RuntimeError("CompressionState needs torch.distributed initialised (dist.init_process_group) "
                               "before its first hook call or checkpoint")
        self.group = group
        self.ops = group if simulated(group) else _Dist(group)
        self.world, self.rank, self.backend = self.ops.world, self.ops.rank, self.ops.backend
        self.shared = simulated(group)  # a gather's messages one copy for every rank (simulate.Rank.gathered)
        self.tally = Tally()
        self._lock = threading.Lock()  # bytes are counted from completion callbacks too
        self._rooms = {}               # coalesced phases' buffers, reused every step

    def count(self, kind: str, nbytes: int):
        """A collective of `kind` (_traffic.KINDS but all_to_all) to which this rank hands nbytes."""
        sent, received = ring(kind, nbytes, self.world)
        with self._lock:
            self.tally.add(kind, nbytes, sent, received)

    def count_dense(self, values: int):
        """The dense reduction a step's collectives stand for: `values` gradient values."""
        with self._lock:
            self.tally.dense += values

    def take_counts(self) -> Tally:
        """The step's tally; the next starts from zero."""
        with self._lock:
            tally, self.tally = self.tally, Tally()
        return tally

    def host(self, like):
        """Where a collective of host data (message bytes, lengths) goes: NCCL moves only device
        tensors, gloo takes CPU ones."""
        return like.device if self.backend in ("nccl", "local") else torch.device("cpu")

    def same_everywhere(self, text: str):
        """The ranks whose text differs from this rank's (a collective over digests)."""
        digest = torch.tensor(list(hashlib.sha256(text.encode()).digest()), dtype=torch.uint8)
        if self.backend == "nccl":
            digest = digest.cuda()
        everyone = [torch.empty_like(digest) for _ in range(self.world)]
        self.ops.all_gather(everyone, digest, async_op=False)
        return [r for r, d in enumerate(everyone) if not torch.equal(d, digest)]

    def broadcast(self, t, root: int = 0):
        """t from the group's rank root, in place."""
        self.ops.broadcast(t, root)

    def sum(self, t):
        """t summed over the ranks in place, blocking, its bytes not counted (the caller's)."""
        self.ops.all_reduce(t, async_op=False)

    def gather_lengths(self, mine, like):
        """Every rank's list of W byte counts (mine: this rank's), as lists in rank order: an
        all-gather, blocking."""
        t = torch.tensor(mine, dtype=torch.int64, device=self.host(like))
        everyone = [torch.empty_like(t) for _ in range(self.world)]
        self.count("all_gather", t.numel() * 8)
        self.ops.all_gather(everyone, t, async_op=False)
        return [e.tolist() for e in everyone]

    def exchange(self, parts, sizes, like):
        """parts[r] (uint8) to rank r, and from each rank r its part for this rank, of sizes[r]
        bytes, in rank order: an all-to-all, blocking. Counts every part, this rank's own too: the
        exchange's input, as a reduce-scatter's or an all-reduce's is counted whole; the link
        carries the W − 1 others each way."""
        on = self.host(like)
        out = torch.empty(sum(sizes), dtype=torch.uint8, device=on)
        payload = sum(p.numel() for p in parts)
        with self._lock:
            self.tally.add("all_to_all", payload, payload - parts[self.rank].numel(), sum(sizes) - sizes[self.rank])
        self.ops.all_to_all(out, torch.cat(parts).to(on), list(sizes), [p.numel() for p in parts])
        return list(out.split(list(sizes)))

    def reduce_scatter_sum(self, out, parts):
        """out = the sum over the ranks of their parts[rank] (parts: W tensors like out, or one
        of W times its values): a reduce-scatter, blocking, its bytes not counted (the
        caller's)."""
        self.ops.reduce_scatter(out, parts if torch.is_tensor(parts) else torch.cat(parts))

    def all_reduce_mean(self, buf):
        """buf's mean over the ranks (fp32 all-reduce, then float32(1/W)): a future of buf."""
        self.count("all_reduce", buf.numel() * 4)
        self.count_dense(buf.numel())
        inv = mean_factor(self.world)
        fut = self.ops.all_reduce(buf).get_future()
        return fut.then(lambda f: f.value()[0].mul_(inv))

    def issue(self, requests, flat=None):
        """Issues the collectives of requests; returns (pending, settle, more): once they have
        completed (pending.wait(), or pending.future), settle() makes the results whole that
        they cover. more is None, unless requests
        hold int8 sums (_Int8Sums), whose integers depend on their groups' scales: pending then
        covers their scales' max all-reduce too (issued now, beside the others), and more(),
        called once it has completed and settle() has run, issues the integers and returns
        (pending, settle, None) for them. A caller that does not wait calls more() in its turn
        (the scheduler's chain), so that every rank issues it in the same order. Alone (flat
        None), each request is one collective on its own tensor. flat (a phase's key,
        coalesced): one all-reduce per wire dtype and one all-gather per dtype, over the
        requests laid end to end in a buffer kept under that key (the requests come in unit
        order, the same on every rank), and the int8 sums' scales and integers one all-reduce
        each."""
        if len(requests) == 1 and type(requests[0]) is Sum and requests[0].wire is not torch.int8:
            # A phase's one sum (PowerSGD's factors, a dense unit), in its own dtype or a 16-bit
            # wire: the common case, in as few steps as it takes (FSDP runs it once per module a
            # step).
            r = requests[0]
            self.count("all_reduce", r.n * r.wire.itemsize)
            if not r.cast_needed:
                return Pending([self.ops.all_reduce(r.t)]), _nothing, None
            r.cast.copy_(r.t)
            return Pending([self.ops.all_reduce(r.cast)]), (lambda: r.t.copy_(r.cast)), None
        eights = [r for r in requests if isinstance(r, Sum) and r.wire == torch.int8]
        works, after = self._plain([r for r in requests if not (isinstance(r, Sum) and r.wire == torch.int8)], flat)
        if not eights:
            return (*_joined(works, after), None)
        sums = _Int8Sums(self, eights, flat)  # their scales' max all-reduce issued

        def more():
            return (*_joined(*sums.integers()), None)
        return (*_joined(works + sums.works, after), more)

    def _plain(self, requests, flat):
        """Issues requests (no int8 sums): (works, after), after the functions that make the
        results whole once the works have completed."""
        ops, W = self.ops, self.world
        works, after = [], []
        kinds = {}
        for r in requests:
            if isinstance(r, Exchange):
                works.append(self._exchange(r))
                continue
            kinds.setdefault(r.kind, []).append(r)
        for (kind, dtype, device), rs in kinds.items():
            n = sum(r.n for r in rs)
            self.count("all_gather" if kind is Gather else "all_reduce", n * dtype.itemsize)
            if len(rs) == 1 or flat is None:
                for r in rs:
                    if kind is Gather and self.shared:  # a simulated group's: read, never written
                        r.everyone, work = ops.gathered(r.t)
                        works.append(work)
                    elif kind is Gather:
                        r.everyone = [torch.empty_like(r.t) for _ in range(W)]
                        works.append(ops.all_gather(r.everyone, r.t))
                    elif not r.cast_needed:
                        works.append(ops.all_reduce(r.t))
                    else:
                        r.cast.copy_(r.t)
                        works.append(ops.all_reduce(r.cast))
                        after.append(lambda r=r: r.t.copy_(r.cast))
                continue
            buf = self._room((flat, kind.__name__, dtype, device), n, dtype, device)
            _lay(buf, [r.t for r in rs])
            if kind is Sum:
                works.append(ops.all_reduce(buf))
                after.append(lambda rs=rs, buf=buf: _unlay(buf, [r.t for r in rs]))
            else:
                outs = [self._room((flat, "everyone", r, dtype, device), n, dtype, device) for r in range(W)]
                works.append(ops.all_gather(outs, buf))
                at = 0
                for r in rs:
                    r.everyone = [o[at:at + r.t.numel()] for o in outs]
                    at += r.t.numel()
        return works, after

    def _exchange(self, r):
        """Issues an Exchange: its link carries the W − 1 parts that are not this rank's, each way."""
        part = r.parts[0].numel()
        with self._lock:
            self.tally.add("all_to_all", r.n, r.n - part, r.n - part)
        out = torch.empty(r.n, dtype=torch.uint8, device=r.parts[0].device)
        sizes = [part] * self.world
        work = self.ops.all_to_all(out, torch.cat(r.parts), sizes, sizes, async_op=True)
        r.everyone = list(out.split(part))
        return work

    def _room(self, key, n: int, dtype, device):
        t = self._rooms.get(key)
        if t is None or t.numel() != n:
            t = self._rooms[key] = torch.empty(n, dtype=dtype, device=device)
        return t


def _lay(buf, ts) -> None:
    """The tensors ts laid end to end into buf."""
    at = 0
    for t in ts:
        buf[at:at + t.numel()].copy_(t.view(-1))
        at += t.numel()


def _unlay(buf, ts) -> None:
    """The tensors ts read back from buf, where _lay put them."""
    at = 0
    for t in ts:
        t.view(-1).copy_(buf[at:at + t.numel()])
        at += t.numel()


def _nothing() -> None:
    pass


class Pending:
    """Collectives issued together: wait() for all of them on this thread, or their future
    (made when asked for), which completes with the last of them."""

    def __init__(self, works):
        self.works, self._future = works, None

    def wait(self) -> None:
        for w in self.works:
            w.wait()

    @property
    def future(self):
        if self._future is None:
            ws = self.works
            self._future = ws[0].get_future() if len(ws) == 1 else \
                torch.futures.collect_all([w.get_future() for w in ws])
        return self._future


def _joined(works, after):
    """(pending, settle) of collectives issued together (Pending); settle(), once they have
    completed, makes their results whole (after: functions to call)."""
    pending = Pending(works)

    def settle():
        if len(works) > 1 and pending._future is not None:
            # collect_all drops the collectives' CUDA events: order after them here (wait()
            # waited for each)
            for f in pending._future.value():
                f.wait()
        for a in after:
            a()
    return pending, settle


class _Int8Sums:
    """int8 Sums (_int8) in two steps: their groups' largest magnitudes agreed by a max
    all-reduce (issued when made: `works`), then, once that has completed, the integers rounded
    against them summed (integers()). Alone (flat None) each sum is two collectives of its own;
    coalesced, all of a phase's are two in all, the scales and the integers each laid end to end."""

    def __init__(self, comm, sums, flat):
        self.comm, self.sums, self.flat = comm, sums, flat
        self.level = _int8.levels(comm.world)
        self.groups = [_int8.Groups(r.t, r.columns) for r in sums]
        largest = [g.largest() for g in self.groups]
        comm.count("all_reduce", sum(m.numel() for m in largest) * 4)
        if flat is None or len(sums) == 1:
            self.largest = largest
            self.works = [comm.ops.all_reduce(m, op=dist.ReduceOp.MAX) for m in largest]
        else:
            on = largest[0].device
            buf = comm._room((flat, "int8 scales", on), sum(m.numel() for m in largest), torch.float32, on)
            _lay(buf, largest)
            self.largest = list(buf.split([m.numel() for m in largest]))
            self.works = [comm.ops.all_reduce(buf, op=dist.ReduceOp.MAX)]

    def integers(self):
        """Issues the integers' all-reduce (the scales' has completed): (works, after)."""
        comm, level = self.comm, self.level
        qs = [g.quantize(m, level, r.cast)[:g.n] for g, m, r in zip(self.groups, self.largest, self.sums)]
        comm.count("all_reduce", sum(g.n for g in self.groups))

        def back():
            for g, m, r in zip(self.groups, self.largest, self.sums):
                g.dequantize(r.cast, m, level, r.t)
        if self.flat is None or len(qs) == 1:
            return [comm.ops.all_reduce(q) for q in qs], [back]
        buf = comm._room((self.flat, "int8", qs[0].device), sum(q.numel() for q in qs), torch.int8, qs[0].device)
        _lay(buf, qs)
        return [comm.ops.all_reduce(buf)], [lambda: _unlay(buf, qs), back]
