"""`python -m rollout.launch ... run.dry_run=true`: build and check everything a run needs except the model.

Checks, each reported with what it found: the env and its task files (loaded and validated: e.g. DAPO-Math-17k parquet,
AIME JSONL), one env constructed and closed, the policy (server policies: the model directory's config and tokenizer
are read and the client is built, no request is sent; the local policy: its model / warm-start config), the judge
client, the trainer, farm, reward, loop and sampling settings. For an experiment (`experiment.arms`), every arm's
composed config is checked the same way. Exit status 0 when every check passes, 2 otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rollout.config import dataclass_from, plain

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
    import json

    arch = json.loads((p / "config.json").read_text()).get("architectures", ["?"])
    weights = sorted(f.name for f in p.glob("*.safetensors")) or sorted(f.name for f in p.glob("*.bin"))
    if not weights:
        raise FileNotFoundError(f"{what}={path} has no *.safetensors or *.bin weight files")
    return f"{p} ({', '.join(arch)}; {len(weights)} weight file(s), not loaded)"


def check_config(cfg: DictConfig) -> list[Check]:
    """Every check for one launcher config."""
    from rollout.launch import build_judge, env_setup

    checks: list[Check] = []
    env_info: dict[str, Any] = {}

    def env_check() -> str:
        import envs

        name, kwargs, train, evals = env_setup(cfg.env)
        env = envs.make(name, **kwargs)
        env.close()
        env_info.update(name=name, kwargs=kwargs)
        src = plain(cfg.env)
        held = src.get("holdout_fraction")
        eval_src = f"a held-out {held:g} of those" if held else (src.get("eval_tasks") or "bundled")
        where = f"train {src.get('tasks') or 'bundled'}, eval {eval_src}"
        return f"{name}: {len(train)} train / {len(evals)} eval tasks ({where}); env constructed and closed"

    _run(checks, "env and task files", env_check)

    def policy_check() -> str:
        pcfg = plain(cfg.policy)
        kind = pcfg.get("type")
        if kind in ("sglang", "openai"):
            from rollout.policy.factory import make_server_policy

            detail = check_model_dir(pcfg.get("tokenizer") or pcfg.get("model_path"))
            if not pcfg.get("urls") and not pcfg.get("url"):
                raise ValueError("policy.urls is empty: the server URL(s)")
            pcfg.setdefault("weights_dir", str(Path(cfg.run.out_dir) / "weights"))
            policy = make_server_policy(pcfg)
            asyncio.run(policy.close())
            return f"{kind} client for {pcfg.get('urls') or pcfg.get('url')}; model {detail}"
        if kind == "local":
            from rollout.policy.local import LocalPolicyConfig
            from train.sft import SFTConfig

            ws = pcfg.get("warm_start", {})
            SFTConfig(**ws.get("sft", {}))
            for st in ws.get("stages") or []:
                SFTConfig(**st.get("sft", {}))
            LocalPolicyConfig(max_batch=int(pcfg["max_batch"]), max_prompt_tokens=int(pcfg["max_prompt_tokens"]))
            m = pcfg.get("model", {})
            return (f"local tiny Qwen3 (hidden {m.get('hidden_size')}, {m.get('num_layers')} layers), "
                    f"{1 + len(ws.get('stages') or [])} SFT stage(s), not built")
        raise ValueError(f"policy.type={kind!r}: known local, sglang, openai")

    _run(checks, "policy", policy_check)

    def judge_check() -> str:
        judge = build_judge(cfg.judge)
        if judge is None:
            return "no judge"
        close = getattr(judge, "close", None)
        if close is not None:
            asyncio.run(close())
        j = plain(cfg.judge)
        extra = f", url {j.get('url') or j.get('urls')}, m={j.get('m')}, T={j.get('temperature')}" if j.get(
            "type") in ("llm", "ensemble") else ""
        return f"{type(judge).__name__}{extra}"

    _run(checks, "judge", judge_check)

    def trainer_check() -> str:
        t = plain(cfg.trainer)
        backend = t.pop("backend", "torch")
        if backend == "torch":
            from train.backends.torch_backend import TorchTrainerConfig

            tc = dataclass_from(TorchTrainerConfig, t, temperature=float(cfg.sampling.temperature))
            return (f"torch: lr {tc.lr}, weight decay {tc.weight_decay}, betas {tc.betas}, KL {tc.kl_coef}, clip "
                    f"{tc.clip_low}/{tc.clip_high} (model not built)")
        if backend == "megatron":
            from train.backends.megatron_backend import MegatronTrainerConfig

            mc = MegatronTrainerConfig.from_mapping({**t, "temperature": float(cfg.sampling.temperature)})
            return (f"megatron: lr {mc.lr}, weight decay {mc.weight_decay}, betas {mc.betas}, KL {mc.kl_coef}, clip "
                    f"{mc.clip_low}/{mc.clip_high}, bf16 {mc.bf16}, TP {mc.tp_size}, device {mc.device} (model not "
                    "built)")
        raise ValueError(f"trainer.backend={backend!r}: known torch, megatron")

    _run(checks, "trainer", trainer_check)

    def settings_check() -> str:
        from rollout.farm import FarmConfig
        from rollout.loop import LoopConfig
        from rollout.policy.base import SamplingParams
        from train.batch import RewardConfig

        dataclass_from(FarmConfig, cfg.farm)
        r = dataclass_from(RewardConfig, cfg.reward)
        loop = dataclass_from(LoopConfig, cfg.loop, seed=int(cfg.run.seed))
        s = dataclass_from(SamplingParams, cfg.sampling)
        return (f"reward {r.mode}; {loop.iterations} iterations of {loop.tasks_per_iteration} tasks x "
                f"{loop.samples_per_task} samples; eval {loop.eval_tasks} tasks x {loop.eval_samples} every "
                f"{loop.eval_every}; sampling T={s.temperature}, max_new_tokens={s.max_new_tokens}")

    _run(checks, "farm, reward, loop, sampling", settings_check)
    return checks


def dry_run_main(cfg: DictConfig) -> int:
    """Print the checks of this config (or of every arm of its experiment); 0 if all pass, else 2."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if Console().is_terminal else 160)
    groups: list[tuple[str, list[Check]]] = []
    experiment = cfg.get("experiment")
    if experiment is not None and experiment.get("arms"):
        from hydra.core.hydra_config import HydraConfig

        from rollout.experiment import ExperimentSpec, compose_run, plan_runs

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
            table.add_row(name, c.name, "ok" if c.ok else "FAILED", c.detail)
    console.print(table)
    return 0 if ok else 2


__all__ = ["Check", "check_config", "check_model_dir", "dry_run_main"]
