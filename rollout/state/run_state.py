"""What a run has committed, on disk as `<run>/run_state.json` (one small JSON object, `RunState`), replaced atomically.

A run commits at its checkpoints: the trainer (weights, optimizer, KL reference, version) and the RNG states go to
`checkpoints/it<NNNNNN>/`, then this file is replaced (written to a temporary file, fsynced, renamed over the old one,
the directory fsynced) to point at it. So at any moment, a `kill -9` included, the file names a complete checkpoint and
says exactly which records of the run's JSONL files it covers: training iterations `< iterations_done` and the
evaluations in `evals_done`. Everything else in those files came after it and is superseded when the run resumes
(rollout/state/resume.py). The format is documented in docs/long_runs.md ("The run state").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "run_state.json"
FORMAT = 1
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "it"  # checkpoints/it<NNNNNN>: the commits; other names there (failed-v<N>) are left alone


@dataclass
class RunState:
    format: int = FORMAT
    run_name: str = ""
    iterations_done: int = 0  # training iterations 0 .. iterations_done - 1 are trained, synced and on disk
    evals_done: list[int] = field(default_factory=list)  # evaluation points whose episodes and rows are on disk
    weight_version: int = 0  # the trainer's version in `checkpoint` (0: the initial weights)
    checkpoint: str | None = None  # the trainer + RNG checkpoint, relative to the run dir; None: the initial weights
    sampler_position: int = 0  # training tasks drawn before iteration `iterations_done` (the sampler replays to it)
    tasks_digest: str = ""  # sha256 of the training task ids in order: a resume must draw from the same task list
    # the staleness books of the committed iterations (train.staleness.StalenessReport's run totals)
    produced: int = 0
    trained: int = 0
    dropped_stale: int = 0
    dropped_future: int = 0
    staleness: dict[str, int] = field(default_factory=dict)  # versions behind -> trained samples (keys as strings)
    aborted_episodes: int = 0  # aborted attempts in the committed iterations and evaluations
    sync_failures: int = 0  # failed weight syncs in a row at the checkpoint
    resumes: int = 0  # how many times the run was resumed (screenshots of attempt a go to screenshots/a<a>/)
    finished: bool = False  # the run ended (its last iteration and evaluation are committed)
    wandb_id: str | None = None  # the W&B run this run logs to (run.loggers=[wandb]): a resume continues it
    updated: str = ""  # local time of the last write

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = STATE_FILE) -> RunState:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ValueError(f"{where}: run state format {data.get('format')!r}; this NextState reads format {FORMAT}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown} (written by a newer NextState?)")
        return cls(**data)


def tasks_digest(tasks: Sequence[dict[str, Any]]) -> str:
    return hashlib.sha256("\n".join(str(t.get("id")) for t in tasks).encode()).hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a reader (or a crash) sees the old content or the new, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fsync_dir(path.parent)


def write_state(run_dir: Path, state: RunState) -> None:
    state.updated = time.strftime("%Y-%m-%d %H:%M:%S")
    atomic_write(Path(run_dir) / STATE_FILE, (json.dumps(dataclasses.asdict(state), indent=2) + "\n").encode())


def read_state(run_dir: Path) -> RunState | None:
    """The run's state, or None for a directory without one (a run killed before its first commit)."""
    path = Path(run_dir) / STATE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:  # only a hand edit can do this: writes are atomic
        raise ValueError(f"{path} is not valid JSON ({exc}); it is written atomically, so it was edited") from exc
    return RunState.from_json(data, str(path))


__all__ = ["CHECKPOINTS_DIR", "CHECKPOINT_PREFIX", "FORMAT", "STATE_FILE", "RunState", "atomic_write", "fsync_dir", "read_state", "tasks_digest", "write_state"]
