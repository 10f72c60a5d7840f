"""Build the configured policy. `local`: a tiny Qwen3 warm-started on the env's demonstrations (cached on disk)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

import envs
from envs.cache import cache_dir
from rollout.config import plain

log = logging.getLogger(__name__)


def demonstrations(
    env_name: str, env_kwargs: dict[str, Any], tasks: list[dict], limit: int, options: dict[str, Any] | None = None
) -> list[list[dict]]:
    """Reference conversations from an env built with the run's own settings (its tools and prompts); `options` go to
    `env.demonstration(task, **options)` (e.g. toolcall chain tasks' `noise`)."""
    env = envs.make(env_name, **env_kwargs)
    try:
        demo = getattr(env, "demonstration", None)
        if demo is None:
            return []
        return [demo(t, **(options or {})) for t in tasks[:limit]]
    finally:
        env.close()


def demonstration_label_rates(env_name: str, tasks: list[dict], convs: list[list[dict]]) -> dict[int, dict[str, float]]:
    """Per assistant-turn index, the fraction of each step label (envs with `demonstration_labels`, else {})."""
    from collections import Counter

    labeler = getattr(envs.env_class(env_name), "demonstration_labels", None)
    if labeler is None:
        return {}
    counts: dict[int, Counter] = {}
    for task, conv in zip(tasks, convs):
        for i, label in enumerate(labeler(task, conv) or []):
            counts.setdefault(i, Counter())[label] += 1
    return {i: {k: n / sum(c.values()) for k, n in sorted(c.items())} for i, c in sorted(counts.items())}


def build_local_policy(pcfg: DictConfig, env_name: str, env_kwargs: dict[str, Any], train_tasks: list[dict],
                       seed: int = 0):
    """(policy, trainable model copy, tokenizer, summary dict) for `policy=local`."""
    from rollout.policy.local import LocalPolicy, LocalPolicyConfig
    from rollout.policy.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
    from train.sft import SFTConfig
    from train.warmstart import SFTStage, WarmStartConfig, warm_start

    if pcfg.get("num_threads"):  # before the warm start too: on a busy CPU extra OpenMP threads slow SFT many-fold
        import torch

        torch.set_num_threads(int(pcfg.num_threads))
    ws = plain(pcfg.warm_start)
    if ws.get("seed") is not None:  # a fixed SFT start shared by runs of different seeds (experiments)
        seed_sft = int(ws["seed"])
    else:
        seed_sft = seed
    model_cfg = plain(pcfg.model)
    digits = str(plain(pcfg.get("tokenizer")).get("digits", "single"))
    limit = int(ws.get("max_conversations", 2000))
    convs = demonstrations(env_name, env_kwargs, train_tasks, limit, ws.get("demonstrations"))
    skipped = None
    if ws.get("enabled", True) and not convs:
        # a minimal plugin (reset, step, close, tasks) runs under the default command: RL from an untrained tiny model
        skipped = (f"env {env_name!r} has no demonstration(task) method, so the tiny model starts untrained (add "
                   "demonstration() to the env for an SFT start)")
        log.warning("local policy: warm start skipped: %s", skipped)
    if ws.get("enabled", True) and convs:
        stages, labels = [], {"sft": demonstration_label_rates(env_name, train_tasks[:limit], convs)}
        for i, st in enumerate(ws.get("stages") or []):
            name = str(st.get("name") or f"stage{i + 1}")
            start = int(st.get("offset", 0))
            tasks = train_tasks[start : start + int(st.get("max_conversations", limit))]
            stage_convs = demonstrations(env_name, env_kwargs, tasks, len(tasks), st.get("demonstrations"))
            stages.append(SFTStage(stage_convs, SFTConfig(**{**st.get("sft", {}), "seed": seed_sft}), name))
            labels[name] = demonstration_label_rates(env_name, tasks, stage_convs)
        wcfg = WarmStartConfig(**model_cfg, digits=digits, seed=seed_sft,
                               sft=SFTConfig(**ws.get("sft", {}), seed=seed_sft))
        cache = Path(ws["cache_dir"]).expanduser() if ws.get("cache_dir") else cache_dir("warmstart")
        model, tokenizer, info = warm_start(convs, wcfg, cache, stages)
        summary = {
            "cache": "hit" if info.cache_hit else "trained",
            "seconds": round(info.seconds, 1),
            "params": info.params,
            "conversations": sum(s.get("conversations", 0) for s in info.stages) or info.conversations,
            "final SFT loss": info.sft.get("final_loss"),
            # written to warm_start.json by the launcher (not printed): what the SFT saw and did, stage by stage
            "_details": {"path": info.path, "key": info.key, "stages": info.stages, "demonstration_labels": labels,
                         "train_seconds": info.train_seconds, "vocab_size": info.vocab_size},
        }
    else:
        texts = [render_chat(c) for c in convs] or [str(t) for t in train_tasks]
        tokenizer = build_tokenizer(texts, vocab_size=int(model_cfg.pop("vocab_size", 1024)), digits=digits)
        config = tiny_qwen3_config(len(tokenizer), **model_cfg, pad_token_id=tokenizer.pad_token_id,
                                   eos_token_id=tokenizer.eos_token_id)
        model = build_model(config, seed=seed_sft)
        summary = {"cache": "off (random init)", "params": sum(p.numel() for p in model.parameters())}
        if skipped:
            summary["skipped"] = skipped  # in warm_start.json and the run summary
    policy_cfg = LocalPolicyConfig(max_batch=int(pcfg.max_batch), max_prompt_tokens=int(pcfg.max_prompt_tokens),
                                   seed=seed, num_threads=pcfg.get("num_threads"))
    policy = LocalPolicy(copy.deepcopy(model), tokenizer, policy_cfg)
    log.info("local policy: %s", summary)
    return policy, model, tokenizer, summary

