"""A policy that answers every turn at once with a fixed text: what the benchmarks run when they measure the env farm
or the judge rather than a model (benchmarks/farm.py, judge.py, mix_farm.py), and what tests use as a stand-in."""

from __future__ import annotations

import itertools
from typing import Any

from rollout.policy.base import Completion, Policy, SamplingParams, WeightUpdate


class FixedPolicy(Policy):
    """Answers every turn at once with `template`, `{n}` numbered by call (so that no two steps are identical, e.g. no
    judge cache hits). No token ids unless `ids`."""

    def __init__(self, template: str = "ok", ids: bool = False):
        self.template = template
        self.ids = ids
        self.counter = itertools.count()
        self.weight_version = 0

    async def generate(self, messages: Any, sampling: SamplingParams, session: str | None = None) -> Completion:
        text = self.template.format(n=next(self.counter)) if "{n}" in self.template else self.template
        if self.ids:
            return Completion(text, [1], [2], [-0.1], "stop", self.weight_version)
        return Completion(text, [], [], [], "stop", self.weight_version)

    async def update_weights(self, update: WeightUpdate) -> None:
        self.weight_version = update.version

    async def close(self) -> None:
        return None
