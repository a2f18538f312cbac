"""The int8 wire format's arithmetic for an all-reduce (compress/include/sketchsgd/compress/
wire.hpp, WireFloat::I8): a room's n values read as rows of `columns` (PowerSGD's factors: a
column per rank), each column's values in runs of ROWS rows sharing a float32 scale. The ranks
agree on every group's scale first (the largest magnitude anywhere: an all-reduce by max), round
their values to 127 // W levels of it, so that W ranks' integers add up in 8 bits, and read the
sum back through the same scales. A value that is not finite makes its group's largest +inf on
every rank, and the group's sum NaN, as a float sum would be. The communicator runs the
collectives; this module only computes."""

import torch

ROWS = 64  # wire.hpp: kI8Rows


def levels(world: int) -> int:
    """The integer range ±L a rank rounds to, so that `world` ranks' sum fits in an int8."""
    if world > 127:
        raise ValueError(f"wire=int8 sums at most 127 ranks (127 // W levels each), this group has {world}: "
                         "use fp16 or bf16")
    return 127 // world


def groups(n: int, columns: int) -> int:
    """Scales for n values (wire.hpp: i8_groups)."""
    block = columns * ROWS
    return (n + block - 1) // block * columns


def padded(n: int, columns: int) -> int:
    """n rounded up to whole row blocks: the integers' room."""
    return n + (-n) % (columns * ROWS)


class Groups:
    """t's values (float32, 1-D) by group: shaped (row blocks, ROWS, columns), through a padded
    copy where n is not whole row blocks. Few passes: on the CPU each costs more in dispatch than
    in arithmetic at these sizes."""

    def __init__(self, t, columns: int):
        self.n, self.columns = t.numel(), columns
        whole = padded(self.n, columns)
        x = t if whole == self.n else torch.nn.functional.pad(t, (0, whole - self.n))
        self.x = x.view(-1, ROWS, columns)

    def largest(self):
        """Each group's largest magnitude (float32, its groups() values), +inf where a value is
        not finite: what the ranks' max all-reduce takes."""
        m = torch.linalg.vector_norm(self.x, float("inf"), dim=1)
        return m.nan_to_num_(nan=float("inf")).view(-1)

    def quantize(self, largest, level: int, out):
        """The values as integers of ±level in units of largest / level (out: int8, padded(n, columns)
        values; a group whose largest is 0 or not finite gives zeros)."""
        unit = (largest.view(-1, 1, self.columns) / level).clamp_min_(torch.finfo(torch.float32).tiny)
        y = torch.div(self.x, unit).round_().clamp_(-level, level).nan_to_num_(0.0)  # 0 / tiny = 0; x / inf = 0
        out.view_as(self.x).copy_(y)
        return out

    def dequantize(self, total, largest, level: int, into):
        """into (float32, n values) = the summed integers (total: int8, padded(n, columns)
        values, the first n summed) times their groups' unit; NaN in a group whose largest is not
        finite."""
        m = largest.view(-1, 1, self.columns)
        unit = (m / level).masked_fill_(~torch.isfinite(m), float("nan"))
        into.copy_(torch.mul(total.view_as(self.x), unit).view(-1)[:self.n])
