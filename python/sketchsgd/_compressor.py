"""sketchsgd.Compressor and sketchsgd.Aggregator: the C++ codecs on torch tensors."""

import torch

from . import _core
from ._tensors import Streams, address, device_of, message


def _kind(kind: str) -> str:
    if kind not in ("gradient", "query", "answer", "update"):
        raise ValueError(f"message kind {kind!r}: expected gradient, query, answer or update")
    return kind


def layout_text(shapes) -> str:
    """The spec form of tensor shapes: [(1024, 784), (1024,)] -> "1024x784+1024" (a 0-d tensor
    counts as one value)."""
    if isinstance(shapes, str):
        return shapes
    try:
        parts = []
        for s in shapes:
            dims = [int(d) for d in s] or [1]
            if any(isinstance(d, bool) or d < 1 for d in s):
                raise ValueError
            parts.append("x".join(map(str, dims)))
    except (TypeError, ValueError):
        raise ValueError(f"layout: expected a list of tensor shapes with dimensions ≥ 1, got {shapes!r}") from None
    if not parts:
        raise ValueError("layout: no tensors")
    return "+".join(parts)


def gathered(spec: str) -> bool:
    """Whether spec's codec gathers its messages, each worker's decoded apart (top-k, SparseLoCo,
    signSGD, QSGD, TernGrad: an all-gather, or an all-to-all per destination), rather than
    summing them (dense, the sketch, PowerSGD: an all-reduce of payloads). A property of the codec,
    so its first example on 100 values tells."""
    name = _core.share_spec(spec).partition(":")[0]
    entry = next(c for c in _core.codecs() if c["name"] == name)
    probe = Compressor(entry["examples"][0], 100, layout=None if entry["layout"] == "none" else [(10, 10)])
    return probe.sum_size("gradient") == 0


class Aggregator:
    """The server side of a codec for world_size workers: add() their messages (or add_sum() an
    all-reduced sum of their encode_sum() outputs), finish() → the Update (or a Query)."""

    def __init__(self, core, compressor: "Compressor"):
        self._a = core
        self._device = compressor.device
        self._streams = compressor._streams
        self._reply_size = compressor.reply_size

    @property
    def count(self) -> int:
        return self._a.count

    @property
    def world_size(self) -> int:
        return self._a.world_size

    @property
    def expecting(self) -> str:
        """"gradient", or "answer" while a second round is open."""
        return self._a.expecting

    def add(self, msg) -> None:
        self._a.add(message(msg))

    def add_sum(self, total: torch.Tensor, contributors: int, round: int) -> None:
        """The element-wise sum of `contributors` workers' summable payloads, in place of their
        messages (float32, on the codec's device)."""
        ptr, n = address(total, "sum", self._device)
        with self._streams.ordered():
            self._a.add_sum(ptr, n, int(contributors), int(round))

    @property
    def replying(self) -> str:
        """What finish() returns next: "query" after a two-round codec's gradient phase, else
        "update"."""
        return self._a.replying

    def finish(self, copy: bool = True):
        """The round's reply message: bytes, or with copy=False a read-only memoryview over the
        message the C++ aggregator built (no copy of an update of megabytes; it stays valid as
        long as the view is referenced)."""
        if not isinstance(copy, bool):
            raise TypeError(f"finish(copy=...): expected a bool, got {type(copy).__name__}")
        with self._streams.ordered():
            return self._a.finish(copy)

    def finish_values(self, out: torch.Tensor = None) -> torch.Tensor:
        """finish() for codecs whose reply is a float vector (reply_size() > 0: powersgd, dense):
        its values, as the message would carry them, in a float32 tensor on the codec's device,
        which answer_sum() and apply() take in place of the bytes (no host copy between phases)."""
        n = self._reply_size(self.replying)
        if n == 0:
            raise _core.ProtocolError(f"this codec's {self.replying} is not a float vector: use finish()")
        if out is None:
            out = torch.empty(n, dtype=torch.float32, device=self._device)
        ptr, _ = address(out, "out", self._device, n, writable=True)
        with self._streams.ordered():
            self._a.finish_values(ptr, n)
        return out

    def abandon(self) -> None:
        self._a.abandon()

    def state_dict(self) -> dict:
        return {"state": _state_tensor(self._a.save_state())}

    def load_state_dict(self, d: dict) -> None:
        self._a.load_state(message(d["state"], "aggregator state"))


