"""`python -m rollout.launch env=<name> [group=option ...] [key=value ...]`: build everything from config and run.

Builds (farm, policy, judge, trainer) from the Hydra config, runs the rollout <-> train loop (train/loop.py), and writes
`outputs/<run>/` with the resolved `config.yaml`, `trajectories.jsonl`, `episodes.jsonl` and `metrics.jsonl`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import envs
from envs.taskfile import load_tasks
from prm.judge import Judge
from rollout.config import dataclass_from, open_dict_overrides, plain
from rollout.farm import FarmConfig, make_farm
from rollout.policy.base import SamplingParams
from rollout.progress import LiveProgress, print_summary
from train.backends import Trainer
from train.batch import RewardConfig
from train.loop import LoopConfig, RLLoop, RunWriter, TrainingFailed

log = logging.getLogger("nextstate")

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
# read by the launcher; every other env key goes to the constructor
ENV_LAUNCH_KEYS = ("name", "tasks", "eval_tasks", "tasks_format", "eval_tasks_format", "holdout_fraction",
                   "holdout_seed")


def register_plugin_configs() -> None:
    """Give every plugin env without a configs/env/<name>.yaml a default config node, so `env=<plugin>` works."""
    cs = ConfigStore.instance()
    for name in envs.names():
        if not (CONFIG_DIR / "env" / f"{name}.yaml").exists():
            cs.store(group="env", name=name, node={"name": name, "tasks": None, "eval_tasks": None})


def task_set_options(cls: Any, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The env options that its `tasks()` also takes (e.g. toolcall's `task_set`): they select the bundled set."""
    try:
        params = inspect.signature(cls.tasks).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in env_kwargs.items() if k in params and k != "split"}


def env_setup(env_cfg: DictConfig) -> tuple[str, dict[str, Any], list[dict], list[dict]]:
    """(name, constructor kwargs, train tasks, eval tasks) from the env config."""
    data = plain(env_cfg)
    name = data["name"]
    cls = envs.env_class(name)
    validate = getattr(cls, "validate_task", None)
    kwargs = {k: v for k, v in data.items() if k not in ENV_LAUNCH_KEYS}
    picks = task_set_options(cls, kwargs)
    train = (load_task_source(cls, data["tasks"], data.get("tasks_format"), validate) if data.get("tasks")
             else [dict(t) for t in cls.tasks("train", **picks)])
    evals = (load_task_source(cls, data["eval_tasks"], data.get("eval_tasks_format"), validate)
             if data.get("eval_tasks") else [dict(t) for t in cls.tasks("eval", **picks)])
    if data.get("holdout_fraction"):  # a held-out split of the training tasks replaces the eval tasks
        if data.get("eval_tasks"):
            raise ValueError("env.holdout_fraction splits env.tasks into train and eval: leave env.eval_tasks null")
        train, evals = holdout_split(train, float(data["holdout_fraction"]), int(data.get("holdout_seed") or 0))
    return name, kwargs, train, evals


def holdout_split(tasks: list[dict], fraction: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, held out): each task goes by a hash of (seed, id), so the split does not depend on file order."""
    import hashlib

    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in (0, 1), got {fraction}")
    train, held = [], []
    for t in tasks:
        h = int.from_bytes(hashlib.sha256(f"{seed}:{t['id']}".encode()).digest()[:8], "big") / 2**64
        (held if h < fraction else train).append(t)
    if not train or not held:
        raise ValueError(f"holdout_fraction={fraction} leaves an empty split of {len(tasks)} tasks")
    return train, held


def load_task_source(cls: Any, path: str, fmt: str | None, validate: Any) -> list[dict]:
    """A task file: the generic JSON / JSONL / parquet reader, or one of the env's named formats (`tasks_format`,
    e.g. toolcall's dapo_math / aime) through its `load_task_file(path, fmt)`."""
    if not fmt:
        return load_tasks(path, validate)
    loader = getattr(cls, "load_task_file", None)
    if loader is None:
        raise ValueError(f"{cls.__name__} reads no named task formats (tasks_format={fmt!r}); drop the option")
    tasks = loader(path, fmt)
    return [validate(dict(t)) if validate else dict(t) for t in tasks]


