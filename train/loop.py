"""The rollout <-> train loop: collect groups of episodes, score and normalize them, train, sync weights, evaluate.

Records go to disk as soon as they exist: every episode to `episodes.jsonl` when it ends (aborted ones included), every
step with its R_t and advantage to `trajectories.jsonl` once its iteration is scored, and one line per iteration / eval to
`metrics.jsonl`. A crash loses at most the steps of the iteration in progress, never an episode's existence.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prm.judge import Judge
from rollout.collect import collect
from rollout.farm import EnvFarm
from rollout.policy.base import Policy, SamplingParams, WeightUpdate
from rollout.records import EpisodeStatus, JsonlWriter, Trajectory
from rollout.runner import EpisodeRequest, RunnerConfig
from train.backends import Trainer
from train.batch import RewardConfig, assign_advantages, step_samples

log = logging.getLogger(__name__)


@dataclass
class LoopConfig:
    iterations: int = 4
    tasks_per_iteration: int = 8  # B task groups per iteration
    samples_per_task: int = 4  # n samples per task (the normalization group)
    eval_tasks: int = 64  # held-out tasks evaluated before and after training (0: no eval)
    eval_every: int = 0  # also evaluate every k iterations (0: only before and after)
    eval_judge: bool = False  # judge evaluation episodes too (off: evaluation never costs judge calls)
    eval_samples: int = 1  # episodes per held-out task (accuracy = mean over all of them, e.g. AIME avg@16)
    eval_greedy: bool = True  # greedy evaluation; false: the rollout sampling settings (with eval_samples > 1)
    max_retries: int = 2  # re-run a task whose episode aborted (env failure) up to this many times
    seed: int = 0
    record_token_ids: bool = False  # also write prompt/output token ids and logprobs to trajectories.jsonl


@dataclass
class EvalResult:
    iteration: int
    accuracy: float  # fraction of episodes with outcome > 0
    mean_outcome: float
    episodes: int
    aborted: int
    wall_s: float


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


class RunWriter:
    """The files of one run directory."""

    def __init__(self, out_dir: Path, record_token_ids: bool = False):
        self.out_dir = out_dir
        self.token_ids = record_token_ids
        self.trajectories = JsonlWriter(out_dir / "trajectories.jsonl")
        self.eval_trajectories = JsonlWriter(out_dir / "eval_trajectories.jsonl")
        self.episodes = JsonlWriter(out_dir / "episodes.jsonl")
        self.metrics = JsonlWriter(out_dir / "metrics.jsonl")

    def episode(self, traj: Trajectory) -> None:
        self.episodes.write(traj.summary())

    def steps(self, trajs: Sequence[Trajectory], *, eval_split: bool = False) -> None:
        w = self.eval_trajectories if eval_split else self.trajectories
        for tr in trajs:
            for s in tr.steps:
                w.write(s.to_json(self.token_ids))

    def metric(self, row: dict[str, Any]) -> None:
        self.metrics.write(row)

    def flush(self) -> None:
        for w in (self.trajectories, self.eval_trajectories, self.episodes, self.metrics):
            w.flush()

    def close(self) -> None:
        for w in (self.trajectories, self.eval_trajectories, self.episodes, self.metrics):
            w.close()


class TaskSampler:
    """Draws tasks without replacement from a shuffled pool, reshuffling when it runs out (seeded)."""

    def __init__(self, tasks: Sequence[dict[str, Any]], seed: int):
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks = list(tasks)
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def take(self, k: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(k):
            if not self.order:
                self.order = list(range(len(self.tasks)))
                self.rng.shuffle(self.order)
            out.append(self.tasks[self.order.pop()])
        return out


ProgressHook = Callable[..., None]  # (phase, done, total[, note]): LiveProgress.update or any 3-argument callable

FARM_NOTE_EVERY_S = 1.0  # how often the progress note with the farm's live metrics is refreshed during a phase


class RLLoop:
    def __init__(
        self,
        *,
        farm: EnvFarm,
        policy: Policy,
        judge: Judge | None,
        trainer: Trainer,
        reward_cfg: RewardConfig,
        loop_cfg: LoopConfig,
        sampling: SamplingParams,
        run_id: str,
        train_tasks: Sequence[dict[str, Any]],
        eval_tasks: Sequence[dict[str, Any]],
        writer: RunWriter,
        progress: ProgressHook | None = None,
    ):
        self.farm, self.policy, self.judge, self.trainer = farm, policy, judge, trainer
        self.reward_cfg, self.cfg, self.sampling = reward_cfg, loop_cfg, sampling
        self.run_id = run_id
        self.sampler = TaskSampler(train_tasks, loop_cfg.seed)
        self.eval_tasks = list(eval_tasks)[: loop_cfg.eval_tasks]
        self.writer = writer
        self.progress = progress or (lambda phase, done, total: None)
        self._progress_takes_note = _takes_four_args(self.progress)
        self.env_steps = 0
        self.aborted = 0

    def farm_metrics(self) -> dict[str, Any]:
        """The farm's metrics as flat `farm/*` keys (empty for a farm without `metrics()`)."""
        snapshot = getattr(self.farm, "metrics", None)
        return snapshot().as_dict() if snapshot is not None else {}

    def _report(self, phase: str, done: int, total: int) -> None:
        """Progress with the farm's live line (envs, in flight, steps/s, restarts, aborted) when the hook takes a note."""
        snapshot = getattr(self.farm, "metrics", None)
        if snapshot is not None and self._progress_takes_note:
            self.progress(phase, done, total, snapshot().brief())
        else:
            self.progress(phase, done, total)

    async def _collect(self, phase: str, requests: list[EpisodeRequest], runner_cfg: RunnerConfig) -> list[Trajectory]:
        done = 0
        total = len(requests)
        self._report(phase, 0, total)

        async def refresh() -> None:  # keeps the farm line live while long episodes run
            while True:
                await asyncio.sleep(FARM_NOTE_EVERY_S)
                self._report(phase, done, total)

        def on_episode(traj: Trajectory) -> None:
            nonlocal done
            self.writer.episode(traj)
            self.env_steps += len(traj.steps)
            if traj.status == EpisodeStatus.ABORTED:
                self.aborted += 1
                log.warning("episode %s aborted: %s", traj.episode_id, traj.reason.strip().splitlines()[-1:])
            else:
                done += 1
                self._report(phase, done, total)

        ticker = asyncio.ensure_future(refresh())
        try:
            return await collect(
                self.farm, self.policy, self.judge, requests, runner_cfg, max_retries=self.cfg.max_retries,
                on_episode=on_episode,
            )
        finally:
            ticker.cancel()

    async def evaluate(self, iteration: int) -> EvalResult | None:
        if not self.eval_tasks:
            return None
        t0 = time.perf_counter()
        sampling = SamplingParams(**{**asdict(self.sampling), "greedy": self.cfg.eval_greedy})
        runner_cfg = RunnerConfig(run_id=self.run_id, sampling=sampling, judge_enabled=self.cfg.eval_judge)
        n = max(1, self.cfg.eval_samples)
        requests = [
            EpisodeRequest(f"eval{iteration}-{i}" + (f"-s{j}" if n > 1 else ""), f"eval{iteration}-{i}", t,
                           seed=self.cfg.seed + i * n + j, split="eval", iteration=iteration)
            for i, t in enumerate(self.eval_tasks)
            for j in range(n)
        ]
        trajs = await self._collect(f"eval @ iteration {iteration}", requests, runner_cfg)
        self.writer.steps(trajs, eval_split=True)
        final = _final_attempts(trajs)
        ok = [t for t in final if t.status == EpisodeStatus.OK]
        res = EvalResult(
            iteration=iteration,
            accuracy=sum((t.outcome or 0) > 0 for t in ok) / len(final) if final else 0.0,
            mean_outcome=sum(t.outcome or 0 for t in ok) / len(ok) if ok else 0.0,
            episodes=len(final),
            aborted=sum(t.status == EpisodeStatus.ABORTED for t in final),
            wall_s=time.perf_counter() - t0,
        )
        self.writer.metric({"kind": "eval", **asdict(res), **self.farm_metrics()})
        self.writer.flush()
        return res

    async def iteration(self, k: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        steps_before = self.env_steps
        tasks = self.sampler.take(self.cfg.tasks_per_iteration)
        requests = [
            EpisodeRequest(
                episode_id=f"it{k}-g{g}-s{j}",
                group_id=f"it{k}-g{g}",
                task=task,
                seed=self.cfg.seed * 1_000_003 + k * 10_007 + g * 101 + j,
                iteration=k,
            )
            for g, task in enumerate(tasks)
            for j in range(self.cfg.samples_per_task)
        ]
        runner_cfg = RunnerConfig(run_id=self.run_id, sampling=self.sampling, judge_enabled=self.judge is not None)
        trajs = await self._collect(f"iteration {k + 1}/{self.cfg.iterations}", requests, runner_cfg)
        t_rollout = time.perf_counter() - t0
        adv_stats = assign_advantages(trajs, self.reward_cfg)
        self.writer.steps(trajs)
        self.writer.flush()  # on disk before training: a trainer crash loses nothing collected
        samples = step_samples(trajs)
        t1 = time.perf_counter()
        train_metrics = await asyncio.to_thread(self.trainer.train_step, samples) if samples else {}
        update = WeightUpdate(version=self.trainer.version, state_dict=self.trainer.state_dict())
        await self.policy.update_weights(update)
        t_train = time.perf_counter() - t1
        ok = [t for t in trajs if t.status == EpisodeStatus.OK]
        scores = [s.judge.score for t in ok for s in t.steps if s.judge is not None]
        n_steps = self.env_steps - steps_before
        row = {
            "kind": "train",
            "iteration": k,
            "episodes": len(trajs),
            "episodes_ok": len(ok),
            "episodes_aborted": sum(t.status == EpisodeStatus.ABORTED for t in trajs),
            "episodes_failed": sum(t.status == EpisodeStatus.FAILED for t in trajs),
            "mean_outcome": sum(t.outcome or 0 for t in ok) / len(ok) if ok else 0.0,
            "accuracy": sum((t.outcome or 0) > 0 for t in ok) / len(ok) if ok else 0.0,
            "mean_step_score": sum(scores) / len(scores) if scores else 0.0,
            "mean_steps": sum(len(t.steps) for t in ok) / len(ok) if ok else 0.0,
            "env_steps": n_steps,
            "steps_per_s": n_steps / t_rollout if t_rollout > 0 else 0.0,
            "samples": len(samples),
            "dropped_step_fraction": adv_stats.dropped_step_fraction,
            "dropped_buckets": adv_stats.dropped_buckets,
            "buckets": adv_stats.buckets,
            "weight_version": self.trainer.version,
            "rollout_s": t_rollout,
            "train_s": t_train,
            **{f"train/{k_}": v for k_, v in train_metrics.items()},
            **self.farm_metrics(),
        }
        self.writer.metric(row)
        self.writer.flush()
        return row

    async def run(self) -> RunSummary:
        t0 = time.perf_counter()
        before = await self.evaluate(0)
        rows = []
        for k in range(self.cfg.iterations):
            rows.append(await self.iteration(k))
            if self.cfg.eval_every and (k + 1) % self.cfg.eval_every == 0 and k + 1 < self.cfg.iterations:
                await self.evaluate(k + 1)
        after = await self.evaluate(self.cfg.iterations) if self.cfg.iterations else before
        wall = time.perf_counter() - t0
        rollout_time = sum(r["rollout_s"] for r in rows)
        steps = sum(r["env_steps"] for r in rows)
        scores = [r["mean_step_score"] for r in rows]
        return RunSummary(
            iterations=len(rows),
            mean_outcome_first=rows[0]["mean_outcome"] if rows else 0.0,
            mean_outcome_last=rows[-1]["mean_outcome"] if rows else 0.0,
            mean_step_score=sum(scores) / len(scores) if scores else 0.0,
            eval_before=before,
            eval_after=after,
            env_steps=steps,
            steps_per_s=steps / rollout_time if rollout_time > 0 else 0.0,
            wall_s=wall,
            aborted_episodes=self.aborted,
            metrics=rows,
            farm=self.farm_metrics(),
        )


def _takes_four_args(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind("phase", 0, 0, "note")
        return True
    except (TypeError, ValueError):
        return False


def _final_attempts(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The last attempt of every episode (retries of an aborted episode replace it)."""
    last: dict[str, Trajectory] = {}
    for t in trajs:
        base = t.episode_id.split("#retry")[0]
        if base not in last or t.attempt >= last[base].attempt:
            last[base] = t
    return list(last.values())
