"""A DDP communication hook for every sketchsgd codec, on torch.distributed (gloo or NCCL; CPU or
CUDA tensors):

    from sketchsgd.torch import CompressionState, compression_hook
    state = CompressionState(spec="sketch:rows=1,cols=200000,k=40000", process_group=None)
    ddp_model.register_comm_hook(state, compression_hook)

Per bucket, the gradients of tensors with two or more dimensions are compressed; 1-D tensors
(biases) and tensors below `dense_below` elements travel uncompressed in the same collective.
Codecs that work per tensor (powersgd) get the whole bucket with its tensors' shapes (a layout)
and choose themselves which tensors to factor; their result is written straight into the bucket.
Codecs whose payload sums (dense, sketch, powersgd) all-reduce it and every rank's copy of the C++
aggregator takes the sum in place of W messages; the others (topk, signsgd, terngrad, qsgd)
all-gather their messages and every rank aggregates all W. Every rank therefore ends with the
same averaged bucket, bit for bit.

Backward never waits for a bucket's collectives, except for the step's last bucket, when there is
no backward left to overlap. The hook issues a bucket's first collective and returns; a
collective that depends on an earlier one (the second all-reduce of sketch p2 and powersgd, a
gathered codec's messages after their lengths) is issued from the earlier one's completion
callback, in a chain the hook waits for before its next collective, so every rank issues them in
the same order. So the next bucket's backward overlaps the first collective (and the hook for
that bucket waits only if the collective took longer than that bucket's backward).

CompressionState(coalesce=True) trades that overlap for fewer collectives: each bucket is encoded
in its own call, and the step's last bucket issues every unit's collectives of a phase at once,
laid end to end (one all-reduce per wire dtype, one all-gather per dtype), so a step issues as
many collectives as with the model in one bucket. Where every collective costs latency and CPU
time on busy cores, that is faster (docs/BENCHMARKS.md); with 2 ranks the results are those of
the overlapped hook bit for bit (with more, the sums' order in the ring differs).

Budget rule: options `k` and `cols` in the spec are budgets for the whole model. Bucket b, holding
n_b of the model's N compressed coordinates, gets round(value · n_b / N) (at least 1); 0
(automatic) stays automatic per bucket. Other options apply to every bucket as written.

Warm-up: the first `start_iter` (≥ 2) synchronised steps are plain fp32 all-reduces, past DDP's
bucket rebuild after the first step; they also fix each bucket's layout and N.

A NaN or ±Inf in a rank's compressed gradients: that rank's hook raises NonFiniteError (naming
the coordinate; its codec state as before), and it still joins the step's first collective, so
that every other rank's hook raises NonFiniteError too instead of waiting for it; the step has
no update anywhere, and the next one goes on alike on every rank.
"""

import hashlib
import math
import threading
import time

import torch
import torch.distributed as dist

from . import _core
from ._checkpoint import Exchange
from ._compressor import Compressor

__all__ = ["CompressionState", "DiLoCo", "FlatBucket", "compression_hook"]

def _checked_spec(spec: str) -> str:
    """The canonical form of a spec, checked by the C++ registry (InvalidArgument naming the
    problem)."""
    if not isinstance(spec, str) or not spec.strip():
        raise TypeError(f"spec: expected a codec spec string such as 'sketch:k=1000', got {spec!r}")
    return _core.share_spec(spec)


class _Unit:
    """The unit of compression: the parameters of one DDP bucket as it stood at the end of the
    warm-up, as (key, numel, compressed) in bucket order; keys number parameters in the order DDP
    first showed them (its initial bucket: the model's order), so they are the same in a resumed
    job. It owns the codec (worker state) and this rank's replica of the aggregator. A later
    bucket holds one or more whole units: the same bucket after the warm-up, or DDP's initial
    single bucket right after a resume."""

    def __init__(self, index: int, entries):
        self.index = index
        self.entries = [tuple(e) for e in entries]
        self.n_compressed = sum(n for _, n, c in self.entries if c)
        self.n_dense = sum(n for _, n, c in self.entries if not c)
        self.codec = self.aggregator = None
        self.summable = self.dense = False
        self._room = {}  # name -> tensor reused every step (large fresh buffers cost page faults)

    def room(self, name: str, n: int, like):
        """A float32 tensor of n values on like's device, the same one every step: a unit's
        futures complete before DDP calls the hook for it again, so nothing still reads it."""
        t = self._room.get(name)
        if t is None or t.numel() != n or t.device != like.device:
            t = self._room[name] = torch.empty(n, dtype=torch.float32, device=like.device)
        return t

    def build(self, spec: str, device, world: int, pending=None, shapes=None):
        if self.n_compressed and self.codec is None:
            self.dense = spec.partition(":")[0] == "dense"
            layout = [shapes[k] for k, _, c in self.entries if c] if shapes is not None else None
            self.codec = Compressor(spec, self.n_compressed, device, layout=layout)
            self.aggregator = self.codec.make_aggregator(world)
            self.summable = self.codec.sum_size("gradient") > 0
            if pending is not None:
                self.codec.load_state_dict(pending["codec"])
                self.aggregator.load_state_dict(pending["aggregator"])

    def room16(self, name: str, n: int, dtype, like):
        """As room(), in another dtype (a payload cast for a 16-bit all-reduce)."""
        key = (name, dtype)
        t = self._room.get(key)
        if t is None or t.numel() != n or t.device != like.device:
            t = self._room[key] = torch.empty(n, dtype=dtype, device=like.device)
        return t

    def segments(self, where, compressed: bool):
        """(offset, numel) in the bucket's buffer of this unit's compressed or dense parameters,
        adjacent ones merged (a unit that is the whole bucket is one view: no copies)."""
        return _core.merge_runs([(where[k], n) for k, n, c in self.entries if c == compressed])


