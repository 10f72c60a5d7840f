"""`python -m rollout.launch env=<name> [group=option ...] [key=value ...]`: build everything from config and run.

The command line only: `main` composes the config (Hydra) and hands it to the dry run (`run.dry_run=true`,
rollout.dry_run), an experiment (`experiment.arms`, rollout.experiment.core) or one run (rollout.run). Every
component is built by rollout.build, whichever of the three it is. `run.resume=<dir>` continues a run
(rollout.state.resume) or, when <dir> holds an experiment, that experiment (rollout.experiment.resume).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rollout.build import CONFIG_DIR, compose_launch_config, register_schemas
from rollout.config import open_dict_overrides, resume_logs_in_place
from rollout.dry_run import dry_run_main
from rollout.event_loop import run_async
from rollout.experiment.core import run_experiment
from rollout.experiment.resume import experiment_resume_overrides, is_experiment_dir
from rollout.run import command_line_overrides, run
from rollout.state.resume import ResumeError

register_schemas()  # before Hydra composes anything: every group's defaults come from its dataclass


@hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="launch")
def main(cfg: DictConfig) -> None:
    logging.getLogger().setLevel(cfg.get("log_level", "INFO"))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per judge / policy request otherwise
    if cfg.run.get("dry_run"):
        sys.exit(dry_run_main(cfg))  # builds and checks everything but the model; runs nothing
    if cfg.run.get("resume") and is_experiment_dir(cfg.run.resume):
        try:  # the experiment's own command, composed again
            overrides = experiment_resume_overrides(Path(cfg.run.resume).resolve(), command_line_overrides())
        except ResumeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        sys.exit(run_experiment(compose_launch_config(overrides), overrides))
    experiment = cfg.get("experiment")
    if experiment is not None and experiment.get("arms"):
        sys.exit(run_experiment(cfg))  # every (seed, arm) is a run of rollout.run
    sys.exit(run_async(run(cfg), cfg.run.get("event_loop", "auto")))


if __name__ == "__main__":
    sys.argv[1:] = open_dict_overrides(sys.argv[1:])  # `farm.worker_resources={docker: 1}` works as written
    sys.argv[1:] = resume_logs_in_place(sys.argv[1:])  # a resumed start logs into its run's launch.log
    main()
