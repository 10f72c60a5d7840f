"""Farm metrics: a snapshot dataclass (`EnvFarm.metrics()`) and the sliding-window rate meter behind steps/s and resets/s."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Any


class RateMeter:
    """Events per second over the last `window_s` seconds, from one-second buckets (O(1) per event batch)."""

    def __init__(self, window_s: float = 10.0, clock=time.monotonic):
        self.window_s = max(float(window_s), 1.0)
        self._clock = clock
        self._t0 = clock()
        self._buckets: deque[list[float]] = deque()  # [second, count]
        self.total = 0

    def add(self, n: int = 1) -> None:
        self.total += n
        sec = int(self._clock())
        if self._buckets and self._buckets[-1][0] == sec:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([sec, n])
            self._trim(sec)

    def rate(self) -> float:
        now = self._clock()
        self._trim(int(now))
        span = min(self.window_s, max(now - self._t0, 1e-9))
        return sum(c for _, c in self._buckets) / span

    def _trim(self, sec: int) -> None:
        while self._buckets and self._buckets[0][0] <= sec - self.window_s:
            self._buckets.popleft()


@dataclass
class FarmMetrics:
    """One snapshot of the farm's state and counters (all counters are totals since `start()`)."""

    backend: str
    workers: int  # worker processes (Ray actors; 1 for the local backend)
    workers_alive: int  # up and answering (not restarting, not dead)
    env_slots: int  # slots not retired (a slot retires when its worker exhausts max_worker_restarts)
    envs_alive: int  # envs that exist and were reset successfully
    in_flight: int  # episodes in flight = leased slots
    peak_in_flight: int
    ops_in_flight: int  # resets and steps sent to workers and not answered yet
    starting: int  # resets in flight (env starts), capped by max_starting
    peak_starting: int
    steps_per_s: float  # over the last metrics_window_s
    resets_per_s: float
    steps: int
    resets: int
    timeouts: int  # resets/steps that ran past their timeout (the env was recycled)
    env_errors: int  # resets/steps that raised (the env was recycled)
    restarts: int  # worker restarts (crash, hang or broken channel)
    aborted_episodes: int  # leases during which an EnvError reached the episode
    last_recovery_s: float | None  # failure detected -> worker healthy again, for the latest restart
    uptime_s: float

    @classmethod
    def total(cls, parts: list[FarmMetrics]) -> FarmMetrics:
        """Several farms as one (a mixed farm's families): counts added (a peak: the sum of the farms' peaks, an upper
        bound), the latest recovery and the uptime the largest."""
        if not parts:
            raise ValueError("no farm metrics to add up")
        largest = ("last_recovery_s", "uptime_s")
        out: dict[str, Any] = {"backend": parts[0].backend}
        for f in fields(cls):
            if f.name == "backend":
                continue
            values = [getattr(p, f.name) for p in parts]
            if f.name in largest:
                present = [v for v in values if v is not None]
                out[f.name] = max(present) if present else None
            else:
                out[f.name] = sum(values)
        return cls(**out)

    def as_dict(self, prefix: str = "farm/") -> dict[str, Any]:
        """Flat, JSON-ready (for metrics.jsonl and progress bars)."""
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            out[prefix + k] = round(v, 4) if isinstance(v, float) else v
        return out

    def brief(self) -> str:
        """A short line for a progress bar."""
        return (
            f"envs {self.envs_alive}/{self.env_slots} in-flight {self.in_flight} "
            f"{self.steps_per_s:.0f} st/s {self.resets_per_s:.1f} rs/s "
            f"restarts {self.restarts} aborted {self.aborted_episodes}"
        )