def _gather(buf, segments, out=None):
    if len(segments) == 1:
        o, n = segments[0]
        return buf[o:o + n]
    return torch.cat([buf[o:o + n] for o, n in segments], out=out)


def _scatter(buf, segments, values):
    at = 0
    for o, n in segments:
        buf[o:o + n].copy_(values[at:at + n])
        at += n


class CompressionState:
    """State of compression_hook for one DDP model: the spec, per-bucket codecs keyed by bucket
    index, the warm-up and the traffic statistics. Build it on every rank with the same
    arguments (checked: a collective over the process group, at construction when
    torch.distributed is initialised, else at the first hook call; so it can be made before the
    process group, as Lightning's DDPStrategy(ddp_comm_state=...) needs).

    spec:         any sketchsgd codec spec (sketchsgd.describe() lists them).
    start_iter:   plain all-reduce steps first (≥ 2: DDP rebuilds its buckets after step 1).
    compress_1d:  also compress 1-D tensors (biases); default: they go uncompressed.
    dense_below:  tensors with fewer elements go uncompressed too.
    coalesce:     True: a step's collectives wait for its last bucket and go out together, one
                  a phase (per dtype) for the whole model, as with the model in one bucket: a
                  collective's latency paid once a phase instead of once a bucket, none of them
                  overlapping backward (docs/BENCHMARKS.md measures both). Each bucket's
                  encoding still runs in its own hook call.
    (Codecs that work per tensor, powersgd, get every tensor with its shape and apply their own
    rule instead: 1-D tensors and matrices not worth factoring travel uncompressed.)
    """

    def __init__(self, spec: str, process_group=None, start_iter: int = 2, compress_1d: bool = False,
                 dense_below: int = 0, coalesce: bool = False, checkpoint_timeout: float = 30.0):
        self._configure(spec, process_group, start_iter, compress_1d, dense_below, coalesce, check_ranks=True,
                        checkpoint_timeout=checkpoint_timeout)

    def _configure(self, spec, process_group, start_iter, compress_1d, dense_below, coalesce, check_ranks: bool,
                   checkpoint_timeout: float = 30.0):
        """The state for these arguments. With torch.distributed initialised it binds to the
        process group now (and, check_ranks, compares the configuration over it: a collective);
        else at the first hook call, which every rank makes for the same bucket (Lightning's
        DDPStrategy takes the state before it creates the process group)."""
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 2:
            raise ValueError(f"start_iter={start_iter!r}: must be an int ≥ 2 (DDP rebuilds buckets after the first step)")
        if isinstance(dense_below, bool) or not isinstance(dense_below, int) or dense_below < 0:
            raise ValueError(f"dense_below={dense_below!r}: must be an int ≥ 0")
        if not isinstance(coalesce, bool):
            raise TypeError(f"coalesce={coalesce!r}: expected True or False")
        if isinstance(checkpoint_timeout, bool) or not isinstance(checkpoint_timeout, (int, float)) or \
                not 0 < checkpoint_timeout < math.inf:
            raise ValueError(f"checkpoint_timeout={checkpoint_timeout!r}: seconds, a finite number > 0")
        self.checkpoint_timeout = float(checkpoint_timeout)
        self._exchange = None    # worker states for rank 0's checkpoints (_checkpoint.Exchange)
        self._open = False       # a step's hook calls have begun and its last has not ended
        self._inflight = []      # this step's futures (a snapshot waits for them)
        self._step_lock = threading.Lock()
        self.process_group = process_group
        self.world_size = self.rank = self.backend = None
        self.spec = spec.strip() if isinstance(spec, str) else spec
        self.start_iter = start_iter
        self.compress_1d = bool(compress_1d)
        self.dense_below = dense_below
        self.coalesce = coalesce
        self._ranks_checked = False
        # Every rank must run the same configuration: compare digests before anything can fail
        # on one rank alone, then raise on every rank alike.
        if dist.is_available() and dist.is_initialized():
            self._bind()
            if check_ranks:
                self._check_ranks()
        self._name, _, given = _checked_spec(self.spec).partition(":")
        options = dict(item.split("=", 1) for item in given.split(",") if item)  # canonical: every key
        # Codecs that work per tensor (powersgd) get every tensor of a unit with its shape and
        # decide themselves what stays uncompressed.
        self._uses_layout = next(c["layout"] for c in _core.codecs() if c["name"] == self._name) == "required"
        if "layout" in options:
            raise ValueError("sketchsgd hook: the hook gives the codec its layout (the bucket's tensors): "
                             "leave layout= out of the spec")
        self._shapes = {}        # key -> shape of the parameter's gradient
        self.iteration = 0
        self._keys = {}          # id(parameter) -> key, in the order DDP first showed them
        self._warm = {}          # bucket index -> unit entries, from the latest warm-up step
        self._units = None       # unit index -> _Unit, fixed when the warm-up ends
        self._pending = {}       # unit index -> states from load_state_dict()
        self._checked = False
        self._blocking = False   # every unit finishes in its hook call (the outer loop; no overlap)
        self._held = []          # coalesce: this step's (round, future) so far, in unit order
        self._rooms = {}         # coalesce: a phase's collectives laid end to end, reused every step
        self._wide = {}          # bucket index -> float32 copy of a half-precision bucket
        self._whole = {}         # parameter key -> sent uncompressed (the small-tensor rule)
        self._step_bytes = 0     # this step's payload so far (counted from callbacks too: _lock)
        self._lock = threading.Lock()
        # Completed once every collective chained so far (a unit's second phase, issued from the
        # first one's callback) has been issued; the hook waits for it before issuing its own.
        self._chain = torch.futures.Future()
        self._chain.set_result(None)
        self._dense_step_bytes = 0
        self._stats = {"steps": 0, "compressed_steps": 0, "payload_bytes": 0, "dense_bytes": 0,
                       "last_payload_bytes": 0, "last_dense_bytes": 0}

    # ---- the process group and checks -----------------------------------------------------------
    def _bind(self):
        """Reads the process group: rank, world size, backend (no collective)."""
        if self.backend is not None:
            return
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("CompressionState needs torch.distributed initialised (dist.init_process_group) "
                               "before its first hook call or checkpoint")
        self.world_size = dist.get_world_size(self.process_group)
        self.rank = dist.get_rank(self.process_group)
        self.backend = dist.get_backend(self.process_group)
        if self.world_size > 1:
            digest = hashlib.sha256(self._config().encode()).hexdigest()[:16]
            self._exchange = Exchange(self, self.process_group, self.rank, self.world_size, digest,
                                      self.checkpoint_timeout)


    def _check_ranks(self):
        """Once: every rank's configuration is this one (a collective)."""
        if not self._ranks_checked:
            self._check_same_on_every_rank(self._config() + repr(self.coalesce))
            self._ranks_checked = True

    def _check_same_on_every_rank(self, text: str):
        digest = torch.tensor(list(hashlib.sha256(text.encode()).digest()), dtype=torch.uint8)
        if self.backend == "nccl":
            digest = digest.cuda()
        everyone = [torch.empty_like(digest) for _ in range(self.world_size)]
        dist.all_gather(everyone, digest, group=self.process_group)
        differ = [r for r, d in enumerate(everyone) if not torch.equal(d, digest)]
        if differ:
            raise ValueError(f"rank {self.rank}: CompressionState(spec={self.spec!r}, ...) differs from ranks "
                             f"{differ}: every rank must use the same spec and options")

    def _check_bucket(self, buf):
        if buf.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"sketchsgd hook: bucket of dtype {buf.dtype}; the codecs take float32 gradients "
                            "(float16 and bfloat16 buckets are widened to it)")
        if self._checked:
            return
        if buf.device.type == "cuda" and not _core.cuda_build:
            raise ValueError("sketchsgd hook: CUDA gradients, but this sketchsgd build has no CUDA")
        if self.backend == "nccl" and buf.device.type != "cuda":
            raise ValueError("sketchsgd hook: NCCL needs CUDA tensors; use gloo for a model on the CPU")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"sketchsgd hook: backend {self.backend!r} is not supported (gloo or nccl)")
        self._checked = True

    def _widened(self, index: int, buf):
        """A float32 copy of a half-precision bucket, the same tensor every step: the codecs and
        the collectives see float32 whatever the model's precision (gloo has no bfloat16 sum)."""
        t = self._wide.get(index)
        if t is None or t.numel() != buf.numel() or t.device != buf.device:
            t = self._wide[index] = torch.empty(buf.numel(), dtype=torch.float32, device=buf.device)
        return t.copy_(buf)

    # ---- buckets and units ----------------------------------------------------------------------
    def _entries(self, bucket):
        """(key, numel, compressed) per gradient of the bucket, and key -> offset in its buffer."""
        grads, params = bucket.gradients(), bucket.parameters()
        if len(params) != len(grads):
            raise RuntimeError(f"bucket {bucket.index()}: {len(grads)} gradients for {len(params)} parameters")
        entries, where, offset = [], {}, 0
        for p, g in zip(params, grads):
            key = self._keys.setdefault(id(p), len(self._keys))
            self._shapes[key] = tuple(g.shape)
            n = g.numel()
            dense = self._whole.get(key)
            if dense is None:  # the library's small-tensor rule (compress_1d: 1-D tensors count as matrices)
                dims = max(g.dim(), 2) if self.compress_1d else g.dim()
                dense = self._whole[key] = not self._uses_layout and _core.sent_whole(dims, n, self.dense_below)
            entries.append((key, n, not dense))
            where[key] = offset
            offset += n
        if offset != bucket.buffer().numel():
            raise RuntimeError(f"bucket {bucket.index()}: gradients hold {offset} values, its buffer {bucket.buffer().numel()}")
        return entries, where

    def _fix_units(self):
        self._units = {i: _Unit(i, e) for i, e in sorted(self._warm.items())}
        self._warm = {}

    def _units_of(self, bucket, buf):
        """The units this bucket holds (whole), built on first use, and its key -> offset map."""
        entries, where = self._entries(bucket)
        keys = {k for k, _, _ in entries}
        held = [u for u in self._units.values() if u.entries and u.entries[0][0] in keys]
        if sorted(k for u in held for k, _, _ in u.entries) != sorted(keys) or any(
                (k, n, c) not in entries for u in held for k, n, c in u.entries):
            raise RuntimeError(f"sketchsgd hook: bucket {bucket.index()} does not hold whole buckets of the "
                               "warm-up (DDP changed its buckets later: raise start_iter, or a resumed model differs)")
        total = sum(u.n_compressed for u in self._units.values())
        for u in held:
            if u.codec is None and u.n_compressed:
                spec = _core.share_spec(self.spec, u.n_compressed / total)
                u.build(spec, buf.device, self.world_size, self._pending.pop(u.index, None),
                        self._shapes if self._uses_layout else None)
        return held, where

    # ---- coalesced steps ------------------------------------------------------------------------
    def _hold(self, rounds, last: bool):
        """coalesce: keeps a bucket's rounds until the step's last bucket, whose call runs them all
        (_together). Returns their futures. A unit already held belongs to a step that never
        reached its last bucket (an error in between): that step's units fail and are dropped."""
        held = {rnd.index for rnd, _ in self._held}
        if any(rnd.index in held for rnd in rounds):
            stale, self._held = self._held, []
            for _, out in stale:
                out.set_exception(RuntimeError("sketchsgd hook: the step ended before its last bucket"))
        futures = [torch.futures.Future() for _ in rounds]
        self._held += zip(rounds, futures)
        if last:
            step, self._held = sorted(self._held, key=lambda h: h[0].index), []
            _together(self, step)
        return futures

    def _room(self, key, n: int, dtype, device):
        """A tensor of n values kept under key and reused every step (as _Unit.room)."""
        t = self._rooms.get(key)
        if t is None or t.numel() != n:
            t = self._rooms[key] = torch.empty(n, dtype=dtype, device=device)
        return t

    # ---- statistics ---------------------------------------------------------------------------
    def _count(self, payload: int, dense: int):
        with self._lock:
            self._step_bytes += payload
            self._dense_step_bytes += dense

    def _end_step(self, compressed: bool):
        self._chain.wait()  # the step's last phases are issued (and counted)
        s = self._stats
        s["steps"] += 1
        s["compressed_steps"] += int(compressed)
        s["payload_bytes"] += self._step_bytes
        s["dense_bytes"] += self._dense_step_bytes
        s["last_payload_bytes"] = self._step_bytes
        s["last_dense_bytes"] = self._dense_step_bytes
        self._step_bytes = self._dense_step_bytes = 0
        with self._step_lock:
            self.iteration += 1
            self._open = False

    def _begin_call(self):
        """A hook call begins: the first of a step opens it (checkpoints wait or refuse meanwhile)."""
        with self._step_lock:
            if not self._open:
                self._open, self._inflight = True, []

    def stats(self) -> dict:
        """Payload bytes this rank contributed to the collectives (an all-reduce of n floats
        counts 4n bytes, an all-gather the rank's own padded message), against dense fp32."""
        s = dict(self._stats)
        s["ratio"] = s["dense_bytes"] / s["payload_bytes"] if s["payload_bytes"] else 0.0
        s["last_ratio"] = s["last_dense_bytes"] / s["last_payload_bytes"] if s["last_payload_bytes"] else 0.0
        return s

    # ---- checkpoints --------------------------------------------------------------------------
    def _config(self):
        return repr((self.spec, self.start_iter, self.compress_1d, self.dense_below))

    def state_dict(self, gather: bool = True) -> dict:
        """Everything but the process group: the iteration, the units with their aggregator state
        (the same on every rank) and this rank's worker state (error feedback, momentum), the
        statistics.

        gather=True (the default): the dict of the group's rank 0 also holds every other rank's
        worker state ("workers"), so the one file rank 0 writes restores every rank
        (load_state_dict() takes its own rank's part). It is no collective: the other ranks hand
        their state over from a thread while they wait (PyTorch's tutorial: rank 0 alone saves,
        the others wait in a barrier), or leave it in the store when they call state_dict()
        themselves at that step (Accelerate, Lightning: then they may go on at once). A rank that
        has begun the next step without either makes rank 0 raise ProtocolError naming it, at
        once; a rank that never answers, TimeoutError after checkpoint_timeout seconds. The
        other ranks' dicts hold their own. gather=False: this rank's alone, nothing asked of or
        left for the others."""
        if not isinstance(gather, bool):
            raise TypeError(f"gather={gather!r}: expected True or False")
        self._bind()
        units = {}
        for i, u in (self._units or {}).items():
            units[i] = {"entries": [list(e) for e in u.entries],
                        "codec": u.codec.state_dict() if u.codec else None,
                        "aggregator": u.aggregator.state_dict() if u.codec else None}
            if u.codec is None and i in self._pending:
                units[i].update(self._pending[i])
        d = {"version": 1, "config": self._config(), "rank": self.rank, "world_size": self.world_size,
             "iteration": self.iteration,
             "warm": {i: [list(e) for e in es] for i, es in self._warm.items()},
             "units": units if self._units is not None else None, "stats": dict(self._stats)}
        if gather:
            mine = self._worker_states(units)
            if self._exchange is None:
                d["workers"] = {self.rank: mine}
            elif self.rank == 0:
                d["workers"] = self._exchange.collect(mine, self.iteration)
            else:
                self._exchange.offer(mine, self.iteration)
                d["workers"] = {self.rank: mine}
        return d

    @staticmethod
    def _worker_states(units: dict) -> dict:
        """unit index -> this rank's worker state (uint8) from a state_dict's units."""
        return {i: u["codec"]["state"].reshape(-1).cpu() if u["codec"] is not None else torch.empty(0, dtype=torch.uint8)
                for i, u in units.items()}

    def worker_snapshot(self, iteration: int, timeout: float):
        """This rank's worker states at the end of step `iteration` (for rank 0's checkpoint,
        called from the exchange's thread): waits while this rank is still in an earlier step;
        a string saying why when it has begun a later one."""
        deadline = time.monotonic() + timeout
        while True:
            with self._step_lock:
                if self.iteration == iteration and not self._open:
                    torch.futures.wait_all(self._inflight)
                    return self._worker_states(self.state_dict(gather=False)["units"] or {})
                if self.iteration > iteration or (self.iteration == iteration and self._open):
                    return (f"state_dict() on rank 0 at step {iteration}: rank {self.rank} has begun step "
                            f"{self.iteration + int(self._open) - 1} (its worker state has changed). Let every "
                            "rank wait until rank 0 has saved (dist.barrier() after the save, as in PyTorch's "
                            "tutorial), or call state_dict() on every rank before the next step")
            if time.monotonic() > deadline:
                return (f"state_dict() on rank 0 at step {iteration}: rank {self.rank} is still at step "
                        f"{self.iteration} after {timeout:g} s")
            time.sleep(0.005)

    def load_state_dict(self, d: dict) -> None:
        """Restores state_dict() (this rank's own, or one holding every rank's worker state: the
        group's rank 0's gathered one); the hook then continues as the saved job would have, also
        through DDP's initial bucket of a new DDP model."""
        if not isinstance(d, dict) or d.get("version") != 1:
            raise ValueError("not a sketchsgd CompressionState state_dict")
        self._bind()
        if d["config"] != self._config():
            raise _core.ConfigMismatch(f"state_dict of {d['config']} loaded into {self._config()}")
        if "world_size" in d and d["world_size"] != self.world_size:
            raise _core.ConfigMismatch(f"state_dict of a job of {d['world_size']} ranks loaded into one of "
                                       f"{self.world_size}")
        units = d["units"] or {}
        # Worker state (error feedback, momentum) belongs to its rank: this rank's part of a
        # gathered state_dict, or a state_dict this rank saved. Older state_dicts carry no rank
        # and are taken as they are.
        workers = d.get("workers")
        if workers is not None and self.rank in workers:
            mine = workers[self.rank]
            missing = [i for i, u in units.items() if u["codec"] is not None and i not in mine]
            if missing:
                raise ValueError(f"state_dict: no worker state of rank {self.rank} for units {missing}")
            units = {i: dict(u, codec=None if u["codec"] is None else dict(u["codec"], state=mine[i]))
                     for i, u in units.items()}
        elif "rank" in d and d["rank"] != self.rank and any(
                u["codec"] is not None and u["codec"]["state"].numel() for u in units.values()):
            held = f"ranks {sorted(workers)}" if workers is not None else f"rank {d['rank']} only"
            raise _core.ConfigMismatch(
                f"rank {self.rank} given a state_dict holding the worker state of {held}: load the group's rank 0's "
                "state_dict() (gathered: it holds every rank's) or each rank its own state_dict")
        self.iteration = int(d["iteration"])
        self._warm = {int(i): [tuple(e) for e in es] for i, es in d["warm"].items()}
        self._units, self._pending = None, {}
        if d["units"] is not None:
            self._units = {int(i): _Unit(int(i), u["entries"]) for i, u in units.items()}
            self._pending = {int(i): {"codec": u["codec"], "aggregator": u["aggregator"]}
                             for i, u in units.items() if u["codec"] is not None}
        self._stats = dict(d["stats"])

    def __getstate__(self):
        """Pickling (torch.save(state)): the configuration and this rank's state_dict (no
        collective: one rank may pickle alone); the process group is dropped and, when loaded,
        the default group is used (as PyTorch's PowerSGDState does). Each rank saves and loads
        its own (its worker state)."""
        return {"args": (self.spec, self.start_iter, self.compress_1d, self.dense_below),
                "coalesce": self.coalesce, "state": self.state_dict(gather=False)}

    def __setstate__(self, d):
        spec, start_iter, compress_1d, dense_below = d["args"]
        # No collective here: one rank may load alone; the ranks' configurations are compared at
        # the first hook call, and the saved rank is checked against this one.
        self._configure(spec, None, start_iter, compress_1d, dense_below, d.get("coalesce", False),
                        check_ranks=False)
        self.load_state_dict(d["state"])


