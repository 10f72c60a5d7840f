"""The servers' next checkpoint from an in-memory state dict: the shared export step of the server policies' weight
syncs (sglang, vllm, openai) when the trainer hands over a state dict rather than a directory."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.policy.base import WeightUpdate


#: files of an HF model directory that describe the model (not weights); copied next to exported weights
MODEL_FILES = ("config.json", "generation_config.json")


async def export_update(update: WeightUpdate, cfg: Any) -> str:
    """Write `update.state_dict` under `cfg.weights_dir` (off the event loop) as the servers' next checkpoint: the
    shared step of the server policies' (sglang, openai) weight syncs. `cfg` has weights_dir, model_path and
    keep_weight_versions."""
    return await asyncio.to_thread(
        export_checkpoint,
        update.state_dict,
        Path(cfg.weights_dir),
        update.version,
        cfg.model_path,
        cfg.keep_weight_versions,
    )


def export_checkpoint(
    state_dict: Mapping[str, Any], root: Path, version: int, model_path: str | None = None, keep: int = 2
) -> str:
    """Write `state_dict` as `root/v<version>/model.safetensors` (shared tensors saved once); returns the directory."""
    from safetensors.torch import save_file

    out = root / f"v{version}"
    tmp = root / f".v{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    seen: set[int] = set()
    tensors = {}
    for k, v in state_dict.items():  # tied embeddings: keep the first name (HF drops lm_head.weight the same way)
        ptr = v.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        tensors[k] = v.detach().to("cpu").contiguous()
    save_file(tensors, str(tmp / "model.safetensors"))
    for name in MODEL_FILES if model_path else ():
        src = Path(model_path) / name
        if src.is_file():
            shutil.copy2(src, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # servers never see a half-written checkpoint
    old = sorted((p for p in root.glob("v*") if p.is_dir() and p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
    for p in old[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    return str(out)
