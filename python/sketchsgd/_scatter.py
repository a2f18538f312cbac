"""A gathered codec's reduce-scatter, per destination (sketchsgd.fsdp.compress_reduce_scatter).

FSDP2 hands its reduce-scatter every rank's gradient of a group cut into W chunks, chunk r what
rank r keeps. Each chunk is a unit of its own here (its codec, its error feedback, its share of
the budget), so a rank's message for chunk r concerns rank r alone: it goes there in one
all-to-all, and each rank decodes and averages the W messages of its own chunk. Against an
all-gather of whole-gradient messages, a rank sends and receives about W times fewer bytes over
its links and decodes W times fewer values.

The protocol is the C++ one of compress/scatter.hpp (_core.Scatter: what each rank sends where,
and when every rank stops alike); this module makes the chunks' units and runs its collectives.
The collectives of a group's step, the same on every rank:
  1. an all-gather of each rank's W message lengths (8 bytes each): every rank sees every
     length, so a failed encode (length 0: a rank that fails any of its chunks sends 0 for all)
     or a bad length stops every rank at the same point, with no rank left waiting;
  2. an all-to-all of the messages (each of its own length, no padding);
  3. a reduce-scatter of the tensors the layout sends whole, when the group has any (an
     all-to-all where the chunks hold different ones: FSDP1).
Summable codecs keep the whole-gradient round (sketchsgd.fsdp): their sums need no per-rank
decode, and their error feedback wants the whole mean.

Chunks may hold different tensors: FSDP2's chunk r is every parameter's r-th padded shard (the
same shapes in every chunk), FSDP1's the r-th W-th of a flat gradient, which cuts parameters
anywhere (a chunk may then hold no compressed values, or no whole ones)."""

import torch

from . import _core
from ._comm import settled
from ._hook import views_of
from ._rounds import Core


class Alone(Exception):
    """A failure of this rank's round alone, after every collective of the step: the messages of
    its chunk did not decode, or the decode failed otherwise (the other ranks went through
    theirs). error: what the decode raised."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _bucket(index: int, rank: int, world: int) -> int:
    """The unit index of FSDP group index's chunk for rank (the units' book keys units by it)."""
    return index * world + rank


def keys(index: int, rank: int, count: int):
    """The tensor keys of group index's chunk for rank: (group, rank, parameter)."""
    return [(index, rank, j) for j in range(count)]


def register(state, index: int, shapes) -> None:
    """Group index's W chunks become units before the first call (shapes[r]: chunk r's tensors'
    shapes, end to end; W = len(shapes))."""
    world = len(shapes)
    for r, chunk in enumerate(shapes):
        state.units.register(_bucket(index, r, world), keys(index, r, len(chunk)), chunk)


def reduce_scatter(state, index: int, chunks, shapes, out) -> None:
    """chunks: (W, n) float32, row r this rank's gradient of chunk r (tensors of shapes[r] end to
    end, as registered); out: n float32 values, written with the mean of this rank's chunk over
    the state's group. A step of the state, blocking. NonFiniteError on every rank when any
    rank's chunk was not finite, WireError on every rank for a bad length; Alone(the error) on
    this rank alone when the messages of its chunk do not decode (after every collective of the
    step: the others are not left waiting)."""
    comm = state.comm
    W, me = comm.world, comm.rank
    if len(shapes) != W:
        raise RuntimeError(f"sketchsgd.fsdp: group {index} has {len(shapes)} chunks for {W} ranks")
    state.begin(chunks)
    try:
        _step(state, comm, W, me, index, chunks, shapes, out)
    finally:
        state.end_step(True)


def _step(state, comm, W, me, index, chunks, shapes, out):
    n = chunks.shape[1]
    units, cores, runs = [], [], []
    for r in range(W):
        buf = chunks[r]
        entries, where = state.units.entries(keys(index, r, len(shapes[r])), views_of(buf, shapes[r]), n,
                                             _bucket(index, r, W))
        state.units.fix(_bucket(index, r, W), entries)
        (u,) = state.units.held(_bucket(index, r, W), entries, buf.device, W)
        if u.core is None:
            u.core = Core(comm, u, buf, per_destination=True)
        units.append(u)
        cores.append(u.core)
        runs.append((u.segments(where, True), u.segments(where, False)))
        comm.count_dense(u.n_compressed + u.n_dense)
    coded = [u.codec is not None for u in units]  # the same on every rank (chunk r's layout)

    # Each chunk's encode (coded) or its whole tensors gathered and checked; then the protocol
    # of compress/scatter.hpp: this rank's lengths all-gathered, checked alike on every rank
    # (a failure or a bad length raises everywhere before any message moves), the messages
    # sent per destination.
    for r in range(W):
        with cores[r].streams.ordered():
            cores[r].round.start(chunks[r].data_ptr(), n, runs[r][0], runs[r][1], state.iteration)
    scatter = _core.Scatter([c.round for c in cores], me)
    send, receive = scatter.next(comm.gather_lengths(scatter.lengths(), chunks))
    got = []
    if any(coded):
        parts = [torch.frombuffer(p, dtype=torch.uint8) if len(p) else torch.empty(0, dtype=torch.uint8)
                 for p in send]
        got = comm.exchange(parts, receive, chunks)
    _whole(comm, W, me, units, cores)
    try:
        with cores[me].streams.ordered():
            cores[me].round.finish([g.cpu().numpy() for g in got] if coded[me] else [], out.data_ptr(), n,
                                   runs[me][0], runs[me][1])
    except Exception as e:  # every collective of the step is done: whatever failed is this rank's alone
        raise Alone(e) from None
    settled(out)


def _whole(comm, W, me, units, cores) -> None:
    """The tensors sent whole, summed into this rank's chunk's room: one reduce-scatter of every
    chunk's where the chunks hold the same (FSDP2), else one all-to-all of each chunk's to the
    rank that keeps it (FSDP1's chunks hold different ones), summed here in rank order: each
    link carries the values, not a padding to the longest chunk's."""
    longest = max(u.n_dense for u in units)  # the same on every rank
    if not longest:
        return
    rooms = [c.rooms[0] for c in cores]
    if all(u.n_dense == longest for u in units):
        comm.count("reduce_scatter", longest * 4 * W)  # its whole input, as counted elsewhere
        comm.reduce_scatter_sum(rooms[me], rooms)
        return
    got = comm.exchange([room.view(torch.uint8) for room in rooms], [rooms[me].numel() * 4] * W, rooms[me])
    total = torch.zeros_like(rooms[me])
    for part in got:
        total += part.view(torch.float32).to(total.device)
    rooms[me].copy_(total)
