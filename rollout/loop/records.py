"""What the loop hands between its parts and returns: a scored batch, an evaluation, the run's summary, where a
resumed run starts; and the per-family figures those are made of."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rollout.metrics import (PROMPT_KEYS, accuracy, family_keys, family_values,
                             mean_outcome)
from rollout.state.run_state import RunState
from rollout.teacher import TeacherBatch
from train.batch import AdvantageStats
from train.records import EpisodeStatus, TrainSample, Trajectory
from train.sample_layout import LayoutStats


@dataclass
class RolloutBatch:
    """One iteration's scored episodes and their samples, on disk before the trainer sees them."""

    iteration: int
    trajs: list[Trajectory]
    samples: list[TrainSample]
    layout: LayoutStats
    advantages: AdvantageStats
    env_steps: int
    rollout_s: float
    policy_version_at_start: int
    family_of: dict[str, str] = field(default_factory=dict)  # group id -> family
    family_advantages: dict[str, AdvantageStats] = field(default_factory=dict)
    family_s: dict[str, float] = field(default_factory=dict)  # family -> seconds until its last episode ended
    family_groups: dict[str, int] = field(default_factory=dict)  # family -> task groups in this batch
    teacher: TeacherBatch | None = None  # directive modes: the teacher's log-probs of the hinted steps


@dataclass
class EvalResult:
    iteration: int
    accuracy: float  # rollout.metrics.accuracy: the fraction of episodes solved (aborted ones count as not solved)
    mean_outcome: float  # rollout.metrics.mean_outcome: over the episodes that ended ok
    episodes: int
    aborted: int
    wall_s: float
    families: dict[str, dict[str, Any]] = field(default_factory=dict)  # family -> accuracy, mean_outcome, episodes, aborted
    prompts: dict[str, int] = field(default_factory=dict)  # rollout.metrics.prompt_metrics of its steps (policy/*)

    def row(self) -> dict[str, Any]:
        """The eval row's figures: the run's, the policy's prompts (`policy/*`), then each family's as
        `family/<family>/<key>`."""
        out = {k: v for k, v in asdict(self).items() if k not in ("families", "prompts")}
        out.update(self.prompts)
        for fam, values in self.families.items():
            out.update(family_keys(fam, values))
        return out

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> EvalResult:
        """The result an eval row of metrics.jsonl holds (a resumed run keeps its evaluations)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("families", "prompts")]
        families = {fam: {k: v[k] for k in EVAL_FIGURES if k in v} for fam, v in family_values(row).items()}
        prompts = {k: row[k] for k in PROMPT_KEYS if k in row}
        return cls(**{k: row[k] for k in names}, families={f: v for f, v in families.items() if v}, prompts=prompts)


@dataclass
class RunSummary:
    iterations: int
    mean_outcome_first: float
    mean_outcome_last: float
    mean_step_score: float
    eval_before: EvalResult | None
    eval_after: EvalResult | None
    env_steps: int
    steps_per_s: float
    wall_s: float
    aborted_episodes: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    farm: dict[str, Any] = field(default_factory=dict)  # the farm's last FarmMetrics snapshot (farm/* keys)
    max_staleness: int | dict[str, int] = 0
    produced: int = 0  # samples built from scored steps
    trained: int = 0  # samples handed to the trainer
    dropped_stale: int = 0  # samples older than the staleness bound
    dropped_future: int = 0  # samples stamped with a version the trainer never produced (0 unless misconfigured)
    rollout_busy_s: float = 0.0  # wall time during which training rollouts were being collected
    train_busy_s: float = 0.0  # wall time during which the trainer trained or synced weights
    overlap_s: float = 0.0  # wall time during which both happened
    overlap_fraction: float = 0.0  # overlap_s / wall time of the training iterations
    # family -> its figures over the run (rollout.loop.family_summary): episodes, accuracy and mean outcome of the
    # first and last iteration it trained in, mean step score, env steps, steps/s, aborted, eval before / after
    families: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the policy's prompts over the run (rollout.metrics.prompt_totals of the train and eval rows): how many it cut to
    # its limit (policy/truncated_prompts), the longest (policy/longest_prompt_tokens)
    prompts: dict[str, int] = field(default_factory=dict)


@dataclass
class ResumePoint:
    """Where a resumed loop starts: the last commit's state, and what it covers (for the run summary)."""

    state: RunState
    train_rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl train rows of the kept iterations
    evals: dict[int, EvalResult] = field(default_factory=dict)  # the kept evaluations


#: each family's farm figures in the metrics rows (`family/<family>/farm/<key>`)
FAMILY_FARM_KEYS = ("env_slots", "envs_alive", "peak_in_flight", "peak_starting", "steps_per_s", "steps", "resets",
                    "env_errors", "timeouts", "restarts", "aborted_episodes")


EVAL_FIGURES = ("accuracy", "mean_outcome", "episodes", "aborted")  # a family's held-out figures (eval_figures)


def eval_figures(final: Sequence[Trajectory]) -> dict[str, Any]:
    """One family's held-out figures from its episodes' final attempts."""
    return {"accuracy": accuracy(final), "mean_outcome": mean_outcome(final), "episodes": len(final),
            "aborted": sum(t.status == EpisodeStatus.ABORTED for t in final)}


def family_summary(rows: list[dict[str, Any]], before: EvalResult | None, after: EvalResult | None,
                   family: str) -> dict[str, Any]:
    """One family's figures over a run, from its per-iteration figures and the evaluations before and after."""
    steps = sum(r["env_steps"] for r in rows)
    seconds = sum(r["rollout_s"] for r in rows)
    scores = [r["mean_step_score"] for r in rows if r["episodes_ok"]]
    ev_b = (before.families.get(family) or {}) if before else {}
    ev_a = (after.families.get(family) or {}) if after else {}
    return {
        "iterations": len(rows),
        "episodes": sum(r["episodes"] for r in rows),
        "accuracy_first": rows[0]["accuracy"] if rows else None,
        "accuracy_last": rows[-1]["accuracy"] if rows else None,
        "mean_outcome_first": rows[0]["mean_outcome"] if rows else None,
        "mean_outcome_last": rows[-1]["mean_outcome"] if rows else None,
        "mean_step_score": sum(scores) / len(scores) if scores else None,
        "env_steps": steps,
        "steps_per_s": steps / seconds if seconds > 0 else 0.0,
        "aborted": sum(r["episodes_aborted"] for r in rows),
        "dropped_stale": sum(r["dropped_stale"] for r in rows),
        "eval_before": ev_b.get("accuracy"),
        "eval_after": ev_a.get("accuracy"),
        "eval_episodes": ev_a.get("episodes", ev_b.get("episodes")),
        "eval_aborted": (ev_b.get("aborted") or 0) + (ev_a.get("aborted") or 0) if (ev_a or ev_b) else None,
    }


def add_advantage_stats(parts: Sequence[AdvantageStats] | Any) -> AdvantageStats:
    """Several families' advantage statistics as one batch's."""
    parts = list(parts)
    return AdvantageStats(*(sum(getattr(p, name) for p in parts) for name in
                            ("trajectories", "steps", "steps_with_gradient", "dropped_buckets", "buckets")))
