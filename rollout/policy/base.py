"""The Policy protocol: chat messages in, a completion with exact token ids and logprobs out."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from train.records import TeacherTopK, VisionInputs

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, "image"?: ndarray}


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 96  # the default tiny policy's actions are short; raise it for real models
    stop: list[str] = field(default_factory=list)
    greedy: bool = False  # argmax decoding (evaluation); logprobs are still those of the temperature-1 model
    # this request's own random stream: the same seed and prompt give the same sample whichever requests share a batch
    # (the local policy, our policy server and OpenAI-compatible servers take it). The runner sets one per episode turn.
    seed: int | None = None


@dataclass
class Completion:
    text: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int = 0
    vision: VisionInputs | None = None  # the prompt's images as the model saw them (vision-language policies)
    # the prompt's length in tokens before the policy cut it to its limit (LocalPolicy's max_prompt_tokens); None: the
    # prompt was not cut. It travels with the step (Step.prompt_truncated_from) to the metrics, wherever the policy runs
    prompt_truncated_from: int | None = None

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
    """What the runner and the loop need of a policy. The optional members have defaults here: a policy that subclasses
    Policy gets them, and overrides what it supports."""

    weight_version: int

    # `session` (optional, keyword): a key shared by the turns of one episode. Server policies use it to route the
    # episode to one server (prefix cache) and to continue from the exact token ids of its earlier turns.
    async def generate(
        self, messages: Sequence[Message], sampling: SamplingParams, session: str | None = None
    ) -> Completion: ...

    async def update_weights(self, update: WeightUpdate) -> None: ...

    async def close(self) -> None: ...

    # ----- optional -----
    #: True for a policy in this process: weight sync (loop.weight_sync=auto) hands it a state dict in memory
    in_process: bool = False

    def end_session(self, session: str) -> None:
        """Drop what was kept for an episode (exact token ids, routing) when it ends."""
        return None

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The token ids this policy would continue for `messages` as a fresh conversation (its chat template and
        generation prompt): the teacher's context of a directive signal (a turn's messages with the hint added)."""
        raise NotImplementedError(
            f"{type(self).__name__} renders no token ids: directive signals (reward=opd|combined|gated|multiplicative) "
            "need policy=local or policy=sglang"
        )

    async def score_tokens(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """For each (context ids, action ids): the log-prob of every action token under the served weights, with no
        generation (`reward.teacher=policy`: the teacher's log-probs computed where the policy runs)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot score given tokens: use reward.teacher=trainer (or policy=sglang)"
        )

    async def score_topk(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], k: int) -> list[TeacherTopK]:
        """For each (context ids, action ids): the served weights' top-k at every action token and the token's own
        log-prob, no generation (`reward.teacher=policy` with `reward.opd_signal=teacher_topk`)."""
        raise NotImplementedError(
            f"{type(self).__name__} gives no top-k of given tokens: use reward.teacher=trainer (or policy=sglang)"
        )

    #: the weight sync's log-prob parity check (rollout/policy/parity.py: ParityConfig) of a policy on servers, which
    #: also gives `probe_servers`; None: no check (an in-process policy gets the trainer's own tensors)
    parity_config: Any = None

    async def probe_servers(self, context: Sequence[int], sampling: SamplingParams) -> dict[str, Any]:
        """Every server's continuation of `context` (end-of-sequence ignored): url -> (sampled ids, their log-probs)
        or the error it gave: the parity check after a weight sync."""
        raise NotImplementedError(f"{type(self).__name__} has no servers to probe")

    def rng_state(self) -> Any:
        """The sampler's random state, saved with a run's checkpoints (None: the policy keeps none, e.g. a server)."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore `rng_state()`'s value when a run resumes."""
        return None


def _accepts_session(policy: Any) -> bool:
    method = policy.generate
    fn = getattr(method, "__func__", method)  # one answer per generate function, not per call (inspect is slow)
    try:
        return _SESSION_AWARE[fn]
    except (KeyError, TypeError):  # not asked yet, or not hashable
        pass
    try:
        params = inspect.signature(method).parameters
        accepts = "session" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        accepts = False
    try:
        _SESSION_AWARE[fn] = accepts
    except TypeError:
        pass
    return accepts


_SESSION_AWARE: dict[Any, bool] = {}


async def generate(
    policy: Policy, messages: Sequence[Message], sampling: SamplingParams, session: str | None = None
) -> Completion:
    """Call `policy.generate`, passing `session` only to policies that take it (older ones keep working)."""
    if session is not None and _accepts_session(policy):
        return await policy.generate(messages, sampling, session=session)
    return await policy.generate(messages, sampling)
