"""Bounded staleness: which samples a trainer at version v may still learn from (pure functions, no I/O).

A sample's weight version is the oldest policy version behind any of its scored tokens. With bound S, a trainer at
version v trains on samples with v - S <= version <= v and drops the older ones ("stale"); a version above v cannot
come from this trainer (a policy serving weights the trainer never produced) and is dropped as "future".
Every produced sample is counted exactly once: produced == trained + dropped_stale + dropped_future.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from train.records import TrainSample


@dataclass
class StalenessReport:
    bound: int
    trainer_version: int
    produced: int = 0
    trained: int = 0
    dropped_stale: int = 0
    dropped_future: int = 0
    staleness: Counter = field(default_factory=Counter)  # trainer_version - sample version, over trained samples

    @property
    def balanced(self) -> bool:
        return self.produced == self.trained + self.dropped_stale + self.dropped_future

    def as_metrics(self) -> dict[str, float]:
        trained_versions = [self.trainer_version - lag for lag, n in self.staleness.items() for _ in range(n)]
        return {
            "produced": self.produced,
            "trained": self.trained,
            "dropped_stale": self.dropped_stale,
            "dropped_future": self.dropped_future,
            "max_staleness": self.bound,
            "trainer_version_before": self.trainer_version,
            "staleness_mean": (sum(lag * n for lag, n in self.staleness.items()) / self.trained)
            if self.trained
            else 0.0,
            "staleness_max": max(self.staleness) if self.staleness else 0,
            "trained_version_min": min(trained_versions) if trained_versions else None,
            "trained_version_max": max(trained_versions) if trained_versions else None,
        }


def filter_stale(
    samples: Sequence[TrainSample], trainer_version: int, bound: int
) -> tuple[list[TrainSample], StalenessReport]:
    """The samples a trainer at `trainer_version` trains on under staleness bound `bound`, and the books."""
    if bound < 0:
        raise ValueError(f"max_staleness must be >= 0, got {bound}")
    report = StalenessReport(bound=bound, trainer_version=trainer_version, produced=len(samples))
    kept = []
    for s in samples:
        lag = trainer_version - s.weight_version
        if lag < 0:
            report.dropped_future += 1
        elif lag > bound:
            report.dropped_stale += 1
        else:
            kept.append(s)
            report.staleness[lag] += 1
    report.trained = len(kept)
    return kept, report


__all__ = ["StalenessReport", "filter_stale"]
