"""Trainer backends behind one protocol: `torch` (CPU / one GPU, HF model) and `megatron` (megatron-core)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from train.records import TrainSample


@runtime_checkable
class Trainer(Protocol):
    version: int  # weight version after the last update (0 = initial weights)

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]: ...

    def export_weights(self, path: str) -> str: ...

    def state_dict(self) -> dict[str, Any]: ...
