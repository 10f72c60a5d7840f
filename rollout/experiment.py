"""Experiments: several arms over paired seeds, each (seed, arm) a full launcher run, then one report.

`python -m rollout.launch experiment=<name>` with `experiment.arms` set comes here (see configs/experiment/). For each
(arm, seed) the launcher's config is composed again by Hydra from the same command line plus the arm's overrides, with
`run.seed=<seed>` and `run.out_dir=<experiment dir>/<arm>/seed<seed>`, and run by `rollout.launch.run` (envs, farm,
judge, rewards, trainer: the product, not a side script) in a worker process, whose console output goes to that run's
`run.log`. Arms of the same seed share the SFT start through the warm-start cache. Then `rollout.experiment_report`
writes `report.md`, `report.json` and `learning_curves.png` from the run directories' files alone.

Files in the experiment directory: `experiment.json` (the spec, the command, the per-run overrides), `runs.jsonl` (one
line per finished run: arm, seed, directory, exit status, wall time, machine load), the run directories, the report.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rollout.config import plain

log = logging.getLogger("nextstate.experiment")

EXPERIMENT_FILE = "experiment.json"
RUNS_FILE = "runs.jsonl"
RUN_LOG = "run.log"


@dataclass
class ExperimentSpec:
    """`experiment.*` in the config."""

    name: str = "experiment"
    seeds: list[int] = field(default_factory=lambda: [1, 2])
    arms: dict[str, list[str]] = field(default_factory=dict)  # arm name -> Hydra overrides on top of the experiment
    comparisons: list[list[str]] = field(default_factory=list)  # [arm_a, arm_b]: paired differences a - b
    workers: int = 1  # runs at once (processes); 2 on an idle 2-core machine with policy.num_threads=1
    threshold: float = 0.8  # report the first evaluated iteration whose held-out accuracy reaches this
    headline_iteration: int | None = None  # the iteration the summary table shows (null: the last evaluated one)
    collapse_drop: float = 0.2  # a run "collapsed" if its last accuracy is this far below its best ...
    collapse_malformed: float = 0.5  # ... or more than this fraction of its last iteration's steps are malformed
    notes: str = ""  # free text copied into the report (e.g. where the learning rate came from)

    def __post_init__(self) -> None:
        self.seeds = [int(s) for s in self.seeds]
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"experiment.seeds must be distinct seeds, got {self.seeds}")
        if not self.arms:
            raise ValueError("experiment.arms is empty: name at least one arm (arm name -> list of overrides)")
        # an arm set to null is dropped (e.g. `experiment.arms.integrated_judge80=null`, or a derived experiment's)
        self.arms = {str(k): [str(o) for o in v] for k, v in self.arms.items() if v is not None}
        if not self.arms:
            raise ValueError("every arm of the experiment is null: nothing to run")
        self.comparisons = [list(p) for p in self.comparisons if all(a in self.arms for a in p)]
        for pair in self.comparisons:
            if len(pair) != 2 or any(a not in self.arms for a in pair):
                raise ValueError(f"experiment.comparisons entry {pair}: two arm names among {list(self.arms)}")
        if self.workers < 1:
            raise ValueError(f"experiment.workers must be >= 1, got {self.workers}")

    @classmethod
    def from_config(cls, node: Any) -> ExperimentSpec:
        data = plain(node)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown experiment option(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass
class RunJob:
    arm: str
    seed: int
    out_dir: str
    overrides: list[str]


def override_key(override: str) -> str:
    """The config key an override sets ("+a.b=1" -> "a.b", "reward=outcome_only" -> "reward")."""
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(*lists: list[str]) -> list[str]:
    """Later lists win; each key appears once, at the place of its last setting."""
    last: dict[str, str] = {}
    for lst in lists:
        for o in lst:
            key = override_key(o)
            last.pop(key, None)
            last[key] = o
    return list(last.values())


def plan_runs(spec: ExperimentSpec, base_overrides: list[str], exp_dir: Path, run_name: str) -> list[RunJob]:
    """Arm-major order: parallel workers start on different seeds (different SFT starts), and the later arms of a
    seed find its SFT start in the cache."""
    user = [o for o in base_overrides if not override_key(o).startswith("hydra.")]
    jobs = []
    for arm, arm_overrides in spec.arms.items():
        for seed in spec.seeds:
            out = exp_dir / arm / f"seed{seed}"
            fixed = [f"run.seed={seed}", f"run.out_dir={out}", f"run.name={run_name}-{arm}-seed{seed}",
                     "experiment.arms=null"]
            jobs.append(RunJob(arm, seed, str(out), merge_overrides(user, arm_overrides, fixed)))
    return jobs


def compose_run(overrides: list[str]) -> dict[str, Any]:
    """The launcher's config for one run, composed by Hydra as `python -m rollout.launch <overrides>` would."""
    from hydra import compose

    cfg = compose(config_name="launch", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def execute_run(cfg: dict[str, Any], log_path: str) -> dict[str, Any]:
    """Run one launcher config in this (worker) process, its console output to `log_path`; never raises."""
    t0 = time.perf_counter()
    load_before = _load_average()
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    rc, error = 0, ""
    try:
        from rollout.launch import run

        logging.basicConfig(level=cfg.get("log_level", "INFO"), stream=sys.stderr, force=True,
                            format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        rc = asyncio.run(run(OmegaConf.create(cfg)))
    except BaseException:  # a failed run is recorded; the others go on
        rc, error = 1, traceback.format_exc()
        print(error, file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)
    return {"rc": rc, "error": error[-4000:], "wall_s": time.perf_counter() - t0, "load_before": load_before,
            "load_after": _load_average(), "pid": os.getpid()}


def _summary_line(out_dir: Path) -> str:
    from rollout.records import read_jsonl

    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return ""
    evals = [m for m in read_jsonl(path) if m.get("kind") == "eval"]
    if not evals:
        return ""
    return f"held-out accuracy {evals[0]['accuracy']:.3f} -> {evals[-1]['accuracy']:.3f}"


def run_experiment(cfg: DictConfig) -> int:
    """Run every (arm, seed) of `cfg.experiment`, then write the report. Returns 0 when every run succeeded."""
    from hydra.core.hydra_config import HydraConfig
    from rich.console import Console

    from rollout.experiment_report import write_report

    console = Console(stderr=True)
    spec = ExperimentSpec.from_config(cfg.experiment)
    exp_dir = Path(cfg.run.out_dir).resolve()
    exp_dir.mkdir(parents=True, exist_ok=True)
    base_overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    jobs = plan_runs(spec, base_overrides, exp_dir, str(cfg.run.name))
    configs = [compose_run(j.overrides) for j in jobs]
    t0 = time.perf_counter()
    (exp_dir / EXPERIMENT_FILE).write_text(json.dumps({
        "spec": asdict(spec),
        "command": ["python", "-m", "rollout.launch", *base_overrides],
        "runs": [asdict(j) for j in jobs],
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": _load_average()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }, indent=2))
    (exp_dir / RUNS_FILE).unlink(missing_ok=True)
    console.print(f"experiment {spec.name}: {len(spec.arms)} arms x {len(spec.seeds)} seeds = {len(jobs)} runs, "
                  f"{spec.workers} at a time, in {exp_dir}")
    failures = 0
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no torch / event-loop state shared with us
    with ProcessPoolExecutor(max_workers=spec.workers, mp_context=ctx) as pool:
        futures = {pool.submit(execute_run, c, str(Path(j.out_dir) / RUN_LOG)): j for j, c in zip(jobs, configs)}
        for n, fut in enumerate(as_completed(futures), 1):
            job = futures[fut]
            try:
                res = fut.result()
            except Exception as exc:  # the worker process itself died
                res = {"rc": 1, "error": f"worker failed: {type(exc).__name__}: {exc}", "wall_s": 0.0}
            row = {"arm": job.arm, "seed": job.seed, "out_dir": job.out_dir, **res}
            with (exp_dir / RUNS_FILE).open("a") as f:
                f.write(json.dumps(row) + "\n")
            status = "ok" if res["rc"] == 0 else f"FAILED (see {Path(job.out_dir) / RUN_LOG})"
            failures += res["rc"] != 0
            console.print(f"[{n}/{len(jobs)}] {job.arm} seed {job.seed}: {status} in {res['wall_s']:.0f} s  "
                          f"{_summary_line(Path(job.out_dir))}")
    wall = time.perf_counter() - t0
    info = json.loads((exp_dir / EXPERIMENT_FILE).read_text())
    info.update({"wall_s": wall, "load_average_at_end": _load_average(), "failed_runs": failures})
    (exp_dir / EXPERIMENT_FILE).write_text(json.dumps(info, indent=2))
    report = write_report(exp_dir)
    console.print(f"experiment done in {wall / 60:.1f} min; report: {report}")
    return 0 if failures == 0 else 1


__all__ = ["ExperimentSpec", "RunJob", "compose_run", "execute_run", "merge_overrides", "plan_runs", "run_experiment"]
