"""Rollout runners that scale out (`loop.runners=N`): episodes run in N Ray actors, each with its own event loop, its
share of the env slots (its own farm), its own policy client (sessions) and judge client, and return each finished
trajectory to the driver's loop.

The driver keeps the books exactly as `rollout.episodes.collect.collect` does (it is the same contract): every attempt
ends as one Trajectory passed to `on_episode` at once and returned in request order (each request's attempts in turn),
an aborted attempt is retried up to `max_retries` times, and `CollectStats` balances. A runner that dies (its process
killed, its node lost) aborts the episodes it was running: each becomes an aborted attempt naming the runner and its
pid, counted and retried (on another runner first); Ray restarts the runner (`farm.max_worker_restarts` times), and the
restarted runner builds its farm and clients again before its next episode.

What a runner builds comes from picklable factories (`RunnerSpec`), so the builder decides what runs where
(rollout/build.py: `build_runners`); a runner's farm is its share of the run's farm (`runner_farm_config`). One Ray
call per episode attempt is all the driver pays per episode; the per-step work (policy requests, env steps, judge
calls) happens in the runners.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.episodes.collect import CollectStats, EpisodeCallback, collect_attempts
from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
from rollout.farm.core import EnvFarm, FarmConfig, FarmMetrics, MixFarm, init_ray
from train.records import EpisodeStatus, Trajectory

log = logging.getLogger(__name__)

__all__ = ["RunnerPool", "RunnerSpec", "runner_farm_config"]


def runner_farm_config(cfg: FarmConfig, index: int, runners: int) -> FarmConfig:
    """Runner `index`'s share of a farm: its env slots and its cap on envs starting (the first runners take the
    remainders), the rest as configured. Raises if a runner would get no slot."""
    if runners < 1 or not 0 <= index < runners:
        raise ValueError(f"runner {index} of {runners}: need 0 <= index < runners and runners >= 1")
    if cfg.num_envs < runners:
        raise ValueError(f"farm.num_envs={cfg.num_envs} is fewer than loop.runners={runners}: every runner needs an "
                         "env slot")

    def share(total: int) -> int:
        return total // runners + (index < total % runners)

    starting = max(1, share(cfg.max_starting)) if cfg.max_starting > 0 else 0
    per_worker = min(cfg.envs_per_worker, share(cfg.num_envs))
    families = {f: {**opts, **({"num_envs": max(1, opts["num_envs"] // runners)} if "num_envs" in opts else {})}
                for f, opts in cfg.families.items()}
    return dataclasses.replace(cfg, num_envs=share(cfg.num_envs), max_starting=starting, envs_per_worker=per_worker,
                               families=families)


@dataclass
class RunnerSpec:
    """How each runner builds its parts (every field picklable: it travels to the actors).

    `farm(index, runners)` builds runner `index`'s farm (not started), `policy()` its policy client, `judge()` its
    judge (or None)."""

    farm: Callable[[int, int], EnvFarm | MixFarm]
    policy: Callable[[], Any]
    judge: Callable[[], Any] | None = None  # None: no judge
    max_restarts: int = 3  # Ray restarts of a runner that died (farm.max_worker_restarts)
    num_cpus: float = 0.0  # CPUs reserved per runner actor (0: they share a small machine)
    resources: dict[str, float] = field(default_factory=dict)


class RolloutRunner:
    """One runner: a farm, a policy client and a judge in its own process and event loop (a Ray actor)."""

    def __init__(self, spec: RunnerSpec, index: int, runners: int):
        self.spec, self.index, self.runners = spec, index, runners
        self._ready: asyncio.Task | None = None
        self.farm: EnvFarm | MixFarm | None = None
        self.policy: Any = None
        self.judge: Any = None

    async def _build(self) -> None:
        self.farm = self.spec.farm(self.index, self.runners)
        await self.farm.start()
        self.policy = self.spec.policy()
        self.judge = self.spec.judge() if self.spec.judge is not None else None

    async def start(self) -> dict[str, Any]:
        """Build everything (once; a restarted runner builds again on its first call); where it runs."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._build())
        await self._ready
        return {"index": self.index, "slots": self.farm.capacity, **self.farm_snapshot()}

    async def run_episode(self, req: EpisodeRequest, cfg: RunnerConfig) -> tuple[Trajectory, dict[str, Any]]:
        """One attempt of `req`, and this runner's farm figures after it (the driver's live farm metrics)."""
        await self.start()
        traj = await run_episode(self.farm.route(req.family), self.policy, self.judge, req, cfg)
        return traj, self.farm_snapshot()

    def farm_snapshot(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "farm": self.farm.metrics(), "families": self.farm.family_metrics()}

    async def close(self) -> None:
        for part, how in ((self.farm, "close"), (self.judge, "close"), (self.policy, "close")):
            if part is not None:
                try:
                    await getattr(part, how)()
                except Exception:
                    log.warning("runner %d: closing %s failed", self.index, type(part).__name__, exc_info=True)