def _state_tensor(b: bytes) -> torch.Tensor:
    """Saved state as a uint8 tensor: what torch.load(weights_only=True), the default since
    PyTorch 2.6, reads back (it refuses pickled bytes objects in some versions)."""
    return torch.frombuffer(bytearray(b), dtype=torch.uint8) if b else torch.empty(0, dtype=torch.uint8)


class Compressor:
    """One codec, built from a spec string (see sketchsgd.codecs()), for vectors of length dim on
    a device ("cpu" or "cuda:N"). Tensors are float32, contiguous, on that device; messages are
    bytes. On CUDA the work is ordered on the caller's current stream, with no host copy of the
    vectors."""

    def __init__(self, spec: str, dim: int = None, device="cpu", layout=None):
        """layout: the shapes of the tensors the vector is made of, in order (e.g. the
        parameters' .shape), for codecs that work per tensor (powersgd); dim is then their total
        (may be omitted)."""
        if not isinstance(spec, str):
            raise TypeError(f"spec: expected a string, got {type(spec).__name__}")
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
            raise TypeError(f"dim: expected an int, got {type(dim).__name__}")
        text = layout_text(layout) if layout is not None else None
        if text is None and dim is None:
            raise TypeError("Compressor needs dim (or a layout)")
        self.device = device_of(device)
        if self.device.type == "cuda" and not _core.cuda_build:
            raise ValueError("device cuda: this sketchsgd build has no CUDA (configure with -DSKETCHSGD_CUDA=ON)")
        self._streams = Streams(self.device)
        gpu = self.device.index if self.device.type == "cuda" else -1
        if text is None:
            self._c = _core.Compressor(spec, dim, gpu, self._streams.handle)
        else:
            self._c = _core.Compressor.with_layout(spec, text, gpu, self._streams.handle)
            if dim is not None and dim != self._c.dim:
                raise ValueError(f"dim={dim} but the layout holds {self._c.dim} values")

    # ---- description ------------------------------------------------------------------------
    @property
    def spec(self) -> str:
        """The canonical spec: every option spelled out."""
        return self._c.spec

    @property
    def dim(self) -> int:
        return self._c.dim

    @property
    def two_rounds(self) -> bool:
        return self._c.two_rounds

    def sum_dtype(self, kind: str = "gradient") -> torch.dtype:
        """The dtype a collective should sum a phase's payloads in (the codec's wire format for
        it); the payloads themselves are float32. torch.int8 (wire=int8) is not a cast: scales
        agreed by a max first, then integers at 127 // W levels (docs/CODECS.md, sum_columns())."""
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "int8": torch.int8}[self._c.sum_format(_kind(kind))]

    def sum_columns(self, kind: str = "gradient") -> int:
        """The payload's values as rows of this many columns, each column's runs of _int8.ROWS rows
        sharing an int8 scale (PowerSGD: its rank); 1 for most codecs."""
        return self._c.sum_columns(_kind(kind))

    @property
    def last_message_bytes(self) -> int:
        return self._c.last_message_bytes

    @property
    def compression_ratio(self) -> float:
        """Dense fp32 bytes over the last encoded message's bytes."""
        return self._c.compression_ratio

    def sum_size(self, kind: str = "gradient") -> int:
        """Floats of the summable payload of a phase (0: the codec's messages do not sum)."""
        return self._c.sum_size(_kind(kind))

    def reply_size(self, kind: str = "update") -> int:
        """Floats of a query or update that is a float vector (0: it is not; see
        Aggregator.finish_values)."""
        return self._c.reply_size(_kind(kind))

    def max_message_bytes(self, kind: str = "gradient") -> int:
        return self._c.max_message_bytes(_kind(kind))

    # ---- worker role ------------------------------------------------------------------------
    def _vec(self, t, name, writable=False):
        return address(t, name, self.device, self.dim, writable)

    def _out(self, out, n, name):
        if out is None:
            out = torch.empty(n, dtype=torch.float32, device=self.device)
        ptr, _ = address(out, name, self.device, n, writable=True)
        return out, ptr

    def encode(self, grad: torch.Tensor, round: int = 0, rank: int = 0) -> bytes:
        ptr, n = self._vec(grad, "gradient")
        with self._streams.ordered():
            return self._c.encode(ptr, n, int(round), int(rank))

    def encode_sum(self, grad: torch.Tensor, round: int = 0, out: torch.Tensor = None) -> torch.Tensor:
        """The summable payload of a gradient (for an all-reduce), with encode()'s state change."""
        ptr, n = self._vec(grad, "gradient")
        size = self.sum_size("gradient")
        if size == 0:
            raise _core.ProtocolError(f"codec {self.spec} has no summable payload: gather its messages")
        out, optr = self._out(out, size, "out")
        with self._streams.ordered():
            self._c.encode_sum(ptr, n, int(round), optr, size)
        return out

    def answer(self, query, rank: int = 0) -> bytes:
        with self._streams.ordered():
            return self._c.answer(message(query, "query"), int(rank))

    def _values(self, t, kind):
        """A reply given as its values (finish_values()): float32 on the codec's device."""
        n = self.reply_size(kind)
        if n == 0:
            raise _core.ProtocolError(f"codec {self.spec}: its {kind} is not a float vector; pass its message")
        return address(t, kind, self.device, n)

    def answer_sum(self, query, out: torch.Tensor = None) -> torch.Tensor:
        """The summable answer to a query: its message, or its values (a float32 tensor from
        Aggregator.finish_values())."""
        size = self.sum_size("answer")
        if size == 0:
            raise _core.ProtocolError(f"codec {self.spec} has no summable answer")
        out, optr = self._out(out, size, "out")
        values = self._values(query, "query") if isinstance(query, torch.Tensor) and query.dtype != torch.uint8 else None
        with self._streams.ordered():
            if values is not None:
                self._c.answer_values(*values, optr, size)
            else:
                self._c.answer_sum(message(query, "query"), optr, size)
        return out

    def apply(self, update, step: torch.Tensor = None) -> torch.Tensor:
        """The dense step of an Update (the mean gradient estimate), with the codec's state
        change (error feedback keeps what was not applied). update: its message, or its values
        (a float32 tensor from Aggregator.finish_values())."""
        step, ptr = self._out(step, self.dim, "step")
        values = self._values(update, "update") if isinstance(update, torch.Tensor) and update.dtype != torch.uint8 else None
        with self._streams.ordered():
            if values is not None:
                self._c.apply_values(*values, ptr, self.dim)
            else:
                self._c.apply(message(update, "update"), ptr, self.dim)
        return step

    def apply_step(self, update, params: torch.Tensor, lr: float) -> None:
        """params −= lr · step, touching only the update's coordinates when it is sparse."""
        ptr, n = self._vec(params, "params", writable=True)
        with self._streams.ordered():
            self._c.apply_step(message(update, "update"), ptr, n, float(lr))

    # ---- server role ------------------------------------------------------------------------
    def make_aggregator(self, world_size: int) -> Aggregator:
        return Aggregator(self._c.make_aggregator(int(world_size)), self)

    # ---- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The worker state (momentum, error feedback) and what it belongs to."""
        return {"spec": self.spec, "dim": self.dim, "state": _state_tensor(self._c.save_state())}

    def load_state_dict(self, d: dict) -> None:
        saved = d.get("spec")
        try:  # in today's canonical form: an older build names the same codec in older words
            saved = _core.share_spec(saved)  # (a PowerSGD spec before its option blocks)
        except (TypeError, ValueError):
            pass  # not a spec: refused below, naming it
        if saved != self.spec or d.get("dim") != self.dim:
            raise _core.ConfigMismatch(
                f"state of codec {d.get('spec')!r} (dim {d.get('dim')}) given to {self.spec!r} (dim {self.dim})")
        self._c.load_state(message(d["state"], "codec state"))
