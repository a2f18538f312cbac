"""Tensors handed to the C++ core: checked here (type, dtype, device, contiguity, size) and passed
as address + length, so the compiled module needs no libtorch. On CUDA the codec's work is ordered
after the caller's current stream and the caller's stream after it (no host synchronisation)."""

import contextlib

import torch


def device_of(device) -> torch.device:
    """torch.device from "cpu", "cuda", "cuda:N" or a torch.device (cuda → the current one)."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r}: {e}") from None
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"device {d}: sketchsgd runs on cpu or cuda")
    return d


def address(t, name: str, device: torch.device, numel=None, writable=False) -> tuple:
    """(address, numel) of a float32 contiguous tensor on device, or TypeError/ValueError."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: dtype {t.dtype}; sketchsgd works on torch.float32 (use .float())")
    if t.device != device:
        raise ValueError(f"{name}: tensor on {t.device}, but the codec works on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: tensor is not contiguous (use .contiguous())")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name}: {t.numel()} elements, expected {numel}")
    if writable and t.requires_grad:
        raise ValueError(f"{name}: tensor requires grad; pass .detach() or work under torch.no_grad()")
    return t.data_ptr(), t.numel()


def message(m, name: str = "message"):
    """A message as a buffer the core reads: bytes, bytearray, memoryview, a NumPy uint8 array or
    a uint8 CPU tensor."""
    if isinstance(m, torch.Tensor):
        if m.dtype != torch.uint8 or m.device.type != "cpu":
            raise TypeError(f"{name}: a message tensor must be uint8 on the CPU, got {m.dtype} on {m.device}")
        return m.contiguous().numpy()
    if isinstance(m, (bytes, bytearray, memoryview)) or hasattr(m, "__array_interface__"):
        return m
    raise TypeError(f"{name}: expected bytes or a uint8 buffer, got {type(m).__name__}")


_NOTHING = contextlib.nullcontext()


class Streams:
    """The codec's CUDA stream (the caller's current stream when it was made) and the ordering
    around each call; a no-op on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    @property
    def handle(self) -> int:
        return self.stream.cuda_stream if self.stream is not None else 0

    def ordered(self):
        """A context that orders the codec's work after the caller's stream and the caller's
        after it; on the CPU a shared no-op (a blocking FSDP call runs four Python stretches
        between its C++ phases, each on caches the phase left cold: the less it touches, the
        less it costs)."""
        return _NOTHING if self.stream is None else self._ordered()

    @contextlib.contextmanager
    def _ordered(self):
        current = torch.cuda.current_stream(self.device)
        if current == self.stream:
            yield
            return
        self.stream.wait_stream(current)
        try:
            yield
        finally:
            current.wait_stream(self.stream)
