"""Argument types shared by the command-line tools (examples/, scripts/, benchmarks/): a bad value
fails while the arguments are parsed, with one line naming the option and exit status 2

    ddp_train.py: error: argument --progress: must be an integer >= 1, got 0

before anything starts (no worker processes, no traceback on every rank). Checks that need more
than one option, or files, go through parser.error() after parsing, the same line and status.

    from cli import count, positive
    p.add_argument("--workers", type=count, default=4)
"""

import argparse
import math


def integer(lo=None, hi=None):
    """An argparse type: an int in [lo, hi] (either end may be open: None)."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            bound = (f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {v}")
        return v
    return parse


def number(lo=None, hi=None, lo_open=False, hi_open=False):
    """An argparse type: a finite float in the range (lo, hi: None for no bound; *_open excludes
    that end)."""
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_bad = lo is not None and (v <= lo if lo_open else v < lo)
        high_bad = hi is not None and (v >= hi if hi_open else v > hi)
        if not math.isfinite(v) or low_bad or high_bad:
            if lo is not None and hi is not None:
                bound = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            elif lo is not None:
                bound = f" {'>' if lo_open else '>='} {lo:g}"
            elif hi is not None:
                bound = f" {'<' if hi_open else '<='} {hi:g}"
            else:
                bound = ""
            raise argparse.ArgumentTypeError(f"must be a finite number{bound}, got {text}")
        return v
    return parse


count = integer(lo=1)                              # workers, epochs, steps: at least one
natural = integer(lo=0)                            # 0 has a meaning (off, all, default)
positive = number(lo=0, lo_open=True)              # learning rates, seconds
nonnegative = number(lo=0)                         # weight decay, clipping (0: off)
momentum = number(lo=0, hi=1, hi_open=True)        # [0, 1)


def names(choices, sep=","):
    """An argparse type: a list of names from choices separated by sep (empty items ignored; the
    empty string allowed: "all"); returns the text as given."""
    choices = list(choices)

    def parse(text):
        unknown = [n for n in text.split(sep) if n and n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, unknown))}; expected "
                                             f"{sep.join(choices)}")
        return text
    return parse


def items(kind, sep=","):
    """An argparse type: a non-empty list of values of type kind (another of these types)
    separated by sep; returns the list."""
    def parse(text):
        parts = [t.strip() for t in text.split(sep)]
        if not text.strip() or any(not t for t in parts):
            raise argparse.ArgumentTypeError(f"expected a {sep!r}-separated list, got {text!r}")
        out = []
        for t in parts:
            try:
                out.append(kind(t))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"{e} (in {text!r})") from None
        return out
    return parse


def one_line(err) -> str:
    """An exception's message as one line for parser.error(): its first line (sketchsgd's spec
    errors go on with the codec's options, which sketchsgd.describe() lists too)."""
    lines = str(err).strip().splitlines() or [type(err).__name__]
    head = lines[0].rstrip()
    if len(lines) > 1 and head.endswith(":"):  # "…; topk accepts:" and the list
        head = head[:-1].rsplit("; ", 1)[0]
    return head
