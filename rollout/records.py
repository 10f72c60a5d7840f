"""The run's JSONL files: a writer that never blocks the event loop (background thread, fsync at batch ends).

The record types themselves (Step, Trajectory, TrainSample) live in `train.records`, the lowest layer that needs them.
One JSON object per step goes to `trajectories.jsonl`; one per episode goes to `episodes.jsonl`, so an episode that
aborted before its first step is still on record.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np


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


def finished_episodes(steps: list[dict[str, Any]]) -> dict[str, list[list[dict[str, Any]]]]:
    """trajectories.jsonl step records -> {group_id: [each finished ("ok") episode's steps, in step order]}."""
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for s in steps:
        by_episode.setdefault(s["episode_id"], []).append(s)
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for ep in by_episode.values():
        ep.sort(key=lambda s: s["step_index"])
        if ep[0]["status"] == "ok":
            groups.setdefault(ep[0]["group_id"], []).append(ep)
    return groups
