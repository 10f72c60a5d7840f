"""SimulatedLatencyPolicy: a policy that takes as long as a remote server would (benchmarks, schedule tests).

Each completion of the wrapped policy is held back by `per_request_s + per_token_s * output tokens`, slept on the event
loop (no CPU), so a tiny in-process model behaves like a large model decoding on another machine. The time from the
call to the answer is recorded as busy time of the `generate` lane of a Timeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rollout.policy.base import Completion, Message, Policy, SamplingParams, WeightUpdate, generate
from train.timeline import Timeline


class SimulatedLatencyPolicy(Policy):
    def __init__(
        self,
        inner: Policy,
        *,
        per_token_s: float = 0.0,
        per_request_s: float = 0.0,
        timeline: Timeline | None = None,
        lane: str = "generate",
    ):
        if per_token_s < 0 or per_request_s < 0:
            raise ValueError("simulated latencies must be >= 0")
        self.inner = inner
        self.per_token_s, self.per_request_s = per_token_s, per_request_s
        self.timeline = timeline or Timeline()
        self.lane = lane
        self.in_process = inner.in_process  # weight sync goes to the wrapped policy

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(
        self, messages: Sequence[Message], sampling: SamplingParams, session: str | None = None
    ) -> Completion:
        with self.timeline.span(self.lane):
            out = await generate(self.inner, messages, sampling, session=session)
            await asyncio.sleep(self.per_request_s + self.per_token_s * len(out.output_ids))
        return out

    def end_session(self, session: str) -> None:
        self.inner.end_session(session)

    async def update_weights(self, update: WeightUpdate) -> None:
        await self.inner.update_weights(update)

    async def close(self) -> None:
        await self.inner.close()


__all__ = ["SimulatedLatencyPolicy"]
