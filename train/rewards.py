"""Reward math (pure functions, no I/O). See docs/architecture.md, "The reward math".

- `integrate`: R_t = o + coef * r_t (the outcome is added before normalization).
- `step_index_normalize`: bucket (task group, step index) across the samples of a task and standardize inside each
  bucket with the population standard deviation; singleton and constant buckets follow explicit options.
- `grpo_outcome_advantages` / `broadcast_outcome_advantages`: the outcome-only baseline (Table 4's comparison arm).
- `never_reinforce`: caps the advantages of given steps at 0 (e.g. outputs cut off at the token limit).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

CONSTANT_VAR = 1e-12  # a bucket whose variance is at most this is "constant"
SINGLETON_OPTIONS = ("raw", "zero", "drop")
CONSTANT_OPTIONS = ("drop", "zero")


def integrate(outcome: float, step_scores: Sequence[float], coef: float = 1.0) -> list[float]:
    """Per-step reward R_t = outcome + coef * r_t."""
    return [float(outcome) + coef * float(r) for r in step_scores]


@dataclass(frozen=True)
class BucketStats:
    buckets: int
    singleton: int
    constant: int
    dropped_steps: int
    total_steps: int


def _check_option(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: use one of {', '.join(allowed)}")


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mu = sum(values) / len(values)
    var = sum((v - mu) ** 2 for v in values) / len(values)  # population variance
    return mu, var


def step_index_normalize(
    rewards: Mapping[Hashable, Sequence[Sequence[float]]],
    *,
    eps: float = 1e-6,
    singleton: str = "raw",
    constant: str = "drop",
) -> dict[Hashable, list[list[float | None]]]:
    """Standardize R within each (group, step index) bucket: A = (R - mu) / (sigma + eps), sigma the population std.

    `rewards[g][i][t]` is R_t of trajectory i of task group g. The result has the same shape; None marks a step that gets
    no gradient. `singleton`: a bucket with one member keeps its raw R ("raw", reference behaviour), gets 0 ("zero"),
    or is dropped ("drop"). `constant`: a bucket of n > 1 members with zero variance is dropped ("drop", reference) or
    gets 0 ("zero").
    """
    return step_index_normalize_with_stats(rewards, eps=eps, singleton=singleton, constant=constant)[0]


def step_index_normalize_with_stats(
    rewards: Mapping[Hashable, Sequence[Sequence[float]]],
    *,
    eps: float = 1e-6,
    singleton: str = "raw",
    constant: str = "drop",
) -> tuple[dict[Hashable, list[list[float | None]]], BucketStats]:
    _check_option("singleton", singleton, SINGLETON_OPTIONS)
    _check_option("constant", constant, CONSTANT_OPTIONS)
    out: dict[Hashable, list[list[float | None]]] = {}
    n_buckets = n_single = n_const = dropped = total = 0
    for g, trajs in rewards.items():
        adv: list[list[float | None]] = [[None] * len(r) for r in trajs]
        depth = max((len(r) for r in trajs), default=0)
        for t in range(depth):
            members = [i for i, r in enumerate(trajs) if t < len(r)]
            values = [float(trajs[i][t]) for i in members]
            n_buckets += 1
            total += len(members)
            if any(not math.isfinite(v) for v in values):
                raise ValueError(f"group {g!r} step {t}: non-finite reward in {values}")
            if len(members) == 1:
                n_single += 1
                a = {"raw": values[0], "zero": 0.0, "drop": None}[singleton]
                adv[members[0]][t] = a
                dropped += a is None
                continue
            mu, var = _mean_std(values)
            if var <= CONSTANT_VAR:
                n_const += 1
                for i in members:
                    adv[i][t] = None if constant == "drop" else 0.0
                dropped += len(members) if constant == "drop" else 0
                continue
            sigma = math.sqrt(var)
            for i, v in zip(members, values):
                adv[i][t] = (v - mu) / (sigma + eps)
        out[g] = adv
    return out, BucketStats(n_buckets, n_single, n_const, dropped, total)


def grpo_outcome_advantages(
    outcomes: Mapping[Hashable, Sequence[float]],
    *,
    eps: float = 1e-6,
    constant: str = "drop",
    std_normalize: bool = True,
) -> dict[Hashable, list[float | None]]:
    """GRPO: A_i = (o_i - mean_g) / (std_g + eps) within each task group (population std).

    A group whose outcomes are all equal (or with one member) gives no signal: dropped (None) or zeros.
    """
    _check_option("constant", constant, CONSTANT_OPTIONS)
    out: dict[Hashable, list[float | None]] = {}
    for g, os_ in outcomes.items():
        values = [float(o) for o in os_]
        if not values:
            out[g] = []
            continue
        mu, var = _mean_std(values)
        if len(values) == 1 or var <= CONSTANT_VAR:
            out[g] = [None if constant == "drop" else 0.0 for _ in values]
            continue
        scale = (math.sqrt(var) + eps) if std_normalize else 1.0
        out[g] = [(v - mu) / scale for v in values]
    return out


def never_reinforce(advantages: Sequence[float | None], capped: Sequence[bool]) -> list[float | None]:
    """The advantages with those of the `capped` steps at most 0: such a step can be pushed down, never up."""
    return [a if a is None or not c else min(a, 0.0) for a, c in zip(advantages, capped, strict=True)]


def broadcast_outcome_advantages(
    advantages: Mapping[Hashable, Sequence[float | None]], lengths: Mapping[Hashable, Sequence[int]]
) -> dict[Hashable, list[list[float | None]]]:
    """Give every step of trajectory i the trajectory's advantage (outcome-only arm)."""
    return {g: [[a] * n for a, n in zip(advantages[g], lengths[g])] for g in advantages}
