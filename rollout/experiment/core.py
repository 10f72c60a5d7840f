"""Experiments: several arms over paired seeds, each (seed, arm) a full launcher run, then one report.

`python -m rollout.launch experiment=<name>` with `experiment.arms` set comes here (see configs/experiment/). For each
(arm, seed) the launcher's config is composed again by Hydra from the same command line plus the arm's overrides, with
`run.seed=<seed>` and `run.out_dir=<experiment dir>/<arm>/seed<seed>`, and run by `rollout.run.run` (envs, farm,
judge, rewards, trainer: the product, not a side script) in a worker process, whose console output goes to that run's
`run.log`. Arms of the same seed share the SFT start through the warm-start cache. Then `rollout.experiment.report`
writes `report.md`, `report.json` and `learning_curves.png` from the run directories' files alone.

With `experiment.tune` set, a tuning stage runs first: one arm (e.g. outcome-only) at each value of one key (e.g.
`trainer.lr`) on its own seeds (never the evaluation seeds), in `<experiment dir>/tune/`; the value whose runs have the
largest mean area under the held-out curve is then set for every arm (the report shows the sweep and the choice),
unless it beats the config's own value of the key (`tune.default`) by less than `tune.min_gain`: a flat sweep keeps the
default instead of picking noise. A value of that key given on the command line skips the stage.

Before any run, the distinct SFT starts of all runs are built side by side (`starts/start<i>.log`), so runs that share
one do not wait for it in turn.

Files in the experiment directory: `experiment.json` (the spec, the command, the per-run overrides, the starts built,
the tuning runs and the chosen value), `runs.jsonl` (one line per finished run: arm, seed, directory, exit status, wall
time, machine load), the run directories, the report.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from envs.options import from_options
from rollout.build import compose_launch_config, plan_run
from rollout.config import merge_overrides, override_key, plain
from rollout.event_loop import run_async
from rollout.experiment.report import write_report
from rollout.experiment.resume import EXPERIMENT_FILE, RUNS_FILE, set_aside_unfinished
from rollout.metrics import area_under_curve, eval_curve, pick_tuned_value, tune_arm_name
from rollout.policy.build import build_local_policy
from rollout.records import read_jsonl
from rollout.run import run
from rollout.stack import software_stack

log = logging.getLogger("nextstate.experiment")

RUN_LOG = "run.log"


@dataclass
class TuneSpec:
    """`experiment.tune`: pick one key's value for every arm from a sweep of one arm on seeds of its own."""

    arm: str = "outcome_only"  # the arm that is swept (its overrides apply)
    key: str = "trainer.lr"  # the config key swept
    values: list[Any] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [101, 102])  # must not overlap the evaluation seeds
    overrides: list[str] = field(default_factory=list)  # extra overrides for the tuning runs only (e.g. fewer iterations)
    # the best value replaces `default` only if its mean area is at least `min_gain` larger (a flat sweep of a baseline
    # that learns at no value would otherwise pick noise); default None = the config's value of `key`
    min_gain: float = 0.0
    default: Any = None

    def __post_init__(self) -> None:
        self.seeds = [int(s) for s in self.seeds]
        self.overrides = [str(o) for o in self.overrides]
        if len(self.values) < 2:
            raise ValueError(f"experiment.tune.values: at least two values of {self.key} to choose from, got {self.values}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"experiment.tune.seeds must be distinct seeds, got {self.seeds}")
        if self.min_gain < 0:
            raise ValueError(f"experiment.tune.min_gain must be >= 0, got {self.min_gain}")
        if self.min_gain > 0 and self.default is not None and self.default not in self.values:
            raise ValueError(f"experiment.tune.default {self.default!r} ({self.key}) must be one of the swept values "
                             f"{self.values}: the sweep compares the others with it")


@dataclass
class ExperimentSpec:
    """`experiment.*` in the config."""

    name: str = "experiment"
    seeds: list[int] = field(default_factory=lambda: [1, 2])
    arms: dict[str, list[str]] = field(default_factory=dict)  # arm name -> Hydra overrides on top of the experiment
    comparisons: list[list[str]] = field(default_factory=list)  # [arm_a, arm_b]: paired differences a - b
    # [arm_a, arm_b, family]: paired differences a - b of one family's held-out accuracy (env=mix runs report each
    # family's; a one-env run's family is its env), e.g. [mix, single_gui, gui]
    family_comparisons: list[list[str]] = field(default_factory=list)
    workers: int = 1  # runs at once (processes); 2 on an idle 2-core machine with policy.num_threads=1
    threshold: float = 0.8  # report the first evaluated iteration whose held-out accuracy reaches this
    headline_iteration: int | None = None  # the iteration the summary table shows (null: the last evaluated one)
    collapse_drop: float = 0.2  # a run "collapsed" if its last accuracy is this far below its best ...
    collapse_malformed: float = 0.5  # ... or more than this fraction of its last iteration's steps are malformed
    notes: str = ""  # free text copied into the report (e.g. where the learning rate came from)
    tune: TuneSpec | None = None  # a sweep that picks one key's value for every arm first (see the module doc)
    arm_seeds: dict[str, list[int]] = field(default_factory=dict)  # arm -> its own seeds (a subset); default `seeds`

    def __post_init__(self) -> None:
        self.seeds = [int(s) for s in self.seeds]
        if isinstance(self.tune, dict):
            self.tune = TuneSpec(**self.tune)
        if self.tune is not None:
            if self.tune.arm not in (self.arms or {}) or (self.arms or {}).get(self.tune.arm) is None:
                raise ValueError(f"experiment.tune.arm={self.tune.arm!r} is not an arm of the experiment")
            shared = set(self.tune.seeds) & set(self.seeds)
            if shared:
                raise ValueError(f"experiment.tune.seeds {sorted(shared)} are also evaluation seeds: tune on others")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"experiment.seeds must be distinct seeds, got {self.seeds}")
        if not self.arms:
            raise ValueError("experiment.arms is empty: name at least one arm (arm name -> list of overrides)")
        # an arm set to null is dropped (e.g. `experiment.arms.integrated_judge80=null`, or a derived experiment's)
        self.arms = {str(k): [str(o) for o in v] for k, v in self.arms.items() if v is not None}
        if not self.arms:
            raise ValueError("every arm of the experiment is null: nothing to run")
        # an arm's own seeds are those of its list that are also experiment seeds (so `experiment.seeds=[1,2]` on the
        # command line shrinks every arm)
        arm_seeds = {str(a): [int(x) for x in v] for a, v in (self.arm_seeds or {}).items()
                     if v is not None and a in self.arms}
        self.arm_seeds = {a: [x for x in v if x in self.seeds] for a, v in arm_seeds.items()}
        for a, v in self.arm_seeds.items():
            if not v or len(set(v)) != len(v):
                raise ValueError(f"experiment.arm_seeds.{a}={arm_seeds[a]}: distinct seeds, at least one of "
                                 f"experiment.seeds {self.seeds}")
        self.comparisons = [list(p) for p in self.comparisons if all(a in self.arms for a in p)]
        for pair in self.comparisons:
            if len(pair) != 2 or any(a not in self.arms for a in pair):
                raise ValueError(f"experiment.comparisons entry {pair}: two arm names among {list(self.arms)}")
        self.family_comparisons = [[str(x) for x in c] for c in self.family_comparisons
                                   if len(c) == 3 and all(a in self.arms for a in c[:2])]
        if self.workers < 1:
            raise ValueError(f"experiment.workers must be >= 1, got {self.workers}")

    def seeds_of(self, arm: str) -> list[int]:
        return self.arm_seeds.get(arm, self.seeds)

    @classmethod
    def from_config(cls, node: Any) -> ExperimentSpec:
        return from_options(cls, plain(node), "experiment")


