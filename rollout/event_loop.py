"""Which asyncio event loop a process runs (`run.event_loop`; the dev server's `--event-loop`).

uvloop (libuv under asyncio's API) costs about a third less CPU per socket event than asyncio's own loop; at hundreds
of episodes in flight the driver's loop is where a step's CPU goes (docs/performance.md, "The rollout side at steady
state"), so `auto` uses it wherever it is installed (it is a dependency on Linux and macOS) and asyncio's loop otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

CHOICES = ("auto", "uvloop", "asyncio")
T = TypeVar("T")


def event_loop_factory(kind: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A loop factory for `asyncio.Runner` (None: asyncio's default loop)."""
    if kind not in CHOICES:
        raise ValueError(f"event_loop={kind!r}: use one of {', '.join(CHOICES)}")
    if kind == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":
            raise ValueError("event_loop=uvloop but uvloop is not installed (pip install uvloop), or use auto") from None
        return None
    return uvloop.new_event_loop


def run_async(main: Coroutine[Any, Any, T], kind: str = "auto") -> T:
    """`asyncio.run(main)` on the loop `kind` names."""
    with asyncio.Runner(loop_factory=event_loop_factory(kind)) as runner:
        return runner.run(main)
