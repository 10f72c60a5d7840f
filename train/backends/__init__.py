"""Trainer backends behind one protocol: `torch` (CPU / one GPU, HF model) and `megatron` (megatron-core)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from train.records import TrainSample


@runtime_checkable
class Trainer(Protocol):
    """What the rollout <-> train loop needs of a trainer. The optional members have defaults here: a backend that
    subclasses Trainer gets them, and overrides what it supports."""

    version: int  # weight version after the last update (0 = initial weights)

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]: ...

    def export_weights(self, path: str) -> str: ...

    def state_dict(self) -> dict[str, Any]: ...

    # ----- optional -----
    def save_checkpoint(self, directory: str | Path) -> Path:
        """A full checkpoint (weights, reference model, optimizer, version) a failed run can resume from."""
        raise NotImplementedError(f"{type(self).__name__} writes no checkpoints (its weights can still be exported)")

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what `save_checkpoint` wrote (a resumed run continues from it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot load checkpoints, so its runs cannot be resumed")

    def close(self) -> None:
        """Release what the trainer holds beyond memory (megatron: its process group and parallel state)."""
        return None