@dataclass
class RunJob:
    arm: str
    seed: int
    out_dir: str
    overrides: list[str]


def plan_runs(spec: ExperimentSpec, base_overrides: list[str], exp_dir: Path, run_name: str) -> list[RunJob]:
    """Arm-major order: parallel workers start on different seeds (different SFT starts), and the later arms of a
    seed find its SFT start in the cache."""
    user = [o for o in base_overrides if not override_key(o).startswith("hydra.")]
    jobs = []
    for arm, arm_overrides in spec.arms.items():
        for seed in spec.seeds_of(arm):
            out = exp_dir / arm / f"seed{seed}"
            fixed = [f"run.seed={seed}", f"run.out_dir={out}", f"run.name={run_name}-{arm}-seed{seed}",
                     "experiment.arms=null"]
            jobs.append(RunJob(arm, seed, str(out), merge_overrides(user, arm_overrides, fixed)))
    return jobs


def plan_tune_runs(tune: TuneSpec, arm_overrides: list[str], base_overrides: list[str], exp_dir: Path,
                   run_name: str) -> list[RunJob]:
    """The tuning runs: the tuned arm at each value, on the tuning seeds, under `<exp_dir>/tune/<key>=<value>/`."""
    user = [o for o in base_overrides if not override_key(o).startswith("hydra.")]
    jobs = []
    for value in tune.values:
        name = tune_arm_name(tune.key, value)
        for seed in tune.seeds:
            out = exp_dir / "tune" / name / f"seed{seed}"
            fixed = [f"{tune.key}={value}", f"run.seed={seed}", f"run.out_dir={out}",
                     f"run.name={run_name}-tune-{name}-seed{seed}", "experiment.arms=null"]
            jobs.append(RunJob(name, seed, str(out), merge_overrides(user, arm_overrides, tune.overrides, fixed)))
    return jobs


