"""The test doubles of the suite and the benchmarks, in one place: policies that play a script or a fixed answer, and
spies that wrap the real trainer or policy to watch them or inject failures. (The real policy, trainer and envs are
tested end to end elsewhere; a double stands in only where a test is about the code around it.)"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rollout.policy.base import Completion, Message, Policy, SamplingParams, WeightUpdate, generate
from rollout.policy.fixed import FixedPolicy  # noqa: F401  (the tests' fixed answer is the benchmarks' policy)


class ScriptedPolicy(Policy):
    """Plays a fixed script: `script` a list of actions (turn by turn), or a dict {the episode's first user message:
    actions}; `default` once the script runs out (and for episodes the dict does not name); each answer after
    `delay_s`, like a model taking its time. Token ids are made from the text (one per character)."""

    def __init__(self, script: dict[str, list[str]] | list[str] | None = None, default: str = "inc",
                 delay_s: float = 0.0):
        self.script = script if script is not None else []
        self.default = default
        self.delay_s = delay_s
        self.weight_version = 0
        self.calls = 0

    async def generate(self, messages: Sequence[Message], sampling: SamplingParams) -> Completion:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        turn = sum(m["role"] == "assistant" for m in messages)
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        actions = self.script.get(first_user, [self.default]) if isinstance(self.script, dict) else self.script
        text = actions[turn] if turn < len(actions) else self.default
        ids = [ord(c) % 251 for c in text] or [0]
        return Completion(text, [1, 2, 3 + turn], ids, [-0.5] * len(ids), "stop", self.weight_version)

    async def update_weights(self, update: WeightUpdate) -> None:
        self.weight_version = update.version

    async def close(self) -> None:
        return None


class RecordingTrainer:
    """The real trainer, watched: what each train_step got (versions) and at which trainer version; can fail on cue."""

    def __init__(self, inner: Any, fail_on_call: int | None = None):
        self.inner = inner
        self.fail_on_call = fail_on_call
        self.calls: list[tuple[int, list[int]]] = []  # (trainer version before the step, sample weight versions)

    @property
    def version(self) -> int:
        return self.inner.version

    def train_step(self, batch):
        self.calls.append((self.inner.version, [s.weight_version for s in batch]))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("injected trainer failure (out of memory, say)")
        return self.inner.train_step(batch)

    def __getattr__(self, name: str) -> Any:  # state_dict, export_weights, save_checkpoint, close, ...
        return getattr(self.inner, name)


class FlakyUpdatesPolicy(Policy):
    """The real policy, but the first push of each version in `fail_versions` fails (a server could not load it)."""

    in_process = True

    def __init__(self, inner: Policy, fail_versions: set[int]):
        self.inner, self.fail_versions = inner, set(fail_versions)

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, messages, sampling, session=None):
        return await generate(self.inner, messages, sampling, session=session)

    async def update_weights(self, update: WeightUpdate) -> None:
        if update.version in self.fail_versions:
            self.fail_versions.discard(update.version)
            raise RuntimeError(f"server could not load weights v{update.version}")
        await self.inner.update_weights(update)

    async def close(self) -> None:
        await self.inner.close()
