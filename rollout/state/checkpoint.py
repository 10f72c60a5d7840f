"""Commits of a run: a trainer checkpoint with the RNG states, then the run state that names it
(rollout/state/run_state.py).

`run.checkpoint_every=k` checkpoints the trainer after every k-th iteration and after the last one (0: only after the
last); `run.keep_checkpoints` are kept. A commit writes `checkpoints/it<NNNNNN>/trainer/` (the backend's
`save_checkpoint`: weights, optimizer, KL reference, version) and `rng.pt` (Python's, numpy's and torch's global
states and the policy's sampler), fsyncs them, and only then replaces `run_state.json`: a kill at any point leaves the
previous commit intact. Commits that need no trainer checkpoint (an evaluation before any training) only write the
state. The loop calls `commit` between iterations, never while the trainer trains.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rollout.policy.base import Policy
from rollout.state.run_state import CHECKPOINT_PREFIX, CHECKPOINTS_DIR, RunState, fsync_dir, write_state
from train.backends import Trainer

log = logging.getLogger(__name__)

RNG_FILE = "rng.pt"
TRAINER_DIR = "trainer"


@dataclass
class CheckpointConfig:
    every: int = 1  # trainer checkpoint after every k-th iteration and after the last (0: only after the last)
    keep: int = 1  # checkpoints kept (the newest)

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"run.checkpoint_every must be >= 0 (0: only after the last iteration), got {self.every}")
        if self.keep < 1:
            raise ValueError(f"run.keep_checkpoints must be >= 1, got {self.keep}")


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def rng_states(policy: Policy) -> dict[str, Any]:
    import torch  # a run with a trainer has it loaded already

    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "torch": torch.get_rng_state(), "policy": policy.rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any], policy: Policy) -> None:
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    policy.set_rng_state(states.get("policy"))


class Checkpointer:
    def __init__(self, run_dir: Path, cfg: CheckpointConfig, trainer: Trainer, policy: Policy, state: RunState):
        self.run_dir, self.cfg, self.trainer, self.policy = Path(run_dir), cfg, trainer, policy
        self.state = state  # the last state written
        self.seconds = 0.0  # time spent writing trainer checkpoints (reported in the run summary)

    def due(self, iterations_done: int, planned: int) -> bool:
        """Whether the commit after `iterations_done` iterations checkpoints the trainer."""
        return iterations_done >= planned or (self.cfg.every > 0 and iterations_done % self.cfg.every == 0)

    async def commit(self, state: RunState, *, trainer: bool) -> None:
        """Write `state` (with a new trainer checkpoint first when `trainer`)."""
        if trainer:
            t0 = time.perf_counter()
            rel = f"{CHECKPOINTS_DIR}/{CHECKPOINT_PREFIX}{state.iterations_done:06d}"
            await asyncio.to_thread(self._save, self.run_dir / rel)
            state.checkpoint, state.weight_version = rel, self.trainer.version
            self.seconds += time.perf_counter() - t0
            log.info("checkpoint %s (trainer v%d) in %.2f s", rel, self.trainer.version, time.perf_counter() - t0)
        await asyncio.to_thread(write_state, self.run_dir, state)
        self.state = state
        if trainer:
            self._prune()

    def _save(self, target: Path) -> None:
        import torch

        if target.exists():  # left by an attempt killed before it committed
            shutil.rmtree(target)
        target.mkdir(parents=True)
        self.trainer.save_checkpoint(target / TRAINER_DIR)
        torch.save(rng_states(self.policy), target / RNG_FILE)
        _fsync_tree(target)

    def _prune(self) -> None:
        root = self.run_dir / CHECKPOINTS_DIR
        ours = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX))
        for p in ours[: -self.cfg.keep]:
            if f"{CHECKPOINTS_DIR}/{p.name}" != self.state.checkpoint:
                shutil.rmtree(p, ignore_errors=True)

    def restore(self) -> None:
        """Load the state's trainer checkpoint and RNG states (nothing to load for the initial weights)."""
        if self.state.checkpoint is None:
            return
        root = self.run_dir / self.state.checkpoint
        if not (root / RNG_FILE).exists():
            raise FileNotFoundError(f"{root} is not a complete checkpoint (no {RNG_FILE}); run_state.json names it")
        import torch

        self.trainer.load_checkpoint(root / TRAINER_DIR)
        if self.trainer.version != self.state.weight_version:
            raise ValueError(f"{root}: the trainer checkpoint is at weight version {self.trainer.version}, the run "
                             f"state says {self.state.weight_version}")
        restore_rng(torch.load(root / RNG_FILE, weights_only=False), self.policy)


__all__ = ["CheckpointConfig", "Checkpointer", "RNG_FILE", "TRAINER_DIR", "restore_rng", "rng_states"]
