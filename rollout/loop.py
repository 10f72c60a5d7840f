"""The rollout <-> train loop: collect groups of episodes, score and normalize them, train, sync weights, evaluate.

Two schedules, one set of parts (`_rollout(k)` -> RolloutBatch, `_train(batch)` -> metrics row):
- synchronous (`max_staleness=0`): rollout k, train k, sync, rollout k+1 ... (on-policy);
- overlapped (`max_staleness=S>=1`): a producer task collects batch k+1 while the trainer trains on batch k. Batch k
  may start once batch k-S-1 is trained and synced, so its samples come from weights at most S versions behind the
  trainer that learns from them; before training, samples outside [version - S, version] are dropped and counted
  (train/staleness.py), e.g. when a policy server missed a weight update. produced == trained + dropped_stale.

Records go to disk as soon as they exist: every episode to `episodes.jsonl` when it ends (aborted ones included), every
step with its R_t and advantage to `trajectories.jsonl` once its batch is scored (before any training on it), and one
line per iteration / eval to `metrics.jsonl` (with the judge's observability: rollout/judge_metrics.py). GUI screenshots go
to `screenshots/` as PNGs when `save_screenshots` is on (rollout/screenshots.py).

Commits (rollout/checkpoint.py): after eval 0, after every `run.checkpoint_every`-th iteration and after the last one,
the trainer, the RNG states and the run state (rollout/run_state.py) are written; a loop given a `ResumePoint` starts
after the last commit (evaluations it covers are kept, the task sampler replays to its position, the books continue)
and first sends the checkpoint's weights to the policy through the weight sync. A trainer exception (or repeated weight-sync failures) stops the loop
cleanly: the trainer is checkpointed as far as it can be, a `kind: error` metrics line is written, and `TrainingFailed`
is raised (the launcher exits non-zero); everything collected is already on disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prm.judge import Judge
from rollout.checkpoint import Checkpointer
from rollout.collect import collect
from rollout.farm import EnvFarm
from rollout.judge_metrics import JudgeTally
from rollout.loggers import Loggers
from rollout.metrics import accuracy, directive_metrics, final_attempts, mean_outcome
from rollout.policy.base import Policy, SamplingParams
from rollout.records import JsonlWriter
from rollout.run_state import RunState, tasks_digest
from rollout.runner import EpisodeRequest, RunnerConfig
from rollout.screenshots import ScreenshotWriter
from rollout.teacher import TeacherBatch, teacher_logprobs
from rollout.weight_sync import MODES, WeightSync, WeightSyncConfig
from train.backends import Trainer
from train.batch import AdvantageStats, RewardConfig, TrajectoryScores, score_trajectories
from train.opd import gap_summary
from train.records import EpisodeStatus, TrainSample, Trajectory
from train.sample_layout import LAYOUTS, LayoutStats, build_samples
from train.staleness import StalenessReport, filter_stale
from train.timeline import Timeline

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
    max_staleness: int = 1  # 0: synchronous (on-policy); S >= 1: rollouts run ahead of training by up to S versions
    sample_layout: str = "step"  # "step": one sample per step; "trajectory": one per episode with per-step spans
    weight_sync: str = "auto"  # "auto" | "memory" (in-process state dict) | "disk" (export, policy loads the path)
    weights_dir: str | None = None  # disk sync: versioned exports go here; None: <run dir>/weights
    keep_weight_versions: int = 2  # disk sync: exports kept
    max_sync_failures: int = 3  # consecutive failed weight syncs tolerated (the policy keeps older weights meanwhile)
    save_screenshots: bool = True  # GUI: each step's screen as a PNG under <run>/screenshots/ (envs without images: none)

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"loop.max_staleness must be >= 0 (0 = synchronous), got {self.max_staleness}")
        if self.sample_layout not in LAYOUTS:
            raise ValueError(f"loop.sample_layout={self.sample_layout!r}: use one of {', '.join(LAYOUTS)}")
        if self.weight_sync not in MODES:
            raise ValueError(f"loop.weight_sync={self.weight_sync!r}: use one of {', '.join(MODES)}")


class TrainingFailed(RuntimeError):
    """The trainer (or the weight sync) failed; the loop stopped after checkpointing what it could."""

    def __init__(self, stage: str, iteration: int, version: int, cause: BaseException, checkpoint: str | None):
        self.stage, self.iteration, self.version, self.checkpoint = stage, iteration, version, checkpoint
        where = f"checkpoint: {checkpoint}" if checkpoint else "no checkpoint could be written"
        super().__init__(
            f"{stage} failed at iteration {iteration} (trainer at weight version {version}): "
            f"{type(cause).__name__}: {cause}; {where}"
        )


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
    teacher: TeacherBatch | None = None  # directive modes: the teacher's log-probs of the hinted steps


@dataclass
class EvalResult:
    iteration: int
    accuracy: float  # rollout.metrics.accuracy: the fraction of episodes solved (aborted ones count as not solved)
    mean_outcome: float  # rollout.metrics.mean_outcome: over the episodes that ended ok
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
    max_staleness: int = 0
    produced: int = 0  # samples built from scored steps
    trained: int = 0  # samples handed to the trainer
    dropped_stale: int = 0  # samples older than the staleness bound
    dropped_future: int = 0  # samples stamped with a version the trainer never produced (0 unless misconfigured)
    rollout_busy_s: float = 0.0  # wall time during which training rollouts were being collected
    train_busy_s: float = 0.0  # wall time during which the trainer trained or synced weights
    overlap_s: float = 0.0  # wall time during which both happened
    overlap_fraction: float = 0.0  # overlap_s / wall time of the training iterations


class RunWriter:
    """The files of one run directory (and the configured loggers: every metrics row goes to them too)."""

    def __init__(self, out_dir: Path, record_token_ids: bool = False, loggers: Loggers | None = None):
        self.out_dir = out_dir
        self.token_ids = record_token_ids
        self.loggers = loggers or Loggers()
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
        self.loggers.log(row)

    def flush(self) -> None:
        for w in (self.trajectories, self.eval_trajectories, self.episodes, self.metrics):
            w.flush()

    def close(self) -> None:
        for w in (self.trajectories, self.eval_trajectories, self.episodes, self.metrics):
            w.close()
        self.loggers.close()


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


@dataclass
class ResumePoint:
    """Where a resumed loop starts: the last commit's state, and what it covers (for the run summary)."""

    state: RunState
    train_rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl train rows of the kept iterations
    evals: dict[int, EvalResult] = field(default_factory=dict)  # the kept evaluations


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
        timeline: Timeline | None = None,
        checkpointer: Checkpointer | None = None,
        resume: ResumePoint | None = None,
    ):
        self.farm, self.policy, self.judge, self.trainer = farm, policy, judge, trainer
        self.reward_cfg, self.cfg, self.sampling = reward_cfg, loop_cfg, sampling
        self.run_id = run_id
        self.sampler = TaskSampler(train_tasks, loop_cfg.seed)
        self.tasks_digest = tasks_digest(train_tasks)
        self.eval_tasks = list(eval_tasks)[: loop_cfg.eval_tasks]
        self.writer = writer
        self.progress = progress or (lambda phase, done, total: None)
        self._progress_takes_note = _takes_four_args(self.progress)
        self.env_steps = 0
        self.aborted = 0
        # "rollout": a training batch is being collected; "train": the trainer trains or syncs weights
        self.timeline = timeline or Timeline()
        weights_dir = loop_cfg.weights_dir or str(Path(writer.out_dir) / "weights")
        self.weight_sync = WeightSync(
            policy, trainer, WeightSyncConfig(loop_cfg.weight_sync, weights_dir, loop_cfg.keep_weight_versions)
        )
        self.books = StalenessReport(bound=loop_cfg.max_staleness, trainer_version=0)  # run totals
        self._sync_failures = 0
        # held while the trainer updates its weights; the teacher's log-probs (directive modes) wait for it, so an
        # overlapped rollout never reads weights that are being changed
        self._trainer_lock = asyncio.Lock()
        self.checkpointer = checkpointer
        self.resume = resume
        self.start_iteration = 0
        self._evals_done: dict[int, EvalResult] = {}  # evaluation point -> its result (kept ones included)
        self._draw_positions: dict[int, int] = {}  # iteration -> the sampler's position before its tasks were drawn
        self._aborted_at: Counter = Counter()  # (split, iteration) -> aborted attempts in this process
        self._aborted_before = 0  # aborted attempts the resumed-from commit covers
        self._previous_rows: list[dict[str, Any]] = []
        attempt = 0
        if resume is not None:
            attempt = self._start_from(resume)
        self.screenshots = (ScreenshotWriter(Path(writer.out_dir), attempt) if loop_cfg.save_screenshots else None)

    def _start_from(self, resume: ResumePoint) -> int:
        """Continue after `resume`'s commit; returns the attempt number (the run's resumes so far)."""
        st = resume.state
        if st.tasks_digest and st.tasks_digest != self.tasks_digest:
            raise ValueError("the training tasks differ from those the run drew from (their ids or order changed): "
                             "resume with the same task set, or start a new run")
        self.start_iteration = st.iterations_done
        self.sampler.skip(st.sampler_position)
        self._evals_done = {j: r for j, r in resume.evals.items() if j in st.evals_done}
        self._previous_rows = list(resume.train_rows)
        b = self.books
        b.produced, b.trained, b.dropped_stale, b.dropped_future = st.produced, st.trained, st.dropped_stale, st.dropped_future
        b.staleness.update({int(k): v for k, v in st.staleness.items()})
        self.aborted = self._aborted_before = st.aborted_episodes
        self._sync_failures = st.sync_failures
        return st.resumes

    def farm_metrics(self) -> dict[str, Any]:
        """The farm's metrics as flat `farm/*` keys."""
        return self.farm.metrics().as_dict()

    def _report(self, phase: str, done: int, total: int, judged: JudgeTally | None = None) -> None:
        """Progress with the farm's live line (envs, in flight, steps/s, restarts, aborted) and the judge's (agreement,
        invalid votes, latency, tokens) when the hook takes a note."""
        if self._progress_takes_note:
            note = self.farm.metrics().brief()
            if judged is not None and judged.steps:
                note = f"{note} | {judged.brief()}"
            self.progress(phase, done, total, note)
        else:
            self.progress(phase, done, total)

    async def _collect(self, phase: str, requests: list[EpisodeRequest], runner_cfg: RunnerConfig) -> list[Trajectory]:
        done = 0
        total = len(requests)
        judged = JudgeTally()  # this phase's judged steps so far, for the progress line
        self._report(phase, 0, total)

        async def refresh() -> None:  # keeps the farm line live while long episodes run
            while True:
                await asyncio.sleep(FARM_NOTE_EVERY_S)
                self._report(phase, done, total, judged)

        def on_episode(traj: Trajectory) -> None:
            nonlocal done
            self.writer.episode(traj)
            self.env_steps += len(traj.steps)
            judged.add_trajectories([traj])
            if traj.status == EpisodeStatus.ABORTED:
                self.aborted += 1
                self._aborted_at[(traj.split, traj.iteration)] += 1
                log.warning("episode %s aborted: %s", traj.episode_id, traj.reason.strip().splitlines()[-1:])
            else:
                done += 1
                self._report(phase, done, total, judged)

        ticker = asyncio.ensure_future(refresh())
        try:
            return await collect(
                self.farm, self.policy, self.judge, requests, runner_cfg, max_retries=self.cfg.max_retries,
                on_episode=on_episode,
            )
        finally:
            ticker.cancel()

    async def evaluate(self, iteration: int) -> EvalResult | None:
        """Evaluate at `iteration` (or return the evaluation a resumed run kept from before)."""
        if not self.eval_tasks:
            return None
        if iteration in self._evals_done:
            log.info("eval @ iteration %d: kept from before the resume", iteration)
            return self._evals_done[iteration]
        t0 = time.perf_counter()
        sampling = SamplingParams(**{**asdict(self.sampling), "greedy": self.cfg.eval_greedy})
        runner_cfg = RunnerConfig(run_id=self.run_id, sampling=sampling, judge_enabled=self.cfg.eval_judge,
                                  screenshots=self.screenshots)
        n = max(1, self.cfg.eval_samples)
        requests = [
            EpisodeRequest(f"eval{iteration}-{i}" + (f"-s{j}" if n > 1 else ""), f"eval{iteration}-{i}", t,
                           seed=self.cfg.seed + i * n + j, split="eval", iteration=iteration)
            for i, t in enumerate(self.eval_tasks)
            for j in range(n)
        ]
        trajs = await self._collect(f"eval @ iteration {iteration}", requests, runner_cfg)
        self.writer.steps(trajs, eval_split=True)
        final = final_attempts(trajs)
        res = EvalResult(
            iteration=iteration,
            accuracy=accuracy(final),
            mean_outcome=mean_outcome(final),
            episodes=len(final),
            aborted=sum(t.status == EpisodeStatus.ABORTED for t in final),
            wall_s=time.perf_counter() - t0,
        )
        judged = JudgeTally().add_trajectories(trajs).as_metrics() if self.cfg.eval_judge else {}
        self.writer.metric({"kind": "eval", **asdict(res), **judged, **self.farm_metrics()})
        self.writer.flush()
        self._evals_done[iteration] = res
        return res

    # ----- the two halves of an iteration -----
    async def _rollout(self, k: int) -> RolloutBatch:
        """Collect iteration k's groups, score them, write their steps (before any training), build the samples."""
        t0 = time.perf_counter()
        version = self.policy.weight_version
        self._draw_positions[k] = self.sampler.position
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
        runner_cfg = RunnerConfig(run_id=self.run_id, sampling=self.sampling, judge_enabled=self.judge is not None,
                                  screenshots=self.screenshots)
        with self.timeline.span("rollout"):
            trajs = await self._collect(f"iteration {k + 1}/{self.cfg.iterations}", requests, runner_cfg)
        rollout_s = time.perf_counter() - t0
        teacher = None
        if self.reward_cfg.directive:
            teacher = await teacher_logprobs(trajs, self.policy, self.trainer, self.reward_cfg.teacher,
                                             self._trainer_lock)
        scores = score_trajectories(trajs, self.reward_cfg, teacher.logprobs if teacher else None)
        put_scores(trajs, scores, teacher)
        self.writer.steps(trajs)
        self.writer.flush()  # on disk before training: a trainer crash loses nothing collected
        samples, layout = build_samples(trajs, self.cfg.sample_layout)
        if layout.fallback_trajectories:
            log.info("iteration %d: %d of %d trajectories re-rendered their history differently: per-step samples",
                     k, layout.fallback_trajectories, layout.trajectories)
        return RolloutBatch(k, trajs, samples, layout, scores.stats, sum(len(t.steps) for t in trajs), rollout_s, version,
                            teacher)

    async def _train(self, batch: RolloutBatch, wait_s: float = 0.0) -> dict[str, Any]:
        """Drop stale samples, train, sync the new weights to the policy, write the iteration's metrics row."""
        k = batch.iteration
        kept, books = filter_stale(batch.samples, self.trainer.version, self.cfg.max_staleness)
        if books.dropped_stale or books.dropped_future:
            log.warning("iteration %d: dropped %d stale and %d future-versioned of %d samples (trainer v%d, bound %d)",
                        k, books.dropped_stale, books.dropped_future, books.produced, self.trainer.version,
                        self.cfg.max_staleness)
        self._add_books(books)
        t1 = self.timeline.clock()
        sync = None
        with self.timeline.span("train"):
            try:
                async with self._trainer_lock:
                    train_metrics = await asyncio.to_thread(self.trainer.train_step, kept) if kept else {}
            except Exception as exc:
                raise await self._fail("trainer", k, exc) from exc
            try:
                if self.policy.weight_version != self.trainer.version:  # no update (empty batch): nothing to send
                    sync = await self.weight_sync.push()
                sync_state = sync.mode if sync else "unchanged"
                self._sync_failures = 0
            except Exception as exc:
                sync_state = "failed"
                self._sync_failures += 1
                log.error("weight sync of v%d failed (%d in a row; the policy keeps v%d): %s: %s", self.trainer.version,
                          self._sync_failures, self.policy.weight_version, type(exc).__name__, exc)
                if self._sync_failures > self.cfg.max_sync_failures:
                    raise await self._fail("weight sync", k, exc) from exc
        t_train = self.timeline.clock() - t1
        overlap = self.timeline.overlap("rollout", "train", since=t1)
        ok = [t for t in batch.trajs if t.status == EpisodeStatus.OK]
        scores = [s.judge.score for t in ok for s in t.steps if s.judge is not None]
        row = {
            "kind": "train",
            "iteration": k,
            "episodes": len(batch.trajs),
            "episodes_ok": len(ok),
            "episodes_aborted": sum(t.status == EpisodeStatus.ABORTED for t in batch.trajs),
            "episodes_failed": sum(t.status == EpisodeStatus.FAILED for t in batch.trajs),
            "mean_outcome": mean_outcome(batch.trajs),  # one definition with the eval rows: rollout/metrics.py
            "accuracy": accuracy(batch.trajs),
            "mean_step_score": sum(scores) / len(scores) if scores else 0.0,
            "mean_steps": sum(len(t.steps) for t in ok) / len(ok) if ok else 0.0,
            "env_steps": batch.env_steps,
            "steps_per_s": batch.env_steps / batch.rollout_s if batch.rollout_s > 0 else 0.0,
            "samples": len(kept),
            "dropped_step_fraction": batch.advantages.dropped_step_fraction,
            "dropped_buckets": batch.advantages.dropped_buckets,
            "buckets": batch.advantages.buckets,
            "weight_version": self.trainer.version,
            "policy_version": self.policy.weight_version,
            "rollout_policy_version": batch.policy_version_at_start,  # the policy's version when the batch started
            "rollout_s": batch.rollout_s,
            "train_s": t_train,
            "train_wait_s": wait_s,  # the trainer waited this long for the batch
            "rollout_train_overlap_s": overlap,  # rollouts of later batches running while this one trained
            "weight_sync": sync_state,
            "weight_sync_s": sync.seconds if sync else None,
            **books.as_metrics(),
            **batch.layout.as_metrics(),
            **(directive_metrics(batch.trajs) if self.reward_cfg.directive else {}),
            **(batch.teacher.metrics() if batch.teacher else {}),
            **JudgeTally().add_trajectories(batch.trajs).as_metrics(),
            **{f"train/{k_}": v for k_, v in train_metrics.items()},
            **self.farm_metrics(),
        }
        self.writer.metric(row)
        self.writer.flush()
        return row

    async def iteration(self, k: int) -> dict[str, Any]:
        """One synchronous iteration: rollout k, then train on it."""
        return await self._train(await self._rollout(k))

    # ----- schedules -----
    async def _run_synchronous(self) -> list[dict[str, Any]]:
        rows = []
        for k in range(self.start_iteration, self.cfg.iterations):
            rows.append(await self.iteration(k))
            await self._maybe_evaluate(k)
            await self._commit_iteration(k + 1)
        return rows

    async def _run_overlapped(self) -> list[dict[str, Any]]:
        """The producer collects batch k once batch k-S-1 is trained and synced; the trainer takes batches in order."""
        n, bound = self.cfg.iterations, self.cfg.max_staleness
        queue: asyncio.Queue[RolloutBatch] = asyncio.Queue()
        consumed = self.start_iteration
        gate = asyncio.Condition()

        async def produce() -> None:
            for k in range(self.start_iteration, n):
                async with gate:
                    await gate.wait_for(lambda: consumed >= k - bound)
                await queue.put(await self._rollout(k))

        producer = asyncio.create_task(produce(), name="rollout-producer")
        rows = []
        try:
            for k in range(self.start_iteration, n):
                t_wait = time.perf_counter()
                batch = await _next_batch(queue, producer)
                rows.append(await self._train(batch, wait_s=time.perf_counter() - t_wait))
                consumed += 1
                async with gate:
                    gate.notify_all()
                await self._maybe_evaluate(k)
                await self._commit_iteration(k + 1)
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
        return rows

    async def _maybe_evaluate(self, k: int) -> None:
        if self.cfg.eval_every and (k + 1) % self.cfg.eval_every == 0 and k + 1 < self.cfg.iterations:
            await self.evaluate(k + 1)

    # ----- commits (rollout/checkpoint.py) -----
    def _state(self, iterations_done: int) -> RunState:
        """The run state after `iterations_done` iterations (every evaluation up to that point included)."""
        assert self.checkpointer is not None
        b = self.books
        evals = sorted(j for j in self._evals_done if j <= iterations_done)
        return dataclasses.replace(
            self.checkpointer.state,
            iterations_done=iterations_done,
            evals_done=evals,
            sampler_position=self._draw_positions.get(iterations_done, self.sampler.position),
            tasks_digest=self.tasks_digest,
            produced=b.produced, trained=b.trained, dropped_stale=b.dropped_stale, dropped_future=b.dropped_future,
            staleness={str(k): v for k, v in sorted(b.staleness.items())},
            aborted_episodes=self._committed_aborted(iterations_done, evals),
            sync_failures=self._sync_failures,
        )

    def _committed_aborted(self, iterations_done: int, evals: Collection[int]) -> int:
        """Aborted attempts in the iterations before `iterations_done` and the evaluations `evals`."""
        return self._aborted_before + sum(
            n for (split, it), n in self._aborted_at.items()
            if (split == "train" and it < iterations_done) or (split == "eval" and it in evals))

    async def _commit_iteration(self, iterations_done: int) -> None:
        """After iteration `iterations_done - 1` (and its evaluation): a trainer checkpoint when one is due."""
        if self.checkpointer is not None and self.checkpointer.due(iterations_done, self.cfg.iterations):
            await self.checkpointer.commit(self._state(iterations_done), trainer=True)

    async def _commit_eval(self, iteration: int) -> None:
        """An evaluation at the last commit's iteration (0 before training, the end after the last checkpoint) commits
        at once, without a trainer checkpoint: the weights are those of the commit."""
        if self.checkpointer is None or iteration not in self._evals_done:
            return
        committed = self.checkpointer.state
        if iteration == committed.iterations_done and iteration not in committed.evals_done:
            evals = sorted({*committed.evals_done, iteration})
            state = dataclasses.replace(committed, evals_done=evals,
                                        aborted_episodes=self._committed_aborted(committed.iterations_done, evals))
            await self.checkpointer.commit(state, trainer=False)

    async def run(self) -> RunSummary:
        t0 = time.perf_counter()
        if self.resume is not None and (self.resume.state.checkpoint is not None or self.weight_sync.mode == "disk"):
            # the policy gets the checkpoint's weights (servers: through the disk export they load); servers get them
            # even when they are the initial weights: they may still serve a later version the killed attempt sent
            sync = await self.weight_sync.push()
            log.info("resumed at iteration %d: the policy serves the checkpoint's weights v%d (%s)",
                     self.start_iteration, sync.version, sync.mode)
        before = await self.evaluate(0)
        await self._commit_eval(0)
        t_train0 = self.timeline.clock()
        if self.cfg.max_staleness == 0:
            rows = await self._run_synchronous()
        else:
            rows = await self._run_overlapped()
        rows = self._previous_rows + rows
        train_wall = self.timeline.clock() - t_train0
        after = await self.evaluate(self.cfg.iterations) if self.cfg.iterations else before
        if self.cfg.iterations:
            await self._commit_eval(self.cfg.iterations)
        wall = time.perf_counter() - t0
        rollout_time = sum(r["rollout_s"] for r in rows)
        steps = sum(r["env_steps"] for r in rows)
        scores = [r["mean_step_score"] for r in rows]
        overlap = self.timeline.overlap("rollout", "train", since=t_train0)
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
            max_staleness=self.cfg.max_staleness,
            produced=self.books.produced,
            trained=self.books.trained,
            dropped_stale=self.books.dropped_stale,
            dropped_future=self.books.dropped_future,
            rollout_busy_s=self.timeline.busy("rollout", since=t_train0),
            train_busy_s=self.timeline.busy("train", since=t_train0),
            overlap_s=overlap,
            overlap_fraction=overlap / train_wall if train_wall > 0 else 0.0,
        )

    # ----- failure -----
    def _add_books(self, r: StalenessReport) -> None:
        b = self.books
        b.produced += r.produced
        b.trained += r.trained
        b.dropped_stale += r.dropped_stale
        b.dropped_future += r.dropped_future
        b.staleness.update(r.staleness)

    async def _fail(self, stage: str, k: int, exc: BaseException) -> TrainingFailed:
        """Checkpoint what can be saved, write an error row, and return the exception the loop stops with."""
        log.error("%s failed at iteration %d: %s: %s", stage, k, type(exc).__name__, exc)
        checkpoint = await asyncio.to_thread(self._checkpoint, Path(self.writer.out_dir) / "checkpoints")
        failure = TrainingFailed(stage, k, self.trainer.version, exc, checkpoint)
        self.writer.metric({
            "kind": "error", "stage": stage, "iteration": k, "weight_version": self.trainer.version,
            "error": f"{type(exc).__name__}: {exc}", "checkpoint": checkpoint, "message": str(failure),
            "produced": self.books.produced, "trained": self.books.trained, "dropped_stale": self.books.dropped_stale,
        })
        self.writer.flush()
        return failure

    def _checkpoint(self, root: Path) -> str | None:
        """A full trainer checkpoint if the backend has one, else its exported weights; None if neither works."""
        target = root / f"failed-v{self.trainer.version}"
        for what, save in (("checkpoint", self.trainer.save_checkpoint),
                           ("weights", lambda d: self.trainer.export_weights(str(Path(d) / "model")))):
            try:
                save(target)
                log.error("trainer %s saved to %s", what, target)
                return str(target)
            except NotImplementedError:
                continue
            except Exception:
                log.exception("saving the trainer %s to %s failed", what, target)
        return None