def build_judge(cfg: DictConfig) -> Judge | None:
    """judge.type: rule (embedded default) | llm (judge.url=http://host:port/v1) | ensemble | none.

    `judge.accuracy` < 1 wraps any of them in a NoisyJudge (each vote wrong with probability 1 - accuracy, seeded by
    `judge.noise_seed`): experiments on what judge errors cost."""
    from prm.factory import make_judge

    data = plain(cfg)
    accuracy = float(data.pop("accuracy", 1.0))
    noise_seed = int(data.pop("noise_seed", 0))
    exact_on_parse_errors = bool(data.pop("noise_exact_on_parse_errors", False))
    judge = make_judge(data)
    if judge is not None and accuracy < 1.0:
        from prm.noisy import NoisyJudge

        judge = NoisyJudge(
            judge,
            accuracy,
            seed=noise_seed,
            aggregate_mode=data.get("aggregate", "mean"),
            exact_on_parse_errors=exact_on_parse_errors,
        )
    return judge


class NoTrainer:
    """Stands in for a trainer when a server policy has no local weights to train (evaluation-only runs)."""

    version = 0

    def train_step(self, batch: Any) -> dict[str, float]:
        raise RuntimeError(
            "no trainer: set policy.model_path to the served model's HF directory to train "
            "(or loop.iterations=0 to only evaluate)"
        )

    def state_dict(self) -> dict[str, Any]:
        return self.train_step(None)

    def export_weights(self, path: str) -> str:
        return self.train_step(None)


def build_server_policy_and_trainer(cfg: DictConfig):
    """policy=sglang|openai: the HTTP policy, and the configured trainer on policy.model_path (the served weights)."""
    from rollout.policy.factory import make_server_policy

    pdict = plain(cfg.policy)
    if pdict.get("weights_dir") is None:  # where trained weights go for the servers to load (they must read it)
        pdict["weights_dir"] = str((Path(cfg.run.out_dir) / "weights").resolve())
    policy = make_server_policy(pdict)
    if not pdict.get("model_path"):
        return policy, NoTrainer(), {}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(pdict["model_path"])
    tokenizer = AutoTokenizer.from_pretrained(pdict.get("tokenizer") or pdict["model_path"])
    return policy, build_trainer(cfg.trainer, model, tokenizer, float(cfg.sampling.temperature)), {}


TRAINER_BACKENDS = ("torch", "megatron")


def build_trainer(tcfg: Any, model: Any, tokenizer: Any, temperature: float) -> Trainer:
    """trainer.backend: torch (TorchTrainer on `model`) | megatron (MegatronTrainer converted from `model`'s weights).

    Both start from the same HF weights and compute logprobs at the sampling temperature, so the same batch gives the
    same loss on either backend (tests/test_cross_backend.py)."""
    data = plain(tcfg)
    backend = data.pop("backend", "torch")
    if backend == "torch":
        from train.backends.torch_backend import TorchTrainer, TorchTrainerConfig

        return TorchTrainer(model, dataclass_from(TorchTrainerConfig, data, temperature=temperature), tokenizer)
    if backend == "megatron":
        from train.backends.megatron_backend import MegatronTrainer, MegatronTrainerConfig

        if data.get("pad_token_id") is None:  # null: the tokenizer's (padding is right-side and masked either way)
            data.pop("pad_token_id", None)
            if tokenizer is not None and tokenizer.pad_token_id is not None:
                data["pad_token_id"] = int(tokenizer.pad_token_id)
        cfg = MegatronTrainerConfig.from_mapping({**data, "temperature": temperature})
        return MegatronTrainer.from_hf_model(model, cfg)
    raise ValueError(f"trainer.backend={backend!r} is not available; known: {', '.join(TRAINER_BACKENDS)}")


