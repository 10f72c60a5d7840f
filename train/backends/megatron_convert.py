"""HF Qwen3 state dict <-> megatron-core GPTModel state dict (local layer spec), with tensor-parallel sharding.

Pure tensor reshuffling: no process group, no model, no megatron import, so it is exact (bitwise) and testable anywhere.

Layout megatron expects (what this module writes):
- `linear_qkv.weight` fuses q, k, v per query group (GQA): for each KV head g, the rows are
  [q heads of group g (heads/kv_heads * head_dim rows), k_g (head_dim rows), v_g (head_dim rows)]. A TP rank owns
  kv_heads/tp consecutive groups, so a rank's shard is contiguous in this layout.
- `linear_fc1.weight` fuses SwiGLU's gate and up projections: [gate; up] on every rank, i.e. rank r holds
  cat(gate rows of r, up rows of r) (megatron chunks the local output in two: silu(first half) * second half).
- Column-parallel weights (embedding, output layer, qkv, fc1) are split on dim 0 (output rows / vocab), row-parallel
  weights (linear_proj, linear_fc2) on dim 1 (input columns); norms (RMSNorm weights, QK-norm weights) are replicated.
- Linear layers carry an `_extra_state` entry (Transformer Engine's FP8 metadata slot; None for local layers). We emit
  it so `load_state_dict(strict=True)` accepts the result.
- Vocabulary padding (as megatron's `make_vocab_size_divisible_by`): the embedding and output rows are padded with zero
  rows up to a multiple of the TP size, so any vocabulary splits evenly; the backend masks the padded logits (they never
  take probability mass or gradient) and `megatron_to_hf` cuts them off again.
- Tied embeddings: megatron has no output weight (it reuses the embedding); HF's state dict lists `lm_head.weight` as the
  same tensor as `model.embed_tokens.weight`, and we return it that way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("qwen3",)


class ConversionError(ValueError):
    """The config or state dict cannot be converted (unsupported architecture, missing or misshapen tensor)."""


@dataclass(frozen=True)
class Qwen3Shape:
    """The architecture facts the conversion needs, read from an HF Qwen3Config."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool

    @classmethod
    def from_hf_config(cls, cfg: Any) -> Qwen3Shape:
        model_type = getattr(cfg, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConversionError(f"model_type={model_type!r}: only {', '.join(SUPPORTED_MODEL_TYPES)} is supported")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ConversionError(f"hidden_act={cfg.hidden_act!r}: the megatron model is built with SwiGLU (silu)")
        if getattr(cfg, "attention_bias", False):
            raise ConversionError("attention_bias=True is not supported (Qwen3 checkpoints have no attention bias)")
        if getattr(cfg, "use_sliding_window", False):
            raise ConversionError("use_sliding_window=True is not supported by the megatron backend")
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv = cfg.num_key_value_heads or cfg.num_attention_heads
        if cfg.num_attention_heads % kv:
            raise ConversionError(f"num_attention_heads={cfg.num_attention_heads} is not a multiple of kv heads {kv}")
        return cls(
            num_layers=cfg.num_hidden_layers,
            hidden_size=cfg.hidden_size,
            ffn_hidden_size=cfg.intermediate_size,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            vocab_size=cfg.vocab_size,
            tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab_size(self, tp: int) -> int:
        """The vocabulary rounded up to a multiple of `tp` (the rows megatron's embedding and output layer hold)."""
        return -(-self.vocab_size // tp) * tp

    def check_tp(self, tp: int) -> None:
        """Megatron needs every TP-split dimension to divide evenly (the vocabulary is padded instead)."""
        if tp < 1:
            raise ConversionError(f"tensor-parallel size must be >= 1, got {tp}")
        for name, n in (
            ("num_key_value_heads", self.num_kv_heads),
            ("intermediate_size", self.ffn_hidden_size),
        ):
            if n % tp:
                raise ConversionError(f"{name}={n} is not divisible by tensor-parallel size {tp}")


# megatron suffix <- HF suffix, inside layer i (replicated or simply split tensors; fused ones are handled below)
_LAYER_PLAIN = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")  # split on dim 1
_EXTRA_STATE_LINEARS = (
    "self_attention.linear_proj",
    "self_attention.linear_qkv",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)


def _get(sd: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    try:
        return sd[key]
    except KeyError:
        raise ConversionError(f"state dict has no {key!r} ({len(sd)} keys, e.g. {sorted(sd)[:3]})") from None


def _check_shape(key: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ConversionError(f"{key}: shape {tuple(t.shape)}, expected {shape}")


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Qwen3Shape, tp: int) -> list[torch.Tensor]:
    """HF q/k/v projection weights -> one megatron `linear_qkv.weight` shard per TP rank (grouped per KV head)."""
    h = q.shape[1]
    grouped = torch.cat(
        [
            q.reshape(s.num_kv_heads, s.heads_per_group * s.head_dim, h),
            k.reshape(s.num_kv_heads, s.head_dim, h),
            v.reshape(s.num_kv_heads, s.head_dim, h),
        ],
        dim=1,
    )  # [kv, (heads_per_group + 2) * head_dim, hidden]
    return [g.reshape(-1, h).contiguous() for g in grouped.chunk(tp, dim=0)]


def split_qkv(shards: Sequence[torch.Tensor], s: Qwen3Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_qkv`: megatron `linear_qkv.weight` shards -> HF (q, k, v) weights."""
    full = torch.cat(list(shards), dim=0)
    h = full.shape[1]
    grouped = full.reshape(s.num_kv_heads, (s.heads_per_group + 2) * s.head_dim, h)
    q, k, v = grouped.split([s.heads_per_group * s.head_dim, s.head_dim, s.head_dim], dim=1)
    return (
        q.reshape(s.num_heads * s.head_dim, h).contiguous(),
        k.reshape(s.num_kv_heads * s.head_dim, h).contiguous(),
        v.reshape(s.num_kv_heads * s.head_dim, h).contiguous(),
    )


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """HF gate/up projection weights -> megatron `linear_fc1.weight` shards ([gate_r; up_r] on rank r)."""
    return [torch.cat([g, u], dim=0).contiguous() for g, u in zip(gate.chunk(tp, dim=0), up.chunk(tp, dim=0))]


def split_gate_up(shards: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    gates, ups = zip(*(t.chunk(2, dim=0) for t in shards))
    return torch.cat(gates, dim=0).contiguous(), torch.cat(ups, dim=0).contiguous()


def _split(t: torch.Tensor, tp: int, dim: int) -> list[torch.Tensor]:
    return [c.contiguous() for c in t.chunk(tp, dim=dim)]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows appended up to `rows` (the padded vocabulary)."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))], dim=0)


def hf_to_megatron(hf_sd: Mapping[str, torch.Tensor], s: Qwen3Shape, tp: int = 1) -> list[dict[str, Any]]:
    """HF Qwen3ForCausalLM state dict -> one megatron GPTModel state dict per TP rank."""
    s.check_tp(tp)
    out: list[dict[str, Any]] = [{} for _ in range(tp)]

    def put(key: str, shards: Sequence[Any]) -> None:
        for r in range(tp):
            out[r][key] = shards[r]

    def replicate(key: str, t: torch.Tensor) -> None:
        put(key, [t.contiguous()] * tp)

    h, hd = s.hidden_size, s.head_dim
    emb = _get(hf_sd, "model.embed_tokens.weight")
    _check_shape("model.embed_tokens.weight", emb, (s.vocab_size, h))
    vocab = s.padded_vocab_size(tp)
    put("embedding.word_embeddings.weight", _split(_pad_rows(emb, vocab), tp, 0))
    for i in range(s.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        q, k, v = (_get(hf_sd, src + f"self_attn.{n}_proj.weight") for n in "qkv")
        _check_shape(src + "self_attn.q_proj.weight", q, (s.num_heads * hd, h))
        _check_shape(src + "self_attn.k_proj.weight", k, (s.num_kv_heads * hd, h))
        _check_shape(src + "self_attn.v_proj.weight", v, (s.num_kv_heads * hd, h))
        put(dst + "self_attention.linear_qkv.weight", fuse_qkv(q, k, v, s, tp))
        gate, up = _get(hf_sd, src + "mlp.gate_proj.weight"), _get(hf_sd, src + "mlp.up_proj.weight")
        _check_shape(src + "mlp.gate_proj.weight", gate, (s.ffn_hidden_size, h))
        _check_shape(src + "mlp.up_proj.weight", up, (s.ffn_hidden_size, h))
        put(dst + "mlp.linear_fc1.weight", fuse_gate_up(gate, up, tp))
        for m_suffix, hf_suffix in _LAYER_PLAIN.items():
            t = _get(hf_sd, src + hf_suffix)
            if m_suffix in _ROW_PARALLEL:
                put(dst + m_suffix, _split(t, tp, 1))
            else:
                replicate(dst + m_suffix, t)
        for lin in _EXTRA_STATE_LINEARS:
            put(dst + lin + "._extra_state", [None] * tp)
    replicate("decoder.final_layernorm.weight", _get(hf_sd, "model.norm.weight"))
    if not s.tied_embeddings:
        head = _get(hf_sd, "lm_head.weight")
        _check_shape("lm_head.weight", head, (s.vocab_size, h))
        put("output_layer.weight", _split(_pad_rows(head, vocab), tp, 0))
    put("output_layer._extra_state", [None] * tp)
    return out


def megatron_to_hf(shards: Sequence[Mapping[str, Any]], s: Qwen3Shape) -> dict[str, torch.Tensor]:
    """Megatron GPTModel state dicts of all TP ranks (rank order) -> one HF Qwen3ForCausalLM state dict."""
    tp = len(shards)
    s.check_tp(tp)

    def cat(key: str, dim: int) -> torch.Tensor:
        return torch.cat([_get(sd, key) for sd in shards], dim=dim).contiguous()

    def first(key: str) -> torch.Tensor:
        return _get(shards[0], key).contiguous()

    vocab = s.vocab_size  # the padded rows are cut off
    hf: dict[str, torch.Tensor] = {"model.embed_tokens.weight": cat("embedding.word_embeddings.weight", 0)[:vocab]}
    for i in range(s.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        q, k, v = split_qkv([_get(sd, src + "self_attention.linear_qkv.weight") for sd in shards], s)
        hf[dst + "self_attn.q_proj.weight"], hf[dst + "self_attn.k_proj.weight"] = q, k
        hf[dst + "self_attn.v_proj.weight"] = v
        gate, up = split_gate_up([_get(sd, src + "mlp.linear_fc1.weight") for sd in shards])
        hf[dst + "mlp.gate_proj.weight"], hf[dst + "mlp.up_proj.weight"] = gate, up
        for m_suffix, hf_suffix in _LAYER_PLAIN.items():
            hf[dst + hf_suffix] = cat(src + m_suffix, 1) if m_suffix in _ROW_PARALLEL else first(src + m_suffix)
    hf["model.norm.weight"] = first("decoder.final_layernorm.weight")
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"] if s.tied_embeddings else cat("output_layer.weight", 0)[:vocab]
    return hf

