"""One episode: observe -> policy -> env.step -> judge (async) -> Step record.

The runner owns the conversation (messages), the episode's status, and the judge calls; the farm owns the env.
Env failures abort the episode (recorded with the reason); policy or judge failures mark it failed. Nothing raises out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from envs.seeding import derive_seed
from prm.client.timing import phases
from prm.judge import Judge, Judgement, StepContext
from rollout.episodes.gc_pacing import DEFAULT_THRESHOLD0, paced_gc
from rollout.farm.core import EnvError, EnvFarm
from rollout.policy.base import Message, Policy, SamplingParams, generate
from rollout.screenshots import ScreenshotWriter
from train.records import EpisodeStatus, Step, Trajectory

log = logging.getLogger(__name__)


@dataclass
class EpisodeRequest:
    episode_id: str
    group_id: str
    task: dict[str, Any]
    seed: int | None = None
    split: str = "train"
    iteration: int = 0
    attempt: int = 0
    family: str | None = None  # the env family (routes the episode to that family's farm; None: a one-env farm)


@dataclass
class RunnerConfig:
    run_id: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    judge_enabled: bool = True  # evaluation runs without the judge unless asked
    max_turns: int = 64  # a safety net above the env's own step limit
    family_sampling: dict[str, SamplingParams] = field(default_factory=dict)  # a family's own budgets (env=mix)
    screenshots: ScreenshotWriter | None = None  # GUI: keep each step's screen as a PNG (loop.save_screenshots)
    # each policy and judge request's phases (connection wait, server, read: prm/client/timing.py) in Step.timing
    trace_requests: bool = False
    # Python's generation-0 GC threshold while episodes run (rollout/episodes/gc_pacing.py); 0: the interpreter's own
    gc_threshold: int = DEFAULT_THRESHOLD0

    def sampling_for(self, family: str | None) -> SamplingParams:
        return self.family_sampling.get(family or "", self.sampling)


async def run_episode(
    farm: EnvFarm,
    policy: Policy,
    judge: Judge | None,
    req: EpisodeRequest,
    cfg: RunnerConfig,
) -> Trajectory:
    """Play one episode. Its env slot is given back as soon as the env is done, before the episode waits for the rest
    of its judgements, so another episode can use the slot while the judge works."""
    with paced_gc(cfg.gc_threshold):
        return await _run_episode(farm, policy, judge, req, cfg)


async def _run_episode(farm: EnvFarm, policy: Policy, judge: Judge | None, req: EpisodeRequest,
                       cfg: RunnerConfig) -> Trajectory:
    traj = Trajectory(
        run_id=cfg.run_id,
        episode_id=req.episode_id,
        group_id=req.group_id,
        task_id=str(req.task.get("id")),
        attempt=req.attempt,
        split=req.split,
        iteration=req.iteration,
        family=req.family or "",
    )
    t0 = time.perf_counter()
    judgements: list[asyncio.Task[tuple[Judgement, dict[str, float]]] | None] = []
    saves: list[tuple[Step | Trajectory, asyncio.Task[bool]]] = []  # screenshots being written
    try:
        async with farm.lease() as slot:
            traj.timing["lease_wait_s"] = time.perf_counter() - t0
            traj.move(EpisodeStatus.RUNNING)
            await _play(farm, slot, policy, judge, req, cfg, traj, judgements, saves)
        t_env_done = time.perf_counter()
        await _collect_judgements(traj, judgements)
        traj.timing["judge_wait_s"] = time.perf_counter() - t_env_done  # the slot was already given back
        traj.move(EpisodeStatus.OK)
    except EnvError as exc:
        _cancel(judgements)
        traj.move(EpisodeStatus.ABORTED, exc.reason)
    except asyncio.CancelledError:
        _cancel(judgements)
        _cancel([task for _, task in saves])
        if traj.status not in (EpisodeStatus.OK, EpisodeStatus.FAILED, EpisodeStatus.ABORTED):
            traj.move(EpisodeStatus.ABORTED, "cancelled")
        raise
    except Exception:
        _cancel(judgements)
        status = EpisodeStatus.FAILED if traj.status == EpisodeStatus.RUNNING else EpisodeStatus.ABORTED
        traj.move(status, traceback.format_exc())
        log.warning("episode %s %s:\n%s", traj.episode_id, status.value, traj.reason)
    finally:
        policy.end_session(traj.episode_id)
    await _settle_screenshots(saves)
    traj.wall_s = time.perf_counter() - t0
    return traj


async def _play(
    farm: EnvFarm,
    slot: int,
    policy: Policy,
    judge: Judge | None,
    req: EpisodeRequest,
    cfg: RunnerConfig,
    traj: Trajectory,
    judgements: list[asyncio.Task[Judgement] | None],
    saves: list[tuple[Step | Trajectory, asyncio.Task[bool]]],
) -> None:
    t_reset = time.perf_counter()
    first = await farm.reset(slot, req.task, req.seed)
    traj.timing["reset_s"] = time.perf_counter() - t_reset
    family = first.info.get("family", "generic")  # the judge template's
    traj.family = req.family or family  # a mix's family name (its figures, its farm); else the env's
    shots = cfg.screenshots
    if shots is not None:
        _keep_screenshot(saves, traj, shots.start(first.obs.get("image"), traj.episode_id, "initial"))
    messages: list[Message] = []
    if first.info.get("system_prompt"):
        messages.append({"role": "system", "content": first.info["system_prompt"]})
    messages.append(dict(first.obs))
    instruction = first.obs.get("content", "")
    image_before = first.obs.get("image")
    sampling = cfg.sampling_for(req.family)
    for t in range(cfg.max_turns):
        t_turn = time.perf_counter()
        traced = _traced(cfg)
        try:
            completion = await generate(policy, messages, turn_sampling(sampling, req, t), session=traj.episode_id)
        finally:
            traced.close()
        t_policy = time.perf_counter()
        result = await farm.step(slot, completion.text)
        t_env = time.perf_counter()
        step = Step(
            run_id=cfg.run_id,
            episode_id=traj.episode_id,
            group_id=traj.group_id,
            task_id=traj.task_id,
            step_index=t,
            action=completion.text,
            next_state=dict(result.info.get("next_state") or {"role": result.obs["role"], "content": result.obs["content"]}),
            signals=dict(result.info.get("signals", {})),
            status=EpisodeStatus.RUNNING.value,
            weight_version=completion.weight_version,
            prompt_tokens=len(completion.prompt_ids),
            output_tokens=len(completion.output_ids),
            finish_reason=completion.finish_reason,
            prompt_truncated_from=completion.prompt_truncated_from,
            iteration=req.iteration,
            prompt_ids=completion.prompt_ids,
            output_ids=completion.output_ids,
            output_logprobs=completion.output_logprobs,
            family=traj.family,
            context=list(messages),  # what the policy saw (a directive signal's teacher context is built from it)
            vision=completion.vision,
            timing={"policy_s": t_policy - t_turn, "env_s": t_env - t_policy,
                    **{f"policy_{k}": v for k, v in traced.phases.items()}},
        )
        traj.steps.append(step)
        if shots is not None:
            _keep_screenshot(saves, step, shots.start(result.obs.get("image"), traj.episode_id, f"step{t:03d}"))
        if judge is not None and cfg.judge_enabled:
            ctx = StepContext(
                family=family,
                task_id=traj.task_id,
                instruction=instruction,
                history=list(messages),
                action=completion.text,
                next_state=step.next_state,
                signals=step.signals,
                step_index=t,
                image_before=image_before,
                image_after=result.obs.get("image"),
                episode_id=traj.episode_id,
            )
            judgements.append(asyncio.create_task(_timed_score(judge, ctx, cfg)))
        else:
            judgements.append(None)
        messages.append({"role": "assistant", "content": completion.text})
        messages.append(dict(result.obs))
        image_before = result.obs.get("image")
        step.timing["runner_s"] = time.perf_counter() - t_env  # the runner's own code this turn, after the env step
        if result.terminated or result.truncated:
            outcome = result.info.get("outcome")
            traj.outcome = float(outcome if outcome is not None else result.reward)
            step.outcome = traj.outcome
            return
    raise RuntimeError(f"episode reached the runner's safety limit of {cfg.max_turns} turns without the env ending it")


def turn_sampling(sampling: SamplingParams, req: EpisodeRequest, turn: int) -> SamplingParams:
    """The sampling settings of one turn: with a seeded request, the turn's own random stream, a pure function of
    (split, episode seed, turn), so a sample never depends on which other requests the policy batched it with."""
    if req.seed is None:
        return sampling
    return replace(sampling, seed=derive_seed(sampling.seed, req.split, req.seed, turn))


class _Traced:
    """The request phases of the awaits between its creation and close() (prm/client/timing.py), when asked for."""

    def __init__(self, on: bool):
        self.phases: dict[str, float] = {}
        self._token = phases.set(self.phases) if on else None

    def close(self) -> None:
        if self._token is not None:
            phases.reset(self._token)
            self._token = None


_UNTRACED = _Traced(False)


def _traced(cfg: RunnerConfig) -> _Traced:
    return _Traced(True) if cfg.trace_requests else _UNTRACED


async def _timed_score(judge: Judge, ctx: StepContext, cfg: RunnerConfig) -> tuple[Judgement, dict[str, float]]:
    """The judgement, and where its time went: `judge_s` from the step to its verdict (in flight beside the next
    turns), and its requests' phases when traced (a task of its own: its context is its own)."""
    t0 = time.perf_counter()
    traced = _traced(cfg)
    try:
        j = await judge.score(ctx)
    finally:
        traced.close()
    return j, {"judge_s": time.perf_counter() - t0, **{f"judge_{k}": v for k, v in traced.phases.items()}}


async def _collect_judgements(traj: Trajectory,
                              judgements: list[asyncio.Task[tuple[Judgement, dict[str, float]]] | None]) -> None:
    for step, task in zip(traj.steps, judgements):
        if task is None:
            continue
        j, timing = await task
        step.timing.update(timing)
        # a copy the loop owns (the judge may share a cached verdict between steps); its cost fields come along
        step.judge = dataclasses.replace(j, score=float(j.score), votes=list(j.votes), raw=list(j.raw))


def _keep_screenshot(saves: list[tuple[Step | Trajectory, asyncio.Task[bool]]], record: Step | Trajectory,
                     started: tuple[str, asyncio.Task[bool]] | None) -> None:
    if started is not None:
        record.screenshot, task = started
        saves.append((record, task))


async def _settle_screenshots(saves: list[tuple[Step | Trajectory, asyncio.Task[bool]]]) -> None:
    """Wait for the episode's screenshots; a record whose PNG was not written points at none."""
    for record, task in saves:
        try:
            ok = await task
        except asyncio.CancelledError:
            ok = False
        if not ok:
            record.screenshot = None


def _cancel(judgements: list[asyncio.Task[Judgement] | None]) -> None:
    for task in judgements:
        if task is not None and not task.done():
            task.cancel()
