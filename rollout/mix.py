"""Several env families in one run (`env=mix`, docs/envs/mix.md): each family's part of the loop, and the pure rules
that divide a run between families.

- `GroupShares`: each iteration's B task groups split by weight. A family's share is carried over from one iteration
  to the next (smooth weighted round robin), so over k iterations family f gets k * B * w_f groups to within one,
  even when B * w_f is not a whole number (a 0.1 family with B = 8 gets a group in 4 iterations of 5, not never).
- `slot_quotas`: the farm's env slots split by weight, at least one per family, explicit quotas kept.
- `staleness_bounds`: `loop.max_staleness` as one number for every family or a per-family map.

A single-env run is a mix of one family: the loop, its metric rows and the summary treat both alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the bound of a family that a per-family `loop.max_staleness` map does not name (LoopConfig's default bound)
DEFAULT_STALENESS = 1


@dataclass
class LoopFamily:
    """One family's part of the rollout <-> train loop."""

    name: str  # the family's name in the run (its key in env.families; the env's name in a single-env run)
    train_tasks: Sequence[dict[str, Any]]
    eval_tasks: Sequence[dict[str, Any]]
    weight: float = 1.0  # share of the task groups per iteration (0: evaluated, not trained on)
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams overrides for this family's episodes


class GroupShares:
    """Splits each iteration's task groups between families by weight, carrying the fractions over (see the module)."""

    def __init__(self, weights: Mapping[str, float]):
        total = sum(w for w in weights.values() if w > 0)
        if total <= 0:
            raise ValueError(f"no family has a positive weight: {dict(weights)}")
        self.shares = {f: w / total for f, w in weights.items() if w > 0}
        self.credit = dict.fromkeys(self.shares, 0.0)

    def take(self, groups: int) -> dict[str, int]:
        """How many of `groups` task groups each family gets this iteration (sums to `groups`)."""
        out = dict.fromkeys(self.shares, 0)
        for f, share in self.shares.items():
            self.credit[f] += share * groups
        for _ in range(groups):
            f = max(self.credit, key=lambda name: (self.credit[name], self.shares[name]))  # ties: the larger share
            out[f] += 1
            self.credit[f] -= 1.0
        return out


def slot_quotas(total: int, weights: Mapping[str, float], fixed: Mapping[str, int] | None = None) -> dict[str, int]:
    """`total` env slots split by weight (largest remainder), at least one per family; `fixed` quotas are kept as given
    and the rest is split among the other families. A family of weight 0 (evaluated only) counts as the smallest
    positive weight, so its evaluation is not left one slot."""
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(weights)
    if unknown:
        raise ValueError(f"farm.families names {sorted(unknown)}, which are not families of this run: {list(weights)}")
    free = [f for f in weights if f not in fixed]
    left = total - sum(fixed.values())
    if free and left < len(free):
        raise ValueError(f"farm.num_envs={total} leaves {left} env slots for families {free} after the quotas "
                         f"{fixed}: at least one each")
    positive = [w for w in weights.values() if w > 0]
    floor_w = min(positive) if positive else 1.0
    w = {f: (weights[f] if weights[f] > 0 else floor_w) for f in free}
    out = dict(fixed)
    if not free:
        return out
    total_w = sum(w.values())
    exact = {f: left * w[f] / total_w for f in free}
    got = {f: math.floor(x) for f, x in exact.items()}
    for f in sorted(free, key=lambda f: exact[f] - got[f], reverse=True)[: left - sum(got.values())]:
        got[f] += 1
    for f in free:  # a family rounded down to nothing takes a slot from the family that has the most
        if got[f] == 0:
            richest = max(free, key=lambda g: got[g])
            got[richest] -= 1
            got[f] = 1
    out.update(got)
    return {f: out[f] for f in weights}


def staleness_bounds(value: int | Mapping[str, int], families: Sequence[str]) -> dict[str, int]:
    """Each family's staleness bound from `loop.max_staleness` (a number, or a map family -> bound; families it does
    not name get DEFAULT_STALENESS)."""
    if isinstance(value, Mapping):
        unknown = set(value) - set(families)
        if unknown:
            raise ValueError(f"loop.max_staleness names {sorted(unknown)}, which are not families of this run: "
                             f"{list(families)}")
        return {f: int(value.get(f, DEFAULT_STALENESS)) for f in families}
    return dict.fromkeys(families, int(value))


__all__ = ["DEFAULT_STALENESS", "GroupShares", "LoopFamily", "slot_quotas", "staleness_bounds"]
