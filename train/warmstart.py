"""Warm start: tokenizer + tiny Qwen3 + SFT on demonstrations, cached on disk by a hash of everything that shapes it.

The first call trains (tokenizer ~1 s, SFT ~1 min for ~1-2k short conversations on 2 CPU cores) and saves model and
tokenizer in HF format under `cache_dir/warmstart-<key>/`; a later call with the same config and conversations loads
them in about a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rollout.policy.tiny import build_model, build_tokenizer, clean_messages, render_chat, tiny_qwen3_config
from train.sft import SFTConfig, sft

log = logging.getLogger(__name__)

#: Bump when the tokenizer, template, model init or SFT change in a way that should invalidate cached warm starts.
CACHE_FORMAT = 1
INFO_FILE = "warmstart.json"


@dataclass
class WarmStartConfig:
    vocab_size: int = 1024  # upper bound; the model gets exactly the tokenizer's size
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    seed: int = 0
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        if isinstance(self.sft, Mapping):  # from a config file
            self.sft = SFTConfig(**self.sft)

    def cache_fields(self) -> dict[str, Any]:
        """What decides the result (display-only settings such as the progress bar are left out)."""
        d = asdict(self)
        d["sft"].pop("progress", None)
        return d


@dataclass
class WarmStartInfo:
    cache_hit: bool
    path: str
    key: str
    seconds: float  # this call
    params: int
    vocab_size: int
    conversations: int
    sft: dict[str, Any]  # metrics of the SFT run that produced the weights (SFTResult.as_dict)
    train_seconds: float  # how long building + SFT took when the cache entry was made


def cache_key(conversations: Sequence[Sequence[Mapping[str, Any]]], cfg: WarmStartConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "cfg": cfg.cache_fields()}, sort_keys=True).encode())
    for conv in conversations:
        h.update(json.dumps(clean_messages(conv), sort_keys=True, default=str, ensure_ascii=False).encode())
        h.update(b"\x00")
    return h.hexdigest()[:20]


def warm_start(
    conversations: Sequence[Sequence[Mapping[str, Any]]], cfg: WarmStartConfig | None, cache_dir: str | Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, WarmStartInfo]:
    """(model, tokenizer, info) trained on `conversations`, from the cache when the same inputs were seen before."""
    cfg = cfg or WarmStartConfig()
    if not conversations:
        raise ValueError("warm_start needs at least one conversation")
    t0 = time.perf_counter()
    key = cache_key(conversations, cfg)
    path = Path(cache_dir) / f"warmstart-{key}"
    if (path / INFO_FILE).exists():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        stored = json.loads((path / INFO_FILE).read_text())
        info = WarmStartInfo(cache_hit=True, path=str(path), key=key, seconds=time.perf_counter() - t0, **stored)
        log.info("warm start loaded from %s in %.1f s", path, info.seconds)
        return model, tokenizer, info

    tokenizer = build_tokenizer((render_chat(c) for c in conversations), vocab_size=cfg.vocab_size)
    config = tiny_qwen3_config(
        len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = build_model(config, seed=cfg.seed)
    result = sft(model, tokenizer, conversations, cfg.sft)
    stored = {
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "conversations": len(conversations),
        "sft": result.as_dict(),
        "train_seconds": time.perf_counter() - t0,
    }
    _save_atomically(path, model, tokenizer, {**stored, "key": key, "config": cfg.cache_fields()})
    info = WarmStartInfo(cache_hit=False, path=str(path), key=key, seconds=time.perf_counter() - t0, **stored)
    log.info("warm start trained in %.1f s (final SFT loss %.4f), saved to %s", info.seconds, result.losses[-1], path)
    return model, tokenizer, info


def _save_atomically(
    path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, info: dict[str, Any]
) -> None:
    """Write into a temporary sibling and rename, so a crash or a concurrent run never leaves half an entry."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    stored = {k: info[k] for k in ("params", "vocab_size", "conversations", "sft", "train_seconds")}
    (tmp / INFO_FILE).write_text(json.dumps(stored, indent=2))
    (tmp / "warmstart_config.json").write_text(json.dumps({"key": info["key"], "config": info["config"]}, indent=2))
    try:
        os.replace(tmp, path)
    except OSError:  # another process saved the same entry first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["CACHE_FORMAT", "WarmStartConfig", "WarmStartInfo", "cache_key", "warm_start"]
