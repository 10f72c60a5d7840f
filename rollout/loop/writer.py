"""The files of one run directory, written as things happen."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.loggers import Loggers
from rollout.records import JsonlWriter
from train.records import Trajectory


class RunWriter:
    """The files of one run directory (and the configured loggers: every metrics row goes to them too)."""

    def __init__(self, out_dir: Path, record_token_ids: bool = False, loggers: Loggers | None = None):
        self.out_dir = out_dir
        self.token_ids = record_token_ids
        self.loggers = loggers or Loggers()
        self.trajectories = JsonlWriter(out_dir / "trajectories.jsonl")
        self.eval_trajectories = JsonlWriter(out_dir / "eval_trajectories.jsonl")
        self.episodes = JsonlWriter(out_dir / "episodes.jsonl")
        self.metrics = JsonlWriter(out_dir / "metrics.jsonl")

    def episode(self, traj: Trajectory) -> None:
        self.episodes.write(traj.summary())

    def steps(self, trajs: Sequence[Trajectory], *, eval_split: bool = False) -> None:
        w = self.eval_trajectories if eval_split else self.trajectories
        for tr in trajs:
            for s in tr.steps:
                w.write(s.to_json(self.token_ids))

    def metric(self, row: dict[str, Any]) -> None:
        self.metrics.write(row)
        self.loggers.log(row)

    def flush(self) -> None:
        for w in (self.trajectories, self.eval_trajectories, self.episodes, self.metrics):
            w.flush()

    def close(self) -> None:
        for w in (self.trajectories, self.eval_trajectories, self.episodes, self.metrics):
            w.close()
        self.loggers.close()
