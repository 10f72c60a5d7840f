"""A tiny real Hugging Face model + tokenizer built in memory for tests (no download): a byte-level tokenizer with a
Qwen-style chat template and a 2-layer Qwen3ForCausalLM from config."""

from __future__ import annotations

import functools


@functools.cache
def tiny_tokenizer(merges: tuple[tuple[str, str], ...] = ()):
    """Byte-level BPE: one token per byte, plus the given merges (e.g. (("Ġ", "Ġ"),) makes two spaces one token)."""
    from rollout.server.backends import byte_chat_tokenizer

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
    from rollout.server.backends import HFBackend

    return HFBackend(tiny_model(seed), tiny_tokenizer(), seed=seed)


def save_weights(model, directory) -> str:
    """Write a model's weights as model.safetensors (tied lm_head left out, as HF does); returns the directory."""
    from pathlib import Path

    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    Path(directory).mkdir(parents=True, exist_ok=True)
    save_file(state, str(Path(directory) / "model.safetensors"))
    return str(directory)


#: the tiny Qwen3 shape of the megatron tests (conversion and backend)
QWEN3_TINY = dict(
    vocab_size=1000,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)


def random_norms_qwen3(tied: bool, seed: int = 0, **over):
    """A QWEN3_TINY (`over` changes it) Qwen3ForCausalLM whose norm weights are random too (they start at 1.0), so a
    mis-mapped or swapped norm changes the outputs."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**{**QWEN3_TINY, **over}, tie_word_embeddings=tied))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model
