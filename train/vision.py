"""Prompts with images for a Qwen-VL policy: chat messages whose observations carry a screenshot become token ids with
image placeholders plus the processed images (`VisionInputs`), exactly as the model's own processor makes them.

The chat template renders an image content part as `<|vision_start|><|image_pad|><|vision_end|>`; the image processor
(Qwen2-VL's, resizing to a patch grid within its `max_pixels`) gives each image's patches and (t, h, w) grid; each
`<|image_pad|>` is then repeated t*h*w / merge_size**2 times (one per merged patch), which is what Qwen-VL's processor
and SGLang's multimodal processor do. The same ids and pixels go to the sampler and, through the training sample, to
the trainer, so both compute logprobs on exactly the same inputs.

`VisionProcessor` needs only a tokenizer and an image processor: transformers' Qwen3VLProcessor also wants a video
processor, which requires torchvision (not installed on CPU machines here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from train.config import VisionConfig
from train.records import VisionInputs

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
CONFIG_FILE = "vision_prompt.json"  # our options, next to the tokenizer and preprocessor_config.json


def to_pil(image: Any) -> Any:
    """An observation's image (H x W x 3 uint8 array, a PIL image, or PNG bytes) as an RGB PIL image."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, (bytes, bytearray)):
        import io

        return Image.open(io.BytesIO(image)).convert("RGB")
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"an observation image must be H x W x 3 uint8, got {arr.shape} {arr.dtype}")
    return Image.fromarray(arr)


def vision_messages(messages: Sequence[Mapping[str, Any]], max_images: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages with content parts for the chat template, and their images in order: the `max_images` latest messages
    that carry an "image" get an image part before their text; older ones keep only their text."""
    with_image = [i for i, m in enumerate(messages) if m.get("image") is not None]
    shown = set(with_image[-max_images:])
    out, images = [], []
    for i, m in enumerate(messages):
        d = {k: v for k, v in m.items() if k != "image"}
        if i in shown:
            d["content"] = [{"type": "image"}, {"type": "text", "text": str(m.get("content") or "")}]
            images.append(m["image"])
        out.append(d)
    return out, images


class VisionProcessor:
    """Tokenizer + image processor of a Qwen-VL model: `encode(text, images) -> (ids, VisionInputs | None)`."""

    def __init__(self, tokenizer: Any, image_processor: Any, options: VisionConfig | None = None):
        self.tokenizer, self.image_processor = tokenizer, image_processor
        self.options = options or VisionConfig(enabled=True)
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(IMAGE_PAD))
        if self.image_token_id == tokenizer.unk_token_id or self.image_token_id is None:
            raise ValueError(f"the tokenizer has no {IMAGE_PAD} token: not a vision-language tokenizer")
        self.merge = int(getattr(image_processor, "merge_size", 2))

    def __len__(self) -> int:
        return len(self.tokenizer)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> tuple[str, list]:
        """The chat-template text (one placeholder per shown image) and the images in order."""
        parts, images = vision_messages(messages, self.options.max_images)
        text = self.tokenizer.apply_chat_template(parts, add_generation_prompt=add_generation_prompt, tokenize=False)
        return text, images

    def encode(self, text: str, images: Sequence[Any]) -> tuple[list[int], VisionInputs | None]:
        """Token ids of `text` with every image placeholder expanded to its merged-patch count, and the images."""
        n_placeholders = text.count(IMAGE_PAD)
        if n_placeholders != len(images):
            raise ValueError(f"{n_placeholders} image placeholders for {len(images)} images")
        if not images:
            return list(self.tokenizer.encode(text, add_special_tokens=False)), None
        import torch

        # the image processor's own resolution (its preprocessor_config.json), as the model's servers use it
        out = self.image_processor(images=[to_pil(im) for im in images], return_tensors="pt")
        grid = torch.as_tensor(out["image_grid_thw"], dtype=torch.long)
        pieces = text.split(IMAGE_PAD)
        expanded = pieces[0]
        for g, rest in zip(grid, pieces[1:]):
            expanded += IMAGE_PAD * (int(g.prod()) // self.merge**2) + rest
        ids = list(self.tokenizer.encode(expanded, add_special_tokens=False))
        return ids, VisionInputs(torch.as_tensor(out["pixel_values"], dtype=torch.float32), grid)

    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int], VisionInputs | None]:
        """The prompt a policy continues: the messages (the latest screenshots shown) and the generation prompt."""
        return self.encode(*self.render(messages, add_generation_prompt=True))

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(str(path))
        self.image_processor.save_pretrained(str(path))
        (Path(path) / CONFIG_FILE).write_text(json.dumps(self.options.__dict__, indent=2))

    @classmethod
    def from_pretrained(cls, path: str | Path, options: VisionConfig | None = None) -> VisionProcessor:
        """From a model directory: its tokenizer, its preprocessor_config.json (transformers picks the PIL backend
        without torchvision) and our prompt options when saved there."""
        from transformers import AutoImageProcessor, AutoTokenizer

        saved = Path(path) / CONFIG_FILE
        if options is None and saved.is_file():
            options = VisionConfig(**json.loads(saved.read_text()))
        return cls(AutoTokenizer.from_pretrained(str(path)), AutoImageProcessor.from_pretrained(str(path)), options)


__all__ = ["IMAGE_PAD", "IMAGE_PLACEHOLDER", "VISION_TOKENS", "VisionInputs", "VisionProcessor", "VisionConfig",
           "to_pil", "vision_messages"]
