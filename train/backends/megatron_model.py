"""A megatron-core GPTModel built from an HF Qwen3 config, and per-token logprobs through `vocab_parallel_cross_entropy`.

Qwen3 in megatron terms: RMSNorm everywhere, QK-norm (RMSNorm over head_dim on q and k), GQA (`num_query_groups`),
SwiGLU (`gated_linear_unit` + silu), RoPE (non-interleaved, base = rope_theta), no linear biases, tied or untied
embeddings. We use megatron's local layer spec (no Transformer Engine: it is not installable here), and always build the
weights on the CPU without initialization: the values come from an HF state dict through `megatron_convert`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F

from train.backends.megatron_convert import ConversionError, Qwen3Shape


def _quiet_import():
    # megatron warns at import that apex / Transformer Engine are absent; we know, and use the local spec on purpose.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.transformer.transformer_config import TransformerConfig
    return GPTModel, TransformerConfig, get_gpt_layer_local_spec


def rope_theta(hf_config: Any) -> float:
    """RoPE base of an HF config (transformers 5 keeps it in `rope_parameters`, 4.x in `rope_theta`)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ConversionError(f"rope_type={rope_type!r}: only the default RoPE is supported by the megatron backend")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ConversionError("the HF config has no rope_theta")
    return float(theta)


def transformer_config(
    hf_config: Any,
    *,
    tp: int = 1,
    pp: int = 1,
    params_dtype: torch.dtype = torch.float32,
):
    """megatron TransformerConfig equivalent to an HF Qwen3Config."""
    _, TransformerConfig, _ = _quiet_import()
    s = Qwen3Shape.from_hf_config(hf_config)
    s.check_tp(tp)
    bf16 = params_dtype == torch.bfloat16
    with warnings.catch_warnings():  # 0.16 warns about its own default cuda_graph_scope; we use no CUDA graphs
        warnings.simplefilter("ignore")
        return _make_config(TransformerConfig, s, hf_config, tp, pp, params_dtype, bf16)


def _make_config(TransformerConfig, s: Qwen3Shape, hf_config: Any, tp: int, pp: int, params_dtype, bf16: bool):
    return TransformerConfig(
        num_layers=s.num_layers,
        hidden_size=s.hidden_size,
        ffn_hidden_size=s.ffn_hidden_size,
        num_attention_heads=s.num_heads,
        num_query_groups=s.num_kv_heads,
        kv_channels=s.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=float(hf_config.rms_norm_eps),
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        init_method_std=float(getattr(hf_config, "initializer_range", 0.02)),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=False,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=bf16,
        attention_softmax_in_fp32=True,
        # every fused kernel off: they need CUDA extensions (apex / TE) that are not installed
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=False,
        use_cpu_initialization=True,
        perform_initialization=False,  # weights come from the HF state dict
    )


def build_gpt_model(hf_config: Any, config) -> torch.nn.Module:
    """GPTModel for one TP rank (call after the model-parallel state is initialized)."""
    GPTModel, _, get_spec = _quiet_import()
    s = Qwen3Shape.from_hf_config(hf_config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = get_spec(qk_layernorm=True, normalization="RMSNorm")
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=s.padded_vocab_size(config.tensor_model_parallel_size),  # rows beyond vocab_size: masked
            max_sequence_length=int(getattr(hf_config, "max_position_embeddings", 32768)),
            pre_process=True,
            post_process=True,
            parallel_output=True,  # logits stay split over the vocabulary; the cross entropy reduces across TP
            share_embeddings_and_output_weights=s.tied_embeddings,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=rope_theta(hf_config),
        )
    mark_tensor_parallel_params(model)
    return model


def mark_tensor_parallel_params(model: torch.nn.Module) -> None:
    """Tag TP-split weights with `tensor_model_parallel` / `partition_dim` / `partition_stride`.

    megatron sets these inside its weight-init functions, which `perform_initialization=False` skips; without them
    its gradient-norm and clipping code (and ours) would count a split weight as a replicated one.
    """
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.nn.Parameter) or hasattr(weight, "tensor_model_parallel"):
            continue
        if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
            set_tensor_model_parallel_attributes(weight, True, 0, 1)
        elif isinstance(module, RowParallelLinear):
            set_tensor_model_parallel_attributes(weight, True, 1, 1)


def causal_mask(length: int, device: torch.device | str) -> torch.Tensor:
    """[1, 1, T, T] bool, True where attention is masked. Passed explicitly so megatron never builds its own mask
    (its default one is allocated on device="cuda")."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)[None, None]


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int | None) -> torch.Tensor:
    """This TP rank's logits [.., V / tp] with the columns of padded vocabulary rows (ids >= vocab_size) at -inf: the
    padding never takes probability mass, so the log-softmax is the unpadded model's."""
    if vocab_size is None:
        return logits
    from megatron.core import parallel_state

    local = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * local
    if start + local <= vocab_size:
        return logits
    ids = torch.arange(start, start + local, device=logits.device)
    return logits.masked_fill(ids >= vocab_size, float("-inf"))


def token_logprobs(
    model: torch.nn.Module, tokens: torch.Tensor, temperature: float = 1.0, vocab_size: int | None = None
) -> torch.Tensor:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for right-padded `tokens` [B, T] -> [B, T-1] (fp32), of the
    distribution softmax(logits / temperature) the policy sampled from.

    Right padding with a causal mask never lets a pad token influence a real one, so no padding mask is needed.
    The logits stay split over the vocabulary across TP ranks; `vocab_parallel_cross_entropy` reduces the log-softmax
    across ranks; logprob = -cross entropy. `vocab_size`: the real vocabulary when the model's is padded.
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    b, t = tokens.shape
    inputs = tokens[:, :-1].contiguous()
    targets = tokens[:, 1:].contiguous()
    positions = torch.arange(t - 1, device=tokens.device).unsqueeze(0).expand(b, -1)
    logits = model(inputs, positions, causal_mask(t - 1, tokens.device)).float()  # [B, T-1, V / tp]
    if temperature != 1.0:
        logits = logits / temperature
    return -vocab_parallel_cross_entropy(mask_padded_vocab(logits, vocab_size), targets)
