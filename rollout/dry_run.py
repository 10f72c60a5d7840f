"""`python -m rollout.launch ... run.dry_run=true`: build and check everything a run needs except the model.

Checks, each reported with what it found: the env and its task files (loaded and validated: e.g. DAPO-Math-17k parquet,
AIME JSONL), one env constructed and closed, the policy (server policies: the model directory's config and tokenizer
are read and the client is built, no request is sent; the local policy: its model / warm-start config), the judge
client, the trainer, farm, reward, loop and sampling settings, and the trainer's modelled GPU memory per rank
(train/memory_plan.py: weights, gradients, optimizer, reference, activations for its TP / DP / PP layout), refused
when it exceeds `trainer.gpu_memory_gb` (else the visible GPU's memory; no check without either). For an experiment (`experiment.arms`), every arm's
composed config is checked the same way. Exit status 0 when every check passes, 2 otherwise.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import envs
from prm.factory import make_judge
from prm.llm_judge import HINT_KINDS
from prm.prompt import TemplateSet
from rollout import build
from rollout.experiment.core import ExperimentSpec, compose_run, plan_runs
from rollout.experiment.resume import is_experiment_dir
from rollout.mix import staleness_bounds
from rollout.policy.vllm_server import find_python, vllm_version
from rollout.state.resume import saved_config_file
from rollout.trainer_group import check_placement, check_resources
from train.memory_plan import plan_memory

log = logging.getLogger(__name__)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _run(checks: list[Check], name: str, fn: Callable[[], str]) -> None:
    try:
        checks.append(Check(name, True, fn()))
    except Exception as exc:  # every problem is reported, not just the first
        checks.append(Check(name, False, f"{type(exc).__name__}: {exc}"))


def check_model_dir(path: str | None, what: str = "policy.model_path") -> str:
    """A local Hugging Face model directory: config.json and a tokenizer (weights are not opened)."""
    if not path:
        raise ValueError(f"{what} is not set: the served model's local HF directory")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"{what}={path} is not a directory")
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"{what}={path} has no config.json")
    if not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise FileNotFoundError(f"{what}={path} has no tokenizer files")
    arch = json.loads((p / "config.json").read_text()).get("architectures", ["?"])
    weights = sorted(f.name for f in p.glob("*.safetensors")) or sorted(f.name for f in p.glob("*.bin"))
    if not weights:
        raise FileNotFoundError(f"{what}={path} has no *.safetensors or *.bin weight files")
    return f"{p} ({', '.join(arch)}; {len(weights)} weight file(s), not loaded)"


def visible_gpu_gib() -> float | None:
    """Memory of the GPU this process sees (GiB, device 0), None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 1024**3


@dataclass
class Planned:
    """One config's checks in progress: the config, its run settings, and each component's plan by name (run, env,
    policy, judge, trainer, settings) as the checks make them; a later check reuses an earlier one's plan."""

    cfg: DictConfig
    run: Any  # rollout.build.RunSettings
    found: dict[str, Any]

    def policy(self) -> Any:
        return self.found.get("policy") or build.plan_policy(self.cfg.policy, self.run)

    def trainer(self) -> Any:
        return self.found.get("trainer") or build.plan_trainer(self.cfg.trainer, float(self.cfg.sampling.temperature))


def check_env(p: Planned) -> str:
    setup = p.found["env"] = build.plan_env(p.cfg.env)
    for fam in setup.families:  # env=mix: every family's env
        envs.make(fam.name, **fam.kwargs).close()
    return f"{setup.describe()}; " + ("env constructed and closed" if len(setup.families) == 1 else
                                      f"each of the {len(setup.families)} families' envs constructed and closed")


