"""One run of the launcher's config: plan and build every component (rollout.build), run the rollout <-> train loop
(rollout.loop), and write `outputs/<run>/` with the resolved `config.yaml`, `trajectories.jsonl`, `episodes.jsonl` and
`metrics.jsonl`. Experiments call `run` for each of their (arm, seed) runs."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from prm.factory import make_judge
from rollout.build import MixSetup, RunPlan, build_farm, build_policy_and_trainer, plan_run
from rollout.loop import RLLoop, RunWriter, TrainingFailed
from rollout.progress import LiveProgress, print_summary

log = logging.getLogger("nextstate")


def make_loop(plan: RunPlan, *, farm: Any, policy: Any, judge: Any, trainer: Any, writer: RunWriter,
              progress: Any = None, timeline: Any = None) -> RLLoop:
    """The rollout <-> train loop of `plan` on built components."""
    return RLLoop(
        farm=farm, policy=policy, judge=judge, trainer=trainer, reward_cfg=plan.reward, loop_cfg=plan.loop,
        sampling=plan.sampling, run_id=plan.run.name, families=plan.loop_families(), writer=writer, progress=progress,
        timeline=timeline,
    )


FAMILIES_FILE = "families.json"


def describe_families(plan: RunPlan) -> dict[str, Any]:
    """Each family of an env=mix run as it ran: its env and options, weight, sampling overrides, task counts and farm."""
    return {f.family: {"env": f.name, "weight": f.weight, "options": f.kwargs, "sampling": f.sampling,
                       "tasks": f.sources.tasks, "eval_tasks": f.sources.eval_tasks,
                       "train_task_count": len(f.train_tasks), "eval_task_count": len(f.eval_tasks),
                       "farm": dataclasses.asdict(plan.farms[f.family])}
            for f in plan.env.families}


async def run(cfg: DictConfig) -> int:
    out_dir = Path(cfg.run.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    plan = plan_run(cfg)
    log.info("run %s: %s; farm=%s, output %s", plan.run.name, plan.env.describe(), plan.farm.backend, out_dir)
    if isinstance(plan.env, MixSetup):  # what each family ran with, next to config.yaml
        (out_dir / FAMILIES_FILE).write_text(json.dumps(describe_families(plan), indent=2, default=str))
    with LiveProgress() as progress:
        policy, trainer, warm_info = build_policy_and_trainer(plan)
        if warm_info:
            (out_dir / "warm_start.json").write_text(json.dumps(warm_info, indent=2, default=str))
        judge = make_judge(plan.judge)
        farm = build_farm(plan)
        writer = RunWriter(out_dir, plan.loop.record_token_ids)
        try:
            await farm.start()
            loop = make_loop(plan, farm=farm, policy=policy, judge=judge, trainer=trainer, writer=writer,
                             progress=progress.update)
            summary = await loop.run()
        except TrainingFailed as exc:
            log.error("training stopped: %s", exc)
            print(f"error: training stopped: {exc}\ncollected trajectories and metrics (with the error row) are in "
                  f"{out_dir}/ (trajectories.jsonl, episodes.jsonl, metrics.jsonl)", file=sys.stderr)
            return 1
        finally:
            writer.close()
            await farm.close()
            if judge is not None:
                await judge.close()
            await policy.close()
            trainer.close()  # megatron: its process group and parallel state
    print_summary(summary, out_dir, warm_info)
    return 0


__all__ = ["FAMILIES_FILE", "describe_families", "make_loop", "run"]