def choose_tuned_value(tune: TuneSpec, jobs: list[RunJob]) -> tuple[Any, dict[str, float | None]]:
    """(the chosen value: see `pick_tuned_value`, value name -> mean area under the held-out curve over its seeds).
    Computed from the tuning runs' metrics.jsonl."""
    scores: dict[str, float | None] = {}
    for value in tune.values:
        name = tune_arm_name(tune.key, value)
        aucs = []
        for j in jobs:
            path = Path(j.out_dir) / "metrics.jsonl"
            if j.arm == name and path.exists():
                curve = eval_curve(read_jsonl(path))
                if curve:
                    aucs.append(area_under_curve(curve))
        scores[name] = sum(aucs) / len(aucs) if aucs else None
    chosen = pick_tuned_value(tune.values, [scores[tune_arm_name(tune.key, v)] for v in tune.values], tune.default,
                              tune.min_gain)
    if chosen is None:
        raise RuntimeError("every tuning run failed: no value to choose (see the run.log files under tune/)")
    return chosen, scores


def compose_run(overrides: list[str]) -> dict[str, Any]:
    """The launcher's config for one run, composed by Hydra as `python -m rollout.launch <overrides>` would."""
    cfg = compose_launch_config(overrides)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


PR_SET_PDEATHSIG = 1  # linux/prctl.h


_stopping = False  # set in a pool worker by its first SIGTERM: finish unwinding the run, then exit (not take another)
_in_run = False  # a pool worker is inside execute_run's try/finally, which turns SIGTERM's SystemExit into its exit
# a worker whose unwinding is still not done this long after SIGTERM exits anyway: Python 3.11's asyncio.run joins the
# default executor's threads without a timeout, so a `to_thread` call that never returns (a trainer group's `ray.get`
# on a stuck rank has no timeout) would otherwise keep the worker for ever
UNWIND_GRACE_S = 60.0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """A pool worker's SIGTERM handler. The first SIGTERM unwinds the run (its farm, sandboxes and desktops are closed
    by their owners), then execute_run exits; outside a run there is nothing to unwind: exit at once. Later SIGTERMs
    change nothing: PR_SET_PDEATHSIG comes once per driver *thread* (the worker is re-parented to each of a dying
    driver's threads in turn, tens of ms apart), and a second SystemExit would cut the unwinding short, or, raised in
    execute_run's `finally`, escape its exit: concurrent.futures then hands the worker the next run, or leaves it
    waiting for one with the driver gone."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    if not _in_run:  # idle in the pool, in its initializer, or taking or giving back a run: the pool would catch it
        os._exit(128 + signum)
    timer = threading.Timer(UNWIND_GRACE_S, os._exit, (128 + signum,))
    timer.daemon = True
    timer.start()
    raise SystemExit(128 + signum)


def _stop_with_driver(driver_pid: int) -> None:
    """Pool worker initializer: the kernel sends this worker SIGTERM when the driver dies, however it dies (a killed
    driver would otherwise leave its workers training on), and SIGTERM unwinds the run, so its farm, sandboxes and
    desktops are closed by their owners."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != driver_pid:  # the driver died before prctl took effect
        raise SystemExit(1)


