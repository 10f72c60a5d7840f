"""Finished trajectories -> per-step rewards R_t and advantages A_t (a `TrajectoryScores`, aligned with the batch).

The math lives in `train.rewards`; this module only gathers the inputs by task group and returns the results. It never
writes into the trajectories: the caller (rollout's loop) puts the scores on its own records.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from train.records import EpisodeStatus, Step, Trajectory
from train.rewards import (
    BucketStats,
    broadcast_outcome_advantages,
    grpo_outcome_advantages,
    integrate,
    never_reinforce,
    step_index_normalize_with_stats,
)


TRUNCATED_OPTIONS = ("score", "fail")
UNFINISHED_SCORE = -1.0  # the step score of an output cut off at the token limit under truncated="fail" (the worst vote)


@dataclass
class RewardConfig:
    mode: str = "integrated"  # "integrated": R_t = o + coef * r_t, step-index normalized; "outcome_only": GRPO
    coef: float = 1.0  # weight of the step score r_t
    eps: float = 1e-6
    singleton: str = "raw"  # step-index bucket with one member: "raw" | "zero" | "drop"
    # bucket (or GRPO group) with zero variance: "drop" (no gradient at all) | "zero" (advantage 0: no policy gradient,
    # but its tokens stay in the loss, so the KL anchor still acts on them)
    constant: str = "drop"
    # a step whose output hit max_new_tokens (finish_reason "length"): "score" (as judged, the reference) | "fail" (an
    # unfinished output: step score -1 whatever the judge said, and never a positive advantage, so a runaway output
    # whose prefix happened to parse is never reinforced)
    truncated: str = "score"

    def __post_init__(self) -> None:
        if self.mode not in ("integrated", "outcome_only"):
            raise ValueError(f"reward.mode={self.mode!r}: use 'integrated' or 'outcome_only'")
        if self.truncated not in TRUNCATED_OPTIONS:
            raise ValueError(f"reward.truncated={self.truncated!r}: use one of {', '.join(TRUNCATED_OPTIONS)}")


@dataclass
class AdvantageStats:
    trajectories: int
    steps: int
    steps_with_gradient: int  # steps with a nonzero advantage (a policy gradient)
    dropped_buckets: int  # integrated: constant buckets; outcome-only: constant groups (dropped or zeroed)
    buckets: int

    @property
    def dropped_step_fraction(self) -> float:
        return 1.0 - self.steps_with_gradient / self.steps if self.steps else 0.0


@dataclass
class TrajectoryScores:
    """A scored batch, aligned with the trajectories given (and their steps): R_t and A_t per step, None where a step
    gets no gradient (an aborted or failed episode, a dropped bucket). The caller puts them on its own records."""

    rewards: list[list[float | None]]
    advantages: list[list[float | None]]
    stats: AdvantageStats


def score_trajectories(trajs: Sequence[Trajectory], cfg: RewardConfig) -> TrajectoryScores:
    """R_t and A_t for every step of the finished (status ok) trajectories, grouped by group_id; the trajectories are
    not changed."""
    groups: dict[str, list[int]] = defaultdict(list)  # group id -> indices into trajs
    for i, tr in enumerate(trajs):
        if tr.status == EpisodeStatus.OK and tr.steps:
            groups[tr.group_id].append(i)
    # aborted / failed episodes get no gradient
    out_r: list[list[float | None]] = [[None] * len(tr.steps) for tr in trajs]
    out_a: list[list[float | None]] = [[None] * len(tr.steps) for tr in trajs]
    fail_unfinished = cfg.truncated == "fail"

    def step_score(s: Step) -> float:
        if fail_unfinished and s.finish_reason == "length":
            return UNFINISHED_SCORE
        return s.judge.score if s.judge else 0.0

    rewards = {
        g: [integrate(trajs[i].outcome or 0.0, [step_score(s) for s in trajs[i].steps], cfg.coef) for i in members]
        for g, members in groups.items()
    }
    if cfg.mode == "integrated":
        adv, bs = step_index_normalize_with_stats(rewards, eps=cfg.eps, singleton=cfg.singleton, constant=cfg.constant)
        dropped, buckets = bs.constant, bs.buckets
    else:
        outcome_adv = grpo_outcome_advantages(
            {g: [trajs[i].outcome or 0.0 for i in m] for g, m in groups.items()}, eps=cfg.eps, constant=cfg.constant
        )
        adv = broadcast_outcome_advantages(outcome_adv, {g: [len(trajs[i].steps) for i in m] for g, m in groups.items()})
        dropped = sum(1 for a in outcome_adv.values() if a and all(x is None or x == 0.0 for x in a))
        buckets = len(outcome_adv)
    n_steps = n_grad = 0
    for g, members in groups.items():
        for i, r_row, a_row in zip(members, rewards[g], adv[g]):
            if fail_unfinished:
                a_row = never_reinforce(a_row, [s.finish_reason == "length" for s in trajs[i].steps])
            out_r[i], out_a[i] = list(r_row), list(a_row)
            n_steps += len(a_row)
            n_grad += sum(a is not None and a != 0.0 for a in a_row)
    stats = AdvantageStats(sum(len(m) for m in groups.values()), n_steps, n_grad, dropped, buckets)
    return TrajectoryScores(out_r, out_a, stats)


__all__ = ["AdvantageStats", "BucketStats", "RewardConfig", "TrajectoryScores", "score_trajectories"]
