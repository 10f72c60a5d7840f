"""A megatron-core GPTModel built from an HF Qwen3 config, and per-token logprobs through `vocab_parallel_cross_entropy`.

Qwen3 in megatron terms: RMSNorm everywhere, QK-norm (RMSNorm over head_dim on q and k), GQA (`num_query_groups`),
SwiGLU (`gated_linear_unit` + silu), RoPE (non-interleaved, base = rope_theta), no linear biases, tied or untied
embeddings. The weights are always built on the CPU without initialization: the values come from an HF state dict
through `megatron_convert`.

Attention (`MegatronTrainerConfig.attention`, one of ATTENTION):
- "local": megatron's local layer spec with its unfused `DotProductAttention`, which materialises the [heads, s, s]
  scores of every layer (fp32 softmax + a copy); the reference the others are checked against.
- "fused": the same local spec with the core attention replaced by `SDPAttention`: torch's
  `scaled_dot_product_attention` with `is_causal=True` (flash / memory-efficient kernels on a GPU; nothing quadratic in
  s is kept for backward). A micro-batch holds one sample per row, right-padded (train.backends.microbatch), so a
  causal mask per row is exactly "no attention across samples"; no [s, s] mask is built.
- "te": megatron's TransformerEngine layer spec (needs transformer_engine; a clear error without it). Its layer norms
  live inside the fused linear layers, so the state dict's keys are renamed on the way in and out (`TE_KEYS`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from train.backends.megatron_convert import ConversionError, Qwen3Shape


ATTENTION = ("local", "fused", "te")
RECOMPUTE = ("none", "selective", "full")

#: local-spec key suffix -> TransformerEngine-spec key suffix (TE fuses the pre-attention / pre-MLP RMSNorm into the
#: following linear layer)
TE_KEYS = {
    ".input_layernorm.weight": ".self_attention.linear_qkv.layer_norm_weight",
    ".pre_mlp_layernorm.weight": ".mlp.linear_fc1.layer_norm_weight",
}


def _quiet_import():
    # megatron warns at import that apex / Transformer Engine are absent; we know, and pick the spec ourselves.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.transformer.transformer_config import TransformerConfig
    return GPTModel, TransformerConfig, get_gpt_layer_local_spec


def transformer_engine_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


def layer_spec(attention: str):
    """megatron's ModuleSpec of one Qwen3 layer for `attention` (see the module docstring)."""
    if attention not in ATTENTION:
        raise ValueError(f"trainer.attention={attention!r}: use one of {', '.join(ATTENTION)}")
    _, _, get_local_spec = _quiet_import()
    if attention == "te":
        if not transformer_engine_available():
            raise ImportError(
                "trainer.attention='te' needs NVIDIA Transformer Engine (pip install transformer-engine[pytorch], on a "
                "CUDA machine); without it use trainer.attention='fused' (torch's scaled_dot_product_attention)"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

            return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = get_local_spec(qk_layernorm=True, normalization="RMSNorm")
    if attention == "fused":
        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def to_te_keys(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A local-spec state dict with the TransformerEngine spec's names (TE_KEYS)."""
    return {_rename(k, TE_KEYS): v for k, v in state_dict.items()}


def from_te_keys(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `to_te_keys`; TE's `_extra_state` entries are dropped."""
    back = {v: k for k, v in TE_KEYS.items()}
    return {_rename(k, back): v for k, v in state_dict.items() if not k.endswith("_extra_state")}


def _rename(key: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        if key.endswith(old):
            return key[: -len(old)] + new
    return key


class SDPAttention(torch.nn.Module):
    """megatron's core-attention interface (as DotProductAttention: [s, b, heads, d] q / k / v in, [s, b, heads * d]
    out) on torch's `scaled_dot_product_attention`, causal, GQA without repeating k / v. The scale is megatron's
    (1 / sqrt(head dim) unless the config sets one); dropout is the config's attention_dropout while training."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None):
        super().__init__()
        from megatron.core.transformer.enums import AttnMaskType

        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"SDPAttention is causal only, got attn_mask_type={attn_mask_type}")
        if getattr(config, "context_parallel_size", 1) != 1:
            raise ValueError("SDPAttention does not split sequences over context-parallel ranks")
        self.config = config
        self.head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        if config.apply_query_key_layer_scaling:
            raise ValueError("SDPAttention does not implement apply_query_key_layer_scaling")
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention takes one sample per row (no packed_seq_params, no attention_bias)")
        # attention_mask is ignored: every row is one right-padded sample, so causal is the whole mask
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True, scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)  # [s, b, heads * d]


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
    recompute_granularity: str = "none",
    recompute_method: str = "uniform",
    recompute_num_layers: int = 1,
):
    """megatron TransformerConfig equivalent to an HF Qwen3Config, with megatron's activation recompute:
    `recompute_granularity` "none" | "selective" (the core attention of every layer is recomputed in backward) |
    "full" (whole layers: `recompute_method` "uniform" checkpoints chunks of `recompute_num_layers` layers, "block"
    the first `recompute_num_layers` layers of the stage)."""
    _, TransformerConfig, _ = _quiet_import()
    s = Qwen3Shape.from_hf_config(hf_config)
    s.check_tp(tp)
    if recompute_granularity not in RECOMPUTE:
        raise ValueError(f"recompute_granularity={recompute_granularity!r}: use one of {', '.join(RECOMPUTE)}")
    recompute: dict[str, Any] = {}
    if recompute_granularity != "none":
        recompute["recompute_granularity"] = recompute_granularity
    if recompute_granularity == "full":
        recompute.update(recompute_method=recompute_method, recompute_num_layers=recompute_num_layers)
    bf16 = params_dtype == torch.bfloat16
    with warnings.catch_warnings():  # 0.16 warns about its own default cuda_graph_scope; we use no CUDA graphs
        warnings.simplefilter("ignore")
        return _make_config(TransformerConfig, s, hf_config, tp, pp, params_dtype, bf16, recompute)


def _make_config(TransformerConfig, s: Qwen3Shape, hf_config: Any, tp: int, pp: int, params_dtype, bf16: bool,
                 recompute: dict[str, Any]):
    return TransformerConfig(
        **recompute,
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


def build_gpt_model(hf_config: Any, config, attention: str = "local") -> torch.nn.Module:
    """GPTModel for one TP rank (call after the model-parallel state is initialized), its layers built for
    `attention` (ATTENTION); `model.attention` records which."""
    GPTModel, _, _ = _quiet_import()
    s = Qwen3Shape.from_hf_config(hf_config)
    spec = layer_spec(attention)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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
    model.attention = attention
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
    # local attention takes an explicit [s, s] mask; fused and TE kernels apply causality themselves
    mask = causal_mask(t - 1, tokens.device) if getattr(model, "attention", "local") == "local" else None
    logits = model(inputs, positions, mask).float()  # [B, T-1, V / tp]
    if temperature != 1.0:
        logits = logits / temperature
    return -vocab_parallel_cross_entropy(mask_padded_vocab(logits, vocab_size), targets)