def _global_rank(group, rank: int) -> int:
    """The global rank of a group's rank."""
    return dist.get_global_rank(group, rank)


class FlatBucket:
    """What a DDP hook reads of a dist.GradBucket, over given parameters: one flat buffer with a
    gradient view per parameter. For calling a hook outside DDP (benchmarks, tests, a training
    loop of one's own); pass the same parameter objects every step, as DDP does."""

    def __init__(self, index: int, params, grads=None, last: bool = True):
        self._index, self._last, self._params = index, last, list(params)
        sources = list(grads) if grads is not None else None
        n = sum(p.numel() for p in self._params)
        like = sources[0] if sources else self._params[0]
        self._buf = torch.zeros(n, dtype=like.dtype, device=like.device)
        self._grads, at = [], 0
        for i, p in enumerate(self._params):
            view = self._buf[at:at + p.numel()].view(p.shape)
            if sources is not None:
                view.copy_(sources[i])
            self._grads.append(view)
            at += p.numel()

    def index(self):
        return self._index

    def buffer(self):
        return self._buf

    def gradients(self):
        return self._grads

    def parameters(self):
        return self._params

    def is_last(self):
        return self._last


def _averaged(state: CompressionState):
    """Multiplies by float32(1/W) (what the C++ aggregators do), so every path averages alike."""
    inv = torch.tensor(1.0, dtype=torch.float32) / state.world_size
    return inv.item()