def build_start(cfg: dict[str, Any]) -> None:
    """Train the local policy's SFT start of one run's config into the warm-start cache (or find it there): the run's
    own builder, stopped after the policy."""
    plan = plan_run(OmegaConf.create(cfg))
    options = plan.policy.config.start_options(plan.run.seed) if plan.policy.type == "vllm" else plan.policy.config
    build_local_policy(options, plan.env.families, plan.run.seed)


def start_identity(cfg: dict[str, Any]) -> str | None:
    """What a run's SFT start depends on (its policy and env configs, and its seed unless the start's seed is fixed);
    None when it has none (a served policy, or no warm start)."""
    policy = cfg.get("policy") or {}
    ws = policy.get("warm_start") or {}
    served_start = policy.get("type") == "vllm" and not policy.get("urls") and not policy.get("url") \
        and not policy.get("model_path")  # policy=vllm serves the tiny start policy=local would train
    if (policy.get("type") != "local" and not served_start) or not ws.get("enabled", True):
        return None
    seed = cfg["run"]["seed"] if ws.get("seed") is None else None
    env = dict(cfg.get("env") or {})
    if isinstance(env.get("families"), dict):  # env=mix: a family's weight does not change its demonstrations
        env["families"] = {f: ({k: v for k, v in e.items() if k != "weight"} if isinstance(e, dict) else e)
                           for f, e in env["families"].items() if e is not None}
    return json.dumps({"policy": policy, "env": env, "seed": seed}, sort_keys=True, default=str)


def execute_run(cfg: dict[str, Any], log_path: str, start_only: bool = False) -> dict[str, Any]:
    """Run one launcher config in this (worker) process, its console output to `log_path`; never raises. With
    `start_only`, only build its SFT start (`build_start`)."""
    global _in_run
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
    _in_run = True  # from here to the finally's first line, SIGTERM unwinds the run (`_exit_on_sigterm`)
    try:
        logging.basicConfig(level=cfg.get("log_level", "INFO"), stream=sys.stderr, force=True,
                            format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        if start_only:
            build_start(cfg)
        else:
            rc = run_async(run(OmegaConf.create(cfg)), cfg.get("run", {}).get("event_loop", "auto"))
    except BaseException:  # a failed run is recorded; the others go on
        rc, error = 1, traceback.format_exc()
        print(error, file=sys.stderr)
    finally:
        _in_run = False  # first: a SIGTERM from here on exits at once, it cannot raise past the check below
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)
        if _stopping:  # the pool would catch the SystemExit and hand this worker the next run: leave instead
            os._exit(128 + signal.SIGTERM)
    return {"rc": rc, "error": error[-4000:], "wall_s": time.perf_counter() - t0, "load_before": load_before,
            "load_after": _load_average(), "pid": os.getpid()}


def _summary_line(out_dir: Path) -> str:
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return ""
    evals = [m for m in read_jsonl(path) if m.get("kind") == "eval"]
    if not evals:
        return ""
    return f"held-out accuracy {evals[0]['accuracy']:.3f} -> {evals[-1]['accuracy']:.3f}"


def _result(fut: Any) -> dict[str, Any]:
    """`execute_run`'s result, or a failed one when the worker process itself died."""
    try:
        return fut.result()
    except Exception as exc:
        return {"rc": 1, "error": f"worker failed: {type(exc).__name__}: {exc}", "wall_s": 0.0}


