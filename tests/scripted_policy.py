"""A Policy that plays a fixed script (unit tests of the runner and loop; the real policy is tested end to end)."""

from __future__ import annotations

from rollout.policy.base import Completion, SamplingParams, WeightUpdate


class ScriptedPolicy:
    def __init__(self, script: dict[str, list[str]] | list[str], default: str = "inc"):
        self.script = script
        self.default = default
        self.weight_version = 0
        self.calls = 0

    async def generate(self, messages, sampling: SamplingParams) -> Completion:
        self.calls += 1
        turn = sum(m["role"] == "assistant" for m in messages)
        key = messages[-1]["content"] if turn == 0 else None
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        actions = self.script.get(first_user, [self.default]) if isinstance(self.script, dict) else self.script
        text = actions[turn] if turn < len(actions) else self.default
        del key
        ids = [ord(c) % 251 for c in text] or [0]
        return Completion(text, [1, 2, 3 + turn], ids, [-0.5] * len(ids), "stop", self.weight_version)

    async def update_weights(self, update: WeightUpdate) -> None:
        self.weight_version = update.version

    async def close(self) -> None:
        pass