def _warm_up(state: CompressionState, bucket, buf):
    state._warm[bucket.index()] = state._entries(bucket)[0]
    return _all_reduce_mean(state, buf)


def _all_reduce_mean(state, buf):
    state._count(buf.numel() * 4, buf.numel() * 4)
    inv = _averaged(state)
    fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].mul_(inv))


def _settled(buf):
    """Ends a callback that wrote buf on a GPU: waits for its stream. DDP gets the bucket through
    futures combined by collect_all, which carry no CUDA events, so nothing else would order
    DDP's reads of the bucket after this work (replicas drifted apart on a GPU without it)."""
    if buf.is_cuda:
        torch.cuda.current_stream(buf.device).synchronize()


# ---- collectives: what a unit's phase asks for, issued alone or with other units' ----------------
class _Sum:
    """A phase's all-reduce: t becomes the sum over the ranks; on the wire in dtype `wire` through
    `cast` (a tensor like t of that dtype, the unit's own) when that is not t's dtype."""

    def __init__(self, t, wire=None, cast=None):
        self.t, self.wire, self.cast = t, wire if wire is not None else t.dtype, cast


class _Gather:
    """A phase's all-gather: afterwards `everyone` holds every rank's t, in rank order."""

    def __init__(self, t, everyone=None):
        self.t, self.everyone = t, everyone


