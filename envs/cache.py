"""Where NextState keeps what it builds once and reuses: one root for every cache (warm starts, GUI demonstrations, SWE
clones and venvs), so one variable moves them all (the test suite points it at a fresh folder).

`NEXTSTATE_CACHE` when set; else /var/cache/nextstate as root (sandbox uids must reach SWE clones there), else
~/.cache/nextstate. The docker / rootfs image builds keep their own place (envs/runtime/rootfs_image.py): they are keyed by
their recipe, so reusing them can hide nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "NEXTSTATE_CACHE"


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path("/var/cache/nextstate") if os.geteuid() == 0 else Path.home() / ".cache" / "nextstate"


def cache_dir(kind: str) -> Path:
    """`<cache root>/<kind>` (e.g. "warmstart", "gui-demos", "swe"); not created here."""
    return cache_root() / kind