def _build_starts(pool: ProcessPoolExecutor, workers: int, jobs: list[RunJob], exp_dir: Path,
                  console: Any) -> list[dict[str, Any]]:
    """Build the distinct SFT starts of `jobs` side by side before any run (runs sharing a start would otherwise wait
    for it one after another, with workers idle); each start's log in `starts/start<i>.log`."""
    firsts: dict[str, RunJob] = {}
    configs: dict[str, dict[str, Any]] = {}
    for job in jobs:
        cfg = compose_run(job.overrides)
        ident = start_identity(cfg)
        if ident is not None and ident not in firsts:
            firsts[ident], configs[ident] = job, cfg
    if not firsts:
        return []
    console.print(f"SFT starts: {len(firsts)} distinct, built {min(len(firsts), workers)} at a time "
                  f"(logs in {exp_dir / 'starts'})")
    futures = {pool.submit(execute_run, configs[ident], str(exp_dir / "starts" / f"start{i}.log"), True): (i, job)
               for i, (ident, job) in enumerate(firsts.items())}
    built = []
    for fut in as_completed(futures):
        i, job = futures[fut]
        res = _result(fut)
        built.append({"start": i, "first_run": f"{job.arm}/seed{job.seed}", "rc": res["rc"], "wall_s": res["wall_s"],
                      "error": res.get("error", "")})
        status = "ok" if res["rc"] == 0 else f"FAILED (see {exp_dir / 'starts' / f'start{i}.log'}; its runs will fail too)"
        console.print(f"[start {len(built)}/{len(firsts)}] the SFT start of {job.arm} seed {job.seed}: {status} "
                      f"in {res['wall_s']:.0f} s", markup=False)
    return sorted(built, key=lambda b: b["start"])


def _run_jobs(pool: ProcessPoolExecutor, jobs: list[RunJob], exp_dir: Path, console: Any, stage: str,
              kept: dict[str, dict[str, Any]] | None = None) -> int:
    """Run the jobs in the pool, a line per finished run in runs.jsonl; returns the number that failed. `kept`: the
    runs a resumed experiment keeps (out_dir -> their runs.jsonl row), not run again."""
    kept = kept or {}
    for job in jobs:
        if job.out_dir in kept:
            console.print(f"[{stage}] {job.arm} seed {job.seed}: kept (it finished before the resume)", markup=False)
    jobs = [j for j in jobs if j.out_dir not in kept]
    configs = [compose_run(j.overrides) for j in jobs]
    failures = 0
    futures = {pool.submit(execute_run, c, str(Path(j.out_dir) / RUN_LOG)): j for j, c in zip(jobs, configs)}
    for n, fut in enumerate(as_completed(futures), 1):
        job = futures[fut]
        res = _result(fut)
        row = {"stage": stage, "arm": job.arm, "seed": job.seed, "out_dir": job.out_dir, **res}
        with (exp_dir / RUNS_FILE).open("a") as f:
            f.write(json.dumps(row) + "\n")
        status = "ok" if res["rc"] == 0 else f"FAILED (see {Path(job.out_dir) / RUN_LOG})"
        failures += res["rc"] != 0
        console.print(f"[{stage} {n}/{len(jobs)}] {job.arm} seed {job.seed}: {status} in {res['wall_s']:.0f} s  "
                      f"{_summary_line(Path(job.out_dir))}", markup=False)
    return failures


