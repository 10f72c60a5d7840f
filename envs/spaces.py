"""Gymnasium spaces for text observations and actions.

gymnasium's `Text` only admits characters of its charset (alphanumeric by default), so real shell output, code or prose
fails `check_env`. `FreeText` admits any `str` within its length bounds and samples printable ASCII.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces


class FreeText(spaces.Text):
    """Any string of `min_length`..`max_length` characters (unicode included)."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None):
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText({self.min_length}, {self.max_length})"


ROLE_SPACE = spaces.Text(16, min_length=1, charset=string.ascii_lowercase)


def message_space(max_chars: int) -> spaces.Dict:
    """Observation space of a text message: {"role": "user" | "tool", "content": str}."""
    return spaces.Dict({"role": ROLE_SPACE, "content": FreeText(max_chars)})


def truncate_middle(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of `text` within `limit` characters, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text, False
    marker = "\n[... {} characters truncated ...]\n"
    room = max(limit - len(marker.format(len(text))), 0)
    head = room // 2
    tail = room - head
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[-tail:] if tail else ""), True