def check_policy(p: Planned) -> str:
    plan = p.found["policy"] = build.plan_policy(p.cfg.policy, p.run)
    if plan.type == "local":
        c = plan.config
        return (f"local tiny Qwen3 (hidden {c.model.hidden_size}, {c.model.num_layers} layers), "
                f"{1 + len(c.warm_start.stages)} SFT stage(s), not built")
    if plan.type == "vllm" and not plan.config.urls:  # the launcher will start them: is vLLM installed?
        python = find_python(plan.config.server.python)
        where = plan.config.model_path or "the tiny start policy=local would build"
        return (f"{plan.config.server.num_servers} vLLM server(s) started by the launcher on {where} "
                f"(vLLM {vllm_version(python)} at {python}), not started")
    detail = check_model_dir(plan.config.tokenizer if plan.type == "sglang" else plan.config.model_path)
    asyncio.run(build.build_server_policy(plan).close())
    return f"{plan.type} client for {plan.config.urls}; model {detail}"


def check_judge(p: Planned) -> str:
    plan = p.found["judge"] = build.plan_judge(p.cfg.judge, build.plan_reward(p.cfg.reward))
    if plan.llm is not None and not plan.llm.urls:  # judge.model_path: a vLLM server the launcher starts
        python = find_python(plan.llm.server.get("python"))
        return f"LLM judge on a vLLM server the launcher starts on {plan.llm.model_path} (vLLM " \
               f"{vllm_version(python)}), not started"
    judge = make_judge(plan)
    if judge is None:
        return "no judge"
    asyncio.run(judge.close())
    extra = f", url {plan.llm.urls}, m={plan.llm.m}, T={plan.llm.temperature}" if plan.llm else ""
    if plan.hints:
        family = envs.env_class(build.plan_env(p.cfg.env).name).family
        extra += f", hints (min {plan.min_hint_chars} chars, on {plan.hint_steps} steps"
        if plan.llm:  # the hint template the env family's steps get (loaded: a broken file fails here)
            kind = HINT_KINDS[plan.hint_steps]
            hint = TemplateSet(plan.llm.templates_dir, plan.llm.hint_template, kind=kind).for_family(family)
            extra += f", template {hint.source}, max_new_tokens={plan.llm.hint_max_tokens}"
        extra += ")"
    return f"{type(judge).__name__}{extra}"


def check_trainer(p: Planned) -> str:
    plan = p.found["trainer"] = build.plan_trainer(p.cfg.trainer, float(p.cfg.sampling.temperature))
    build.check_reference_teacher(build.plan_reward(p.cfg.reward), plan)
    build.check_topk_trainer(build.plan_reward(p.cfg.reward), plan)
    t = plan.config
    extra = f", bf16 {t.bf16}, device {t.device}" if plan.backend == "megatron" else ""
    policy = p.policy()
    # the same placement and the same check of the model's shape as a run (rollout.build.build_trainer)
    shape = check_placement(plan.placement, build.planned_model_config(policy))
    settings = p.found.get("settings") or build.plan_settings(p.cfg, p.run, policy)
    resources = check_resources(plan.placement, settings.farm.ray_address)
    return (f"{plan.backend}: lr {t.lr}, weight decay {t.weight_decay}, betas {t.betas}, KL {t.kl_coef}, clip "
            f"{t.clip_low}/{t.clip_high}{extra}; placement: {plan.placement.describe()}; {shape}; {resources} "
            "(model not built)")


def check_memory(p: Planned) -> str:
    plan = p.trainer()
    model_config = build.planned_model_config(p.policy())
    if model_config is None:
        raise ValueError("no model config to estimate the trainer's memory from: set policy.model_path")
    memory = plan_memory(plan.backend, plan.config, model_config, visible_gpu_gib())
    if not memory.fits:
        raise MemoryError(memory.refusal())
    return memory.describe()


