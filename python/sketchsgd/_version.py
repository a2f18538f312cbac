"""The PyTorch versions sketchsgd supports, checked when the package is imported: an older torch
fails there with the reason, not later inside a collective."""

import re

OLDEST = (2, 4)  # FSDP2, bfloat16 collectives on gloo, torch.compile of DDP; tested on 2.11 and 2.13


def check(version: str) -> None:
    """ImportError unless version (torch.__version__) is OLDEST or newer."""
    m = re.match(r"(\d+)\.(\d+)", str(version))
    if m is None or tuple(int(g) for g in m.groups()) < OLDEST:
        raise ImportError(f"sketchsgd needs PyTorch >= {OLDEST[0]}.{OLDEST[1]}, and this is torch {version}: "
                          "install a newer one (the project's environment pins torch==2.13.0: scripts/venv.sh)")
