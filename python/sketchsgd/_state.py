"""CompressionState: a compressed all-reduce's configuration, its units, its step counter and
statistics, and its checkpoints (sketchsgd._checkpoint). The drivers (the DDP hook, average())
run its rounds."""

import contextlib
import hashlib
import math
import threading

import torch

from . import _checkpoint, _core
from ._comm import Communicator, ready
from ._exchange import Exchange
from ._schedule import Scheduler
from ._traffic import Tally
from ._units import Units, checked_spec


class CompressionState:
    """State of compression_hook for one DDP model (or of average() for one set of tensors): the
    spec, per-bucket codecs keyed by bucket index, the warm-up and the traffic statistics. Build
    it on every rank with the same arguments (checked: a collective over the process group, at
    construction when torch.distributed is initialised, else at the first call; so it can be
    made before the process group, as Lightning's DDPStrategy(ddp_comm_state=...) needs).

    spec:         any sketchsgd codec spec (sketchsgd.describe() lists them).
    start_iter:   plain all-reduce steps of the hook first (≥ 2: DDP rebuilds its buckets after
                  step 1; average() compresses from its first call).
    compress_1d:  also compress 1-D tensors (biases); default: they go uncompressed.
    dense_below:  tensors with fewer elements go uncompressed too.
    coalesce:     True: a step's collectives wait for its last bucket and go out together, one
                  a phase (per dtype) for the whole model, as with the model in one bucket: a
                  collective's latency paid once a phase instead of once a bucket, none of them
                  overlapping backward (docs/BENCHMARKS.md measures both). Each bucket's
                  encoding still runs in its own hook call.
    checkpoint_timeout: seconds rank 0's state_dict() waits for the other ranks' worker state.
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
        else at the first call, which every rank makes for the same bucket."""
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 2:
            raise ValueError(f"start_iter={start_iter!r}: must be an int ≥ 2 (DDP rebuilds buckets after the first step)")
        if isinstance(dense_below, bool) or not isinstance(dense_below, int) or dense_below < 0:
            raise ValueError(f"dense_below={dense_below!r}: must be an int ≥ 0")
        if not isinstance(coalesce, bool):
            raise TypeError(f"coalesce={coalesce!r}: expected True or False")
        if isinstance(checkpoint_timeout, bool) or not isinstance(checkpoint_timeout, (int, float)) or \
                not 0 < checkpoint_timeout < math.inf:
            raise ValueError(f"checkpoint_timeout={checkpoint_timeout!r}: seconds, a finite number > 0")
        if type(process_group).__name__ == "DeviceMesh":
            raise TypeError("process_group: a DeviceMesh; pass one of its dimensions' process groups, as "
                            "mesh['replicate'].get_group()")
        self.checkpoint_timeout = float(checkpoint_timeout)
        self.process_group = process_group
        self.spec = spec.strip() if isinstance(spec, str) else spec
        self.start_iter = start_iter
        self.compress_1d = bool(compress_1d)
        self.dense_below = dense_below
        self.coalesce = coalesce
        # Bound to the process group (bind()); exchange: the other ranks' worker states for rank
        # 0's checkpoint (None in a group of one).
        self.comm = self.scheduler = self.exchange = None
        self._open = False       # a step's calls have begun and its last has not ended
        self._inflight = []      # this step's futures (a snapshot waits for them)
        self._step_lock = threading.Lock()
        self._ranks_checked = False
        self._checked = False
        self.blocking = False    # every unit finishes in its call (tests: the order without overlap)
        self.driver = None       # what the state serves: "ddp" (the hook, average()) or "fsdp"
        self._buffers = {}       # buffer(): key -> tensor
        # Every rank must run the same configuration: compare digests before anything can fail
        # on one rank alone, then raise on every rank alike.
        if ready(process_group):
            self.bind()
            if check_ranks:
                self._check_ranks()
        name, _, given = checked_spec(self.spec).partition(":")
        canonical = dict(item.split("=", 1) for item in given.split(",") if item)  # every key
        if "layout" in canonical:
            raise ValueError("sketchsgd hook: the hook gives the codec its layout (the bucket's tensors): "
                             "leave layout= out of the spec")
        if canonical.get("blocks", "1") != "1":
            raise ValueError("sketchsgd hook: the hook gives the codec its blocks (FSDP's sharded layout): "
                             "leave blocks= out of the spec")
        # Codecs that work per tensor (powersgd) get every tensor of a unit with its shape and
        # decide themselves what stays uncompressed; the others, the library's small-tensor rule
        # (compress_1d: 1-D tensors count as matrices).
        uses_layout = next(c["layout"] for c in _core.codecs() if c["name"] == name) == "required"
        self.units = Units(self.spec, None if uses_layout else self._sent_whole)
        self.iteration = 0
        # The dense reduction this state's rounds stand for, the baseline of its link bytes:
        # sketchsgd.fsdp's reduce-scatter drivers set "reduce_scatter".
        self.replaces = "all_reduce"
        self._steps = {"steps": 0, "compressed_steps": 0}
        self._total, self._last = Tally(), Tally()

    def _sent_whole(self, dims: int, numel: int) -> bool:
        return _core.sent_whole(max(dims, 2) if self.compress_1d else dims, numel, self.dense_below)

    # ---- the process group and checks -----------------------------------------------------------
    @property
    def world_size(self):
        return self.comm.world if self.comm else None

    @property
    def rank(self):
        return self.comm.rank if self.comm else None

    @property
    def backend(self):
        return self.comm.backend if self.comm else None

    def bind(self):
        """Reads the process group: rank, world size, backend (no collective)."""
        if self.comm is not None:
            return
        self.comm = Communicator(self.process_group)
        self.scheduler = Scheduler(self.comm)
        if self.comm.world > 1:
            digest = hashlib.sha256(self.configuration.encode()).hexdigest()[:16]
            self.exchange = Exchange(self, self.comm.ops, digest, self.checkpoint_timeout)

    def _check_ranks(self):
        """Once: every rank's configuration is this one (a collective)."""
        if not self._ranks_checked:
            differ = self.comm.same_everywhere(self.configuration + repr(self.coalesce))
            if differ:
                raise ValueError(f"rank {self.rank}: CompressionState(spec={self.spec!r}, ...) differs from ranks "
                                 f"{differ}: every rank must use the same spec and options")
            self._ranks_checked = True

    def _check_tensor(self, buf):
        if buf.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"sketchsgd hook: bucket of dtype {buf.dtype}; the codecs take float32 gradients "
                            "(float16 and bfloat16 buckets are widened to it)")
        if self._checked:
            return
        if buf.device.type == "cuda" and not _core.cuda_build:
            raise ValueError("sketchsgd hook: CUDA gradients, but this sketchsgd build has no CUDA")
        if self.backend == "nccl" and buf.device.type != "cuda":
            raise ValueError("sketchsgd hook: NCCL needs CUDA tensors; use gloo for a model on the CPU")
        if self.backend not in ("gloo", "nccl", "local"):
            raise ValueError(f"sketchsgd hook: backend {self.backend!r} is not supported (gloo or nccl)")
        self._checked = True

    # ---- the drivers' interface (the DDP hook, average(), sketchsgd.fsdp) -------------------------
    # A driver claims the state, runs each call between begin() and, at a step's last call,
    # end_step(); it hands the futures of its calls to track() and keeps its per-call tensors in
    # buffer().

    def claim(self, driver: str) -> None:
        """The state serves driver from now on ("ddp": the DDP hook and average(); "fsdp"); the
        drivers refuse a state another one serves."""
        self.driver = driver

    def begin(self, buf):
        """A call begins: checks (the first call's on every rank compares the configuration), and
        the first call of a step opens it (checkpoints wait or refuse meanwhile). Then the
        collectives chained by earlier calls are issued before this call issues its own."""
        if not self._ranks_checked:
            self.bind()
            self._check_ranks()
        self._check_tensor(buf)
        with self._step_lock:
            if not self._open:
                self._open, self._inflight = True, []
        self.scheduler.drain()

    def track(self, fut) -> None:
        """A future of this step's (a checkpoint of the step's end waits for it)."""
        self._inflight.append(fut)

    def end_step(self, compressed: bool):
        """The step's last call has issued its collectives: the step is counted and ends."""
        self.scheduler.drain()  # the step's last phases are issued (and counted)
        self._last = self.comm.take_counts()
        self._total.merge(self._last)
        self._steps["steps"] += 1
        self._steps["compressed_steps"] += int(compressed)
        with self._step_lock:
            self.iteration += 1
            self._open = False

    def buffer(self, key, n: int, dtype, device):
        """n values of dtype on device kept under key for the calls that follow: the same memory
        each time (DDP's half-precision buckets: a float32 copy each, as they are in flight
        together; sketchsgd.fsdp: one buffer the size of the largest module serves every blocking
        call, where one per module would keep a copy of the whole unsharded gradient alive)."""
        key = (key, dtype, device)
        t = self._buffers.get(key)
        if t is None or t.numel() < n:
            t = self._buffers[key] = torch.empty(n, dtype=dtype, device=device)
        return t[:n]

    def buffer_sizes(self) -> dict:
        """buffer()'s keys -> the values each holds (what the drivers' buffers keep alive)."""
        return {key[0]: t.numel() for key, t in self._buffers.items()}

    @contextlib.contextmanager
    def held(self):
        """The step's bookkeeping held still (no call begins or ends a step meanwhile): yields
        (iteration, open), open while a step's calls have begun and its last has not ended."""
        with self._step_lock:
            yield self.iteration, self._open

    def wait_inflight(self) -> None:
        """Waits for the futures of the current step (under held(): its collectives done)."""
        torch.futures.wait_all(self._inflight)

    def stats(self) -> dict:
        """This rank's bytes over every step so far, and (last_…) over the last step.

        Link bytes, what the rank's network link carries (sent + received, by the ring
        algorithms gloo and NCCL run for large messages, headers aside: sketchsgd._traffic):
        sent_bytes, received_bytes, link_bytes; bf16_link_bytes and fp32_link_bytes, what a dense
        reduction of the same values (an all-reduce; FSDP's reduce-scatter where this state
        compresses one) would carry at this world size; link_ratio_bf16 and link_ratio_fp32, those
        over link_bytes. by_collective: payload, sent and received per kind of collective.

        Payload, what the rank hands to the collectives (an all-reduce of n floats counts 4n
        bytes, an all-gather the rank's own padded message): payload_bytes, against dense_bytes
        (4 bytes a value reduced); ratio is dense over payload. A payload ratio is no traffic
        ratio: at W ranks an all-reduce's link carries 2(W − 1)/W of its payload each way, an
        all-gather's W − 1 times."""
        W = self.comm.world if self.comm else 1
        total, last = self._total, self._last
        s = dict(self._steps, world=W, replaces=self.replaces)
        s["payload_bytes"], s["last_payload_bytes"] = sum(total.payload.values()), sum(last.payload.values())
        s["dense_bytes"], s["last_dense_bytes"] = 4 * total.dense, 4 * last.dense
        s["ratio"] = s["dense_bytes"] / s["payload_bytes"] if s["payload_bytes"] else 0.0
        s["last_ratio"] = s["last_dense_bytes"] / s["last_payload_bytes"] if s["last_payload_bytes"] else 0.0
        s.update(total.report(W, self.replaces))
        s.update(last.report(W, self.replaces, prefix="last_"))
        s["by_collective"] = total.by_collective()
        return s

    # ---- checkpoints (sketchsgd._checkpoint) ----------------------------------------------------
    def counts(self) -> dict:
        """The statistics' counts, as a checkpoint holds them."""
        return dict(self._steps, total=self._total.state(), last=self._last.state())

    def load_counts(self, d: dict) -> None:
        """Restores counts(). A checkpoint of an earlier version, which counted payload alone,
        restores the step counts; its bytes start again from zero."""
        self._steps = {"steps": int(d["steps"]), "compressed_steps": int(d["compressed_steps"])}
        self._total = Tally.of(d["total"]) if "total" in d else Tally()
        self._last = Tally.of(d["last"]) if "last" in d else Tally()

    @property
    def configuration(self) -> str:
        """What every rank and a checkpoint must share: the repr of the arguments' tuple."""
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
        return _checkpoint.save(self, gather)

    def worker_snapshot(self, iteration: int, timeout: float):
        """This rank's worker states at the end of step `iteration` (for rank 0's checkpoint,
        called from the exchange's thread), or a string saying why not."""
        return _checkpoint.snapshot(self, iteration, timeout)

    def load_state_dict(self, d: dict) -> None:
        """Restores state_dict() (this rank's own, or one holding every rank's worker state: the
        group's rank 0's gathered one); the hook then continues as the saved job would have, also
        through DDP's initial bucket of a new DDP model."""
        _checkpoint.load(self, d)

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
        # the first call, and the saved rank is checked against this one.
        self._configure(spec, None, start_iter, compress_1d, dense_below, d.get("coalesce", False),
                        check_ranks=False)
        self.load_state_dict(d["state"])
