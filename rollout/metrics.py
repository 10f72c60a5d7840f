"""One definition of each episode metric, used by the training rows and the evaluation rows of metrics.jsonl (written
by rollout.loop) and by the experiment report (which reads those rows), and the metrics of a held-out curve.

- An episode is counted once, by its final attempt (a retry of an aborted episode replaces it).
- `solved(t)`: the episode ended ok (the env ended it) with an outcome > 0.
- `accuracy`: the fraction of episodes solved. An episode whose last attempt aborted or failed counts as not solved:
  the denominator is every episode asked for, so an unreliable env cannot raise the figure.
- `mean_outcome`: the mean outcome of the episodes that ended ok (an aborted episode has no outcome; their number is
  reported next to it as `episodes_aborted`).
Per family (env=mix; a one-env run has one family): the same figures under `family/<family>/<key>` in each row
(`family_keys`, read back by `family_values` and `family_eval_curve`).
Held-out curves: `eval_curve` (iteration, accuracy) from the eval rows, `area_under_curve` (its mean value),
`first_reaching` (the first iteration at a threshold), and the tuning stage's rule `pick_tuned_value`.
Directive signals: `directive_metrics` (hint rate, teacher-student gap, dropped steps, per family).
The policy's prompts: `prompt_metrics` (prompts cut to the policy's limit, the longest), `prompt_totals` (over a run).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rollout.episodes.collect import RETRY_MARK
from train.records import EpisodeStatus, Trajectory


def final_attempts(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The last attempt of every episode (retries of an aborted episode replace it)."""
    last: dict[str, Trajectory] = {}
    for t in trajs:
        base = t.episode_id.split(RETRY_MARK)[0]
        if base not in last or t.attempt >= last[base].attempt:
            last[base] = t
    return list(last.values())


def solved(t: Trajectory) -> bool:
    return t.status == EpisodeStatus.OK and (t.outcome or 0.0) > 0


def accuracy(trajs: Sequence[Trajectory]) -> float:
    """Fraction of episodes (final attempts) solved; aborted and failed ones count as not solved."""
    final = final_attempts(trajs)
    return sum(solved(t) for t in final) / len(final) if final else 0.0


def mean_outcome(trajs: Sequence[Trajectory]) -> float:
    """Mean outcome of the episodes (final attempts) that ended ok; 0.0 when none did."""
    ok = [t for t in final_attempts(trajs) if t.status == EpisodeStatus.OK]
    return sum(t.outcome or 0.0 for t in ok) / len(ok) if ok else 0.0


