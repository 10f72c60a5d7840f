"""Weight sync: after each update the policy gets the trainer's new weights, tagged with the trainer's version.

- `memory`: the trainer's HF state dict (CPU copy) handed to an in-process policy (LocalPolicy).
- `disk`: `trainer.export_weights(<weights_dir>/v<version>)` writes a complete HF model directory, then the policy
  loads it by path; for SGLang servers that is `/update_weights_from_disk` with `weight_version` on every server (the
  SGLang client does the broadcast). The newest `keep_versions` exports are kept, older ones deleted.
- `auto`: memory for policies that declare `in_process = True`, disk for the rest (HTTP servers).
The policy stamps every completion with the version it served (`Completion.weight_version` -> `Step.weight_version`).

A policy on servers with a parity check (`Policy.parity_config`: policy=sglang, policy=vllm) has it run after every
sync and at the start (`check_start`: the servers serve the trainer's initial weights): each server's log-probs on a
fixed probe against the trainer's (rollout/policy/parity.py); above the tolerance, WeightParityError (the loop stops
the run with it) or a warning.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.policy.base import Policy, WeightUpdate
from rollout.policy.parity import ParityResult, check_parity
from train.backends import Trainer

log = logging.getLogger(__name__)

MODES = ("auto", "memory", "disk")
_VERSION_DIR = re.compile(r"^v(\d+)$")


@dataclass
class WeightSyncConfig:
    mode: str = "auto"
    weights_dir: str | None = None  # disk mode: where versioned exports go (must be readable by the policy servers)
    keep_versions: int = 2  # exports kept on disk (>= 1)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"weight_sync={self.mode!r}: use one of {', '.join(MODES)}")
        if self.keep_versions < 1:
            raise ValueError(f"keep_weight_versions must be >= 1, got {self.keep_versions}")


@dataclass
class SyncResult:
    version: int
    mode: str
    path: str | None
    seconds: float  # the whole sync, the parity check included
    parity: ParityResult | None = None  # the servers' log-probs against the trainer's after it (policies on servers)


def resolve_mode(policy: Any, mode: str) -> str:
    if mode != "auto":
        return mode
    return "memory" if policy.in_process else "disk"


def prune_versions(root: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest `v<N>` directories under `root`; returns what was deleted."""
    if not root.is_dir():
        return []
    found = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _VERSION_DIR.match(p.name))),
        key=lambda x: x[0],
    )
    gone = [p for _, p in found[:-keep]]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def remove_versions_after(root: Path, version: int) -> list[Path]:
    """Delete the `v<N>` exports under `root` with N > `version`: a resumed run's superseded attempt made them, and
    left there they would outrank (and get kept over) the versions the run now exports again."""
    if not root.is_dir():
        return []
    gone = [p for p in root.iterdir() if p.is_dir() and (m := _VERSION_DIR.match(p.name)) and int(m.group(1)) > version]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


class WeightSync:
    def __init__(self, policy: Policy, trainer: Trainer, cfg: WeightSyncConfig | None = None, *,
                 temperature: float = 1.0, trainer_lock: AbstractAsyncContextManager | None = None):
        """`temperature`: the sampling temperature (the parity probe's, the trainer's); `trainer_lock`: held while
        the trainer scores the probe (the loop's: no update runs meanwhile)."""
        self.policy, self.trainer = policy, trainer
        self.cfg = cfg or WeightSyncConfig()
        self.mode = resolve_mode(policy, self.cfg.mode)
        if self.mode == "disk" and not self.cfg.weights_dir:
            raise ValueError("weight sync to disk needs a weights_dir (a directory the policy servers can read)")
        self.temperature = temperature
        self.trainer_lock = trainer_lock

    async def check_parity(self) -> ParityResult | None:
        """The policy's servers against the trainer now (None: a policy without the check)."""
        cfg = getattr(self.policy, "parity_config", None)
        if cfg is None:
            return None
        return await check_parity(self.policy, self.trainer, self.trainer.version, cfg, self.temperature,
                                  self.trainer_lock)

    async def push(self) -> SyncResult:
        """Send the trainer's current weights to the policy; returns when the policy serves them."""
        t0 = time.perf_counter()
        version = self.trainer.version
        path = None
        if self.mode == "memory":
            update = WeightUpdate(version=version, state_dict=await asyncio.to_thread(self.trainer.state_dict))
        else:
            root = Path(self.cfg.weights_dir)  # type: ignore[arg-type]
            path = await asyncio.to_thread(self.trainer.export_weights, str(root / f"v{version}"))
            update = WeightUpdate(version=version, path=str(Path(path).resolve()))
        await self.policy.update_weights(update)
        if path is not None:
            prune_versions(Path(self.cfg.weights_dir), self.cfg.keep_versions)  # type: ignore[arg-type]
        parity = await self.check_parity()
        seconds = time.perf_counter() - t0
        log.info("weights v%d synced to the policy (%s) in %.2f s", version, self.mode, seconds)
        return SyncResult(version, self.mode, path, seconds, parity)


__all__ = ["MODES", "SyncResult", "WeightSync", "WeightSyncConfig", "prune_versions", "remove_versions_after",
           "resolve_mode"]