class _Round:
    """A unit's part of a step: phases, each a function that computes from the previous phase's
    collectives and returns its own (_Sum, _Gather; the first one's are made with the unit), and
    finish, which writes the result into the bucket."""

    def __init__(self, index: int, phases, finish):
        # A third phase would be chained from a callback, after whatever the hook chained
        # meanwhile: an order that depends on timing. Every codec has at most two rounds.
        assert 1 <= len(phases) <= 2, "a unit has one or two phases"
        self.index, self.phases, self.finish = index, phases, finish


def _issue(state, requests, flat=None):
    """Issues the collectives of requests; returns (future, settle): settle() once the future has
    completed makes every request's result whole. Alone (flat None), each request is one
    collective on its own tensor. flat (the step's phase, coalesced): one all-reduce per wire
    dtype and one all-gather per dtype, over the requests laid end to end in a buffer of the
    state's (the requests come in unit order, the same on every rank)."""
    group, W = state.process_group, state.world_size
    works, after = [], []
    kinds = {}
    for r in requests:
        kinds.setdefault((type(r), r.wire if isinstance(r, _Sum) else r.t.dtype, r.t.device), []).append(r)
    for (kind, dtype, device), rs in kinds.items():
        n = sum(r.t.numel() for r in rs)
        state._count(n * torch.empty(0, dtype=dtype).element_size(), 0)
        if len(rs) == 1 or flat is None:
            for r in rs:
                if kind is _Gather:
                    r.everyone = [torch.empty_like(r.t) for _ in range(W)]
                    works.append(dist.all_gather(r.everyone, r.t, group=group, async_op=True))
                elif r.wire == r.t.dtype:
                    works.append(dist.all_reduce(r.t, group=group, async_op=True))
                else:
                    r.cast.copy_(r.t)
                    works.append(dist.all_reduce(r.cast, group=group, async_op=True))
                    after.append(lambda r=r: r.t.copy_(r.cast))
            continue
        buf = state._room((flat, kind.__name__, dtype, device), n, dtype, device)
        at = 0
        for r in rs:
            buf[at:at + r.t.numel()].copy_(r.t)
            at += r.t.numel()
        if kind is _Sum:
            works.append(dist.all_reduce(buf, group=group, async_op=True))

            def back(rs=rs, buf=buf):
                at = 0
                for r in rs:
                    r.t.copy_(buf[at:at + r.t.numel()])
                    at += r.t.numel()
            after.append(back)
        else:
            outs = [state._room((flat, "everyone", r, dtype, device), n, dtype, device) for r in range(W)]
            works.append(dist.all_gather(outs, buf, group=group, async_op=True))
            at = 0
            for r in rs:
                r.everyone = [o[at:at + r.t.numel()] for o in outs]
                at += r.t.numel()
    fut = works[0].get_future() if len(works) == 1 else torch.futures.collect_all([w.get_future() for w in works])

    def settle():
        if len(works) > 1:  # collect_all drops the collectives' CUDA events: order after them here
            for f in fut.value():
                f.wait()
        for a in after:
            a()
    return fut, settle


