"""Build the configured policy. `local`: a tiny Qwen3 warm-started on the env's demonstrations (cached on disk)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

import envs
from rollout.config import plain

log = logging.getLogger(__name__)


def demonstrations(env_name: str, env_kwargs: dict[str, Any], tasks: list[dict], limit: int) -> list[list[dict]]:
    """Reference conversations from an env built with the run's own settings (its tools and prompts)."""
    env = envs.make(env_name, **env_kwargs)
    try:
        demo = getattr(env, "demonstration", None)
        if demo is None:
            return []
        return [demo(t) for t in tasks[:limit]]
    finally:
        env.close()


def build_local_policy(pcfg: DictConfig, env_name: str, env_kwargs: dict[str, Any], train_tasks: list[dict],
                       seed: int = 0):
    """(policy, trainable model copy, tokenizer, summary dict) for `policy=local`."""
    from rollout.policy.local import LocalPolicy, LocalPolicyConfig
    from rollout.policy.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
    from train.sft import SFTConfig
    from train.warmstart import WarmStartConfig, warm_start

    ws = plain(pcfg.warm_start)
    model_cfg = plain(pcfg.model)
    if pcfg.get("num_threads"):
        import torch

        # set before SFT: the warm start, the sampler and the trainer all run in this process, and a tiny model gains
        # nothing from intra-op threads, while OpenMP threads spinning on a busy CPU cost up to 10x (measured here)
        torch.set_num_threads(int(pcfg.num_threads))
    convs = demonstrations(env_name, env_kwargs, train_tasks, int(ws.get("max_conversations", 2000)))
    if ws.get("enabled", True):
        if not convs:
            raise ValueError(
                f"env {env_name!r} has no demonstration(task) method, so the local policy cannot be warm-started; "
                "add one to the env or run with policy.warm_start.enabled=false (a random tiny model)"
            )
        wcfg = WarmStartConfig(**model_cfg, seed=seed, sft=SFTConfig(**ws.get("sft", {}), seed=seed))
        model, tokenizer, info = warm_start(convs, wcfg, Path(ws["cache_dir"]).expanduser())
        summary = {
            "cache": "hit" if info.cache_hit else "trained",
            "seconds": round(info.seconds, 1),
            "params": info.params,
            "conversations": info.conversations,
        }
    else:
        texts = [render_chat(c) for c in convs] or [str(t) for t in train_tasks]
        tokenizer = build_tokenizer(texts, vocab_size=int(model_cfg.pop("vocab_size", 1024)))
        config = tiny_qwen3_config(len(tokenizer), **model_cfg, pad_token_id=tokenizer.pad_token_id,
                                   eos_token_id=tokenizer.eos_token_id)
        model = build_model(config, seed=seed)
        summary = {"cache": "off (random init)", "params": sum(p.numel() for p in model.parameters())}
    policy_cfg = LocalPolicyConfig(max_batch=int(pcfg.max_batch), max_prompt_tokens=int(pcfg.max_prompt_tokens),
                                   seed=seed, num_threads=pcfg.get("num_threads"))
    policy = LocalPolicy(copy.deepcopy(model), tokenizer, policy_cfg)
    log.info("local policy: %s", summary)
    return policy, model, tokenizer, summary

