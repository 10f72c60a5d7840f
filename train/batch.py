"""Finished trajectories -> per-step rewards R_t and advantages A_t (a `TrajectoryScores`, aligned with the batch).

The math lives in `train.rewards` (step-wise) and `train.opd` (per-token, directive signals); this module only gathers
the inputs by task group and returns the results. It never writes into the trajectories: the caller (rollout's loop)
puts the scores on its own records. The directive modes take the teacher's log-probs of each hinted step's action
(computed by the caller: rollout/teacher.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from train.opd import (OPD_MODES, OPD_SIGNALS, TOPK_MODES, TokenAdvantage, distill_advantages, teacher_gap,
                       token_advantages)
from train.records import DEFAULT_DIVERGENCE, DIVERGENCES, EpisodeStatus, Step, Trajectory
from train.rewards import (
    BucketStats,
    broadcast_outcome_advantages,
    grpo_outcome_advantages,
    integrate,
    never_reinforce,
    step_index_normalize_with_stats,
)


REWARD_MODES = ("integrated", "outcome_only", *OPD_MODES)
TEACHERS = ("trainer", "reference", "policy")
TRUNCATED_OPTIONS = ("score", "fail")
UNFINISHED_SCORE = -1.0  # the step score of an output cut off at the token limit under truncated="fail" (the worst vote)


@dataclass
class RewardConfig:
    # "integrated": R_t = o + coef * r_t, step-index normalized; "outcome_only": GRPO; the directive (per-token) modes
    # "opd" | "combined" | "gated" | "multiplicative": train/opd.py
    mode: str = "integrated"
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
    w_step: float = 1.0  # combined: weight of the normalized step advantage A_step
    w_opd: float = 1.0  # combined: weight of the teacher-student gap
    gate_penalty: float = 1.0  # gated: the first step scored < 0 gets -gate_penalty on every token
    # directive modes: each token's teacher-student gap clipped to [-gap_clip, gap_clip] before the mode uses it (None:
    # no clipping, the paper's form); the recorded gaps stay unclipped
    gap_clip: float | None = None
    # directive modes: where the teacher's log-probs are computed: "trainer" (its current weights, both backends),
    # "reference" (the trainer's frozen initial weights, the KL anchor's: a target that does not move with the student)
    # or "policy" (the policy's servers: SGLang /generate scoring the sequence, no second copy of the weights needed)
    teacher: str = "trainer"
    # directive modes: the teacher's signal: "sampled" (the gap log pi_teacher - log pi_old on the sampled tokens, as
    # token advantages) | "teacher_topk" (the teacher's top-k + a tail bin at every action token of a hinted step,
    # and a divergence loss, reward.topk_divergence (reverse KL by default), pulling the student's distribution there
    # toward it: train/topk_distill.py)
    opd_signal: str = "sampled"
    topk: int = 20  # teacher_topk: tokens per position (the rest of the teacher's mass is one tail bin)
    # teacher_topk: each token's divergence clamped to min(divergence, topk_clamp) (None: no clamp)
    topk_clamp: float | None = None
    # teacher_topk: the per-token divergence over the k + tail bins: "reverse" KL(student || teacher) | "forward"
    # KL(teacher || student) | "jsd" (beta 0.5): train/topk_distill.py topk_divergence says what each does
    topk_divergence: str = DEFAULT_DIVERGENCE

    def __post_init__(self) -> None:
        if self.mode not in REWARD_MODES:
            raise ValueError(f"reward.mode={self.mode!r}: use one of {', '.join(REWARD_MODES)}")
        if self.truncated not in TRUNCATED_OPTIONS:
            raise ValueError(f"reward.truncated={self.truncated!r}: use one of {', '.join(TRUNCATED_OPTIONS)}")
        if self.gap_clip is not None and not self.gap_clip > 0:
            raise ValueError(f"reward.gap_clip={self.gap_clip}: use a positive bound, or null for no clipping")
        if self.teacher not in TEACHERS:
            raise ValueError(f"reward.teacher={self.teacher!r}: use one of {', '.join(TEACHERS)}")
        if self.opd_signal not in OPD_SIGNALS:
            raise ValueError(f"reward.opd_signal={self.opd_signal!r}: use one of {', '.join(OPD_SIGNALS)}")
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1:
            raise ValueError(f"reward.topk={self.topk!r}: use a whole number of tokens >= 1")
        if self.topk_clamp is not None and not self.topk_clamp > 0:
            raise ValueError(f"reward.topk_clamp={self.topk_clamp}: use a positive bound, or null for no clamp")
        if self.topk_divergence not in DIVERGENCES:
            raise ValueError(f"reward.topk_divergence={self.topk_divergence!r}: use one of {', '.join(DIVERGENCES)}")
        if self.topk_signal and self.mode not in TOPK_MODES:
            raise ValueError(f"reward.opd_signal=teacher_topk works with reward={' | '.join(TOPK_MODES)}, not "
                             f"{self.mode} (a signed step score times a divergence has no minimum)")

    @property
    def directive(self) -> bool:
        """True for the modes that train on hints (they need the judge's hints and teacher log-probs)."""
        return self.mode in OPD_MODES

    @property
    def topk_signal(self) -> bool:
        """True for a directive mode with the distribution-level signal (the teacher's top-k, a distillation loss)."""
        return self.opd_signal == "teacher_topk" and self.directive


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
    advantages: list[list[float | None]]  # directive modes: the mean of the step's token advantages
    stats: AdvantageStats
    # directive modes (None elsewhere): per step, the per-token advantages (None: no gradient), what gave them
    # (train.opd.APPLIED / NO_GRADIENT) and the teacher-student gap (None: no teacher log-probs)
    token_advantages: list[list[list[float] | None]] | None = None
    modes: list[list[str | None]] | None = None
    gaps: list[list[list[float] | None]] | None = None
    # reward.opd_signal=teacher_topk: per step, the weight of its distillation term (None: masked out of it)
    distill: list[list[float | None]] | None = None


def score_trajectories(
    trajs: Sequence[Trajectory],
    cfg: RewardConfig,
    teacher: Mapping[tuple[int, int], Sequence[float]] | None = None,
) -> TrajectoryScores:
    """R_t and A_t for every step of the finished (status ok) trajectories, grouped by group_id; the trajectories are
    not changed. `teacher[(i, t)]`: the teacher's log-probs of the action tokens of step t of trajectory i (the steps
    with a hint; directive modes only). With reward.opd_signal=teacher_topk the steps in `teacher` are the ones with
    the teacher's top-k: they get the distillation term, and their gap is kept as a diagnostic only."""
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
    if cfg.mode != "outcome_only":  # integrated, and A_step of the directive modes
        adv, bs = step_index_normalize_with_stats(rewards, eps=cfg.eps, singleton=cfg.singleton, constant=cfg.constant)
        dropped, buckets = bs.constant, bs.buckets
    else:
        outcome_adv = grpo_outcome_advantages(
            {g: [trajs[i].outcome or 0.0 for i in m] for g, m in groups.items()}, eps=cfg.eps, constant=cfg.constant
        )
        adv = broadcast_outcome_advantages(outcome_adv, {g: [len(trajs[i].steps) for i in m] for g, m in groups.items()})
        dropped = sum(1 for a in outcome_adv.values() if a and all(x is None or x == 0.0 for x in a))
        buckets = len(outcome_adv)
    for g, members in groups.items():
        for i, r_row, a_row in zip(members, rewards[g], adv[g]):
            if fail_unfinished:
                a_row = never_reinforce(a_row, [s.finish_reason == "length" for s in trajs[i].steps])
            out_r[i], out_a[i] = list(r_row), list(a_row)
    scores = TrajectoryScores(out_r, out_a, AdvantageStats(0, 0, 0, dropped, buckets))
    if cfg.directive:
        _directive(trajs, [i for m in groups.values() for i in m], cfg, teacher or {}, scores, step_score)
    distill = scores.distill or [[None] * len(tr.steps) for tr in trajs]
    steps = [(a, d) for m in groups.values() for i in m for a, d in zip(scores.advantages[i], distill[i])]
    # a step distilled with PPO advantage 0 (reward=opd, teacher_topk) still has a gradient
    with_gradient = sum((a is not None and a != 0.0) or d is not None for a, d in steps)
    scores.stats = AdvantageStats(sum(len(m) for m in groups.values()), len(steps), with_gradient, dropped, buckets)
    return scores


def _directive(trajs: Sequence[Trajectory], scored: list[int], cfg: RewardConfig,
               teacher: Mapping[tuple[int, int], Sequence[float]], scores: TrajectoryScores,
               step_score: Callable[[Step], float]) -> None:
    """Replace the step advantages of the scored trajectories by the directive mode's token advantages."""
    n = len(trajs)
    scores.token_advantages = [[None] * len(tr.steps) for tr in trajs]
    scores.modes = [[None] * len(tr.steps) for tr in trajs]
    scores.gaps = [[None] * len(tr.steps) for tr in trajs]
    if cfg.topk_signal:
        scores.distill = [[None] * len(tr.steps) for tr in trajs]
    unknown = [k for k in teacher if not (0 <= k[0] < n and 0 <= k[1] < len(trajs[k[0]].steps))]
    if unknown:
        raise ValueError(f"teacher log-probs for steps that are not in the batch: {unknown[:5]}")
    for i in scored:
        steps = trajs[i].steps
        gaps = [teacher_gap(teacher[(i, t)], s.output_logprobs) if (i, t) in teacher else None
                for t, s in enumerate(steps)]
        if cfg.topk_signal:
            signals = distill_advantages(
                cfg.mode, step_advantages=scores.advantages[i], step_scores=[step_score(s) for s in steps],
                hinted=[g is not None for g in gaps], lengths=[len(s.output_ids) for s in steps], w_step=cfg.w_step,
                w_opd=cfg.w_opd, gate_penalty=cfg.gate_penalty)
            assert scores.distill is not None
            scores.distill[i] = [x.distill for x in signals]
            result = [x.advantage for x in signals]
        else:
            result = token_advantages(
                cfg.mode,
                step_advantages=scores.advantages[i],
                step_scores=[step_score(s) for s in steps],  # as integrated (reward.truncated applies)
                gaps=gaps,
                lengths=[len(s.output_ids) for s in steps],
                w_step=cfg.w_step,
                w_opd=cfg.w_opd,
                gate_penalty=cfg.gate_penalty,
                gap_clip=cfg.gap_clip,
            )
        if cfg.truncated == "fail":  # as for the step advantages: a cut-off output is never pushed up, token by token
            result = [r if r.values is None or s.finish_reason != "length" else
                      TokenAdvantage([min(v, 0.0) for v in r.values], r.mode) for r, s in zip(result, steps)]
        scores.gaps[i] = gaps
        scores.token_advantages[i] = [r.values for r in result]
        scores.modes[i] = [r.mode for r in result]
        scores.advantages[i] = [r.mean if r.values else None for r in result]


__all__ = ["REWARD_MODES", "TEACHERS", "AdvantageStats", "BucketStats", "RewardConfig", "TrajectoryScores",
           "score_trajectories"]
