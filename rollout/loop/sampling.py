"""Which tasks each iteration trains on: seeded draws without replacement, per family, replayable on resume."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from rollout.mix import GroupShares, LoopFamily
from rollout.state.run_state import tasks_digest


class TaskSampler:
    """Draws tasks without replacement from a shuffled pool, reshuffling when it runs out (seeded). Its draws are a
    function of the seed and `position` alone, so a resumed run replays to its position (`skip`)."""

    def __init__(self, tasks: Sequence[dict[str, Any]], seed: int):
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks = list(tasks)
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.position = 0  # tasks drawn so far

    def take(self, k: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(k):
            if not self.order:
                self.order = list(range(len(self.tasks)))
                self.rng.shuffle(self.order)
            out.append(self.tasks[self.order.pop()])
        self.position += k
        return out

    def skip(self, position: int) -> None:
        """Move on to `position` (from the start), as if those tasks had been drawn."""
        if position < self.position:
            raise ValueError(f"the task sampler is at {self.position}, past {position}")
        self.take(position - self.position)


class FamilySampler:
    """Each iteration's task groups: how many per family (rollout.mix.GroupShares), each family's tasks drawn from
    its own TaskSampler. A one-family run draws exactly as TaskSampler(tasks, seed) does."""

    def __init__(self, families: Sequence[LoopFamily], seed: int):
        trained = [f for f in families if f.weight > 0]
        self.shares = GroupShares({f.name: f.weight for f in trained})
        self.samplers = {f.name: TaskSampler(f.train_tasks, seed if len(families) == 1 else seed * 1009 + i)
                         for i, f in enumerate(families) if f.weight > 0}
        missing = [f.name for f in trained if not f.train_tasks]
        if missing:
            raise ValueError(f"no training tasks for families {missing} (weight > 0)")
        self.position = 0  # task groups drawn so far

    def take(self, groups: int) -> list[tuple[str, dict[str, Any]]]:
        """(family, task) for each of this iteration's `groups` task groups, family by family."""
        self.position += groups
        return [(f, t) for f, n in self.shares.take(groups).items() for t in self.samplers[f].take(n)]

    def skip(self, position: int, groups_per_take: int) -> None:
        """Move on to `position` groups drawn (from the start), as if they had been drawn `groups_per_take` at a time
        (loop.tasks_per_iteration): the shares carry fractions from one iteration to the next, so a mix replays the
        same draws to land on the same families' samplers in the same state."""
        if position < self.position:
            raise ValueError(f"the task sampler is at {self.position}, past {position}")
        while self.position < position:
            self.take(min(groups_per_take, position - self.position))

    def digest(self) -> str:
        """What a resume checks the training tasks against: one family's task ids (as a one-env run's), or every
        trained family's, named by family."""
        if len(self.samplers) == 1:
            return tasks_digest(next(iter(self.samplers.values())).tasks)
        return tasks_digest([{"id": f"{f}:{t.get('id')}"} for f, s in self.samplers.items() for t in s.tasks])
