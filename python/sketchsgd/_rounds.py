"""A unit's round per family of codec: what it encodes, which collectives each phase asks for,
and how the results become the averaged gradient in the buffer. Each takes the communicator for
its rank, world and byte counts, and returns a _schedule.Round for a scheduler to run."""

import math

import torch

from . import _core
from ._comm import Gather, Sum, mean_factor, settled
from ._schedule import Round
from ._units import Unit, gather, scatter


def summable(comm, u: Unit, buf, where, round: int) -> Round:
    """Dense, sketch and powersgd: one all-reduce of the payload (values, table or P factors)
    and the unit's uncompressed parameters; a second one of the answers for two-round codecs
    (sketch p2 > 0: the candidates' values; powersgd: the Q factors)."""
    codec = u.codec
    comp, dense = u.segments(where, True), u.segments(where, False)
    size = codec.sum_size("gradient")
    payload = u.room("payload", size + u.n_dense, buf)
    failed = None
    try:
        codec.encode_sum(gather(buf, comp, u.room("x", u.n_compressed, buf)).contiguous(), round,
                         out=payload[:size])
    except _core.NonFiniteError as e:
        # The other ranks are about to all-reduce: join them rather than leave them waiting, and
        # tell them through the sum (NaN from here; nothing finite sums to NaN).
        failed = e
        payload[:size].fill_(math.nan)
    if dense:
        payload[size:].copy_(gather(buf, dense))
    W, inv = comm.world, mean_factor(comm.world)

    def summed(t, name, kind):
        """t summed over the ranks in the codec's wire dtype for the phase (through a cast copy
        when that is not float32)."""
        wire = codec.sum_dtype(kind)
        return Sum(t, wire, None if wire == torch.float32 else u.room(name, t.numel(), t, wire))

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

    comm.count(0, (u.n_compressed + u.n_dense) * 4)
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
            scatter(buf, comp, step)
        if dense:
            scatter(buf, dense, payload[size:].mul_(inv))
        settled(buf)

    return Round(u.index, [gradient, answer] if codec.two_rounds else [gradient], finish)


def gathered(comm, u: Unit, buf, where, round: int) -> Round:
    """topk, signsgd, terngrad, qsgd: an all-gather of the message lengths, then of the messages padded
    to the longest, and an all-reduce of the uncompressed parameters; every rank aggregates all
    W messages."""
    codec = u.codec
    comp, dense = u.segments(where, True), u.segments(where, False)
    inv = mean_factor(comm.world)
    failed = None
    try:
        msg = codec.encode(gather(buf, comp, u.room("x", u.n_compressed, buf)).contiguous(), round, comm.rank)
    except _core.NonFiniteError as e:  # join the lengths' all-gather with none: every rank stops
        failed, msg = e, b""
    limit = codec.max_message_bytes("gradient")
    on = comm.host(buf)
    # Lengths first (messages vary: sparse lists with delta-coded indices), then every message
    # padded to the longest one of this step, not to the codec's worst case.
    lens = Gather(torch.tensor([len(msg)], dtype=torch.int64, device=on))
    messages = values = sizes = None
    comm.count(0, (u.n_compressed + u.n_dense) * 4)

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
        messages = Gather(mine.to(on))
        if not dense:
            return [messages]
        values = Sum(gather(buf, dense).contiguous().clone())
        return [messages, values]

    def finish():
        for r, t in enumerate(messages.everyone):
            u.aggregator.add(t.cpu()[:sizes[r]].numpy())
        scatter(buf, comp, codec.apply(u.aggregator.finish(), u.room("step", u.n_compressed, buf)))
        if dense:
            scatter(buf, dense, values.t.mul_(inv))
        settled(buf)

    return Round(u.index, [lambda: [lens], padded], finish)


def uncompressed(comm, u: Unit, buf, where) -> Round:
    """A unit with nothing to compress: its parameters all-reduced as they are."""
    segs = u.segments(where, False)
    values = Sum(gather(buf, segs).contiguous().clone())
    comm.count(0, values.t.numel() * 4)
    inv = mean_factor(comm.world)

    def finish():
        scatter(buf, segs, values.t.mul_(inv))
        settled(buf)

    return Round(u.index, [lambda: [values]], finish)
