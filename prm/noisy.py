"""NoisyJudge: a judge of known accuracy, for experiments on how much judge errors cost (Table 4's 80%-judge arm).

Each vote of the wrapped judge is replaced by a wrong one with probability 1 - accuracy: +1 <-> -1, and a neutral 0 becomes
+1 or -1 at random (the step's hint, a separate signal, is passed on unchanged). The draw is a pure function of (seed, episode, step, vote index), so a run is reproducible whatever
order the farm finishes steps in, and samples of the same task get independent errors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random

from envs.base import PARSE_ERROR
from prm.judge import Judge, Judgement, StepContext
from prm.voting import aggregate


def corrupt_vote(vote: int | None, accuracy: float, key: str) -> tuple[int | None, bool]:
    """(the vote as the noisy judge gives it, whether it was changed); invalid votes (None) stay invalid."""
    if vote is None:
        return None, False
    rng = random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))
    if rng.random() < accuracy:
        return vote, False
    if vote == 0:
        return rng.choice((1, -1)), True
    return -vote, True


class NoisyJudge(Judge):
    def __init__(
        self,
        inner: Judge,
        accuracy: float,
        seed: int = 0,
        aggregate_mode: str = "mean",
        exact_on_parse_errors: bool = False,
    ):
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"judge accuracy must be in [0, 1], got {accuracy}")
        self.inner = inner
        self.accuracy = accuracy
        self.seed = seed
        self.aggregate_mode = aggregate_mode
        # true: a step whose action could not be parsed keeps its vote (a judge that never mistakes a malformed action)
        self.exact_on_parse_errors = exact_on_parse_errors
        self.flipped = 0
        self.votes = 0

    async def score(self, ctx: StepContext) -> Judgement:
        j = await self.inner.score(ctx)
        if self.exact_on_parse_errors and ctx.signals.get(PARSE_ERROR):
            return j
        votes: list[int | None] = []
        raw: list[str] = []
        texts = list(j.raw) + [""] * (len(j.votes) - len(j.raw))
        for i, (v, text) in enumerate(zip(j.votes, texts)):
            key = f"{self.seed}|{ctx.task_id}|{ctx.episode_id}|{ctx.step_index}|{i}"
            nv, changed = corrupt_vote(v, self.accuracy, key)
            votes.append(nv)
            raw.append(f"{text} [noisy judge: vote {v} -> {nv}]" if changed else text)
            self.votes += v is not None
            self.flipped += changed
        return dataclasses.replace(j, score=aggregate(votes, self.aggregate_mode), votes=votes, raw=raw)

    async def close(self) -> None:
        await self.inner.close()