def build_policy_and_trainer(cfg: DictConfig, env_name: str, env_kwargs: dict[str, Any], train_tasks: list[dict]):
    """The policy and a trainer holding its own copy of the weights."""
    pcfg = cfg.policy
    if pcfg.type in ("sglang", "openai"):
        return build_server_policy_and_trainer(cfg)
    if pcfg.type != "local":
        raise ValueError(f"policy.type={pcfg.type!r} is not available; known: local, sglang, openai")
    from rollout.policy.build import build_local_policy

    policy, model, tokenizer, info = build_local_policy(pcfg, env_name, env_kwargs, train_tasks, int(cfg.run.seed))
    return policy, build_trainer(cfg.trainer, model, tokenizer, float(cfg.sampling.temperature)), info


async def run(cfg: DictConfig) -> int:
    out_dir = Path(cfg.run.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    env_name, env_kwargs, train_tasks, eval_tasks = env_setup(cfg.env)
    farm_cfg = dataclass_from(FarmConfig, cfg.farm)
    reward_cfg = dataclass_from(RewardConfig, cfg.reward)
    in_eval = {"eval_judge": bool(cfg.judge.in_eval)} if cfg.judge.get("in_eval") is not None else {}
    loop_cfg = dataclass_from(LoopConfig, cfg.loop, seed=int(cfg.run.seed), **in_eval)  # judge.in_eval: judge evals
    if loop_cfg.weights_dir is None and cfg.policy.get("weights_dir"):  # disk sync goes where the servers read
        loop_cfg.weights_dir = str(cfg.policy.weights_dir)
    sampling = dataclass_from(SamplingParams, cfg.sampling)
    log.info("run %s: env=%s (%d train / %d eval tasks), farm=%s, output %s", cfg.run.name, env_name, len(train_tasks),
             len(eval_tasks), farm_cfg.backend, out_dir)
    with LiveProgress() as progress:
        policy, trainer, warm_info = build_policy_and_trainer(cfg, env_name, env_kwargs, train_tasks)
        if warm_info:
            (out_dir / "warm_start.json").write_text(json.dumps(warm_info, indent=2, default=str))
        judge = build_judge(cfg.judge)
        farm = make_farm(env_name, env_kwargs, farm_cfg)
        writer = RunWriter(out_dir, loop_cfg.record_token_ids)
        try:
            await farm.start()
            loop = RLLoop(
                farm=farm, policy=policy, judge=judge, trainer=trainer, reward_cfg=reward_cfg, loop_cfg=loop_cfg,
                sampling=sampling, run_id=str(cfg.run.name), train_tasks=train_tasks, eval_tasks=eval_tasks,
                writer=writer, progress=progress.update,
            )
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
            close_trainer = getattr(trainer, "close", None)
            if close_trainer is not None:
                close_trainer()  # megatron: its process group and parallel state
    print_summary(summary, out_dir, warm_info)
    return 0


@hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="launch")
def main(cfg: DictConfig) -> None:
    logging.getLogger().setLevel(cfg.get("log_level", "INFO"))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per judge / policy request otherwise
    if cfg.run.get("dry_run"):
        from rollout.dry_run import dry_run_main  # builds and checks everything but the model; runs nothing

        sys.exit(dry_run_main(cfg))
    experiment = cfg.get("experiment")
    if experiment is not None and experiment.get("arms"):
        from rollout.experiment import run_experiment  # every (seed, arm) is a run of `run` below

        sys.exit(run_experiment(cfg))
    sys.exit(asyncio.run(run(cfg)))


register_plugin_configs()

if __name__ == "__main__":
    sys.argv[1:] = open_dict_overrides(sys.argv[1:])  # `farm.worker_resources={docker: 1}` works as written
    main()
