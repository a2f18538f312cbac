"""A unit's round on a communicator: the C++ Round (sketchsgd/compress/round.hpp), which holds the
unit's phases for every family of codec (what is encoded, which collectives each phase asks for,
a rank's failure told to the others, the mean), driven through _comm's requests. The round reads
the unit's tensors from the caller's buffer and writes the mean back; this module only hands its
requests to the communicator and the results back."""

import torch

from . import _core, _int8
from ._comm import Exchange, Gather, Sum, settled
from ._schedule import Task
from ._tensors import Streams
from ._units import Unit

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}


class Core:
    """A unit's C++ Round and the rooms its sums are written into (float32, on the codec's device;
    the round keeps their addresses, so they live as long as it does). per_destination: a chunk's
    round of a reduce-scatter per destination (_scatter), gathered even under reduce=sparse."""

    def __init__(self, comm, u: Unit, like, per_destination: bool = False):
        codec = u.codec._c if u.codec is not None else None
        if codec is not None and "int8" in (codec.sum_format("gradient"), codec.sum_format("answer")):
            _int8.levels(comm.world)  # a group too large for int8 sums: refused before any collective
        payload = u.room("payload", _core.Round.payload_size(codec, u.n_dense, per_destination), like)
        answer = u.room("answers", _core.Round.answer_size(codec), like)
        self.rooms = (payload, answer)
        if codec is None:
            self.streams = Streams(like.device)
            gpu = like.device.index if like.device.type == "cuda" else -1
            self.round = _core.Round.whole_only(comm.world, u.n_dense, payload.data_ptr(), payload.numel(), gpu,
                                                self.streams.handle)
        else:
            self.streams = u.codec._streams
            self.round = _core.Round(codec, u.aggregator._a, comm.rank, u.n_dense, payload.data_ptr(),
                                     payload.numel(), answer.data_ptr(), answer.numel(), per_destination)
        self._sums = {}
        self.phases = self.round.phases

    def sum_of(self, req, u):
        """The Sum a phase's sum request (_core.Request) stands for: the same every step, so made
        once (its view of the room and its cast room)."""
        s = self._sums.get(req)
        if s is None:
            t = self.rooms[req.room]
            if req.count:
                t = t[req.offset:req.offset + req.count]
            wire = _DTYPES[req.format]
            n = t.numel() if wire != torch.int8 else _int8.padded(t.numel(), req.columns)
            cast = None if wire == torch.float32 else u.room(("cast", req.room, req.offset), n, t, wire)
            s = self._sums[req] = Sum(t, wire, cast, req.columns)
        return s


def round_of(comm, u: Unit, buf, kept, whole, round: int, window=None) -> Task:
    """The unit's round for this step: its tensors read from buf (its compressed ones at the runs
    kept, the others at whole: Unit.segments) when it starts, the averaged result written back
    into them when it finishes; window = (out, lo):
    only buf's values [lo, lo + out.numel()) are written, into out (float32, contiguous, on
    buf's device), the rest of buf left as it was."""
    core = u.core
    if core is None:
        core = u.core = Core(comm, u, buf)
    comm.count_dense(u.n_compressed + u.n_dense)
    asked = []  # the current phase's requests

    def requests(reqs):
        asked[:] = []
        for req in reqs:
            if req.op == "sum":
                asked.append(core.sum_of(req, u))
            elif req.op == "exchange":
                on = comm.host(buf)
                asked.append(Exchange([torch.frombuffer(p, dtype=torch.uint8).to(on) for p in req.parts]))
            else:
                asked.append(Gather(torch.frombuffer(req.bytes, dtype=torch.uint8).to(comm.host(buf))))
        return list(asked)

    def gathered():
        return [t.cpu().numpy() for g in asked if isinstance(g, (Gather, Exchange)) for t in g.everyone]

    def first():
        with core.streams.ordered():
            return requests(core.round.start(buf.data_ptr(), buf.numel(), kept, whole, round))

    def second():
        got = gathered()
        with core.streams.ordered():
            return requests(core.round.next(got))

    def finish():
        if comm.shared and window is None and core.round.gathered:
            # A simulated group's ranks share one process: the update from everyone's messages
            # reduced once (by rank 0's round), not by each of W ranks.
            with core.streams.ordered():
                update = comm.ops.once(lambda: core.round.reduce(gathered()))
                core.round.finish_update(update, buf.data_ptr(), buf.numel(), kept, whole)
            settled(buf)
            return
        got = gathered()
        with core.streams.ordered():
            if window is None:
                core.round.finish(got, buf.data_ptr(), buf.numel(), kept, whole)
            else:
                out, lo = window
                core.round.finish_window(got, out.data_ptr(), lo, out.numel(), buf.numel(), kept, whole)
        settled(buf if window is None else window[0])

    return Task(u.index, [first] + [second] * (core.phases - 1), finish)