def check_settings(p: Planned) -> str:
    policy = p.policy()
    st = p.found["settings"] = build.plan_settings(p.cfg, p.run, policy)
    build.check_directive(st.reward, policy, st.sampling)
    loop, s = st.loop, st.sampling
    teacher = f" (teacher on the {st.reward.teacher})" if st.reward.directive else ""
    if st.reward.topk_signal:
        teacher += (f", top-{st.reward.topk} distillation ({st.reward.topk_divergence}, clamp "
                    f"{st.reward.topk_clamp})")
    text = (f"reward {st.reward.mode}{teacher}; {loop.iterations} iterations of {loop.tasks_per_iteration} tasks x "
            f"{loop.samples_per_task} samples; eval {loop.eval_tasks} tasks x {loop.eval_samples} every "
            f"{loop.eval_every}; sampling T={s.temperature}, max_new_tokens={s.max_new_tokens}; farm "
            f"{st.farm.backend}, {st.farm.num_envs} env slots")
    setup = p.found.get("env") or build.plan_env(p.cfg.env)
    if isinstance(setup, build.MixSetup):
        farms = build.plan_family_farms(st.farm, setup)
        bounds = staleness_bounds(loop.max_staleness, [f.family for f in setup.families])
        text += "; per family: " + ", ".join(
            f"{f.family} {farms[f.family].num_envs} slots (start cap {farms[f.family].max_starting}), staleness "
            f"{bounds[f.family]}" + (f", sampling {f.sampling}" if f.sampling else "") for f in setup.families)
    return text


def check_run(p: Planned) -> str:
    run = p.run
    for name in run.loggers:  # the optional extra each logger needs
        if importlib.util.find_spec(name) is None:
            raise ImportError(f"run.loggers=[{name}] needs the {name} package: pip install -e '.[loggers]'")
    every = (f"every {run.checkpoint_every} iterations and after the last" if run.checkpoint_every
             else "after the last iteration")
    if run.resume and not is_experiment_dir(run.resume):
        saved_config_file(Path(run.resume))  # the run it names exists (an error now, not after the checks)
    resume = f"; resumes {run.resume}" if run.resume else ""
    return (f"checkpoints {every}, {run.keep_checkpoints} kept; loggers: {', '.join(run.loggers) or 'none'}"
            f"{resume}")


#: the checks in the order they run and are reported (settings before the trainer: it reuses their plan)
CHECKS: tuple[tuple[str, Callable[[Planned], str]], ...] = (
    ("env and task files", check_env), ("policy", check_policy), ("judge", check_judge),
    ("farm, reward, loop, sampling", check_settings), ("trainer", check_trainer), ("trainer memory", check_memory),
    ("run: checkpoints, loggers", check_run),
)


def check_config(cfg: DictConfig, planned: dict[str, Any] | None = None) -> list[Check]:
    """Every check for one launcher config: rollout.build's plan of each component (the same functions a run calls),
    and what can be built without model weights (an env, the server policy's client, the judge). `planned`, when
    given, receives each component's plan by name (run, env, policy, judge, trainer, settings)."""
    found = planned if planned is not None else {}
    try:
        run = found["run"] = build.plan_run_settings(cfg)
    except Exception as exc:
        return [Check("run", False, f"{type(exc).__name__}: {exc}")]
    p = Planned(cfg, run, found)
    checks: list[Check] = []
    for name, fn in CHECKS:
        _run(checks, name, lambda fn=fn: fn(p))
    return checks


def dry_run_main(cfg: DictConfig) -> int:
    """Print the checks of this config (or of every arm of its experiment); 0 if all pass, else 2."""
    console = Console(width=None if Console().is_terminal else 160)
    groups: list[tuple[str, list[Check]]] = []
    experiment = cfg.get("experiment")
    if experiment is not None and experiment.get("arms"):
        spec = ExperimentSpec.from_config(experiment)
        base = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
        jobs = plan_runs(spec, base, Path(cfg.run.out_dir), str(cfg.run.name))
        seen: set[str] = set()
        for job in jobs:
            if job.arm in seen:
                continue  # the seeds of an arm differ only in run.*
            seen.add(job.arm)
            groups.append((f"arm {job.arm}", check_config(OmegaConf.create(compose_run(job.overrides)))))
    else:
        groups.append(("run", check_config(cfg)))
    ok = all(c.ok for _, checks in groups for c in checks)
    table = Table(title=f"dry run: {'all checks pass' if ok else 'PROBLEMS FOUND'} (nothing was started)")
    table.add_column("config")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for name, checks in groups:
        for c in checks:
            table.add_row(name, c.name, "ok" if c.ok else "FAILED", escape(c.detail))  # `[...]` is not markup
    console.print(table)
    return 0 if ok else 2


__all__ = ["Check", "check_config", "check_model_dir", "dry_run_main"]
