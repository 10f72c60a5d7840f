"""Warm start: tokenizer + tiny Qwen3 + SFT on demonstrations, cached on disk by a hash of everything that shapes it.

The first call trains (tokenizer ~1 s, SFT ~1 min for ~1-2k short conversations on 2 CPU cores) and saves model and
tokenizer in HF format under `cache_dir/warmstart-<key>/`; a later call with the same config and conversations loads
them in about a second.

Further SFT stages (`stages`: e.g. clean demonstrations first, then noisy ones) continue from the previous stage's
weights; each stage is its own cache entry keyed by the previous entry's key and the stage's inputs, so two warm starts
that share their first stages train those once. Building an entry holds a lock file (`cache_dir/.locks/<key>`), so
concurrent runs with the same inputs train it once and the others load it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from train.tiny import build_model, build_tokenizer, clean_messages, render_chat, tiny_qwen3_config
from train.config import SFTConfig, WarmStartConfig, sft_cache_fields
from train.sft import sft

log = logging.getLogger(__name__)

#: Bump when the tokenizer, template, model init or SFT change in a way that should invalidate cached warm starts.
CACHE_FORMAT = 1
INFO_FILE = "warmstart.json"


@dataclass
class SFTStage:
    """A further SFT pass on `conversations`, from the weights the previous stage left (same tokenizer)."""

    conversations: Sequence[Sequence[Mapping[str, Any]]]
    sft: SFTConfig = field(default_factory=SFTConfig)
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.sft, Mapping):
            self.sft = SFTConfig(**self.sft)
        if not self.conversations:
            raise ValueError(f"SFT stage {self.name!r} has no conversations")


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
    stages: list[dict[str, Any]] = field(default_factory=list)  # one entry per SFT stage: name, key, sft metrics


def _stage_key(previous: str, stage: SFTStage) -> str:
    h = hashlib.sha256()
    cfg = sft_cache_fields(stage.sft)
    h.update(json.dumps({"format": CACHE_FORMAT, "after": previous, "sft": cfg}, sort_keys=True).encode())
    for conv in stage.conversations:
        h.update(json.dumps(clean_messages(conv), sort_keys=True, default=str, ensure_ascii=False).encode())
        h.update(b"\x00")
    return h.hexdigest()[:20]


@contextlib.contextmanager
def _entry_lock(cache_dir: Path, key: str) -> Iterator[None]:
    """An exclusive lock on building entry `key` (flock: released by the kernel if the holder dies)."""
    locks = cache_dir / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / key, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load(path: Path, key: str, t0: float) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, WarmStartInfo]:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    stored = json.loads((path / INFO_FILE).read_text())
    info = WarmStartInfo(cache_hit=True, path=str(path), key=key, seconds=time.perf_counter() - t0, **stored)
    log.info("warm start loaded from %s in %.1f s", path, info.seconds)
    return model, tokenizer, info


def cache_key(conversations: Sequence[Sequence[Mapping[str, Any]]], cfg: WarmStartConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "cfg": cfg.cache_fields()}, sort_keys=True).encode())
    for conv in conversations:
        h.update(json.dumps(clean_messages(conv), sort_keys=True, default=str, ensure_ascii=False).encode())
        h.update(b"\x00")
    return h.hexdigest()[:20]


def warm_start(
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    cfg: WarmStartConfig | None,
    cache_dir: str | Path,
    stages: Sequence[SFTStage] = (),
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, WarmStartInfo]:
    """(model, tokenizer, info) trained on `conversations` (then on each of `stages` in turn), from the cache when the
    same inputs were seen before."""
    cfg = cfg or WarmStartConfig()
    if not conversations:
        raise ValueError("warm_start needs at least one conversation")
    t0 = time.perf_counter()
    cache_dir = Path(cache_dir)
    keys = [cache_key(conversations, cfg)]
    for stage in stages:
        keys.append(_stage_key(keys[-1], stage))
    paths = [cache_dir / f"warmstart-{k}" for k in keys]
    if (paths[-1] / INFO_FILE).exists():
        return _load(paths[-1], keys[-1], t0)

    done = max((i for i, p in enumerate(paths) if (p / INFO_FILE).exists()), default=-1)
    model: PreTrainedModel | None = None
    tokenizer: PreTrainedTokenizerBase | None = None
    stored: dict[str, Any] = {}
    if done >= 0:
        model, tokenizer, prefix = _load(paths[done], keys[done], t0)
        stored = {k: v for k, v in asdict(prefix).items() if k not in ("cache_hit", "path", "key", "seconds")}
    for i in range(done + 1, len(keys)):
        with _entry_lock(cache_dir, keys[i]):
            if (paths[i] / INFO_FILE).exists():  # another process built it while we waited
                model, tokenizer, info = _load(paths[i], keys[i], t0)
                stored = {k: v for k, v in asdict(info).items() if k not in ("cache_hit", "path", "key", "seconds")}
                continue
            t_entry = time.perf_counter()
            if i == 0:
                model, tokenizer, stored = _first_entry(conversations, cfg)
                stored["stages"] = [{"name": "sft", "key": keys[0], "conversations": len(conversations),
                                     "sft": stored["sft"]}]
            else:
                assert model is not None and tokenizer is not None
                stage = stages[i - 1]
                result = sft(model, tokenizer, stage.conversations, stage.sft)
                stored = {
                    **stored,
                    "sft": result.as_dict(),
                    "conversations": len(stage.conversations),
                    "train_seconds": stored.get("train_seconds", 0.0) + time.perf_counter() - t_entry,
                    "stages": [*stored.get("stages", []), {"name": stage.name or f"stage{i}", "key": keys[i],
                                                           "conversations": len(stage.conversations),
                                                           "sft": result.as_dict()}],
                }
            _save_atomically(paths[i], model, tokenizer, {**stored, "key": keys[i], "config": cfg.cache_fields()})
    assert model is not None and tokenizer is not None
    info = WarmStartInfo(cache_hit=done == len(keys) - 1, path=str(paths[-1]), key=keys[-1],
                         seconds=time.perf_counter() - t0, **stored)
    log.info("warm start ready in %.1f s (final SFT loss %s), at %s", info.seconds, info.sft.get("final_loss"),
             paths[-1])
    return model, tokenizer, info


def _first_entry(
    conversations: Sequence[Sequence[Mapping[str, Any]]], cfg: WarmStartConfig
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    t0 = time.perf_counter()
    tokenizer = build_tokenizer((render_chat(c) for c in conversations), vocab_size=cfg.vocab_size, digits=cfg.digits)
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
    return model, tokenizer, stored


def _save_atomically(
    path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, info: dict[str, Any]
) -> None:
    """Write into a temporary sibling and rename, so a crash or a concurrent run never leaves half an entry."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    stored = {k: info[k] for k in ("params", "vocab_size", "conversations", "sft", "train_seconds", "stages") if k in info}
    (tmp / INFO_FILE).write_text(json.dumps(stored, indent=2))
    (tmp / "warmstart_config.json").write_text(json.dumps({"key": info["key"], "config": info["config"]}, indent=2))
    try:
        os.replace(tmp, path)
    except OSError:  # another process saved the same entry first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["CACHE_FORMAT", "SFTStage", "WarmStartConfig", "WarmStartInfo", "cache_key", "warm_start"]
