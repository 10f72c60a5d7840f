"""Trivial envs for the farm tests (registered with envs.register by `register_farm_envs`).

`ScriptEnv` does what its task says: `steps` steps per episode (the last one ends it with outcome 1.0), `step_s` / `reset_s`
of sleep (simulated I/O), `fail` = "reset" | "step" to raise, `hang` = True to block a step forever, `fail_first` = True to
raise only in the first attempt of that task id within this process. Class-level books (valid for the local backend,
where envs live in the test process) record concurrency peaks and closes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import envs
from envs.base import AgentEnv, Transition


class Books:
    """Process-wide counters the local-backend tests read (one lock, tiny critical sections)."""

    lock = threading.Lock()
    resetting = 0
    peak_resetting = 0
    running = 0  # envs between a successful reset and the end of their episode
    peak_running = 0
    closed: list[int] = []
    failed_once: set[str] = set()

    @classmethod
    def clear(cls) -> None:
        with cls.lock:
            cls.resetting = cls.peak_resetting = cls.running = cls.peak_running = 0
            cls.closed = []
            cls.failed_once = set()


class ScriptEnv(AgentEnv):
    family = "generic"

    def __init__(self, **kw: Any):
        super().__init__(max_steps=1000, tasks=[{"id": "default"}], **kw)
        self.env_id = id(self)
        self._in_episode = False

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[dict]:
        return [{"id": "default"}]

    def begin(self, task: dict) -> Transition:
        with Books.lock:
            Books.resetting += 1
            Books.peak_resetting = max(Books.peak_resetting, Books.resetting)
        try:
            time.sleep(float(task.get("reset_s", 0.0)))
            self._maybe_fail(task, "reset")
        finally:
            with Books.lock:
                Books.resetting -= 1
        self._end_episode()
        with Books.lock:
            Books.running += 1
            Books.peak_running = max(Books.peak_running, Books.running)
        self._in_episode = True
        return Transition(f"task {task['id']}", role="user", extra_info={"env_id": self.env_id, "pid": os.getpid()})

    def act(self, action: str) -> Transition:
        task = self.task or {}
        if task.get("hang") and action != "nohang":
            threading.Event().wait()  # blocks this thread forever (the farm must time it out)
        time.sleep(float(task.get("step_s", 0.0)))
        self._maybe_fail(task, "step")
        done = self.step_index >= int(task.get("steps", 3))
        if done:
            self._end_episode()
        return Transition(
            f"echo {action}", signals={"progress": True}, outcome=1.0 if done else None, extra_info={"env_id": self.env_id}
        )

    def verify(self) -> float:
        return 0.0

    def close(self) -> None:
        self._end_episode()
        with Books.lock:
            Books.closed.append(self.env_id)

    def _end_episode(self) -> None:
        if self._in_episode:
            self._in_episode = False
            with Books.lock:
                Books.running -= 1

    @staticmethod
    def _maybe_fail(task: dict, where: str) -> None:
        if task.get("fail") != where:
            return
        if task.get("fail_first"):
            with Books.lock:
                if task["id"] in Books.failed_once:
                    return
                Books.failed_once.add(task["id"])
        raise ValueError(f"scripted failure in {where} of task {task['id']}")


class EchoEnv(AgentEnv):
    """The trivial env: every step echoes the action; episodes never end on their own."""

    def __init__(self, **kw: Any):
        super().__init__(max_steps=10**9, tasks=[{"id": "echo"}], **kw)

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[dict]:
        return [{"id": "echo"}]

    def begin(self, task: dict) -> Transition:
        return Transition("go", role="user", extra_info={"pid": os.getpid()})

    def act(self, action: str) -> Transition:
        if action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))
        elif action == "boom":
            raise ValueError("boom: a scripted env exception")
        return Transition(f"echo {action}", extra_info={"pid": os.getpid()})

    def verify(self) -> float:
        return 0.0


def register_farm_envs() -> None:
    envs.register("farm_script", ScriptEnv, overwrite=True)
    envs.register("farm_echo", EchoEnv, overwrite=True)


class LockInfoEnv(EchoEnv):
    """Returns an unpicklable object in `info` on "lock" (the farm must fail that step, not the worker)."""

    def act(self, action: str) -> Transition:
        if action == "lock":
            import threading

            return Transition("locked", extra_info={"lock": threading.Lock()})
        return super().act(action)


def register_more_farm_envs() -> None:
    envs.register("farm_lockinfo", LockInfoEnv, overwrite=True)
