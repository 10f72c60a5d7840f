"""Finished trajectories -> per-step rewards R_t and advantages A_t (written onto the Step records) -> TrainSamples.

The math lives in `train.rewards`; this module only gathers the inputs by task group and puts the results back.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from train.records import EpisodeStatus, TrainSample, Trajectory
from train.rewards import (
    BucketStats,
    broadcast_outcome_advantages,
    grpo_outcome_advantages,
    integrate,
    step_index_normalize_with_stats,
)
from train.sample_layout import build_samples


@dataclass
class RewardConfig:
    mode: str = "integrated"  # "integrated": R_t = o + coef * r_t, step-index normalized; "outcome_only": GRPO
    coef: float = 1.0  # weight of the step score r_t
    eps: float = 1e-6
    singleton: str = "raw"  # step-index bucket with one member: "raw" | "zero" | "drop"
    constant: str = "drop"  # bucket (or GRPO group) with zero variance: "drop" | "zero"

    def __post_init__(self) -> None:
        if self.mode not in ("integrated", "outcome_only"):
            raise ValueError(f"reward.mode={self.mode!r}: use 'integrated' or 'outcome_only'")


@dataclass
class AdvantageStats:
    trajectories: int
    steps: int
    steps_with_gradient: int
    dropped_buckets: int  # integrated: constant buckets; outcome-only: constant groups
    buckets: int

    @property
    def dropped_step_fraction(self) -> float:
        return 1.0 - self.steps_with_gradient / self.steps if self.steps else 0.0


def assign_advantages(trajs: Sequence[Trajectory], cfg: RewardConfig) -> AdvantageStats:
    """Set `reward` and `advantage` on every step of the finished (status ok) trajectories, grouped by group_id."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for tr in trajs:
        if tr.status == EpisodeStatus.OK and tr.steps:
            groups[tr.group_id].append(tr)
    included = {id(tr) for members in groups.values() for tr in members}
    for tr in trajs:  # aborted / failed episodes get no gradient
        if id(tr) not in included:
            for s in tr.steps:
                s.reward = s.advantage = None
    rewards = {
        g: [integrate(tr.outcome or 0.0, [s.judge.score if s.judge else 0.0 for s in tr.steps], cfg.coef) for tr in members]
        for g, members in groups.items()
    }
    if cfg.mode == "integrated":
        adv, bs = step_index_normalize_with_stats(rewards, eps=cfg.eps, singleton=cfg.singleton, constant=cfg.constant)
        dropped, buckets = bs.constant, bs.buckets
    else:
        outcome_adv = grpo_outcome_advantages(
            {g: [tr.outcome or 0.0 for tr in m] for g, m in groups.items()}, eps=cfg.eps, constant=cfg.constant
        )
        adv = broadcast_outcome_advantages(outcome_adv, {g: [len(tr.steps) for tr in m] for g, m in groups.items()})
        dropped = sum(1 for a in outcome_adv.values() if a and a[0] is None)
        buckets = len(outcome_adv)
    n_steps = n_grad = 0
    for g, members in groups.items():
        for tr, r_row, a_row in zip(members, rewards[g], adv[g]):
            for s, r, a in zip(tr.steps, r_row, a_row):
                s.reward, s.advantage = r, a
                n_steps += 1
                n_grad += a is not None
    return AdvantageStats(sum(len(m) for m in groups.values()), n_steps, n_grad, dropped, buckets)


def step_samples(trajs: Sequence[Trajectory]) -> list[TrainSample]:
    """One sample per step (prompt + output, the "dynamic history" layout): the step's advantage on its output tokens.

    The token ids are exactly those the policy saw and produced; nothing is re-tokenized.
    """
    return build_samples(trajs, "step")[0]


__all__ = ["RewardConfig", "AdvantageStats", "assign_advantages", "step_samples", "BucketStats"]
