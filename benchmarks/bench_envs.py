"""Envs and a policy for benchmarks/farm.py (importable by Ray workers and gymnasium's subprocesses)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import envs
from envs.base import AgentEnv, Transition


class TrivialEnv(AgentEnv):
    """Echoes the action; never ends. The cheapest AgentEnv there is (~2 us per step)."""

    def __init__(self, **kw: Any):
        super().__init__(max_steps=10**9, tasks=[{"id": "trivial"}], **kw)

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[dict]:
        return [{"id": "trivial"}]

    def begin(self, task: dict) -> Transition:
        return Transition("go", role="user")

    def act(self, action: str) -> Transition:
        return Transition(action)

    def verify(self) -> float:
        return 0.0


class SleepEnv(TrivialEnv):
    """Every step sleeps `step_s` (simulated I/O: a shell command, a container exec, a screenshot)."""

    def __init__(self, step_s: float = 0.05, **kw: Any):
        super().__init__(**kw)
        self.step_s = step_s

    def act(self, action: str) -> Transition:
        time.sleep(self.step_s)
        return Transition(action)


class EpisodeEnv(TrivialEnv):
    """Episodes of `task["steps"]` steps of `task["step_s"]` sleep each; the last step ends it with outcome 1."""

    def act(self, action: str) -> Transition:
        task = self.task or {}
        time.sleep(float(task.get("step_s", 0.05)))
        done = self.step_index >= int(task.get("steps", 10))
        return Transition(action, outcome=1.0 if done else None)


def register_bench_envs() -> None:
    envs.register("bench_trivial", TrivialEnv, overwrite=True)
    envs.register("bench_sleep", SleepEnv, overwrite=True)
    envs.register("bench_episode", EpisodeEnv, overwrite=True)