def _phases(state, rnd: _Round, inline: bool):
    """Runs a unit's round alone: its first phase's collectives issued now; each later phase run
    once the previous one's collectives completed, and its collectives issued; finish once the
    last completed. Returns a future set when finish has run, or with the first error (a
    collective's, a phase's or finish's).

    Not inline, only the first phase runs on the caller's thread (DDP's autograd thread): every
    later one runs from the completion callback of the previous one, in its turn in the state's
    chain (_in_turn), so backward goes on while the collectives are under way and the collectives
    still go out in the same order on every rank. Inline: everything on this thread, for the last
    bucket of a step on the CPU (backward is over and DDP waits for it at once, so there is
    nothing to overlap, while gloo's callback thread, another core scheduled late on a busy
    machine, finds the matrices cold: PowerSGD rank 4 on the demo's MLP applied in 0.5 ms here,
    0.7-0.9 ms there) and for a caller that waits anyway (the outer loop)."""
    out = torch.futures.Future()

    def fail(e):
        if not out.done():
            out.set_exception(e)

    if inline:
        try:
            for i, phase in enumerate(rnd.phases):
                if i:
                    fut.wait()
                    settle()
                fut, settle = _issue(state, phase())
            fut.wait()  # a failed collective's error, not a finish on what it left
            settle()
            rnd.finish()
            out.set_result(None)
        except Exception as e:  # noqa: BLE001 - handed on through the future, as from a callback
            fail(e)
        return out

    settle = None

    def end(f):
        try:
            f.wait()
            settle()
            rnd.finish()
            out.set_result(None)
        except Exception as e:  # noqa: BLE001 - handed on through the future
            fail(e)

    def issue(i):
        nonlocal settle
        if i:
            settle()
        fut, settle = _issue(state, rnd.phases[i]())
        if i + 1 == len(rnd.phases):
            fut.then(end)
        else:
            _in_turn(state, fut, lambda: issue(i + 1), fail)

    issue(0)
    return out


