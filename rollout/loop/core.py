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

Commits (rollout/state/checkpoint.py): after eval 0, after every `run.checkpoint_every`-th iteration and after the last
one, the trainer, the RNG states and the run state (rollout/state/run_state.py) are written; a loop given a
`ResumePoint` starts after the last commit (evaluations it covers are kept, the task sampler replays to its position,
the books continue) and first sends the checkpoint's weights to the policy through the weight sync. A trainer exception
(or repeated weight-sync failures) stops the loop cleanly: the trainer is checkpointed as far as it can be, a
`kind: error` metrics line is written, and `TrainingFailed` is raised (the launcher exits non-zero); everything
collected is already on disk.
"""


from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prm.judge import Judge
from rollout.episodes.collect import collect
from rollout.episodes.pool import RunnerPool
from rollout.episodes.runner import EpisodeRequest, RunnerConfig
from rollout.farm.core import EnvFarm, MixFarm
from rollout.judge_metrics import JudgeTally
from rollout.loop.config import LoopConfig, TrainingFailed
from rollout.loop.records import (FAMILY_FARM_KEYS, EvalResult, ResumePoint, RolloutBatch, RunSummary,
                                  add_advantage_stats, eval_figures, family_summary)
from rollout.loop.sampling import FamilySampler
from rollout.loop.scores import family_teacher, put_scores
from rollout.loop.writer import RunWriter
from rollout.metrics import (accuracy, directive_metrics, episode_stats, family_keys, family_values,
                             final_attempts, mean_outcome, prompt_metrics, prompt_totals)
from rollout.mix import LoopFamily, staleness_bounds
from rollout.policy.base import Policy, SamplingParams
from rollout.policy.parity import WeightParityError, mismatch_metrics
from rollout.screenshots import ScreenshotWriter
from rollout.state.checkpoint import Checkpointer
from rollout.state.run_state import RunState
from rollout.teacher import teacher_logprobs
from rollout.weight_sync import WeightSync, WeightSyncConfig
from train.backends import Trainer
from train.batch import AdvantageStats, RewardConfig, score_trajectories
from train.records import EpisodeStatus, TrainSample, Trajectory
from train.sample_layout import build_samples
from train.staleness import StalenessReport, filter_stale
from train.timeline import Timeline


log = logging.getLogger(__name__)


ProgressHook = Callable[..., None]  # (phase, done, total[, note]): LiveProgress.update or any 3-argument callable

FARM_NOTE_EVERY_S = 1.0  # how often the progress note with the farm's live metrics is refreshed during a phase


class RLLoop:
    def __init__(
        self,
        *,
        farm: EnvFarm | MixFarm | RunnerPool,
        policy: Policy,
        judge: Judge | None,
        trainer: Trainer,
        reward_cfg: RewardConfig,
        loop_cfg: LoopConfig,
        sampling: SamplingParams,
        run_id: str,
        writer: RunWriter,
        train_tasks: Sequence[dict[str, Any]] = (),
        eval_tasks: Sequence[dict[str, Any]] = (),
        families: Sequence[LoopFamily] | None = None,
        progress: ProgressHook | None = None,
        timeline: Timeline | None = None,
        checkpointer: Checkpointer | None = None,
        resume: ResumePoint | None = None,
    ):
        """`families`: each env family's tasks, weight and sampling (rollout.mix); without it, one family of
        `train_tasks` / `eval_tasks` named after the farm's env."""
        self.farm, self.policy, self.judge, self.trainer = farm, policy, judge, trainer
        self.reward_cfg, self.cfg, self.sampling = reward_cfg, loop_cfg, sampling
        self.run_id = run_id
        if families is None:
            families = [LoopFamily(getattr(farm, "env_name", "env"), train_tasks, eval_tasks)]
        self.families = list(families)
        self.mixed = len(self.families) > 1
        self.sampler = FamilySampler(self.families, loop_cfg.seed)
        self.tasks_digest = self.sampler.digest()
        self.eval_tasks = {f.name: list(f.eval_tasks)[: loop_cfg.eval_tasks] for f in self.families
                           if loop_cfg.eval_untrained or f.weight > 0}
        self.bounds = staleness_bounds(loop_cfg.max_staleness, [f.name for f in self.families])
        self.max_bound = max(self.bounds.values())
        self.family_sampling = {f.name: SamplingParams(**{**asdict(sampling), **f.sampling})
                                for f in self.families if f.sampling}
        self._consumed = 0  # batches trained (and synced) so far (a resumed run: from its commit)
        self._trained = asyncio.Condition()
        self._family_rows: dict[str, list[dict[str, Any]]] = {f.name: [] for f in self.families}
        self.writer = writer
        self.progress = progress or (lambda phase, done, total: None)
        self._progress_takes_note = _takes_four_args(self.progress)
        self.env_steps = 0
        self.aborted = 0
        # "rollout": a training batch is being collected; "train": the trainer trains or syncs weights
        self.timeline = timeline or Timeline()
        # held while the trainer updates its weights; the teacher's log-probs (directive modes) wait for it, so an
        # overlapped rollout never reads weights that are being changed
        self._trainer_lock = asyncio.Lock()
        weights_dir = loop_cfg.weights_dir or str(Path(writer.out_dir) / "weights")
        self.weight_sync = WeightSync(
            policy, trainer, WeightSyncConfig(loop_cfg.weight_sync, weights_dir, loop_cfg.keep_weight_versions),
            temperature=sampling.temperature, trainer_lock=self._trainer_lock,
        )
        self.books = StalenessReport(bound=self.max_bound, trainer_version=0)  # run totals
        self._sync_failures = 0
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
        self.trace_requests = loop_cfg.trace_requests
        self.gc_threshold = loop_cfg.gc_threshold

    def _start_from(self, resume: ResumePoint) -> int:
        """Continue after `resume`'s commit; returns the attempt number (the run's resumes so far)."""
        st = resume.state
        if st.tasks_digest and st.tasks_digest != self.tasks_digest:
            raise ValueError("the training tasks differ from those the run drew from (their ids or order changed): "
                             "resume with the same task set, or start a new run")
        self.start_iteration = st.iterations_done
        self.sampler.skip(st.sampler_position, self.cfg.tasks_per_iteration)
        self._consumed = st.iterations_done
        self._evals_done = {j: r for j, r in resume.evals.items() if j in st.evals_done}
        self._previous_rows = list(resume.train_rows)
        for row in self._previous_rows:  # each family's figures of the kept iterations, for the run summary
            for fam, values in family_values(row).items():
                if "env_steps" in values:  # a family trained that iteration (not only its farm's figures)
                    self._family_rows.setdefault(fam, []).append({"iteration": row.get("iteration"), **values})
        b = self.books
        b.produced, b.trained, b.dropped_stale, b.dropped_future = st.produced, st.trained, st.dropped_stale, st.dropped_future
        b.staleness.update({int(k): v for k, v in st.staleness.items()})
        self.aborted = self._aborted_before = st.aborted_episodes
        self._sync_failures = st.sync_failures
        return st.resumes

    def farm_metrics(self) -> dict[str, Any]:
        """The farm's metrics as flat `farm/*` keys (a mixed farm: its families added up), and each family's farm
        as `family/<family>/farm/*` (its slots, live envs, steps/s, errors, timeouts, restarts, aborted)."""
        out = self.farm.metrics().as_dict()
        for fam, m in self.farm.family_metrics().items():
            d = m.as_dict(prefix="farm/")
            out.update(family_keys(fam, {f"farm/{k}": d[f"farm/{k}"] for k in FAMILY_FARM_KEYS}))
        return out

    def _report(self, phase: str, done: int, total: int, by_family: dict[str, list[int]] | None = None,
                judged: JudgeTally | None = None) -> None:
        """Progress with the farm's live line (envs, in flight, steps/s, restarts, aborted) and the judge's (agreement,
        invalid votes, latency, tokens) when the hook takes a note; in a mix, each family's episodes done / asked first."""
        if self._progress_takes_note:
            note = self.farm.metrics().brief()
            if by_family and self.mixed:
                note = " ".join(f"{f} {d}/{n}" for f, (d, n) in by_family.items() if n) + " | " + note
            if judged is not None and judged.steps:
                note = f"{note} | {judged.brief()}"
            self.progress(phase, done, total, note)
        else:
            self.progress(phase, done, total)

    async def _collect(self, phase: str, requests: list[EpisodeRequest], runner_cfg: RunnerConfig,
                       k: int | None = None) -> tuple[list[Trajectory], dict[str, float]]:
        """Run `requests`; each family's start once its staleness bound allows (training batch `k`), the families
        side by side. Returns the trajectories and, per family, the seconds until its last episode ended."""
        t0 = time.perf_counter()
        by_family: dict[str, list[EpisodeRequest]] = {}
        for r in requests:
            by_family.setdefault(r.family or "", []).append(r)
        counts = {f: [0, len(rs)] for f, rs in by_family.items()}
        ended: dict[str, float] = {}
        done = 0
        total = len(requests)
        judged = JudgeTally()  # this phase's judged steps so far, for the progress line
        self._report(phase, 0, total, counts, judged)

        async def refresh() -> None:  # keeps the farm line live while long episodes run
            while True:
                await asyncio.sleep(FARM_NOTE_EVERY_S)
                self._report(phase, done, total, counts, judged)

        def on_episode(traj: Trajectory) -> None:
            nonlocal done
            self.writer.episode(traj)
            self.env_steps += len(traj.steps)
            ended[traj.family] = time.perf_counter() - t0
            judged.add_trajectories([traj])
            if traj.status == EpisodeStatus.ABORTED:
                self.aborted += 1
                self._aborted_at[(traj.split, traj.iteration)] += 1
                log.warning("episode %s (%s) aborted: %s", traj.episode_id, traj.family,
                            traj.reason.strip().splitlines()[-1:])
            else:
                done += 1
                counts[traj.family][0] += 1
                self._report(phase, done, total, counts, judged)

        async def family(name: str, reqs: list[EpisodeRequest]) -> list[Trajectory]:
            if k is not None and self.bounds.get(name, self.max_bound) < self.max_bound:
                await self._wait_trained(k - self.bounds[name])  # this family's tighter staleness bound
            if isinstance(self.farm, RunnerPool):  # loop.runners > 1: the episodes run in the runner actors
                return await self.farm.collect(reqs, runner_cfg, max_retries=self.cfg.max_retries, on_episode=on_episode)
            return await collect(self.farm, self.policy, self.judge, reqs, runner_cfg,
                                 max_retries=self.cfg.max_retries, on_episode=on_episode)

        ticker = asyncio.ensure_future(refresh())
        try:
            parts = await asyncio.gather(*(family(f, rs) for f, rs in by_family.items()))
        finally:
            ticker.cancel()
        return [t for part in parts for t in part], ended

    async def _wait_trained(self, batches: int) -> None:
        """Until `batches` batches are trained and their weights synced."""
        async with self._trained:
            await self._trained.wait_for(lambda: self._consumed >= batches)

    async def _mark_trained(self) -> None:
        self._consumed += 1
        async with self._trained:
            self._trained.notify_all()

    def _runner_config(self, sampling: SamplingParams, judge: bool, greedy: bool | None = None) -> RunnerConfig:
        """The runner's settings: `sampling` for every family, or a family's own budgets (env.families.<f>.sampling)."""
        def adjust(p: SamplingParams) -> SamplingParams:
            return p if greedy is None else dataclasses.replace(p, greedy=greedy)

        return RunnerConfig(run_id=self.run_id, sampling=adjust(sampling), judge_enabled=judge,
                            family_sampling={f: adjust(p) for f, p in self.family_sampling.items()},
                            screenshots=self.screenshots, trace_requests=self.trace_requests,
                            gc_threshold=self.gc_threshold)

    async def evaluate(self, iteration: int) -> EvalResult | None:
        """Every family's held-out tasks (up to loop.eval_tasks each) at `iteration`: the run's figures and each
        family's (or the evaluation a resumed run kept from before)."""
        if not any(self.eval_tasks.values()):
            return None
        if iteration in self._evals_done:
            log.info("eval @ iteration %d: kept from before the resume", iteration)
            return self._evals_done[iteration]
        t0 = time.perf_counter()
        runner_cfg = self._runner_config(self.sampling, self.cfg.eval_judge, greedy=self.cfg.eval_greedy)
        n = max(1, self.cfg.eval_samples)
        requests = []
        for fam, tasks in self.eval_tasks.items():
            tag = f"-{fam}" if self.mixed else ""
            requests += [
                EpisodeRequest(f"eval{iteration}{tag}-{i}" + (f"-s{j}" if n > 1 else ""), f"eval{iteration}{tag}-{i}",
                               t, seed=self.cfg.seed + i * n + j, split="eval", iteration=iteration, family=fam)
                for i, t in enumerate(tasks)
                for j in range(n)
            ]
        trajs, _ = await self._collect(f"eval @ iteration {iteration}", requests, runner_cfg)
        self.writer.steps(trajs, eval_split=True)
        final = final_attempts(trajs)
        res = EvalResult(
            iteration=iteration,
            accuracy=accuracy(final),
            mean_outcome=mean_outcome(final),
            episodes=len(final),
            aborted=sum(t.status == EpisodeStatus.ABORTED for t in final),
            wall_s=time.perf_counter() - t0,
            families={fam: eval_figures([t for t in final if t.family == fam]) for fam, tasks in self.eval_tasks.items()
                      if tasks},
            prompts=prompt_metrics(trajs),
        )
        judged = JudgeTally().add_trajectories(trajs).as_metrics() if self.cfg.eval_judge else {}
        self.writer.metric({"kind": "eval", **res.row(), **judged, **self.farm_metrics()})
        self.writer.flush()
        self._evals_done[iteration] = res
        return res

    # ----- the two halves of an iteration -----
    async def _rollout(self, k: int) -> RolloutBatch:
        """Collect iteration k's groups, score them, write their steps (before any training), build the samples."""
        t0 = time.perf_counter()
        version = self.policy.weight_version
        self._draw_positions[k] = self.sampler.position
        groups = self.sampler.take(self.cfg.tasks_per_iteration)
        requests = [
            EpisodeRequest(
                episode_id=f"it{k}-g{g}-s{j}",
                group_id=f"it{k}-g{g}",
                task=task,
                seed=self.cfg.seed * 1_000_003 + k * 10_007 + g * 101 + j,
                iteration=k,
                family=fam,
            )
            for g, (fam, task) in enumerate(groups)
            for j in range(self.cfg.samples_per_task)
        ]
        runner_cfg = self._runner_config(self.sampling, self.judge is not None)
        with self.timeline.span("rollout"):
            trajs, family_s = await self._collect(f"iteration {k + 1}/{self.cfg.iterations}", requests, runner_cfg, k)
        rollout_s = time.perf_counter() - t0
        teacher = None
        if self.reward_cfg.directive:
            teacher = await teacher_logprobs(trajs, self.policy, self.trainer, self.reward_cfg.teacher,
                                             self._trainer_lock,
                                             self.reward_cfg.topk if self.reward_cfg.topk_signal else None)
        # scored family by family: groups never mix families, so the advantages are those of one call, and each
        # family's dropped buckets are its own
        family_adv: dict[str, AdvantageStats] = {}
        for fam in dict.fromkeys(f for f, _ in groups):
            index = [i for i, t in enumerate(trajs) if t.family == fam]
            part = [trajs[i] for i in index]
            part_teacher = family_teacher(teacher, index) if teacher else None
            scores = score_trajectories(part, self.reward_cfg, part_teacher.logprobs if part_teacher else None)
            put_scores(part, scores, part_teacher)
            family_adv[fam] = scores.stats
        self.writer.steps(trajs)
        self.writer.flush()  # on disk before training: a trainer crash loses nothing collected
        samples, layout = build_samples(trajs, self.cfg.sample_layout, distill_clamp=self.reward_cfg.topk_clamp,
                                        distill_divergence=self.reward_cfg.topk_divergence)
        if layout.fallback_trajectories:
            log.info("iteration %d: %d of %d trajectories re-rendered their history differently: per-step samples",
                     k, layout.fallback_trajectories, layout.trajectories)
        counted: dict[str, int] = {}
        for fam, _ in groups:
            counted[fam] = counted.get(fam, 0) + 1
        return RolloutBatch(k, trajs, samples, layout, add_advantage_stats(family_adv.values()),
                            sum(len(t.steps) for t in trajs), rollout_s, version,
                            family_of={r.group_id: r.family for r in requests}, family_advantages=family_adv,
                            family_s=family_s, family_groups=counted, teacher=teacher)

    async def _train(self, batch: RolloutBatch, wait_s: float = 0.0) -> dict[str, Any]:
        """Drop stale samples, train, sync the new weights to the policy, write the iteration's metrics row."""
        k = batch.iteration
        kept, books, family_books = self._filter_stale(batch)
        if books.dropped_stale or books.dropped_future:
            log.warning("iteration %d: dropped %d stale and %d future-versioned of %d samples (trainer v%d, bounds %s)",
                        k, books.dropped_stale, books.dropped_future, books.produced, self.trainer.version,
                        self.cfg.max_staleness)
        self._add_books(books)
        t1 = self.timeline.clock()
        sync = None
        with self.timeline.span("train"):
            try:
                async with self._trainer_lock:
                    mismatch = await asyncio.to_thread(self._mismatch, kept)
                    train_metrics = await asyncio.to_thread(self.trainer.train_step, kept) if kept else {}
            except Exception as exc:
                raise await self._fail("trainer", k, exc) from exc
            try:
                if self.policy.weight_version != self.trainer.version:  # no update (empty batch): nothing to send
                    sync = await self.weight_sync.push()
                sync_state = sync.mode if sync else "unchanged"
                self._sync_failures = 0
            except WeightParityError as exc:  # the servers do not serve the trainer's weights: stop now
                raise await self._fail("weight sync parity", k, exc) from exc
            except Exception as exc:
                sync_state = "failed"
                self._sync_failures += 1
                log.error("weight sync of v%d failed (%d in a row; the policy keeps v%d): %s: %s", self.trainer.version,
                          self._sync_failures, self.policy.weight_version, type(exc).__name__, exc)
                if self._sync_failures > self.cfg.max_sync_failures:
                    raise await self._fail("weight sync", k, exc) from exc
        t_train = self.timeline.clock() - t1
        overlap = self.timeline.overlap("rollout", "train", since=t1)
        row = {
            "kind": "train",
            "iteration": k,
            **episode_stats(batch.trajs),  # one definition with the eval rows and the families': rollout/metrics.py
            **prompt_metrics(batch.trajs),  # policy/truncated_prompts, policy/longest_prompt_tokens
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
            **(sync.parity.metrics() if sync and sync.parity else {}),  # weight_sync/parity_*
            **mismatch,  # logprobs/*: the rollout's log-probs against the trainer's, on the sampled tokens
            **books.as_metrics(),
            **batch.layout.as_metrics(),
            **(directive_metrics(batch.trajs) if self.reward_cfg.directive else {}),
            **(batch.teacher.metrics() if batch.teacher else {}),
            **JudgeTally().add_trajectories(batch.trajs).as_metrics(),
            **{f"train/{k_}": v for k_, v in train_metrics.items()},
            **self._family_train_figures(batch, family_books),
            **self.farm_metrics(),
        }
        self.writer.metric(row)
        self.writer.flush()
        return row

    def _mismatch(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """The trainer's log-probs before the update against the rollout's (loop.logprob_mismatch), on the samples
        the trainer's current weights produced (older ones differ by the updates since, not by the engine)."""
        current = [s for s in samples if s.weight_version == self.trainer.version]
        if not current or not self.cfg.logprob_mismatch:
            return {}
        try:
            return mismatch_metrics(current, self.trainer.compute_logprobs(current))
        except NotImplementedError:
            return {}

    def _filter_stale(self, batch: RolloutBatch) -> tuple[list[TrainSample], StalenessReport, dict[str, StalenessReport]]:
        """Each family's samples within its own staleness bound; the kept samples and the books, overall and per
        family."""
        by_family: dict[str, list[TrainSample]] = {}
        for smp in batch.samples:
            by_family.setdefault(batch.family_of.get(smp.group_id, ""), []).append(smp)
        kept: list[TrainSample] = []
        books = StalenessReport(bound=self.max_bound, trainer_version=self.trainer.version)
        family_books = {}
        for fam, samples in by_family.items():
            part, report = filter_stale(samples, self.trainer.version, self.bounds.get(fam, self.max_bound))
            kept += part
            family_books[fam] = report
            for name in ("produced", "trained", "dropped_stale", "dropped_future"):
                setattr(books, name, getattr(books, name) + getattr(report, name))
            books.staleness.update(report.staleness)
        return kept, books, family_books

    def _family_train_figures(self, batch: RolloutBatch, books: dict[str, StalenessReport]) -> dict[str, Any]:
        """Each family's figures of one training batch, as `family/<family>/<key>` (rollout/metrics.py)."""
        out: dict[str, Any] = {}
        for fam, groups in batch.family_groups.items():
            trajs = [t for t in batch.trajs if t.family == fam]
            stats = episode_stats(trajs)
            adv = batch.family_advantages.get(fam)
            seconds = batch.family_s.get(fam, batch.rollout_s)
            report = books.get(fam)
            values = {
                "groups": groups,
                **stats,
                "steps_per_s": stats["env_steps"] / seconds if seconds > 0 else 0.0,
                "rollout_s": seconds,
                "dropped_buckets": adv.dropped_buckets if adv else 0,
                "buckets": adv.buckets if adv else 0,
                "dropped_step_fraction": adv.dropped_step_fraction if adv else 0.0,
                "samples": report.trained if report else 0,
                "dropped_stale": report.dropped_stale if report else 0,
                "max_staleness": self.bounds.get(fam, self.max_bound),
            }
            self._family_rows.setdefault(fam, []).append({"iteration": batch.iteration, **values})
            out.update(family_keys(fam, values))
        return out

    async def iteration(self, k: int) -> dict[str, Any]:
        """One synchronous iteration: rollout k, then train on it."""
        row = await self._train(await self._rollout(k))
        await self._mark_trained()
        return row

    # ----- schedules -----
    async def _run_synchronous(self) -> list[dict[str, Any]]:
        rows = []
        for k in range(self.start_iteration, self.cfg.iterations):
            rows.append(await self.iteration(k))
            await self._maybe_evaluate(k)
            await self._commit_iteration(k + 1)
        return rows

    async def _run_overlapped(self) -> list[dict[str, Any]]:
        """The producer collects batch k once batch k-S-1 is trained and synced (S: the loosest family bound; a
        family with a tighter bound starts its part of batch k later, in _collect); the trainer takes batches in
        order."""
        n, bound = self.cfg.iterations, self.max_bound
        queue: asyncio.Queue[RolloutBatch] = asyncio.Queue()

        async def produce() -> None:
            for k in range(self.start_iteration, n):
                await self._wait_trained(k - bound)
                await queue.put(await self._rollout(k))

        producer = asyncio.create_task(produce(), name="rollout-producer")
        rows = []
        try:
            for k in range(self.start_iteration, n):
                t_wait = time.perf_counter()
                batch = await _next_batch(queue, producer)
                rows.append(await self._train(batch, wait_s=time.perf_counter() - t_wait))
                await self._mark_trained()
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

    # ----- commits (rollout/state/checkpoint.py) -----
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
        else:
            try:  # servers: they serve the trainer's starting weights (the parity check of every later sync)
                await self.weight_sync.check_parity()
            except WeightParityError as exc:
                raise await self._fail("weight sync parity", self.start_iteration, exc) from exc
        before = await self.evaluate(0)
        await self._commit_eval(0)
        t_train0 = self.timeline.clock()
        if self.max_bound == 0:
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
            families={f.name: family_summary(self._family_rows.get(f.name, []), before, after, f.name)
                      for f in self.families},
            prompts=prompt_totals([*rows, *(e.row() for e in self._evals_done.values())]),
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
