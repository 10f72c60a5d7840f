"""Trainer backends behind one protocol: `torch` (CPU / one GPU, HF model) and `megatron` (megatron-core)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TokenSpan:
    """The output tokens of one step inside a sample: positions [start, end) of `TrainSample.tokens`."""

    start: int
    end: int
    step_index: int
    weight_version: int
    advantage: float | None  # None: the step gets no gradient (its span is masked)


@dataclass
class TrainSample:
    """One training sequence. All per-token lists have len(tokens); loss_mask is 1 on tokens the policy produced."""

    tokens: list[int]
    loss_mask: list[int]
    advantages: list[float]
    rollout_logprobs: list[float]  # logprob of each token under the policy that sampled it (0 where masked)
    group_id: str = ""
    step_index: int = 0
    weight_version: int = 0  # the oldest weights that produced any of its scored tokens
    meta: dict[str, Any] = field(default_factory=dict)
    spans: list[TokenSpan] = field(default_factory=list)  # each step's output tokens (one per step in the sample)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("loss_mask", "advantages", "rollout_logprobs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrainSample.{name} has {len(getattr(self, name))} entries for {n} tokens")
        for sp in self.spans:
            if not 0 <= sp.start <= sp.end <= n:
                raise ValueError(
                    f"TrainSample span [{sp.start}, {sp.end}) of step {sp.step_index} lies outside its {n} tokens"
                )


@runtime_checkable
class Trainer(Protocol):
    version: int  # weight version after the last update (0 = initial weights)

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]: ...

    def export_weights(self, path: str) -> str: ...

    def state_dict(self) -> dict[str, Any]: ...
