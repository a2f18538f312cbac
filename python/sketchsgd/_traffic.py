"""Link bytes: what a collective moves through one rank's network link, sent and received, and a
step's tally of them beside the payload (what the rank handed to the collective).

The model is the bandwidth term of the ring algorithms gloo and NCCL run for large messages
(shared/reference/scale.md): a ring all-reduce of n bytes sends and receives 2(W − 1)/W · n a
rank, a reduce-scatter of n bytes (W chunks) (W − 1)/W · n, an all-gather of m-byte messages
(W − 1) · m (each rank receives the W − 1 others and forwards them), an all-to-all what goes to
and comes from the other ranks. Headers (TCP/IP, ~3-5 % for large messages) are not counted;
tests/network/link_bytes_test.sh holds the model against what each rank's interface counts.
"""

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def ring(kind: str, nbytes: float, world: int):
    """(sent, received) through one rank's link for a collective of `kind` to which the rank hands
    nbytes (an all-reduce's or a reduce-scatter's whole input, an all-gather's own message)."""
    if world <= 1:
        return 0.0, 0.0
    if kind == "all_reduce":
        b = 2.0 * (world - 1) / world * nbytes
    elif kind == "reduce_scatter":
        b = (world - 1) / world * nbytes
    elif kind == "all_gather":
        b = float((world - 1) * nbytes)
    else:
        raise ValueError(f"ring({kind!r}): an all-to-all's bytes depend on its parts; count them as given")
    return b, b


def link_bytes(kind: str, nbytes: int, world: int) -> tuple:
    """(sent, received) bytes through one rank's link for a collective over `world` ranks to which
    the rank hands `nbytes` (kind: "all_reduce" or "reduce_scatter", its whole input;
    "all_gather", the rank's own message), by the ring algorithms gloo and NCCL run for large
    messages, headers aside. The public form of what stats() counts, for one's own collectives."""
    if kind not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(f"kind={kind!r}: all_reduce, reduce_scatter or all_gather")
    for name, v, low in (("nbytes", nbytes, 0), ("world", world, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}={v!r}: an int ≥ {low}")
    return ring(kind, nbytes, world)


class Tally:
    """Bytes of one step or of a whole job, per kind of collective: payload (handed to it), sent and
    received (through the rank's link, by ring()), and `dense`: the gradient values the dense
    reduction these collectives stand for would have reduced (an all-reduce for the DDP hook,
    average(), DiLoCo and HSDP's replicas; a reduce-scatter for FSDP's), whose link bytes in fp32
    and bf16 are the baselines."""

    __slots__ = ("payload", "sent", "received", "dense")

    def __init__(self):
        self.payload = dict.fromkeys(KINDS, 0)
        self.sent = dict.fromkeys(KINDS, 0.0)
        self.received = dict.fromkeys(KINDS, 0.0)
        self.dense = 0

    def add(self, kind: str, payload: int, sent: float, received: float) -> None:
        self.payload[kind] += payload
        self.sent[kind] += sent
        self.received[kind] += received

    def merge(self, other: "Tally") -> None:
        for k in KINDS:
            self.add(k, other.payload[k], other.sent[k], other.received[k])
        self.dense += other.dense

    def baseline(self, width: int, world: int, kind: str = "all_reduce") -> float:
        """Sent + received through this rank's link by the dense reduction (`kind`) of the same
        values in `width`-byte values (4: fp32, 2: bf16)."""
        return sum(ring(kind, self.dense * width, world))

    def report(self, world: int, kind: str = "all_reduce", prefix: str = "") -> dict:
        """The tally as stats() gives it: link bytes (sent + received) against bf16 and fp32
        reductions (`kind`) of the same values at this world size."""
        sent, received = round(sum(self.sent.values())), round(sum(self.received.values()))
        link = sent + received
        bf16, fp32 = self.baseline(2, world, kind), self.baseline(4, world, kind)
        return {prefix + "sent_bytes": sent, prefix + "received_bytes": received, prefix + "link_bytes": link, prefix + "bf16_link_bytes": round(bf16),
                prefix + "fp32_link_bytes": round(fp32),
                prefix + "link_ratio_bf16": bf16 / link if link else 0.0,
                prefix + "link_ratio_fp32": fp32 / link if link else 0.0}

    def state(self) -> dict:
        """The counts as plain values (a checkpoint's)."""
        return {"payload": dict(self.payload), "sent": dict(self.sent), "received": dict(self.received),
                "dense": self.dense}

    @classmethod
    def of(cls, d: dict) -> "Tally":
        """The tally state() gave."""
        t = cls()
        for k in KINDS:
            t.add(k, int(d["payload"][k]), float(d["sent"][k]), float(d["received"][k]))
        t.dense = int(d["dense"])
        return t

    def by_collective(self) -> dict:
        return {k: {"payload": self.payload[k], "sent": round(self.sent[k]), "received": round(self.received[k])}
                for k in KINDS if self.payload[k] or self.sent[k] or self.received[k]}
