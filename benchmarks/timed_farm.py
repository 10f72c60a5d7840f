"""A farm wrapper for the benchmarks: when each env reset and env step happened and when each episode's env work
ended (wall-clock times, so figures from runner actors' processes compare with each other), and how many env steps
there were."""

from __future__ import annotations

import time
from typing import Any


class TimedFarm:
    def __init__(self, farm: Any):
        self.farm = farm
        self.resets: list[float] = []  # each reset's start
        self.step_times: list[float] = []  # each env step's end
        self.ends: list[float] = []  # each episode's last env step (terminated or truncated)

    def __getattr__(self, name: str) -> Any:  # capacity, lease, ...: the wrapped farm's
        return getattr(self.farm, name)

    @property
    def steps(self) -> int:
        return len(self.step_times)

    @property
    def t_first(self) -> float | None:
        return self.resets[0] if self.resets else None

    @property
    def t_last(self) -> float:
        return self.step_times[-1] if self.step_times else 0.0

    def route(self, family: str | None = None) -> TimedFarm:
        return self

    async def reset(self, slot: int, task: Any, seed: int | None = None):
        self.resets.append(time.time())
        return await self.farm.reset(slot, task, seed)

    async def step(self, slot: int, action: str):
        r = await self.farm.step(slot, action)
        now = time.time()
        self.step_times.append(now)
        if r.terminated or r.truncated:
            self.ends.append(now)
        return r

    def times(self) -> dict[str, list[float]]:
        return {"resets": self.resets, "steps": self.step_times, "ends": self.ends}


def steady_window(times: dict[str, list[float]], slots: int) -> tuple[float, float, int]:
    """The middle of a run of many more episodes than slots: from the moment `slots` episodes have ended (the first
    wave is over, every slot has been refilled once) to the last reset (after it no slot is refilled), and the env
    steps inside it. (0, 0, 0) when the run is too short to have a middle."""
    ends, resets = sorted(times["ends"]), sorted(times["resets"])
    if len(ends) < slots or not resets:
        return 0.0, 0.0, 0
    start, stop = ends[slots - 1], resets[-1]
    if stop <= start:
        return 0.0, 0.0, 0
    return start, stop, sum(1 for t in times["steps"] if start < t <= stop)
