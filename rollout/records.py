"""Step and Trajectory records, and a JSONL writer that never blocks the event loop.

One JSON object per step goes to `trajectories.jsonl` (fields fixed by DESIGN.md); one per episode goes to
`episodes.jsonl`, so an episode that aborted before its first step is still on record.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np


class EpisodeStatus(str, Enum):
    """queued -> running -> ok | failed | aborted (see `TRANSITIONS`)."""

    QUEUED = "queued"
    RUNNING = "running"
    OK = "ok"  # ended by the env (terminated or truncated)
    FAILED = "failed"  # the policy or judge failed; the env is fine
    ABORTED = "aborted"  # the env or its worker died, hung or raised


TRANSITIONS: dict[EpisodeStatus, set[EpisodeStatus]] = {
    EpisodeStatus.QUEUED: {EpisodeStatus.RUNNING, EpisodeStatus.ABORTED},
    EpisodeStatus.RUNNING: {EpisodeStatus.OK, EpisodeStatus.FAILED, EpisodeStatus.ABORTED},
    EpisodeStatus.OK: set(),
    EpisodeStatus.FAILED: set(),
    EpisodeStatus.ABORTED: set(),
}


@dataclass
class JudgeRecord:
    score: float
    votes: list[int | None]
    raw: list[str]


@dataclass
class Step:
    run_id: str
    episode_id: str
    group_id: str
    task_id: str
    step_index: int
    action: str
    next_state: dict[str, str]
    signals: dict[str, Any]
    status: str = EpisodeStatus.RUNNING.value
    judge: JudgeRecord | None = None
    outcome: float | None = None
    reward: float | None = None  # R_t = outcome + coef * step score
    advantage: float | None = None  # None: no gradient for this step
    weight_version: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    # exact token ids / logprobs for training (kept in memory; written only when records.token_ids is on)
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    output_ids: list[int] = field(default_factory=list, repr=False)
    output_logprobs: list[float] = field(default_factory=list, repr=False)

    TOKEN_FIELDS = ("prompt_ids", "output_ids", "output_logprobs")

    def to_json(self, token_ids: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not token_ids:
            for k in self.TOKEN_FIELDS:
                d.pop(k)
        return d


@dataclass
class Trajectory:
    run_id: str
    episode_id: str
    group_id: str
    task_id: str
    status: EpisodeStatus = EpisodeStatus.QUEUED
    steps: list[Step] = field(default_factory=list)
    outcome: float | None = None
    reason: str = ""  # why an episode failed or aborted (with the traceback text)
    attempt: int = 0  # retries of the same task slot after an abort
    split: str = "train"
    iteration: int = 0
    wall_s: float = 0.0

    def move(self, new: EpisodeStatus, reason: str = "") -> None:
        if new not in TRANSITIONS[self.status]:
            raise ValueError(f"episode {self.episode_id}: illegal status change {self.status.value} -> {new.value}")
        self.status = new
        if reason:
            self.reason = reason
        for s in self.steps:
            s.status = new.value

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "episode_id": self.episode_id,
            "group_id": self.group_id,
            "task_id": self.task_id,
            "status": self.status.value,
            "reason": self.reason,
            "attempt": self.attempt,
            "split": self.split,
            "iteration": self.iteration,
            "num_steps": len(self.steps),
            "outcome": self.outcome,
            "wall_s": round(self.wall_s, 4),
        }


def _default(o: Any) -> Any:
    if isinstance(o, Enum):
        return o.value
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return f"<array {o.shape} {o.dtype}>"
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return repr(o)


class JsonlWriter:
    """Appends JSON lines from a background thread; `flush()` waits and fsyncs (call it at batch ends)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"jsonl:{self.path.name}", daemon=True)
        self._thread.start()

    def write(self, obj: dict[str, Any]) -> None:
        self._raise_if_failed()
        self._queue.put(("row", json.dumps(obj, default=_default, ensure_ascii=False)))

    def flush(self) -> None:
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait()
        self._raise_if_failed()

    def close(self) -> None:
        if self._thread.is_alive():
            self.flush()
            self._queue.put(("stop", None))
            self._thread.join()
        self._file.close()

    def _run(self) -> None:
        while True:
            kind, payload = self._queue.get()
            try:
                if kind == "row":
                    self._file.write(payload + "\n")
                elif kind == "flush":
                    self._file.flush()
                    os.fsync(self._file.fileno())
                    payload.set()
                else:
                    return
            except BaseException as exc:  # keep the thread alive so flush() reports instead of hanging
                self._error = exc
                if kind == "flush":
                    payload.set()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise OSError(f"writing {self.path} failed: {self._error}") from self._error

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