def episode_stats(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """The episode figures of a training row (all attempts; `accuracy` and `mean_outcome` by final attempts):
    episodes, episodes_ok / _aborted / _failed, mean_outcome, accuracy, mean_step_score (judged steps of the episodes
    that ended ok), mean_steps (of those), env_steps (every attempt's steps)."""
    ok = [t for t in trajs if t.status == EpisodeStatus.OK]
    scores = [s.judge.score for t in ok for s in t.steps if s.judge is not None]
    return {
        "episodes": len(trajs),
        "episodes_ok": len(ok),
        "episodes_aborted": sum(t.status == EpisodeStatus.ABORTED for t in trajs),
        "episodes_failed": sum(t.status == EpisodeStatus.FAILED for t in trajs),
        "mean_outcome": mean_outcome(trajs),
        "accuracy": accuracy(trajs),
        "mean_step_score": sum(scores) / len(scores) if scores else 0.0,
        "mean_steps": sum(len(t.steps) for t in ok) / len(ok) if ok else 0.0,
        "env_steps": sum(len(t.steps) for t in trajs),
    }


PROMPT_KEYS = ("policy/truncated_prompts", "policy/longest_prompt_tokens")  # prompt_metrics' keys


def prompt_metrics(trajs: Sequence[Trajectory]) -> dict[str, int]:
    """The policy's prompts of these episodes (every attempt's steps, one policy call each):
    `policy/truncated_prompts`, the prompts it cut to its limit (policy=local: `policy.max_prompt_tokens`, left-truncated;
    its log says so once, then counts), and `policy/longest_prompt_tokens`, the longest prompt it was asked to continue,
    before any cut (0: no step)."""
    steps = [s for t in trajs for s in t.steps]
    return {
        "policy/truncated_prompts": sum(s.prompt_truncated_from is not None for s in steps),
        "policy/longest_prompt_tokens": max((s.prompt_truncated_from or s.prompt_tokens for s in steps), default=0),
    }


def prompt_totals(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """`prompt_metrics` over a run: the metrics rows' `policy/truncated_prompts` added up, the longest prompt of all
    (rows without them count 0)."""
    rows = list(rows)
    return {
        "policy/truncated_prompts": sum(int(r.get("policy/truncated_prompts") or 0) for r in rows),
        "policy/longest_prompt_tokens": max((int(r.get("policy/longest_prompt_tokens") or 0) for r in rows), default=0),
    }


FAMILY_PREFIX = "family/"


def family_keys(family: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` as a family's flat metric keys: `family/<family>/<key>`."""
    return {f"{FAMILY_PREFIX}{family}/{k}": v for k, v in values.items()}


def family_values(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A metrics row's per-family keys back as family -> {key: value}."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in row.items():
        if k.startswith(FAMILY_PREFIX):
            family, _, key = k[len(FAMILY_PREFIX):].partition("/")
            out.setdefault(family, {})[key] = v
    return out


def family_eval_curve(metrics: list[dict[str, Any]], family: str) -> list[tuple[int, float]]:
    """(iteration, accuracy) of one family from a run's eval rows."""
    key = f"{FAMILY_PREFIX}{family}/accuracy"
    return [(int(m["iteration"]), float(m[key])) for m in metrics if m.get("kind") == "eval" and key in m]


def eval_curve(metrics: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(iteration, accuracy) of a run's eval rows."""
    return [(int(m["iteration"]), float(m["accuracy"])) for m in metrics if m.get("kind") == "eval"]


def area_under_curve(points: Sequence[tuple[int, float]]) -> float:
    """Trapezoidal area under (iteration, accuracy) points divided by their iteration span: the curve's mean value."""
    pts = sorted(points)
    if not pts:
        raise ValueError("no points")
    if len(pts) == 1 or pts[-1][0] == pts[0][0]:
        return float(pts[0][1])
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


def first_reaching(points: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The first evaluated iteration whose accuracy is at least `threshold` (None: never)."""
    for it, acc in sorted(points):
        if acc >= threshold:
            return it
    return None


def pick_tuned_value(values: list[Any], mean_auc: list[float | None], default: Any = None,
                     min_gain: float = 0.0) -> Any:
    """The value with the largest mean area (the first listed on a tie); `default` instead when that one's area is less
    than `min_gain` above the default's. None when no value has an area (every run failed)."""
    ranked = [(s, -i, v) for i, (v, s) in enumerate(zip(values, mean_auc)) if s is not None]
    if not ranked:
        return None
    best_score, _, best = max(ranked)
    if min_gain > 0 and default in values:
        default_score = mean_auc[values.index(default)]
        if default_score is not None and best_score - default_score < min_gain:
            return default
    return best


def tune_arm_name(key: str, value: Any) -> str:
    return f"{key.rsplit('.', 1)[-1]}_{value}"  # no "=": it goes into run.out_dir=... overrides




def topk_figures(prefix: str, steps: Sequence[Any]) -> dict[str, float]:
    """reward.opd_signal=teacher_topk (none otherwise): `distill_steps` (the fraction of steps in the distillation
    term: hinted, with the teacher's top-k), and over their tokens the teacher's probability of the sampled token
    (`topk_sampled_mass`, 0 where it is outside the top-k), how often it is inside (`topk_sampled_in`) and the
    teacher's mass outside its top-k (`topk_tail`)."""
    tops = [s.teacher_topk_summary for s in steps if s.teacher_topk_summary and s.distill_weight is not None]
    if not tops and not any(s.teacher_topk_summary for s in steps):
        return {}
    tokens = sum(t["tokens"] for t in tops)
    out = {f"{prefix}distill_steps": len(tops) / len(steps) if steps else 0.0}
    for key, name in (("sampled_mass", "topk_sampled_mass"), ("sampled_in_topk", "topk_sampled_in"),
                      ("tail", "topk_tail")):
        out[f"{prefix}{name}"] = sum(t[key] * t["tokens"] for t in tops) / tokens if tokens else 0.0
    return out


def directive_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Directive signals of a training batch (the episodes that ended ok), over all families and per family
    (`directive/<family>/...`): `hint_rate` (judged steps with a hint), `gap_mean` / `gap_std` / `gap_min` / `gap_max`
    (the teacher-student log-prob gap over the hinted steps' tokens: mean, spread over tokens, extremes),
    `dropped_steps` (steps with no gradient) and, over all families only, `mode/<rule>` (steps per rule that gave, or
    withheld, the advantage: train.opd.APPLIED / NO_GRADIENT),
    `hint_rate_right` / `hint_rate_wrong` (among steps scored > 0 / < 0), and with reward.opd_signal=teacher_topk
    `topk_figures`."""
    by_family: dict[str, list[Any]] = {"": []}
    for t in trajs:
        if t.status == EpisodeStatus.OK:
            by_family[""].extend(t.steps)
            by_family.setdefault(t.family or "generic", []).extend(t.steps)
    out: dict[str, float] = {}
    for family, steps in by_family.items():
        prefix = f"directive/{family}/" if family else "directive/"
        judged = [s for s in steps if s.judge is not None]
        gaps = [s.teacher_gap for s in steps if s.teacher_gap]
        tokens = sum(g["tokens"] for g in gaps)
        out[f"{prefix}steps"] = float(len(steps))
        out[f"{prefix}hint_rate"] = sum(s.judge.hint is not None for s in judged) / len(judged) if judged else 0.0
        out[f"{prefix}gap_mean"] = mean = sum(g["mean"] * g["tokens"] for g in gaps) / tokens if tokens else 0.0
        # the spread over tokens; a record written before `sq` existed adds its mean's square (a lower bound)
        square = sum(g.get("sq", g["mean"] ** 2) * g["tokens"] for g in gaps) / tokens if tokens else 0.0
        out[f"{prefix}gap_std"] = max(square - mean * mean, 0.0) ** 0.5
        out[f"{prefix}gap_min"] = min((g["min"] for g in gaps), default=0.0)
        out[f"{prefix}gap_max"] = max((g["max"] for g in gaps), default=0.0)
        out[f"{prefix}dropped_steps"] = sum(s.advantage is None for s in steps) / len(steps) if steps else 0.0
        # which judged steps got a hint: right ones (score > 0, a next state that says what comes next) and wrong ones
        for side, pick in (("right", lambda x: x > 0), ("wrong", lambda x: x < 0)):
            part = [s for s in judged if pick(s.judge.score)]
            out[f"{prefix}hint_rate_{side}"] = (sum(s.judge.hint is not None for s in part) / len(part)
                                                if part else 0.0)
        out.update(topk_figures(prefix, steps))
        if not family:
            for mode in sorted({s.advantage_mode for s in steps if s.advantage_mode}):
                out[f"{prefix}mode/{mode}"] = float(sum(s.advantage_mode == mode for s in steps))
    return out


__all__ = ["FAMILY_PREFIX", "PROMPT_KEYS", "accuracy", "area_under_curve", "directive_metrics", "episode_stats",
           "eval_curve", "family_eval_curve", "family_keys", "family_values", "final_attempts", "first_reaching",
           "mean_outcome", "pick_tuned_value", "prompt_metrics", "prompt_totals", "solved", "topk_figures",
           "tune_arm_name"]
