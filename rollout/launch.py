"""`python -m rollout.launch env=<name> [group=option ...] [key=value ...]`: build everything from config and run.

Builds (farm, policy, judge, trainer) from the Hydra config, runs the rollout <-> train loop (train/loop.py), and writes
`outputs/<run>/` with the resolved `config.yaml`, `trajectories.jsonl`, `episodes.jsonl` and `metrics.jsonl`.
"""

from __future__ import annotations

import asyncio
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
from rollout.config import dataclass_from, plain
from rollout.farm import FarmConfig, make_farm
from rollout.policy.base import SamplingParams
from rollout.progress import LiveProgress, print_summary
from train.backends import Trainer
from train.batch import RewardConfig
from train.loop import LoopConfig, RLLoop, RunWriter, TrainingFailed

log = logging.getLogger("nextstate")

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
ENV_LAUNCH_KEYS = ("name", "tasks", "eval_tasks")  # read by the launcher; every other env key goes to the constructor


def register_plugin_configs() -> None:
    """Give every plugin env without a configs/env/<name>.yaml a default config node, so `env=<plugin>` works."""
    cs = ConfigStore.instance()
    for name in envs.names():
        if not (CONFIG_DIR / "env" / f"{name}.yaml").exists():
            cs.store(group="env", name=name, node={"name": name, "tasks": None, "eval_tasks": None})


def env_setup(env_cfg: DictConfig) -> tuple[str, dict[str, Any], list[dict], list[dict]]:
    """(name, constructor kwargs, train tasks, eval tasks) from the env config."""
    data = plain(env_cfg)
    name = data["name"]
    cls = envs.env_class(name)
    validate = getattr(cls, "validate_task", None)
    train = load_tasks(data["tasks"], validate) if data.get("tasks") else [dict(t) for t in cls.tasks("train")]
    evals = load_tasks(data["eval_tasks"], validate) if data.get("eval_tasks") else [dict(t) for t in cls.tasks("eval")]
    kwargs = {k: v for k, v in data.items() if k not in ENV_LAUNCH_KEYS}
    return name, kwargs, train, evals


def build_judge(cfg: DictConfig) -> Judge | None:
    """judge.type: rule (embedded default) | llm (judge.url=http://host:port/v1) | ensemble | none."""
    from prm.factory import make_judge

    return make_judge(plain(cfg))


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
    sys.exit(asyncio.run(run(cfg)))


register_plugin_configs()

if __name__ == "__main__":
    main()
