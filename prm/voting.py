"""Parse judge votes from `\\boxed{}` and aggregate them into a step score (pure functions)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_BOXED = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")
_THINK_END = "</think>"

PLUS_MINUS = (1, -1)  # the general-agent judges (paper appendix C.4)
WITH_NEUTRAL = (1, 0, -1)  # the personal-agent judge


def strip_reasoning(text: str) -> str:
    """The answer a thinking model gives after its reasoning: the text after the last `</think>` (its chat template may
    open the block in the prompt, so the completion holds only the closing tag). A `<think>` that never closes is all
    reasoning (the answer was cut off): nothing is left."""
    if _THINK_END in text:
        return text.rsplit(_THINK_END, 1)[1]
    if "<think>" in text:
        return ""
    return text


def parse_vote(text: str | None, allowed: Iterable[int] = PLUS_MINUS, *, strip_think: bool = True) -> int | None:
    """The vote in the first `\\boxed{...}` of `text`, if it is exactly one of `allowed`; else None (invalid).
    `strip_think`: look only after the reasoning (`strip_reasoning`), so a box inside `<think>` never casts the vote."""
    if text and strip_think:
        text = strip_reasoning(text)
    if not text:
        return None
    m = _BOXED.search(text)
    if not m:
        return None
    token = m.group(1).replace(" ", "")
    if not re.fullmatch(r"[+-]?\d+", token):
        return None
    value = int(token)
    return value if value in set(allowed) else None


def aggregate(votes: Sequence[int | None], mode: str = "mean") -> float:
    """Step score from votes: `mean` of valid votes (0 if none), or `majority` (ties and no valid vote give 0)."""
    valid = [v for v in votes if v is not None]
    if not valid:
        return 0.0
    if mode == "mean":
        return sum(valid) / len(valid)
    if mode == "majority":
        counts: dict[int, int] = {}
        for v in valid:
            counts[v] = counts.get(v, 0) + 1
        best = max(counts.values())
        winners = [v for v, c in counts.items() if c == best]
        return float(winners[0]) if len(winners) == 1 else 0.0
    raise ValueError(f"unknown aggregate mode {mode!r}: use 'mean' or 'majority'")
