"""One run of the launcher's config: plan and build every component (rollout.build), run the rollout <-> train loop
(rollout.loop), and write `outputs/<run>/` with the resolved `config.yaml`, `trajectories.jsonl`, `episodes.jsonl`,
`metrics.jsonl` and `run_state.json` (its commits: rollout/state/checkpoint.py). Experiments call `run` for each of
their (arm, seed) runs.

`run.resume=<run dir>` continues a run instead (rollout/state/resume.py): its own config, its records after the last
commit set aside under `superseded/`, the trainer and RNG states restored from the checkpoint, the policy sent its
weights, a `kind: resume` row in metrics.jsonl, and the loop started after the commit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from prm.factory import make_judge
from rollout.build import MixSetup, RunPlan, build_farm, build_policy_and_trainer, plan_run, start_judge_servers
from rollout.loggers import make_loggers
from rollout.loop import EvalResult, ResumePoint, RLLoop, RunWriter, TrainingFailed
from rollout.progress import LiveProgress, print_summary
from rollout.stack import software_stack, stack_differences
from rollout.state.checkpoint import CheckpointConfig, Checkpointer
from rollout.state.resume import Resumed, ResumeError, open_resume
from rollout.state.run_state import RunState, atomic_write, write_state
from rollout.weight_sync import remove_versions_after

log = logging.getLogger("nextstate")


def make_loop(plan: RunPlan, *, farm: Any, policy: Any, judge: Any, trainer: Any, writer: RunWriter,
              progress: Any = None, timeline: Any = None, checkpointer: Checkpointer | None = None,
              resume: ResumePoint | None = None) -> RLLoop:
    """The rollout <-> train loop of `plan` on built components."""
    return RLLoop(
        farm=farm, policy=policy, judge=judge, trainer=trainer, reward_cfg=plan.reward, loop_cfg=plan.loop,
        sampling=plan.sampling, run_id=plan.run.name, families=plan.loop_families(), writer=writer, progress=progress,
        timeline=timeline, checkpointer=checkpointer, resume=resume,
    )


FAMILIES_FILE = "families.json"


def with_stack(config: dict[str, Any], stack: dict[str, Any]) -> dict[str, Any]:
    """`config` with the software stack of this start under `stack` (what config.yaml records). A run resumed on
    another stack than its config.yaml's says so and keeps the earlier one as `stack_before_resume`."""
    out = dict(config)
    earlier = config.get("stack")
    if earlier and stack_differences(earlier, stack):
        log.warning("resumed on another software stack than the run started on (its numbers may differ from an "
                    "unbroken run's): %s", "; ".join(stack_differences(earlier, stack)))
        out["stack_before_resume"] = earlier
    out["stack"] = stack
    return out


def describe_families(plan: RunPlan) -> dict[str, Any]:
    """Each family of an env=mix run as it ran: its env and options, weight, sampling overrides, task counts and farm."""
    return {f.family: {"env": f.name, "weight": f.weight, "options": f.kwargs, "sampling": f.sampling,
                       "tasks": f.sources.tasks, "eval_tasks": f.sources.eval_tasks,
                       "train_task_count": len(f.train_tasks), "eval_task_count": len(f.eval_tasks),
                       "farm": dataclasses.asdict(plan.farms[f.family])}
            for f in plan.env.families}


def command_line_overrides() -> list[str]:
    """The overrides the launcher was given (what a resume compares with the run's config)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def resume_point(resumed: Resumed) -> ResumePoint:
    evals = {int(r["iteration"]): EvalResult.from_row(r) for r in resumed.eval_rows}
    return ResumePoint(resumed.state, resumed.train_rows, evals)


async def run(cfg: DictConfig) -> int:
    resumed: Resumed | None = None
    if cfg.run.get("resume"):
        try:
            resumed = open_resume(OmegaConf.to_container(cfg, resolve=True), command_line_overrides())
        except ResumeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        cfg = OmegaConf.create(resumed.config)
        if resumed.finished:
            print(f"run {cfg.run.out_dir} has finished its {resumed.state.iterations_done} iterations: nothing to "
                  "resume (raise loop.iterations to train on)")
            return 0
    out_dir = Path(cfg.run.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = with_stack(OmegaConf.to_container(cfg, resolve=True), software_stack().to_dict())
    config_text = OmegaConf.to_yaml(OmegaConf.create(config))
    atomic_write(out_dir / "config.yaml", config_text.encode())
    plan = plan_run(cfg)
    state = resumed.state if resumed else RunState(run_name=plan.run.name)
    if resumed:
        log.info("resuming %s at iteration %d (trainer v%d); set aside under %s: %s", out_dir, state.iterations_done,
                 state.weight_version, resumed.superseded_dir, resumed.superseded or "nothing")
        remove_versions_after(Path(plan.loop.weights_dir or out_dir / "weights"), state.weight_version)
    log.info("run %s: %s; farm=%s, output %s", plan.run.name, plan.env.describe(), plan.farm.backend, out_dir)
    if isinstance(plan.env, MixSetup):  # what each family ran with, next to config.yaml
        atomic_write(out_dir / FAMILIES_FILE, json.dumps(describe_families(plan), indent=2, default=str).encode())
    loggers, wandb_id = make_loggers(
        plan.run.loggers, out_dir, plan.run.name, config, config_text,
        plan.run.wandb, resume_at=state.iterations_done if resumed else None,
        kept_rows=(resumed.train_rows + resumed.eval_rows) if resumed else (), wandb_id=state.wandb_id)
    state.wandb_id = wandb_id or state.wandb_id
    writer = RunWriter(out_dir, plan.loop.record_token_ids, loggers)
    farm = judge = policy = trainer = None
    judge_servers: list[Any] = []
    with LiveProgress() as progress:
        try:
            policy, trainer, warm_info = build_policy_and_trainer(plan)
            if warm_info and not (resumed and (out_dir / "warm_start.json").exists()):  # the first start's is kept
                (out_dir / "warm_start.json").write_text(json.dumps(warm_info, indent=2, default=str))
            checkpointer = Checkpointer(out_dir, CheckpointConfig(plan.run.checkpoint_every, plan.run.keep_checkpoints),
                                        trainer, policy, state)
            if resumed:
                checkpointer.restore()
                writer.metric(resumed.row())
                writer.flush()
                state.resumes += 1
            write_state(out_dir, state)
            judge_servers = start_judge_servers(plan, trainer)  # judge.model_path: served on vLLM, owned here
            judge = make_judge(plan.judge)
            farm = build_farm(plan)
            await farm.start()
            loop = make_loop(plan, farm=farm, policy=policy, judge=judge, trainer=trainer, writer=writer,
                             progress=progress.update, checkpointer=checkpointer,
                             resume=resume_point(resumed) if resumed else None)
            summary = await loop.run()
            checkpointer.state.finished = True
            write_state(out_dir, checkpointer.state)
        except TrainingFailed as exc:
            log.error("training stopped: %s", exc)
            print(f"error: training stopped: {exc}\ncollected trajectories and metrics (with the error row) are in "
                  f"{out_dir}/ (trajectories.jsonl, episodes.jsonl, metrics.jsonl)", file=sys.stderr)
            return 1
        finally:
            writer.close()
            if farm is not None:
                await farm.close()
            if judge is not None:
                await judge.close()
            for server in judge_servers:
                server.close()
            if policy is not None:
                await policy.close()
            if trainer is not None:
                trainer.close()  # megatron: its process group and parallel state
    print_summary(summary, out_dir, warm_info)
    return 0


__all__ = ["FAMILIES_FILE", "command_line_overrides", "describe_families", "make_loop", "resume_point", "run"]
