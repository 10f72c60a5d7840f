"""The Policy protocol: chat messages in, a completion with exact token ids and logprobs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, "image"?: ndarray}


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    greedy: bool = False  # argmax decoding (evaluation); logprobs are still those of the temperature-1 model


@dataclass
class Completion:
    text: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int = 0

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"completion has {len(self.output_ids)} output ids but {len(self.output_logprobs)} logprobs"
            )


@dataclass
class WeightUpdate:
    """New policy weights: an in-memory state dict (same process) or a checkpoint directory (servers)."""

    version: int
    path: str | None = None
    state_dict: dict[str, Any] | None = None


@runtime_checkable
class Policy(Protocol):
    weight_version: int

    async def generate(self, messages: Sequence[Message], sampling: SamplingParams) -> Completion: ...

    async def update_weights(self, update: WeightUpdate) -> None: ...

    async def close(self) -> None: ...
