"""Small real envs for testing the farm, runner and loop (registered under "test-*" names)."""

from __future__ import annotations

import time

import envs
from envs.base import ERROR, PARSE_ERROR, PROGRESS, AgentEnv, Transition


class CountEnv(AgentEnv):
    """Reach `target` by sending "inc"; "dec" goes back. "raise" raises, "hang" sleeps (fault tests)."""

    family = "generic"

    def __init__(self, max_steps: int = 5, hang_s: float = 30.0, **kw):
        super().__init__(max_steps=max_steps, **kw)
        self.hang_s = hang_s
        self.value = 0

    @classmethod
    def tasks(cls, split: str = "train"):
        offset = 0 if split == "train" else 100
        return [{"id": f"count-{offset + i}", "target": 1 + i % 3} for i in range(12)]

    def begin(self, task):
        self.value = 0
        return Transition(f"reach {task['target']}", role="user", extra_info={"system_prompt": "say inc or dec"})

    def act(self, action):
        a = action.strip()
        if a == "raise":
            raise RuntimeError("boom: the env failed on purpose")
        if a == "hang":
            time.sleep(self.hang_s)
        if a not in ("inc", "dec"):
            return Transition(f"could not parse {a[:20]!r}: say inc or dec", signals={PARSE_ERROR: True})
        self.value += 1 if a == "inc" else -1
        good = a == "inc"
        if self.value == self.task["target"]:
            return Transition(f"value {self.value}: done", signals={PROGRESS: True}, outcome=1.0)
        return Transition(f"value {self.value}", signals={PROGRESS: good, ERROR: not good})

    def verify(self) -> float:
        return -1.0


def register_fixture_envs() -> None:
    envs.register("test-count", CountEnv, overwrite=True)
