"""Every rank's worker state in the checkpoint of whichever rank writes it, without a collective.

Error feedback and momentum differ between ranks, so a checkpoint that restores every rank must
hold all of them. Gathering them with a collective makes state_dict() something every rank must
call at the same moment, and PyTorch's own DDP tutorial saves from rank 0 alone
(`if rank == 0: torch.save(...state_dict()...)`, then a barrier): with a collective that hangs
until the process group's timeout. So the states travel through the process group's store
(the TCPStore every rank already reaches): the group's rank 0 posts a request naming its step,
and every other rank answers from a daemon thread with its state at that step, while its main
thread waits wherever it is (a barrier, say). A rank that calls state_dict() itself (Accelerate
and Lightning call it on every rank) leaves its state in the store for that step at once, so it
may go on training. A rank that has begun the next step without either cannot give the saved
step's state back: it answers so, and rank 0 raises a clear error at once; one that never
answers is a TimeoutError after `timeout` seconds.
"""

import io
import itertools
import threading
import time
import weakref

import torch

from . import _core

_tags = {}  # (configuration digest, group, rank) -> counter: the n-th state of a configuration, the same on
_tags_lock = threading.Lock()  # every rank (a simulated group's ranks share the process: keyed by rank too)


def _tag(key) -> int:
    with _tags_lock:
        return next(_tags.setdefault(key, itertools.count()))


def _arrived(store, key: str, seconds: float, longest: float = 0.05) -> bool:
    """Whether key is in the store within that many seconds. Polls with check(), pauses doubling
    up to `longest`, since the store's own wait() logs two warning lines each time it times out."""
    deadline, pause = time.monotonic() + seconds, 0.002
    while not store.check([key]):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, longest)
    return True


def _to_bytes(obj) -> bytes:
    out = io.BytesIO()
    torch.save(obj, out)
    return out.getvalue()


def _from_bytes(blob: bytes):
    return torch.load(io.BytesIO(blob), weights_only=True)


class Exchange:
    """Rank 0's collect() asks the group's other ranks for their worker state; the others serve
    those requests from a daemon thread. owner.worker_snapshot(iteration, timeout) gives this
    rank's state at that step (a dict of tensors) or a string saying why it cannot."""

    def __init__(self, owner, ops, digest: str, timeout: float):
        """ops: the communicator's collectives (_comm), for the group's ranks and store."""
        self.rank, self.world, self.timeout = ops.rank, ops.world, timeout
        self.prefix = f"sketchsgd/checkpoint/{digest}/{_tag((digest, ops.name, ops.rank))}/{ops.name}"
        self.store = ops.store
        self._asked = 0
        self._offered = None  # the key of this rank's latest offer, unless rank 0 took it
        if self.rank != 0:
            owner_ref = weakref.ref(owner)
            threading.Thread(target=self._serve, args=(owner_ref,), name="sketchsgd-checkpoint",
                             daemon=True).start()

    def _answer_key(self, iteration: int, rank: int) -> str:
        return f"{self.prefix}/answer/{iteration}/{rank}"

    def offer(self, mine: dict, iteration: int) -> None:
        """On another rank calling state_dict() itself: its state for rank 0's request at this
        step, left in the store now (its previous offer, if rank 0 never took it, removed)."""
        key = self._answer_key(iteration, self.rank)
        if self._offered not in (None, key):
            self.store.delete_key(self._offered)
        self.store.set(key, _to_bytes(mine))
        self._offered = key

    def collect(self, mine: dict, iteration: int) -> dict:
        """On the group's rank 0: rank -> worker state, every rank's at this step."""
        n, self._asked = self._asked, self._asked + 1
        self.store.set(f"{self.prefix}/ask/{n}", str(iteration))
        out, deadline = {0: mine}, time.monotonic() + self.timeout
        for r in range(1, self.world):
            key = self._answer_key(iteration, r)
            if not _arrived(self.store, key, deadline - time.monotonic()):
                raise _core.TimeoutError(
                    f"state_dict(): rank {r} gave no worker state within {self.timeout:g} s (is it alive, and "
                    "does its CompressionState exist?)")
            answer = _from_bytes(self.store.get(key))
            self.store.delete_key(key)
            if isinstance(answer, str):
                raise _core.ProtocolError(answer)
            out[r] = answer
        return out

    def _serve(self, owner_ref):
        n = 0
        while True:
            try:
                # Two look-ups a second for the whole job: a request waits 0.5 s at most.
                if not _arrived(self.store, f"{self.prefix}/ask/{n}", 5.0, longest=0.5):
                    if owner_ref() is None:
                        return
                    continue
                iteration = int(self.store.get(f"{self.prefix}/ask/{n}"))
            except Exception:  # noqa: BLE001 - the store is gone (rank 0 ended the job): so is this thread
                return
            answer_key = self._answer_key(iteration, self.rank)
            n += 1
            if self.store.check([answer_key]):  # offered by this rank's own state_dict()
                continue
            owner = owner_ref()
            if owner is None:
                return
            try:
                answer = owner.worker_snapshot(iteration, self.timeout)
            except Exception as e:  # noqa: BLE001 - rank 0 reports it
                answer = f"state_dict(): rank {self.rank} could not give its worker state: {e}"
            del owner
            # This rank's own state_dict() may have offered its state after the look-up above and
            # then begun its next step, which the snapshot refuses: its offer (stored before that
            # step began) is the answer; never overwrite it with the refusal.
            if isinstance(answer, str) and self.store.check([answer_key]):
                continue
            try:
                self.store.set(answer_key, _to_bytes(answer))
            except Exception:  # noqa: BLE001 - the store is gone: the job is over
                return
