"""Seeds derived from names: a random draw that is a pure function of what it is for (a run seed, an episode, a turn,
a judge vote), so it does not depend on which requests happened to share a batch or arrive first."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of `parts` (their str()), e.g. (split, episode seed, turn)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
