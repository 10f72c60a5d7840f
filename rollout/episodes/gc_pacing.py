"""Python's cyclic garbage collector, paced for a process that runs hundreds of episodes at once (`loop.gc_threshold`).

CPython starts a generation-0 collection after every 700 net allocations of container objects (lists, dicts, tuples,
objects). An episode step allocates thousands (token-id lists, messages, HTTP headers and JSON bodies, records), and a
collector process holds a large heap (sessions' token ids, trajectories in flight, torch's and transformers' module
objects), so the collections run all the time and every tenth one also walks generation 1. Measured on 512 episodes in
flight (benchmarks/rollout_side.py --gc python paced, docs/performance.md): the driver's CPU per step falls by about a
third with a generation-0 threshold of 50,000, and steady-state steps/s rises accordingly; a gc.freeze() of the
start-up heap was not adopted (a process-wide, permanent change; its trial's figures were not kept).

While any episode runs in this process, the threshold is raised to `threshold0` (never lowered); when the last one ends
the interpreter's own setting comes back. Cyclic garbage then lives somewhat longer (until 50,000 allocations; what
that costs in memory was not measured); reference counting still frees everything that is not in a cycle at once.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

DEFAULT_THRESHOLD0 = 50_000

_lock = threading.Lock()
_active = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def paced_gc(threshold0: int) -> Iterator[None]:
    """Generation-0 threshold at least `threshold0` inside the block (0 or less: leave the collector as it is).
    Nested and concurrent blocks (many episodes at once) share one raise: the first in sets it, the last out restores."""
    global _active, _saved
    if threshold0 <= 0:
        yield
        return
    with _lock:
        if _active == 0:
            _saved = gc.get_threshold()
            if threshold0 > _saved[0]:
                gc.set_threshold(threshold0, *_saved[1:])
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None


__all__ = ["DEFAULT_THRESHOLD0", "paced_gc"]
