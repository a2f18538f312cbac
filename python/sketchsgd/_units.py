"""Units of compression: which tensors a call's buffer holds, how they group into units, and each
unit's codec and aggregator replica.

A unit is the tensors of one bucket as it stood when the state began to compress (the end of a
DDP warm-up; the first call of a state that compresses at once), as (key, numel, compressed) in
buffer order. Keys number tensors in the order they were first shown, so they are the same in a
resumed job. A later call's buffer holds one or more whole units: the same bucket after the
warm-up, or DDP's initial single bucket right after a resume.
"""

import torch

from . import _core
from ._compressor import Compressor, layout_text


def checked_spec(spec: str) -> str:
    """The canonical form of a spec, checked by the C++ registry (InvalidArgument naming the
    problem)."""
    if not isinstance(spec, str) or not spec.strip():
        raise TypeError(f"spec: expected a codec spec string such as 'sketch:k=1000', got {spec!r}")
    return _core.share_spec(spec)


class Unit:
    """One unit: its entries, its codec (this rank's worker state) and this rank's replica of the
    aggregator, and tensors reused every step."""

    def __init__(self, index: int, entries):
        self.index = index
        self.entries = [tuple(e) for e in entries]
        self.n_compressed = sum(n for _, n, c in self.entries if c)
        self.n_dense = sum(n for _, n, c in self.entries if not c)
        self.codec = self.aggregator = None
        self.core = None  # its _rounds.Core, made on first use
        self._room = {}  # name -> tensor reused every step (large fresh buffers cost page faults)

    def build(self, spec: str, device, world: int, pending=None, shapes=None):
        if self.n_compressed and self.codec is None:
            layout = [shapes[k] for k, _, c in self.entries if c] if shapes is not None else None
            self.codec = Compressor(spec, self.n_compressed, device, layout=layout)
            self.aggregator = self.codec.make_aggregator(world)
            if pending is not None:
                self.codec.load_state_dict(pending["codec"])
                self.aggregator.load_state_dict(pending["aggregator"])

    def room(self, name: str, n: int, like, dtype=torch.float32):
        """A tensor of n values on like's device, the same one every step: a unit's futures
        complete before it is called again, so nothing still reads it."""
        key = name if dtype == torch.float32 else (name, dtype)
        t = self._room.get(key)
        if t is None or t.numel() != n or t.device != like.device:
            t = self._room[key] = torch.empty(n, dtype=dtype, device=like.device)
        return t

    def segments(self, where, compressed: bool):
        """(offset, numel) in the buffer of this unit's compressed or dense tensors, adjacent ones
        merged (a unit that is the whole buffer is one view: no copies)."""
        return _core.merge_runs([(where[k], n) for k, n, c in self.entries if c == compressed])


