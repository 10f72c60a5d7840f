"""A farm wrapper for the benchmarks: when env work started (the first reset) and ended (the last env step), and how
many env steps there were. Wall-clock times, so figures from runner actors' processes compare with each other."""

from __future__ import annotations

import time
from typing import Any


class TimedFarm:
    def __init__(self, farm: Any):
        self.farm = farm
        self.steps = 0
        self.t_first: float | None = None
        self.t_last = 0.0

    def __getattr__(self, name: str) -> Any:  # capacity, lease, ...: the wrapped farm's
        return getattr(self.farm, name)

    def route(self, family: str | None = None) -> TimedFarm:
        return self

    async def reset(self, slot: int, task: Any, seed: int | None = None):
        if self.t_first is None:
            self.t_first = time.time()
        return await self.farm.reset(slot, task, seed)

    async def step(self, slot: int, action: str):
        r = await self.farm.step(slot, action)
        self.steps += 1
        self.t_last = time.time()
        return r
