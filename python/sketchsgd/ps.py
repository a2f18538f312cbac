"""sketchsgd.ps: a worker (or a federated client) of the parameter server, sketchsgd-server.

    from sketchsgd.ps import Client
    with Client("tcp://127.0.0.1:5555", "sketch:fetch=1,k=20000", layout=shapes, rank=0, world=4,
                init=params) as c:
        w = c.params()                      # the model, as of the next round
        out = c.step(grad)                  # push, wait for the round, apply the update
        # out: {"outcome": "updated", "round": 0, "lr": …, "contributors": 4, "bytes_up": …, …}

In an asynchronous job (sketchsgd-server --mode async: Downpour) step() returns once the server
has applied this push, without waiting for the other workers; its result adds the push's "age"
(other workers' updates the server applied since this client fetched its model) and the server's
"version". The client fetches the model after every fetch_every pushes (0: only by fetch()).

A federated job's client (population > 0) registers for the round it was sampled in
(sketchsgd.sample_clients), under its id as the rank, gets the model with its Welcome, steps once
and leaves. The client is the C++ one (worker/client.hpp): it keeps its own copy of the model,
shows liveness while the caller computes and raises sketchsgd's typed errors (ConfigMismatch when
the server refuses it, JobFinished, TimeoutError). Vectors are float32 CPU tensors. This module
needs the build with the parameter server (CMake, not pip).
"""

import torch

from . import _core
from ._compressor import layout_text
from ._tensors import address

try:
    from . import _ps
except ImportError as e:  # a pip build has no parameter server
    _ps = None
    _missing = str(e)


class Client:
    def __init__(self, server: str, spec: str, dim: int = None, layout=None, rank: int = 0, world: int = 1,
                 job: int = 1, population: int = 0, join_round: int = 0, init: torch.Tensor = None,
                 timeout: float = 120.0, quiet: bool = False, shared_io: bool = False,
                 fetch_every: int = 1, weight: float = 1.0):
        """Connects, registers and pulls the model. rank 0 of a fixed job (or any federated
        client) passes init, the initial parameters, for a server that has no model yet. A
        sharded job (sketchsgd-server --shards S) names its S servers in server, comma-separated
        in shard order: each gets its part of every gradient; a replicated server (a backup
        started with --replica-of) is "PRIMARY|BACKUP": the client moves to the backup when the
        primary falls silent. A federated client may come for
        join_round while the round before runs: it returns once its round opens (within
        timeout). shared_io: share one ZeroMQ context
        with the process's other clients that set it (many clients in one process: a simulated
        federated population), instead of starting one each. fetch_every: an asynchronous job's
        pushes between fetches of the model (0: only when fetch() is called); weight: what each
        push counts for there (the steps or tokens it represents, relative to the job's nominal
        push: its step is lr · weight / world)."""
        if _ps is None:
            raise ImportError(f"sketchsgd.ps needs the build with the parameter server (CMake): {_missing}")
        if not isinstance(server, str) or not isinstance(spec, str):
            raise TypeError("server and spec must be strings")
        if not isinstance(shared_io, bool) or not isinstance(quiet, bool):
            raise TypeError("quiet and shared_io must be True or False")
        for name, v in (("rank", rank), ("world", world), ("job", job), ("population", population),
                        ("join_round", join_round), ("fetch_every", fetch_every)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an int ≥ 0, got {v!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= 1e6:
            raise ValueError(f"weight: expected a number in (0, 10^6], got {weight!r}")
        if fetch_every >= 1 << 32:
            raise ValueError(f"fetch_every: expected an int < 2^32, got {fetch_every}")
        text = layout_text(layout) if layout is not None else ""
        if not text and dim is None:
            raise TypeError("Client needs dim (or a layout)")
        n = dim if dim is not None else sum(_numel(s) for s in layout)
        ptr, length = (0, 0) if init is None else address(init, "init", torch.device("cpu"), n)
        self._init = init  # alive while the constructor reads it
        self._c = _ps.Client(server, int(job), int(rank), int(world), int(population), int(join_round), spec, text,
                             int(n), ptr, length, float(timeout), quiet, shared_io, int(fetch_every),
                             float(weight))
        self._init = None

    @property
    def _client(self):
        if self._c is None:
            raise _core.ProtocolError("this client is closed")
        return self._c

    @property
    def dim(self) -> int:
        return self._client.dim

    @property
    def rank(self) -> int:
        """The rank this registration uses (a federated client's slot in its round)."""
        return self._client.rank

    @property
    def round(self) -> int:
        """The round whose update comes next (with shards: the lowest of theirs)."""
        return self._client.round

    @property
    def shards(self) -> int:
        """Servers the model is spread over (1: one server)."""
        return self._client.shards

    @property
    def asynchronous(self) -> bool:
        """The server runs an asynchronous job (--mode async)."""
        return self._client.asynchronous

    def fetch(self) -> dict:
        """An asynchronous job's fetch: params() become the server's model (a round job's are
        current already)."""
        return self._client.fetch()

    def params(self) -> torch.Tensor:
        out = torch.empty(self.dim, dtype=torch.float32)
        self._client.params(out.data_ptr(), out.numel())
        return out

    def step(self, grad: torch.Tensor) -> dict:
        """Pushes grad (float32, length dim, finite) for the next round and waits for its outcome."""
        ptr, n = address(grad, "gradient", torch.device("cpu"), self.dim)
        return self._client.step(ptr, n)

    def close(self) -> None:
        """Says goodbye (when there is still something to say) and closes the connection."""
        self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


__all__ = ["Client"]
