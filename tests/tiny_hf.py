"""A tiny real Hugging Face model + tokenizer built in memory for tests (no download): a byte-level tokenizer with a
Qwen-style chat template and a 2-layer Qwen3ForCausalLM from config."""

from __future__ import annotations

import functools


@functools.cache
def tiny_tokenizer(merges: tuple[tuple[str, str], ...] = ()):
    """Byte-level BPE: one token per byte, plus the given merges (e.g. (("Ġ", "Ġ"),) makes two spaces one token)."""
    from rollout.policy.backends import byte_chat_tokenizer

    return byte_chat_tokenizer(merges)


def tiny_model(seed: int = 0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tiny_tokenizer()),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(cfg).eval()


def tiny_backend(seed: int = 0):
    from rollout.policy.backends import HFBackend

    return HFBackend(tiny_model(seed), tiny_tokenizer(), seed=seed)


def save_weights(model, directory) -> str:
    """Write a model's weights as model.safetensors (tied lm_head left out, as HF does); returns the directory."""
    from pathlib import Path

    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    Path(directory).mkdir(parents=True, exist_ok=True)
    save_file(state, str(Path(directory) / "model.safetensors"))
    return str(directory)