class Units:
    """The state's book of tensors and units. spec: the state's spec; whole(dims, numel): whether
    a tensor goes uncompressed (the library's small-tensor rule), None for codecs that take the
    layout and decide themselves (powersgd)."""

    def __init__(self, spec: str, whole):
        self.spec, self._whole_rule = spec, whole
        self.keys = {}      # identity -> key, in the order first shown
        self.shapes = {}    # key -> shape
        self.whole = {}     # key -> sent uncompressed
        self.warm = {}      # bucket index -> entries, from the latest warm-up call
        self.registered = {}  # bucket index -> entries known up front (register: sketchsgd.fsdp)
        self.fixed = None   # unit index -> Unit, once compression began
        self.pending = {}   # unit index -> states from load_state_dict()
        self.blocks = {}    # bucket index -> B: its tensors are B chunks of one matrix's rows each (register)
        self._lookup = None  # (fixed, its first key -> unit, its compressed values), for held()
        self._plans = {}     # plan(): index -> (fixed, numel, the plan)
        self._factors = {}  # (tensor keys, blocks) -> whether the codec compresses any (_factored)

    @property
    def per_tensor(self) -> bool:
        """Whether the codec reads each tensor's shape (powersgd) rather than a flat vector."""
        return self._whole_rule is None

    def entries(self, ids, tensors, numel: int, index: int):
        """(key, numel, compressed) per tensor of a buffer of numel values, and key -> offset.
        ids: each tensor's identity (a parameter's id(), or its position)."""
        if len(ids) != len(tensors):
            raise RuntimeError(f"bucket {index}: {len(tensors)} gradients for {len(ids)} parameters")
        entries, where, offset = [], {}, 0
        for i, g in zip(ids, tensors):
            key = self.keys.setdefault(i, len(self.keys))
            self.shapes[key] = tuple(g.shape)
            n = g.numel()
            dense = self.whole.get(key)
            if dense is None:
                dense = self.whole[key] = self._whole_rule is not None and self._whole_rule(g.dim(), n)
            entries.append((key, n, not dense))
            where[key] = offset
            offset += n
        if offset != numel:
            raise RuntimeError(f"bucket {index}: gradients hold {offset} values, its buffer {numel}")
        if self._whole_rule is None and entries and not self._factored(index, [k for k, _, _ in entries]):
            # A codec that reads shapes, given no tensor it would compress (an FSDP module of
            # biases and norms alone, its weight frozen; a 3-class head, a LoRA factor too small
            # to factor at the rank): all of it goes whole, as PyTorch's PowerSGD sends such
            # tensors, rather than the codec refusing the unit.
            for k, _, _ in entries:
                self.whole[k] = True
            entries = [(k, n, False) for k, n, _ in entries]
        return entries, where

    def _factored(self, index: int, keys) -> bool:
        """Whether the codec would compress any of these tensors (bucket index's, in order),
        asked of the C++ registry once per set of tensors."""
        key = (tuple(keys), self.blocks.get(index, 1))
        known = self._factors.get(key)
        if known is None:
            shapes = [self.shapes[k] for k in keys]
            known = self._factors[key] = any(len(s) >= 2 for s in shapes) and _core.compresses_any(
                self._spec_of(index), layout_text(shapes))
        return known

    def _spec_of(self, index: int) -> str:
        """The state's spec for bucket index: with blocks where registered so."""
        if index not in self.blocks:
            return self.spec
        name, _, options = self.spec.partition(":")
        return f"{name}:{options + ',' if options.strip() else ''}blocks={self.blocks[index]}"

    def register(self, index: int, ids, shapes, blocks: int = 1):
        """Bucket index's tensors (ids, of these shapes) known before its first call, as a DDP
        warm-up makes them known (sketchsgd.fsdp: each FSDP module's, or chunk's). blocks = B:
        they are B chunks of the same tensors, each a block of rows of its matrix (FSDP's
        sharded layout), for a codec that reads shapes (its option blocks)."""
        if blocks > 1:
            self.blocks[index] = blocks
        metas = [torch.empty(s, device="meta") for s in shapes]
        entries = self.entries(ids, metas, sum(m.numel() for m in metas), index)[0]
        self.warm[index] = self.registered[index] = entries

    def fix(self, index: int, entries):
        """Compression begins: the warm-up's buckets become units (a state without a warm-up:
        this first call's)."""
        if self.fixed is None:
            if not self.warm:
                self.warm[index] = entries
            self.fixed = {i: Unit(i, e) for i, e in sorted(self.warm.items())}
            self.warm = {}

    def plan(self, index: int, numel: int, make):
        """make()'s result for call site index (an FSDP group's buffer of numel values, whose
        tensors are the same at every call: its units and runs), kept while this book of units
        lasts (fixed: a load() makes another) and the buffer keeps its size."""
        got = self._plans.get(index)
        if got is None or got[0] is not self.fixed or got[1] != numel:
            made = make()  # may fix the book: kept with the book it made
            got = self._plans[index] = (self.fixed, numel, made)
        return got[2]

    def held(self, index: int, entries, device, world: int):
        """The units a call's buffer holds (whole), built on first use."""
        first, _ = self._book()
        given = set(entries)
        held = sorted((first[k] for k, _, _ in entries if k in first), key=lambda u: u.index)
        if sorted(k for u in held for k, _, _ in u.entries) != sorted(k for k, _, _ in entries) or any(
                e not in given for u in held for e in u.entries):
            raise RuntimeError(f"sketchsgd hook: bucket {index} does not hold whole buckets of the "
                               "warm-up (DDP changed its buckets later: raise start_iter, or a resumed model differs)")
        for u in held:
            self._build(u, device, world)
        return held

    def build_registered(self, device, world: int) -> None:
        """Every unit known up front (register: all of an FSDP model's) fixed, and its codec built
        now rather than at its first compressed step, past any warm-up: a spec that a unit
        cannot take (a budget past its values, no matrix worth factoring at that rank) is
        refused when the model is registered. A later load_state_dict() fixes the units afresh
        and its codecs are built from the checkpoint, as ever."""
        if self.fixed is not None or not self.warm or set(self.warm) != set(self.registered):
            return
        self.fix(None, None)
        for u in self.fixed.values():
            self._build(u, device, world)

    def _book(self):
        """(the fixed units by their first tensor key, the values they compress in all), kept
        once per book of units, not found per call: FSDP per destination has W units a module,
        a call each, so a scan per call would cost (modules · W)² a backward."""
        if self._lookup is None or self._lookup[0] is not self.fixed:
            self._lookup = (self.fixed, {u.entries[0][0]: u for u in self.fixed.values() if u.entries},
                            sum(u.n_compressed for u in self.fixed.values()))
        return self._lookup[1:]

    def _build(self, u, device, world: int) -> None:
        """u's codec and aggregator replica, unless built: the state's spec with u's share of its
        budget (and blocks where registered so), InvalidArgument naming u where u refuses it."""
        if u.codec is not None or not u.n_compressed:
            return
        total = self._book()[1]
        spec = _core.share_spec(self._spec_of(u.index), u.n_compressed / total)
        try:
            u.build(spec, device, world, self.pending.pop(u.index, None),
                    self.shapes if self._whole_rule is None else None)
        except _core.InvalidArgument as e:
            raise _core.InvalidArgument(
                f"unit {u.index} ({u.n_compressed:,} of the {total:,} values compressed, its share of the "
                f"budget: {spec.split(',layout=')[0]}): {e}") from None

    # ---- checkpoints ----------------------------------------------------------------------------
    def state_dict(self):
        """(warm, units) of a state_dict: every unit's entries, codec and aggregator state."""
        units = {}
        for i, u in (self.fixed or {}).items():
            units[i] = {"entries": [list(e) for e in u.entries],
                        "codec": u.codec.state_dict() if u.codec else None,
                        "aggregator": u.aggregator.state_dict() if u.codec else None}
            if u.codec is None and i in self.pending:
                units[i].update(self.pending[i])
        return ({i: [list(e) for e in es] for i, es in self.warm.items()},
                units if self.fixed is not None else None)

    def check(self, warm, units) -> None:
        """ConfigMismatch when state_dict()'s (warm, units) hold other units than those registered
        up front (a model sharded another way, or another model), rather than at its first call."""
        if not self.registered:
            return
        saved = {int(i): [tuple(e) for e in (u["entries"] if units is not None else u)]
                 for i, u in (units if units is not None else warm).items()}
        mine = {i: [tuple(e) for e in es] for i, es in self.registered.items()}
        if saved != mine:
            i = min(i for i in set(saved) | set(mine) if saved.get(i) != mine.get(i))

            def told(es):
                return "none" if es is None else f"{sum(n for _, n, _ in es):,} values in {len(es)} tensors"

            raise _core.ConfigMismatch(
                f"state_dict of a model whose units differ from this one's ({len(saved)} units saved, {len(mine)} "
                f"here; unit {i}: saved {told(saved.get(i))}, here {told(mine.get(i))}): a model wrapped or sharded "
                "another way, another model, or a checkpoint of an earlier sketchsgd that cut FSDP modules otherwise")

    def load(self, warm, units):
        """state_dict()'s (warm, units); codecs are rebuilt from them on first use."""
        self.warm = {int(i): [tuple(e) for e in es] for i, es in warm.items()}
        self.fixed, self.pending = None, {}
        if units is not None:
            self.fixed = {int(i): Unit(int(i), u["entries"]) for i, u in units.items()}
            self.pending = {int(i): {"codec": u["codec"], "aggregator": u["aggregator"]}
                            for i, u in units.items() if u["codec"] is not None}
