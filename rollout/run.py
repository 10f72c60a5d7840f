"""One run of the launcher's config: plan and build every component (rollout.build), run the rollout <-> train loop
(rollout.loop), and write `outputs/<run>/` with the resolved `config.yaml`, `trajectories.jsonl`, `episodes.jsonl` and
`metrics.jsonl`. Experiments call `run` for each of their (arm, seed) runs."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from prm.factory import make_judge
from rollout.build import RunPlan, build_policy_and_trainer, plan_run
from rollout.farm import make_farm
from rollout.loop import RLLoop, RunWriter, TrainingFailed
from rollout.progress import LiveProgress, print_summary

log = logging.getLogger("nextstate")


def make_loop(plan: RunPlan, *, farm: Any, policy: Any, judge: Any, trainer: Any, writer: RunWriter,
              progress: Any = None, timeline: Any = None) -> RLLoop:
    """The rollout <-> train loop of `plan` on built components."""
    return RLLoop(
        farm=farm, policy=policy, judge=judge, trainer=trainer, reward_cfg=plan.reward, loop_cfg=plan.loop,
        sampling=plan.sampling, run_id=plan.run.name, train_tasks=plan.env.train_tasks,
        eval_tasks=plan.env.eval_tasks, writer=writer, progress=progress, timeline=timeline,
    )


async def run(cfg: DictConfig) -> int:
    out_dir = Path(cfg.run.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    plan = plan_run(cfg)
    log.info("run %s: env=%s (%d train / %d eval tasks), farm=%s, output %s", plan.run.name, plan.env.name,
             len(plan.env.train_tasks), len(plan.env.eval_tasks), plan.farm.backend, out_dir)
    with LiveProgress() as progress:
        policy, trainer, warm_info = build_policy_and_trainer(plan)
        if warm_info:
            (out_dir / "warm_start.json").write_text(json.dumps(warm_info, indent=2, default=str))
        judge = make_judge(plan.judge)
        farm = make_farm(plan.env.name, plan.env.kwargs, plan.farm)
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


__all__ = ["make_loop", "run"]
