"""Busy intervals of concurrent activities ("generate", "train", ...) and how much of the wall time they overlap.

A lane is busy while at least one of its spans is open (many generate calls may run at once). Used by the loop's
metrics and by benchmarks/train.py (the fraction of wall time the policy generated while the trainer trained).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

Interval = tuple[float, float]


def merge(intervals: Sequence[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of the intervals (empty ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in merge(intervals))


def intersection(x: Sequence[Interval], y: Sequence[Interval]) -> list[Interval]:
    """The times both interval sets cover."""
    mx, my = merge(x), merge(y)
    out, i, j = [], 0, 0
    while i < len(mx) and j < len(my):
        a, b = max(mx[i][0], my[j][0]), min(mx[i][1], my[j][1])
        if b > a:
            out.append((a, b))
        if mx[i][1] < my[j][1]:
            i += 1
        else:
            j += 1
    return out


class Timeline:
    """Records when each lane was busy. Not thread-safe: call from one event loop (spans around awaits are fine)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.start = clock()
        self._open: dict[str, int] = {}
        self._since: dict[str, float] = {}
        self.intervals: dict[str, list[Interval]] = {}

    def begin(self, lane: str) -> None:
        if self._open.get(lane, 0) == 0:
            self._since[lane] = self.clock()
        self._open[lane] = self._open.get(lane, 0) + 1

    def end(self, lane: str) -> None:
        n = self._open.get(lane, 0)
        if n <= 0:
            raise RuntimeError(f"timeline lane {lane!r} ended more often than it began")
        self._open[lane] = n - 1
        if n == 1:
            self.intervals.setdefault(lane, []).append((self._since.pop(lane), self.clock()))

    @contextmanager
    def span(self, lane: str) -> Iterator[None]:
        self.begin(lane)
        try:
            yield
        finally:
            self.end(lane)

    def busy(self, lane: str, since: float | None = None) -> float:
        return total(self._clipped(lane, since))

    def overlap(self, a: str, b: str, since: float | None = None) -> float:
        """Seconds during which lanes a and b were both busy."""
        return total(intersection(self._clipped(a, since), self._clipped(b, since)))

    def _clipped(self, lane: str, since: float | None) -> list[Interval]:
        iv = list(self.intervals.get(lane, []))
        if self._open.get(lane, 0) > 0:  # still busy: count up to now
            iv.append((self._since[lane], self.clock()))
        if since is not None:
            iv = [(max(a, since), b) for a, b in iv if b > since]
        return iv


__all__ = ["Interval", "Timeline", "intersection", "merge", "total"]
