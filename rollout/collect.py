"""Run many episodes concurrently on the farm and retry the ones whose env failed.

Every attempt is returned and reported through `on_episode` (so the caller can write it to disk at once): an aborted
attempt is on record with its reason, and its task is re-queued as a new attempt until `max_retries`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

from prm.judge import Judge
from rollout.farm import EnvFarm
from rollout.policy.base import Policy
from rollout.records import EpisodeStatus, Trajectory
from rollout.runner import EpisodeRequest, RunnerConfig, run_episode


def retry_id(episode_id: str, attempt: int) -> str:
    return episode_id if attempt == 0 else f"{episode_id}#retry{attempt}"


async def collect(
    farm: EnvFarm,
    policy: Policy,
    judge: Judge | None,
    requests: Sequence[EpisodeRequest],
    runner_cfg: RunnerConfig,
    *,
    max_retries: int = 2,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    done: list[Trajectory] = []

    async def one(req: EpisodeRequest) -> None:
        while True:
            traj = await run_episode(farm, policy, judge, req, runner_cfg)
            done.append(traj)
            if on_episode is not None:
                on_episode(traj)
            if traj.status != EpisodeStatus.ABORTED or req.attempt >= max_retries:
                return
            base = req.episode_id.split("#retry")[0]
            req = replace(req, attempt=req.attempt + 1, episode_id=retry_id(base, req.attempt + 1))

    await asyncio.gather(*(one(r) for r in requests))
    return done
