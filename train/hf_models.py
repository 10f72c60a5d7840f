"""Loading a Hugging Face model directory as the class it is: a causal LM (Qwen3, ...) or a vision-language model
(Qwen3-VL, ...), with its tokenizer or processor. The launcher, the trainer ranks and the policies all load through
here, so a VL checkpoint is never opened as a text model (transformers' AutoModelForCausalLM has no qwen3_vl entry)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_config(path: str | Path) -> dict[str, Any]:
    """The directory's config.json as a dict (no transformers import)."""
    return json.loads((Path(path) / "config.json").read_text())


def is_vision_config(config: dict[str, Any] | Any) -> bool:
    """A vision-language model: its config has a vision tower (`vision_config`)."""
    if isinstance(config, dict):
        return config.get("vision_config") is not None
    return getattr(config, "vision_config", None) is not None


def load_model(path: str | Path, dtype: Any = None) -> Any:
    """The model of an HF directory: AutoModelForImageTextToText for a vision-language config, else
    AutoModelForCausalLM; float32 unless `dtype` is given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cls = AutoModelForImageTextToText if is_vision_config(read_config(path)) else AutoModelForCausalLM
    return cls.from_pretrained(str(path), dtype=dtype or torch.float32)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a text model, the processor of a vision-language one (what is saved next to exported
    weights): transformers' own where it loads, else (Qwen-VL's needs torchvision for its video processor)
    train.vision.VisionProcessor, the tokenizer and the image processor."""
    from transformers import AutoProcessor, AutoTokenizer

    if (Path(path) / "config.json").is_file() and is_vision_config(read_config(path)):
        try:
            return AutoProcessor.from_pretrained(str(path))
        except ImportError:
            from train.vision import VisionProcessor

            return VisionProcessor.from_pretrained(path)
    return AutoTokenizer.from_pretrained(str(path))


def text_tokenizer(tokenizer_or_processor: Any) -> Any:
    """The text tokenizer of a tokenizer or a processor."""
    return getattr(tokenizer_or_processor, "tokenizer", tokenizer_or_processor)


__all__ = ["is_vision_config", "load_model", "load_tokenizer", "read_config", "text_tokenizer"]