def _together(state, held):
    """Runs the step's rounds (held: (round, future) in unit order) on this thread, the step's
    last bucket's: a phase's collectives of every unit laid end to end (_issue), so a step
    issues as many collectives as with the model in one bucket. A unit whose phase or finish
    raised drops out of the later phases (on every rank alike: the errors come from the sums
    and lengths every rank holds) and its future gets the error."""
    errors = {}
    flight, fut, settle = [], None, None  # the units whose collectives are under way

    def landed():
        """Waits for the collectives under way; a failed one fails every unit in it."""
        try:
            if fut is not None:
                fut.wait()
                settle()
        except Exception as e:  # noqa: BLE001 - handed on through the units' futures
            errors.update((rnd.index, e) for rnd, _ in flight)

    for i in range(max(len(rnd.phases) for rnd, _ in held)):
        landed()
        requests, flight = [], []
        for rnd, out in held:
            if rnd.index in errors or len(rnd.phases) <= i:
                continue
            try:
                requests += rnd.phases[i]()
                flight.append((rnd, out))
            except Exception as e:  # noqa: BLE001 - handed on through the unit's future
                errors[rnd.index] = e
        fut, settle = _issue(state, requests, flat=i) if requests else (None, None)
    landed()
    for rnd, out in held:
        if rnd.index not in errors:
            try:
                rnd.finish()
            except Exception as e:  # noqa: BLE001 - handed on through the unit's future
                errors[rnd.index] = e
        if rnd.index in errors:
            out.set_exception(errors[rnd.index])
        else:
            out.set_result(None)


def _in_turn(state, after, issue, fail):
    """Calls issue() once `after` has completed and every issue chained before this one has run,
    on the thread that completes the last of them; fail(error) instead when `after` failed or
    issue raised. The hook waits for the chain before it issues a collective of its own, so the
    collectives follow the order in which the hook chained them, which is the same on every rank
    (DDP calls the hook for its buckets in order). The chain goes on whatever happens."""
    turn, state._chain = state._chain, torch.futures.Future()
    gate = state._chain

    def run(_):
        try:
            after.wait()
            issue()
        except Exception as e:  # noqa: BLE001 - handed on through the unit's future
            fail(e)
        finally:
            gate.set_result(None)

    torch.futures.collect_all([turn, after]).then(run)


def _inline(state, buf, last: bool) -> bool:
    """Whether a unit finishes on the calling thread (_phases): the last bucket of a step on the
    CPU, and every bucket of a state whose caller waits for each anyway (the outer loop's)."""
    return state._blocking or (last and not buf.is_cuda)


# ---- a unit's round, per kind of codec ------------------------------------------------------------
def _summable(state, u: _Unit, buf, where, round: int) -> _Round:
    """Dense, sketch and powersgd: one all-reduce of the payload (values, table or P factors)
    and the unit's uncompressed parameters; a second one of the answers for two-round codecs
    (sketch p2 > 0: the candidates' values; powersgd: the Q factors)."""
    codec = u.codec
    comp, dense = u.segments(where, True), u.segments(where, False)
    size = codec.sum_size("gradient")
    payload = u.room("payload", size + u.n_dense, buf)
    failed = None
    try:
        codec.encode_sum(_gather(buf, comp, u.room("x", u.n_compressed, buf)).contiguous(), round,
                         out=payload[:size])
    except _core.NonFiniteError as e:
        # The other ranks are about to all-reduce: join them rather than leave them waiting, and
        # tell them through the sum (NaN from here; nothing finite sums to NaN).
        failed = e
        payload[:size].fill_(math.nan)
    if dense:
        payload[size:].copy_(_gather(buf, dense))
    W, inv = state.world_size, _averaged(state)

    def summed(t, name, kind):
        """t summed over the ranks in the codec's wire dtype for the phase (through a cast copy
        when that is not float32)."""
        wire = codec.sum_dtype(kind)
        return _Sum(t, wire, None if wire == torch.float32 else u.room16(name, t.numel(), wire, t))

    def check():
        """After the first all-reduce, on every rank alike: a rank whose gradient was not finite
        stops the step everywhere (no second round, no update)."""
        if failed is not None:
            raise failed
        if size and math.isnan(payload[0].item()):
            raise _core.NonFiniteError("sketchsgd hook: another rank's gradient was not finite (that rank raised "
                                       "NonFiniteError with the coordinate); this step has no update")

    def add(total):
        """The aggregator takes a phase's sum. It checks the sum is finite, so the first phase's
        check() reads the payload (a host synchronisation) only when that fails."""
        if failed is not None:
            raise failed
        try:
            u.aggregator.add_sum(total, W, round)
        except _core.WireError:
            check()
            raise

    def reply(kind):
        """The aggregator's query or update: its values on the device where they are a float
        vector (powersgd: no host copy between the phases), else its message."""
        n = codec.reply_size(kind)
        return u.aggregator.finish_values(u.room(kind, n, buf)) if n else u.aggregator.finish()

    state._count(0, (u.n_compressed + u.n_dense) * 4)
    answers = None

    def gradient():
        return [summed(payload, "payload", "gradient")]

    def answer():
        """The query depends on the first sum: it is made (and the second all-reduce issued) once
        that sum is in."""
        nonlocal answers
        add(payload[:size])
        answers = codec.answer_sum(reply("query"), u.room("answer", codec.sum_size("answer"), buf))
        return [summed(answers, "answers", "answer")]

    def finish():
        if u.dense:
            check()
            # The dense aggregator's update is the sum times float32(1/W) and applying it changes
            # no state: the same here, without the host round trip of a dense Update message.
            step = payload[:size].mul_(inv)
        else:
            add(answers if answers is not None else payload[:size])
            update = reply("update")
            if len(comp) == 1:  # straight into the bucket
                o, n = comp[0]
                codec.apply(update, buf[o:o + n])
                step = None
            else:
                step = codec.apply(update, u.room("step", u.n_compressed, buf))
        if step is not None:
            _scatter(buf, comp, step)
        if dense:
            _scatter(buf, dense, payload[size:].mul_(inv))
        _settled(buf)

    return _Round(u.index, [gradient, answer] if codec.two_rounds else [gradient], finish)