class RunnerPool:
    """N runner actors behind the interface the loop uses of a farm (start, close, metrics) plus `collect`."""

    backend = "runners"

    def __init__(self, spec: RunnerSpec, runners: int, *, env_name: str = "env", ray_address: str | None = None):
        if runners < 1:
            raise ValueError(f"loop.runners must be >= 1, got {runners}")
        self.spec, self.n, self.env_name, self.ray_address = spec, runners, env_name, ray_address
        self._actors: list[Any] = []
        self._pids: list[int | None] = [None] * runners
        self._dead: set[int] = set()  # runners whose restarts are used up
        self._down: dict[int, asyncio.Task] = {}  # runners that failed an episode, until they answer again
        self.runner_restarts = 0
        self._snapshots: list[dict[str, Any]] = []  # each runner's latest: pid, farm metrics, per-family metrics
        self._slots = 0
        self._started = False

    # ----- lifecycle -----
    async def start(self) -> None:
        if self._started:
            return
        import ray

        init_ray(self.ray_address)
        opts: dict[str, Any] = {"num_cpus": self.spec.num_cpus, "max_restarts": self.spec.max_restarts,
                                "max_task_retries": 0,  # never replay an episode into a restarted runner: retries are ours
                                "max_concurrency": 100_000}
        if self.spec.resources:
            opts["resources"] = dict(self.spec.resources)
        actor = ray.remote(RolloutRunner)
        self._actors = [actor.options(**opts).remote(self.spec, i, self.n) for i in range(self.n)]
        infos = await asyncio.gather(*(a.start.remote() for a in self._actors))
        self._pids = [info["pid"] for info in infos]
        self._snapshots = list(infos)
        self._slots = sum(info["slots"] for info in infos)
        self._started = True
        log.info("%d rollout runners up (pids %s), %d env slots", self.n, self._pids, self._slots)

    async def close(self) -> None:
        if not self._started:
            return
        import ray

        self._started = False
        try:
            await asyncio.wait_for(asyncio.gather(*(a.close.remote() for a in self._actors), return_exceptions=True), 60)
        except asyncio.TimeoutError:
            log.warning("rollout runners did not close within 60 s; killing them")
        for a in self._actors:
            ray.kill(a, no_restart=True)

    async def __aenter__(self) -> RunnerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ----- what the loop reads of a farm -----
    @property
    def capacity(self) -> int:
        return self._slots

    async def wait_up(self, timeout_s: float = 120.0) -> None:
        """Until every runner that failed is back (or gone for good)."""
        watches = list(self._down.values())
        if watches:
            await asyncio.wait_for(asyncio.gather(*watches, return_exceptions=True), timeout_s)

    def pids(self) -> list[int | None]:
        """Each runner's process id as last seen (a restarted runner's new pid once it answered)."""
        return list(self._pids)

    async def call_each(self, fn: Callable[[Any], Any]) -> list[Any]:
        """`fn(runner)` inside every runner actor, the results in runner order (for tools that read a runner's state)."""
        return await asyncio.gather(*(a.__ray_call__.remote(fn) for a in self._actors))

    def metrics(self) -> FarmMetrics:
        """The runners' farms added up, as of each runner's latest finished episode (or its start)."""
        self._require_started()
        total = FarmMetrics.total([s["farm"] for s in self._snapshots])
        # a restarted runner's farm starts its counts anew; its restart is counted with the farms' worker restarts
        return dataclasses.replace(total, restarts=total.restarts + self.runner_restarts)

    def family_metrics(self) -> dict[str, FarmMetrics]:
        by_family: dict[str, list[FarmMetrics]] = {}
        self._require_started()
        for s in self._snapshots:
            for fam, m in s["families"].items():
                by_family.setdefault(fam, []).append(m)
        return {fam: FarmMetrics.total(ms) for fam, ms in by_family.items()}

    def route(self, family: str | None = None) -> RunnerPool:
        return self

    def _require_started(self) -> None:
        if not self._snapshots:
            raise RuntimeError("the rollout runners have not started: call `await pool.start()` first")

    # ----- episodes -----
    def _runner_for(self, index: int, attempt: int) -> int:
        """A request's runner: spread by request index; a retry moves on, and runners that are down or dead are
        skipped while others are up."""
        up = [i for i in range(self.n) if i not in self._dead and i not in self._down]
        pick = up or [i for i in range(self.n) if i not in self._dead] or list(range(self.n))
        return pick[(index + attempt) % len(pick)]

    async def _attempt(self, runner: int, req: EpisodeRequest, cfg: RunnerConfig) -> Trajectory:
        import ray

        try:
            traj, snapshot = await self._actors[runner].run_episode.remote(req, cfg)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            if runner not in self._down and runner not in self._dead:
                self._down[runner] = asyncio.ensure_future(self._watch_restart(runner))
            return _lost(req, cfg, f"rollout runner {runner} (pid {self._pids[runner]}) died while running the "
                                   f"episode: {type(exc).__name__}: {_first_line(str(exc))}")
        self._snapshots[runner] = snapshot
        self._pids[runner] = snapshot["pid"]
        return traj

    async def _watch_restart(self, runner: int) -> None:
        """Until a runner that failed answers again (Ray restarted it: it builds its farm and clients anew), or is
        gone for good (its restarts are used up)."""
        import ray

        old = self._pids[runner]
        try:
            while True:
                try:
                    info = await self._actors[runner].start.remote()
                except ray.exceptions.ActorDiedError:
                    self._dead.add(runner)
                    log.error("rollout runner %d (pid %s) is gone for good (max_restarts=%d)", runner, old,
                              self.spec.max_restarts)
                    return
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                    await asyncio.sleep(0.2)
                    continue
                self._pids[runner] = info["pid"]
                self._snapshots[runner] = info
                self.runner_restarts += 1
                log.warning("rollout runner %d is back (pid %s, was %s)", runner, info["pid"], old)
                return
        finally:
            self._down.pop(runner, None)

    async def collect(self, requests: Iterable[EpisodeRequest], runner_cfg: RunnerConfig, *, max_retries: int = 2,
                      on_episode: EpisodeCallback | None = None, stats: CollectStats | None = None) -> list[Trajectory]:
        """`rollout.episodes.collect.collect` over the runners: the same books, callbacks, retries and order."""
        if not self._started:
            raise RuntimeError("the rollout runners have not started: call `await pool.start()` first")

        async def attempt(index: int, req: EpisodeRequest) -> Trajectory:
            return await self._attempt(self._runner_for(index, req.attempt), req, runner_cfg)

        return await collect_attempts(requests, attempt, max_retries=max_retries, on_episode=on_episode, stats=stats)