def run_experiment(cfg: DictConfig, overrides: list[str] | None = None) -> int:
    """Run every (arm, seed) of `cfg.experiment`, then write the report. Returns 0 when every run succeeded.
    `overrides`: the command line's (default: Hydra's); with `run.resume` set, the runs that finished before are kept
    and the others restarted (rollout/experiment/resume.py)."""
    console = Console(stderr=True)
    spec = ExperimentSpec.from_config(cfg.experiment)
    resuming = bool(cfg.run.get("resume"))
    exp_dir = Path(cfg.run.out_dir).resolve()
    exp_dir.mkdir(parents=True, exist_ok=True)
    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    # the experiment's own resume is not its runs': each run it restarts starts from scratch
    base_overrides = [o for o in overrides if override_key(o) != "run.resume"]
    tune = spec.tune
    if tune is not None and any(override_key(o) == tune.key for o in base_overrides):
        console.print(f"{tune.key} is set on the command line: no tuning stage")
        tune = None
    if tune is not None and tune.default is None:
        tune = replace(tune, default=OmegaConf.select(cfg, tune.key))  # validated again by __post_init__
    tune_jobs = (plan_tune_runs(tune, spec.arms[tune.arm], base_overrides, exp_dir, str(cfg.run.name))
                 if tune is not None else [])
    t0 = time.perf_counter()
    earlier = json.loads((exp_dir / EXPERIMENT_FILE).read_text()) if resuming else {}
    info: dict[str, Any] = {
        "spec": asdict(spec),
        "command": earlier.get("command") or ["python", "-m", "rollout.launch", *base_overrides],
        "run_name": str(cfg.run.name),
        "runs": [],
        "tune": {"spec": asdict(tune), "runs": [asdict(j) for j in tune_jobs], "chosen": None} if tune else None,
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": _load_average()},
        "stack": software_stack().to_dict(),
        "started": earlier.get("started") or time.strftime("%Y-%m-%d %H:%M:%S"),
        "resumed": [*earlier.get("resumed", []), time.strftime("%Y-%m-%d %H:%M:%S")] if resuming else [],
    }
    kept: dict[str, dict[str, Any]] = {}
    if resuming:
        planned = [j.out_dir for j in tune_jobs + plan_runs(spec, base_overrides, exp_dir, str(cfg.run.name))]
        kept, restarted = set_aside_unfinished(exp_dir, planned)
        console.print(f"resuming {exp_dir}: {len(kept)} finished runs kept, {len(restarted)} unfinished set aside "
                      f"and restarted")
    else:
        (exp_dir / RUNS_FILE).unlink(missing_ok=True)
    (exp_dir / EXPERIMENT_FILE).write_text(json.dumps(info, indent=2))
    failures = 0
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no torch / event-loop state shared with us
    with ProcessPoolExecutor(max_workers=spec.workers, mp_context=ctx, initializer=_stop_with_driver,
                             initargs=(os.getpid(),)) as pool:
        extra: list[str] = []
        # the table's runs are planned without the tuned value: a trainer key does not change a start (were it a
        # policy key, the runs whose start differs would build theirs themselves, as without this stage)
        untuned = plan_runs(spec, base_overrides, exp_dir, str(cfg.run.name))
        to_run = [j for j in tune_jobs + untuned if j.out_dir not in kept]
        info["starts"] = _build_starts(pool, spec.workers, to_run, exp_dir, console)
        (exp_dir / EXPERIMENT_FILE).write_text(json.dumps(info, indent=2))
        if tune is not None:
            console.print(f"tuning {tune.key} on arm {tune.arm}: {len(tune.values)} values x seeds {tune.seeds} = "
                          f"{len(tune_jobs)} runs, in {exp_dir / 'tune'}")
            failures += _run_jobs(pool, tune_jobs, exp_dir, console, "tune", kept)
            chosen, scores = choose_tuned_value(tune, tune_jobs)
            info["tune"].update(chosen=chosen, mean_auc=scores)
            console.print(f"tuning: {tune.key}={chosen} (mean area under the held-out curve per value: "
                          + ", ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in scores.items())
                          + (f"; default {tune.default}, min gain {tune.min_gain}" if tune.min_gain else "") + ")")
            extra = [f"{tune.key}={chosen}"]
        jobs = plan_runs(spec, merge_overrides(base_overrides, extra), exp_dir, str(cfg.run.name))
        info["runs"] = [asdict(j) for j in jobs]
        (exp_dir / EXPERIMENT_FILE).write_text(json.dumps(info, indent=2))
        console.print(f"experiment {spec.name}: {len(spec.arms)} arms, seeds {spec.seeds}: {len(jobs)} runs, "
                      f"{spec.workers} at a time, in {exp_dir}")
        failures += _run_jobs(pool, jobs, exp_dir, console, "table", kept)
    wall = time.perf_counter() - t0
    info.update({"wall_s": wall, "load_average_at_end": _load_average(), "failed_runs": failures})
    (exp_dir / EXPERIMENT_FILE).write_text(json.dumps(info, indent=2))
    report = write_report(exp_dir)
    console.print(f"experiment done in {wall / 60:.1f} min; report: {report}")
    return 0 if failures == 0 else 1


__all__ = ["ExperimentSpec", "RunJob", "TuneSpec", "build_start", "choose_tuned_value", "compose_run", "execute_run",
           "merge_overrides", "plan_runs", "plan_tune_runs", "run_experiment", "start_identity"]
