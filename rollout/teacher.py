"""The teacher's log-probs of directive signals (docs/training/directive.md).

For every step of a batch whose judgement has a hint: the turn's context with the hint appended to its last user or
tool message (`prm.hints.with_hint`), rendered to token ids by the policy's own chat template (`Policy.prompt_ids`),
then the log-prob of each of the action's exact tokens under the same policy weights, forced, batched, no generation.
`reward.teacher` says where: `trainer` (its current weights, `Trainer.action_logprobs`, both backends; the trainer is
locked meanwhile, so an update never runs during it), `reference` (the trainer's frozen initial weights, the KL
anchor's: a fixed target, so pushing a token down does not also push the teacher down) or `policy` (the policy's
servers, `Policy.score_tokens`: SGLang's `/generate` with `max_new_tokens: 0`, so a cluster needs no second copy of
the weights). With `reward.opd_signal=teacher_topk` the same places give the teacher's top-k at every action token
(`Trainer.action_topk`, `Policy.score_topk`: SGLang's `top_logprobs_num`), with the sampled tokens' log-probs beside.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field

from prm.hints import with_hint
from rollout.policy.base import Policy
from train.backends import Trainer
from train.records import EpisodeStatus, TeacherTopK, Trajectory

log = logging.getLogger(__name__)


@dataclass
class TeacherBatch:
    """Teacher log-probs of a batch's hinted steps, keyed by (trajectory index, step index)."""

    logprobs: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    prompt_ids: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # the enhanced contexts' ids
    topk: dict[tuple[int, int], TeacherTopK] = field(default_factory=dict)  # reward.opd_signal=teacher_topk
    skipped: int = 0  # hinted steps whose enhanced context could not be rendered (logged; they get no teacher)
    tokens: int = 0  # action tokens scored
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {"directive/teacher_steps": float(len(self.logprobs)), "directive/teacher_tokens": float(self.tokens),
                "directive/teacher_skipped": float(self.skipped), "directive/teacher_s": self.seconds}


async def teacher_logprobs(
    trajs: Sequence[Trajectory],
    policy: Policy,
    trainer: Trainer,
    source: str = "trainer",
    trainer_lock: AbstractAsyncContextManager | None = None,
    topk: int | None = None,
) -> TeacherBatch:
    """The teacher's log-probs of the action tokens of every hinted step of the finished trajectories; with `topk`
    (reward.opd_signal=teacher_topk) also its top-k at each of those tokens."""
    t0 = time.perf_counter()
    out = TeacherBatch()
    keys: list[tuple[int, int]] = []
    sequences: list[tuple[list[int], list[int]]] = []
    for i, tr in enumerate(trajs):
        if tr.status != EpisodeStatus.OK:
            continue
        for t, step in enumerate(tr.steps):
            hint = step.judge.hint if step.judge is not None else None
            if not hint or not step.output_ids:
                continue
            try:
                context = policy.prompt_ids(with_hint(step.context, hint))
            except ValueError as exc:  # e.g. a context over the policy's prompt limit: this step has no teacher
                out.skipped += 1
                log.warning("no teacher for %s step %d: %s", tr.episode_id, t, exc)
                continue
            keys.append((i, t))
            sequences.append((context, list(step.output_ids)))
    if sequences:
        tops: list[TeacherTopK] | None = None
        if source not in ("policy", "trainer", "reference"):
            raise ValueError(f"reward.teacher={source!r}: use 'trainer', 'reference' or 'policy'")
        if source == "policy":
            if topk is not None:
                tops = await policy.score_topk(sequences, topk)
            else:
                logprobs = await policy.score_tokens(sequences)
        else:
            async with trainer_lock or nullcontext():
                if topk is not None:
                    tops = await asyncio.to_thread(trainer.action_topk, sequences, topk, source == "reference")
                else:
                    logprobs = await asyncio.to_thread(trainer.action_logprobs, sequences, source == "reference")
        if tops is not None:  # the sampled tokens' log-probs come with the top-k (the gap stays a diagnostic)
            for (_, action), top in zip(sequences, tops):
                if len(top.sampled) != len(action):
                    raise RuntimeError(f"the teacher's top-k has {len(top.sampled)} rows for {len(action)} tokens")
            logprobs = [t.sampled for t in tops]
        if len(logprobs) != len(sequences):
            raise RuntimeError(f"the teacher scored {len(logprobs)} of {len(sequences)} actions")
        for n, (key, (context, action), lp) in enumerate(zip(keys, sequences, logprobs)):
            out.logprobs[key] = [float(x) for x in lp]
            out.prompt_ids[key] = context
            out.tokens += len(action)
            if tops is not None:
                out.topk[key] = tops[n]
    out.seconds = time.perf_counter() - t0
    return out


__all__ = ["TeacherBatch", "teacher_logprobs"]
