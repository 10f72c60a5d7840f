"""Run many episode requests on a farm, concurrently, and retry the ones whose env aborted them.

Every started episode ends as exactly one Trajectory (ok, failed or aborted) that is passed to `on_episode` the moment it
ends (so the caller can write it to disk at once) and returned, in the order of the requests (each request's attempts in
turn), whatever order they finished in: what is scored and trained next does not depend on timing. Nothing is dropped. An aborted episode (its env raised,
hung, or its worker died) is re-queued as `<episode_id>#retry<k>` with `attempt=k`, up to `max_retries` times; failed
episodes (policy or judge errors) are not retried, since a new env would not change them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace

from prm.judge import Judge
from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
from rollout.farm.core import EnvFarm, MixFarm
from rollout.policy.base import Policy
from train.records import EpisodeStatus, Trajectory

log = logging.getLogger(__name__)

RETRY_MARK = "#retry"
EpisodeCallback = Callable[[Trajectory], Awaitable[None] | None]


@dataclass
class CollectStats:
    """The books of one collect() call: started == finished + aborted always holds when it returns."""

    requested: int = 0
    started: int = 0  # episodes run (first attempts and retries)
    finished: int = 0  # ended ok or failed
    aborted: int = 0  # ended aborted (each one was retried, or gave up after max_retries)
    retried: int = 0
    gave_up: int = 0  # requests whose last attempt aborted
    by_status: Counter = field(default_factory=Counter)

    @property
    def balanced(self) -> bool:
        return self.started == self.finished + self.aborted


def retry_request(req: EpisodeRequest) -> EpisodeRequest:
    """The next attempt of `req`: same task, group and seed; id `<base>#retry<k>`."""
    base = req.episode_id.split(RETRY_MARK, 1)[0]
    attempt = req.attempt + 1
    return replace(req, episode_id=f"{base}{RETRY_MARK}{attempt}", attempt=attempt)


Attempt = Callable[[int, EpisodeRequest], Awaitable[Trajectory]]  # (request index, request) -> its trajectory


async def collect(
    farm: EnvFarm | MixFarm,
    policy: Policy,
    judge: Judge | None,
    requests: Iterable[EpisodeRequest],
    runner_cfg: RunnerConfig,
    *,
    max_retries: int = 2,
    on_episode: EpisodeCallback | None = None,
    stats: CollectStats | None = None,
) -> list[Trajectory]:
    """Run `requests` through `run_episode` concurrently; returns every trajectory, retries included, in request order.

    Concurrency is bounded by the farm itself: an episode waits for an env slot (`farm.lease()`; a mixed farm's slot
    of the request's family), and gives it back before its last judgements finish, so a slow judge never idles a slot.
    """

    async def attempt(index: int, req: EpisodeRequest) -> Trajectory:
        return await run_episode(farm.route(req.family), policy, judge, req, runner_cfg)

    return await collect_attempts(requests, attempt, max_retries=max_retries, on_episode=on_episode, stats=stats)


async def collect_attempts(
    requests: Iterable[EpisodeRequest],
    attempt: Attempt,
    *,
    max_retries: int = 2,
    on_episode: EpisodeCallback | None = None,
    stats: CollectStats | None = None,
) -> list[Trajectory]:
    """The books, callbacks, retries and order of `collect`, around any way of running one attempt (in this process,
    or in a runner actor: rollout/episodes/pool.py)."""
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    books = stats if stats is not None else CollectStats()
    pending = list(requests)
    books.requested += len(pending)
    out: list[tuple[int, int, Trajectory]] = []  # (request index, attempt, trajectory)

    async def one(index: int, req: EpisodeRequest) -> None:
        while True:
            books.started += 1
            traj = await attempt(index, req)
            out.append((index, req.attempt, traj))
            books.by_status[traj.status.value] += 1
            aborted = traj.status == EpisodeStatus.ABORTED
            retry = aborted and req.attempt < max_retries
            if aborted:
                books.aborted += 1
                books.retried += retry
                books.gave_up += not retry
                log.log(logging.INFO if retry else logging.WARNING, "episode %s aborted%s: %s", req.episode_id,
                        "; retrying" if retry else " on its last attempt", _last_line(traj.reason))
            else:
                books.finished += 1
            if on_episode is not None:
                maybe = on_episode(traj)
                if inspect.isawaitable(maybe):
                    await maybe
            if not retry:
                return
            req = retry_request(req)

    async with asyncio.TaskGroup() as tg:
        for index, req in enumerate(pending):
            tg.create_task(one(index, req))
    assert books.balanced, f"episode books do not balance: {books}"
    return [traj for _, _, traj in sorted(out, key=lambda entry: entry[:2])]


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