async def _next_batch(queue: asyncio.Queue[RolloutBatch], producer: asyncio.Task[None]) -> RolloutBatch:
    """The next produced batch; re-raises the producer's exception if it died before producing it."""
    get = asyncio.ensure_future(queue.get())
    try:
        while not get.done():
            if producer.done() and producer.exception() is not None:
                raise producer.exception()  # type: ignore[misc]
            await asyncio.wait({get, producer} if not producer.done() else {get},
                               return_when=asyncio.FIRST_COMPLETED)
        return get.result()
    finally:
        if not get.done():
            get.cancel()


def _takes_four_args(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind("phase", 0, 0, "note")
        return True
    except (TypeError, ValueError):
        return False


def put_scores(trajs: Sequence[Trajectory], scores: TrajectoryScores, teacher: TeacherBatch | None = None) -> None:
    """Write a batch's R_t and A_t onto the loop's own step records (the runner made them for this loop); in the
    directive modes also each step's token advantages, the rule that gave them, the teacher's log-probs and gap."""
    for i, (tr, rewards, advantages) in enumerate(zip(trajs, scores.rewards, scores.advantages, strict=True)):
        for t, (step, r, a) in enumerate(zip(tr.steps, rewards, advantages, strict=True)):
            step.reward, step.advantage = r, a
            if scores.token_advantages is None or scores.modes is None or scores.gaps is None:
                continue
            step.token_advantages = scores.token_advantages[i][t]
            step.advantage_mode = scores.modes[i][t]
            step.teacher_gap = gap_summary(scores.gaps[i][t])
            if teacher is not None and (i, t) in teacher.logprobs:
                step.teacher_logprobs = teacher.logprobs[(i, t)]
                step.teacher_prompt_ids = teacher.prompt_ids[(i, t)]