def _gathered(state, u: _Unit, buf, where, round: int) -> _Round:
    """topk, signsgd, terngrad, qsgd: an all-gather of the message lengths, then of the messages padded
    to the longest, and an all-reduce of the uncompressed parameters; every rank aggregates all
    W messages."""
    codec = u.codec
    comp, dense = u.segments(where, True), u.segments(where, False)
    inv = _averaged(state)
    failed = None
    try:
        msg = codec.encode(_gather(buf, comp, u.room("x", u.n_compressed, buf)).contiguous(), round, state.rank)
    except _core.NonFiniteError as e:  # join the lengths' all-gather with none: every rank stops
        failed, msg = e, b""
    limit = codec.max_message_bytes("gradient")
    on = buf.device if state.backend == "nccl" else torch.device("cpu")
    # Lengths first (messages vary: sparse lists with delta-coded indices), then every message
    # padded to the longest one of this step, not to the codec's worst case.
    lens = _Gather(torch.tensor([len(msg)], dtype=torch.int64, device=on))
    messages = values = sizes = None
    state._count(0, (u.n_compressed + u.n_dense) * 4)

    def padded():
        """Once the lengths are in: the messages padded to the longest, and the uncompressed
        parameters."""
        nonlocal messages, values, sizes
        sizes = [int(n.item()) for n in lens.everyone]
        if failed is not None:
            raise failed
        for r, n in enumerate(sizes):
            if n == 0:
                raise _core.NonFiniteError(f"sketchsgd hook: rank {r}'s gradient was not finite (that rank raised "
                                           "NonFiniteError with the coordinate); this step has no update")
            if not 0 < n <= limit:
                raise _core.WireError(f"rank {r} sent a message of {n} bytes (limit {limit})")
        mine = torch.zeros(max(sizes), dtype=torch.uint8)
        mine[:len(msg)] = torch.frombuffer(bytearray(msg), dtype=torch.uint8)
        messages = _Gather(mine.to(on))
        if not dense:
            return [messages]
        values = _Sum(_gather(buf, dense).contiguous().clone())
        return [messages, values]

    def finish():
        for r, t in enumerate(messages.everyone):
            u.aggregator.add(t.cpu()[:sizes[r]].numpy())
        _scatter(buf, comp, codec.apply(u.aggregator.finish(), u.room("step", u.n_compressed, buf)))
        if dense:
            _scatter(buf, dense, values.t.mul_(inv))
        _settled(buf)

    return _Round(u.index, [lambda: [lens], padded], finish)


def _uncompressed(state, u: _Unit, buf, where) -> _Round:
    """A unit with nothing to compress: its parameters all-reduced as they are."""
    segs = u.segments(where, False)
    values = _Sum(_gather(buf, segs).contiguous().clone())
    state._count(0, values.t.numel() * 4)
    inv = _averaged(state)

    def finish():
        _scatter(buf, segs, values.t.mul_(inv))
        _settled(buf)

    return _Round(u.index, [lambda: [values]], finish)


def _compressed(state, bucket, buf):
    if state._units is None:
        if not state._warm:  # a state that compresses from its first call (the outer loop's)
            state._warm[bucket.index()] = state._entries(bucket)[0]
        state._fix_units()
    units, where = state._units_of(bucket, buf)
    rounds = []
    for u in units:
        if u.codec is None:
            rounds.append(_uncompressed(state, u, buf, where))
        else:
            rounds.append((_summable if u.summable else _gathered)(state, u, buf, where, state.iteration))
    if state.coalesce and not state._blocking:
        futures = state._hold(rounds, bucket.is_last())
    else:
        futures = [_phases(state, rnd, _inline(state, buf, bucket.is_last())) for rnd in rounds]
    out = torch.futures.Future()

    def result(_):
        """The bucket, or the first unit's error as that unit raised it (a then() callback would
        wrap it in a RuntimeError)."""
        try:
            for f in futures:
                f.value()
        except Exception as e:  # noqa: BLE001 - handed on through the future
            out.set_exception(e)
            return
        out.set_result(buf)

    torch.futures.collect_all(futures).add_done_callback(result)
    return out


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's averaged gradient through the state's codec. A
    float16 or bfloat16 bucket (a model in half precision) goes through a float32 copy, and the
    averaged result is rounded back into it."""
    buf = bucket.buffer()
    if not state._ranks_checked:  # the first call, on every rank for the same bucket
        state._bind()
        state._check_ranks()
    state._check_bucket(buf)
    state._begin_call()
    # Collectives go out in one order on every rank: after those chained by earlier buckets
    # (their second phases, issued as their first ones complete; _phases).
    state._chain.wait()
    wide = buf if buf.dtype == torch.float32 else state._widened(bucket.index(), buf)
    warm = state.iteration < state.start_iter
    try:
        fut = (_warm_up if warm else _compressed)(state, bucket, wide)
        state._inflight.append(fut)
    finally:
        if bucket.is_last():
            state._end_step(not warm)
    if wide is buf:
        return fut

    def narrowed(f):
        buf.copy_(f.value())
        _settled(buf)
        return buf

    return fut.then(narrowed)


def __getattr__(name):
    """sketchsgd.torch.DiLoCo: the outer loop (sketchsgd.outer), built on the hook above, loaded
    on first use so that each module imports the other's names without a cycle."""
    if name == "DiLoCo":
        from .outer import DiLoCo
        return DiLoCo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