def _lost(req: EpisodeRequest, cfg: RunnerConfig, reason: str) -> Trajectory:
    """The record of an attempt whose runner died: aborted, with the reason (its steps died with the runner)."""
    traj = Trajectory(run_id=cfg.run_id, episode_id=req.episode_id, group_id=req.group_id,
                      task_id=str(req.task.get("id")), attempt=req.attempt, split=req.split, iteration=req.iteration,
                      family=req.family or "")
    traj.move(EpisodeStatus.ABORTED, reason)
    return traj


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def farm_factory(families: Mapping[str, tuple[str, Mapping[str, Any], FarmConfig]], mixed: bool
                 ) -> Callable[[int, int], EnvFarm | MixFarm]:
    """A runner's farm from the run's farms: its share of each (a MixFarm for env=mix, else the one farm)."""
    return _FarmFactory(dict(families), mixed)


@dataclass
class _FarmFactory:
    families: dict[str, tuple[str, Mapping[str, Any], FarmConfig]]
    mixed: bool

    def __call__(self, index: int, runners: int) -> EnvFarm | MixFarm:
        from rollout.farm.core import make_farm

        shares = {f: (name, kwargs, runner_farm_config(cfg, index, runners))
                  for f, (name, kwargs, cfg) in self.families.items()}
        if self.mixed:
            return MixFarm(shares)
        (name, kwargs, cfg), = shares.values()
        return make_farm(name, kwargs, cfg)

