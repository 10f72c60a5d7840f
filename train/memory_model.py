"""Per-rank GPU memory of a training step of the megatron backend, from the model's shape and the trainer's knobs.

Pure arithmetic (no torch, no megatron): `rank_memory(shape, tp=..., dp=..., ...)` returns a `RankMemory` with the bytes
of each part at the step's peak, `fits(memory, gpu_memory_gib)` says whether that leaves the headroom asked for, and
`check_fits` raises `MemoryBudgetError` with the per-part table when it does not.

What is modelled, and what is assumed (each term's formula is commented where it is computed):

- The model is the one `train.backends.megatron_model` builds: megatron-core GPTModel, Qwen3 architecture (RMSNorm,
  QK-norm, GQA, SwiGLU, RoPE, no biases), no sequence parallelism, no dropout (p = 0 saves no masks), logits split over
  the vocabulary across TP ranks, the loss through `vocab_parallel_cross_entropy` on fp32 logits, temperature 1.
- Static state is the usual mixed-precision Adam accounting (megatron-core's distributed-optimizer docs: "bf16 param,
  fp32 grads: 18 bytes per parameter, 6 + 12/d with the distributed optimizer"): bf16 weights (2), an fp32 gradient
  buffer (4: megatron's DDP with `grad_reduce_in_fp32=True`, kept whole on every DP rank), fp32 main weights (4) and
  two fp32 Adam moments (4 + 4); the distributed optimizer shards the last three (main weights and moments) over DP.
  A frozen reference copy (the KL anchor, built when kl_coef != 0) costs its weights again (2), split over TP like the
  policy, replicated over DP. fp32 params need no separate main weights.
- Activations are the tensors autograd saves for backward, counted by storage (a view keeps its whole base alive), for
  megatron's *local* layer spec (what the backend builds today) with its unfused `DotProductAttention`, which keeps the
  whole [heads, s, s] softmax output in fp32 plus its bf16 copy for every layer; 'fused' is what a flash / Transformer
  Engine kernel keeps instead (q, k, v, the output and an fp32 logsumexp per head: nothing quadratic in s). The
  per-tensor inventory was read off megatron-core 0.16 and checked against saved-tensor counts of the real model on a
  CPU (benchmarks/memory_model.py); the RMSNorm terms differ by device: torch's CUDA RMSNorm is the fused kernel
  (saves its input and an fp32 rstd: `norm='fused'`, the default), the CPU one is composite (saves an fp32 upcast of
  its input and the fp32 normalized values: `norm='composite'`, measured).
- The peak is taken at the start of backward: every layer's kept activations, the loss's fp32 softmax, plus the largest
  transient of a single layer (its attention workspace: megatron's persistent bf16 score buffer, and ~3 fp32 score-sized
  buffers while one layer's softmax backward runs: an estimate), plus, under recompute, one layer's activations
  rebuilt during its backward. The reference forward (no grad) runs while the policy's activations are kept; its
  transient is one layer plus its fp32 logits, bounded by the same terms (its logits are counted in `logits`).
- A micro-batch is right-padded rows x longest row <= micro_batch_tokens, and a sample longer than the budget gets a
  micro-batch of its own (train.backends.microbatch); the worst case for attention is rows of the longest sample.
- Not modelled: CUDA context and NCCL buffers, allocator fragmentation (that is what `fits`'s headroom is for), DDP
  bucket padding, the temperature's extra fp32 copy of the logits, vision towers. `pp` > 1 is a rough first-stage bound
  (layers / pp, pp micro-batches in flight under 1F1B, embedding and output on the same stage); the backend runs pp=1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ATTENTION = ("local", "fused")
RECOMPUTE = ("none", "selective", "full")
NORMS = ("fused", "composite")
FP32 = 4


class MemoryBudgetError(ValueError):
    """The modelled per-rank peak does not fit the GPU (the message carries the per-part table)."""


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "tied_embeddings" and (not isinstance(v, int) or v < 1):
                raise ValueError(f"ModelShape.{f.name} must be a positive int, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path) -> ModelShape:
        """From an HF config dict or a config.json path (a model directory works too). A Qwen3-VL config's language
        model is its `text_config`."""
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            config = json.loads(path.read_text())
        if isinstance(config.get("text_config"), Mapping):
            tied = config.get("tie_word_embeddings", config["text_config"].get("tie_word_embeddings", False))
            config = {**config["text_config"], "tie_word_embeddings": tied}
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            ffn_hidden=int(config["intermediate_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    def padded_vocab(self, tp: int) -> int:
        """Rows of megatron's embedding / output layer: the vocabulary rounded up to a multiple of tp."""
        return -(-self.vocab // tp) * tp

    def params_per_rank(self, tp: int = 1) -> int:
        """Parameters one TP rank holds (pp = 1). Split over TP: q/k/v, the output projection, fc1/fc2, the
        embedding and an untied output layer; replicated: the norms (h, h per layer, d each for q/k; h final)."""
        h, f, d = self.hidden, self.ffn_hidden, self.head_dim
        per_layer = (
            h * (self.heads + 2 * self.kv_heads) * d // tp  # linear_qkv
            + self.heads * d * h // tp  # linear_proj
            + h * 2 * f // tp  # linear_fc1 (gate and up)
            + f * h // tp  # linear_fc2
            + 2 * h + 2 * d  # input / pre-MLP RMSNorm, q / k norm
        )
        embed = self.padded_vocab(tp) // tp * h
        return self.layers * per_layer + embed * (1 if self.tied_embeddings else 2) + h

    @property
    def params(self) -> int:
        return self.params_per_rank(1)


PARTS = (
    "weights", "grads", "main_weights", "optimizer", "reference",
    "activations", "attention_scores", "logits",
)


@dataclass(frozen=True)
class RankMemory:
    """Bytes per part on one rank at the step's peak (see the module docstring for what each part holds)."""

    weights: int
    grads: int
    main_weights: int
    optimizer: int
    reference: int
    activations: int  # kept activations except the s x s attention terms, plus a recomputed layer's
    attention_scores: int  # the s x s terms: kept softmax outputs, megatron's score buffer, one layer's workspace
    logits: int  # fp32 logits and the loss's fp32 softmax (the policy's kept, the reference's transient)
    settings: tuple[tuple[str, Any], ...] = ()  # what it was computed for (shown by `table`)

    @property
    def static(self) -> int:
        return self.weights + self.grads + self.main_weights + self.optimizer + self.reference

    @property
    def dynamic(self) -> int:
        return self.activations + self.attention_scores + self.logits

    @property
    def total(self) -> int:
        return self.static + self.dynamic

    def gib(self, part: str) -> float:
        return (self.total if part == "total" else getattr(self, part)) / GIB

    def table(self) -> str:
        lines = []
        if self.settings:
            lines.append(", ".join(f"{k}={v}" for k, v in self.settings))
        width = max(len(p) for p in PARTS)
        for part in PARTS:
            lines.append(f"  {part:<{width}}  {self.gib(part):10.2f} GiB")
        lines.append(f"  {'total':<{width}}  {self.gib('total'):10.2f} GiB")
        return "\n".join(lines)


def micro_batch_geometry(micro_batch_tokens: int, max_sample_tokens: int) -> tuple[int, int]:
    """(rows, longest) of the worst micro-batch for attention: rows of the longest sample, as many as fit the budget;
    a sample longer than the budget alone (train.backends.microbatch never splits a sample)."""
    if micro_batch_tokens < 1 or max_sample_tokens < 1:
        raise ValueError("micro_batch_tokens and max_sample_tokens must be >= 1")
    return max(1, micro_batch_tokens // max_sample_tokens), max_sample_tokens


def _norm_bytes(width: int, act: int, norm: str, groups: int = 1) -> int:
    """Saved bytes per token of one RMSNorm over `groups` groups of `width` values each (q / k norm: one per head).
    fused (torch's CUDA kernel `_fused_rms_norm`): its input in the activation dtype + an fp32 rstd per group.
    composite (CPU): an fp32 upcast of the input and the fp32 normalized values (both saved by the multiplies) + the
    fp32 rstd; with fp32 activations the upcast is the input itself."""
    if norm == "fused":
        return act * width * groups + FP32 * groups
    return ((FP32 if act != FP32 else 0) + FP32) * width * groups + FP32 * groups


def layer_activation_bytes(shape: ModelShape, *, tp: int, act: int, norm: str, attention: str, seq: int) -> dict:
    """Saved bytes per token of one transformer layer, split into {'linear': ..., 'scores': ...} ('scores': the
    terms proportional to the sample length `seq`), for the local layer spec (megatron-core 0.16, no sequence
    parallelism). Inventory (per token; a_t = heads / tp, g_t = kv heads / tp, d = head dim, f_t = ffn / tp):
      input RMSNorm (h) and pre-MLP RMSNorm (h)                 _norm_bytes each
      linear_qkv and linear_fc1 inputs (the normed h)            act * h each
      q-norm (a_t d), k-norm (g_t d)                             _norm_bytes; fused: the k view keeps the whole
                                                                 qkv output (a_t + 2 g_t) d alive
      RoPE cos / sin, for q and for k (per position, not row)    4 * act * d
      local attention: q, k and v repeated to a_t heads          3 * act * a_t d  (baddbmm / bmm inputs; when
                       heads == kv heads v is not repeated but a view of the qkv output, keeping all of it alive)
                       softmax output (fp32) + its cast copy     a_t * seq * (4 + act)  (act == 4: one tensor)
      fused attention: q, k, v (g_t heads), output, logsumexp    act * (2 a_t + 2 g_t) d + 4 a_t
      linear_proj input                                          act * a_t d
      SwiGLU: fc1 output (2 f_t, kept by the chunk views), silu output, the product's second copy, fc2 input
                                                                 act * 5 f_t (measured: five f_t-sized saves)
    """
    h, d = shape.hidden, shape.head_dim
    a_t, g_t, f_t = shape.heads // tp, shape.kv_heads // tp, shape.ffn_hidden // tp
    linear = 2 * _norm_bytes(h, act, norm) + 2 * act * h
    linear += _norm_bytes(d, act, norm, a_t) + _norm_bytes(d, act, norm, g_t)
    if norm == "fused":  # the k-norm's input is a view of the qkv output: the rest of its (a_t + 2 g_t) d stays alive
        linear += act * (a_t + g_t) * d
    linear += act * a_t * d + 5 * act * f_t
    scores = 0
    if attention == "local":
        linear += 2 * act * a_t * d  # q and the repeated k (post-RoPE: a new tensor either way)
        if a_t != g_t:
            linear += act * a_t * d  # v repeated to a_t heads: a copy
        elif norm == "composite":
            linear += act * (a_t + 2 * g_t) * d  # no repeat: v is a view, it keeps the whole qkv output alive
        # (fused norm, no repeat: the k-norm's view already keeps the qkv output alive, counted above)
        scores = a_t * seq * (FP32 + (act if act != FP32 else 0))
    else:
        linear += act * (2 * a_t + 2 * g_t) * d + FP32 * a_t
    # RoPE's cos / sin ([s, 1, 1, d], for q and for k) broadcast over the rows: per position, not per token
    return {"linear": linear, "scores": scores, "rope_per_position": 4 * act * d}


def rank_memory(
    shape: ModelShape,
    *,
    tp: int = 1,
    dp: int = 1,
    pp: int = 1,
    micro_batch_tokens: int,
    max_sample_tokens: int,
    attention: str = "local",
    recompute: str = "none",
    distributed_optimizer: bool = False,
    reference_model: bool = True,
    param_dtype: str = "bf16",
    grad_dtype: str = "fp32",
    norm: str = "fused",
) -> RankMemory:
    """The modelled peak bytes per part on one rank of a training step (assumptions: the module docstring)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r}: use one of {', '.join(ATTENTION)}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: use one of {', '.join(RECOMPUTE)}")
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r}: use one of {', '.join(NORMS)}")
    if param_dtype not in DTYPE_BYTES or grad_dtype not in DTYPE_BYTES:
        raise ValueError(f"dtypes must be among {', '.join(DTYPE_BYTES)}, got {param_dtype!r}, {grad_dtype!r}")
    if min(tp, dp, pp) < 1:
        raise ValueError(f"tp, dp and pp must be >= 1, got {tp}, {dp}, {pp}")
    if shape.kv_heads % tp or shape.ffn_hidden % tp:
        raise ValueError(f"tp={tp} must divide kv_heads={shape.kv_heads} and ffn_hidden={shape.ffn_hidden}")
    act = DTYPE_BYTES[param_dtype]  # activations are in the params' dtype (megatron casts nothing else)
    layers = math.ceil(shape.layers / pp)  # this stage's layers (first stage: the embedding and, roughly, the output)

    # ---- static state: P parameters on this rank (TP split, one pipeline stage) ----
    per_layer_params = (shape.params_per_rank(tp) - _embedding_params(shape, tp)) // shape.layers
    p = layers * per_layer_params + _embedding_params(shape, tp)
    weights = DTYPE_BYTES[param_dtype] * p  # the model's params
    grads = DTYPE_BYTES[grad_dtype] * p  # megatron DDP's grad buffer: whole on every DP rank (reduce-scattered into)
    shard = dp if distributed_optimizer else 1  # the distributed optimizer keeps 1/dp of main weights and moments
    main_weights = (FP32 * p if param_dtype != "fp32" else 0) // shard  # fp32 master copy (fp32 params are their own)
    optimizer = 2 * FP32 * p // shard  # Adam exp_avg and exp_avg_sq, fp32
    reference = DTYPE_BYTES[param_dtype] * p if reference_model else 0  # the frozen KL anchor: weights only

    # ---- activations of the worst micro-batch: rows x longest tokens ----
    rows, seq = micro_batch_geometry(micro_batch_tokens, max_sample_tokens)
    tokens = rows * seq
    in_flight = pp  # 1F1B: the first stage holds pp micro-batches' activations (1 when pp = 1)
    per = layer_activation_bytes(shape, tp=tp, act=act, norm=norm, attention=attention, seq=seq)
    edges = tokens * edge_bytes(shape, act=act, norm=norm) + layers * seq * per["rope_per_position"]
    if recompute == "none":
        kept_linear, kept_scores = layers * tokens * per["linear"], layers * tokens * per["scores"]
        rebuilt_linear = rebuilt_scores = 0
    elif recompute == "selective":
        # megatron's recompute_granularity='selective' (core_attn): the attention core keeps only its q, k, v
        # inputs (k, v at g_t heads); the repeated k / v, the softmax outputs and their copies are rebuilt for
        # one layer at a time in its backward
        core = _core_attention_bytes(shape, tp=tp, act=act, attention=attention, seq=seq)
        inputs = act * (shape.heads // tp + 2 * (shape.kv_heads // tp)) * shape.head_dim
        kept_linear = layers * tokens * (per["linear"] - core["linear"] + inputs)
        kept_scores = 0
        # the rebuilt core reuses its checkpointed inputs: fused saves exactly q, k, v; local saves q (k, v repeated)
        shared = inputs if attention == "fused" else act * (shape.heads // tp) * shape.head_dim
        rebuilt_linear, rebuilt_scores = tokens * (core["linear"] - shared), tokens * core["scores"]
    else:
        # recompute_granularity='full' (uniform, 1 layer per chunk): only each layer's input (act * h) is kept; one
        # layer's whole activations are rebuilt during its backward
        kept_linear, kept_scores = layers * tokens * act * shape.hidden, 0
        # (a fused norm saves its input: the kept layer input itself)
        reused = act * shape.hidden if norm == "fused" else 0
        rebuilt_linear, rebuilt_scores = tokens * (per["linear"] - reused), tokens * per["scores"]
    activations = in_flight * (kept_linear + edges) + rebuilt_linear

    scores = in_flight * kept_scores + rebuilt_scores
    if attention == "local":
        # megatron's global memory buffer ("mpu"): a persistent [rows * a_t, s, s] tensor in the activation dtype,
        # the baddbmm's preallocated input (never freed); plus one layer's transient while its softmax backward
        # runs: ~3 fp32 score-sized buffers (grad of the probs upcast, the softmax grad, the masked-fill grad;
        # an estimate, not measured). The causal mask ([1, 1, s, s] bool) is one tensor shared by every layer.
        elements = rows * (shape.heads // tp) * seq * seq
        scores += elements * act + elements * 3 * FP32 + seq * seq

    # the loss: vocab_parallel_cross_entropy keeps its fp32 softmax (tokens x V/tp) for backward while the fp32 copy
    # of the logits lives through it; then the reference's forward makes its own fp32 logits and softmax while the
    # policy's kept softmax is alive: 4 + 4 + 4 bytes per token per vocabulary column of this rank at that moment
    vocab_rank = shape.padded_vocab(tp) // tp
    logits = tokens * vocab_rank * FP32 * (3 if reference_model else 2)

    settings = (
        ("tp", tp), ("dp", dp), ("pp", pp), ("micro_batch_tokens", micro_batch_tokens),
        ("max_sample_tokens", max_sample_tokens), ("attention", attention), ("recompute", recompute),
        ("distributed_optimizer", distributed_optimizer), ("reference_model", reference_model),
        ("param_dtype", param_dtype), ("grad_dtype", grad_dtype), ("norm", norm),
    )
    return RankMemory(
        weights=weights, grads=grads, main_weights=main_weights, optimizer=optimizer, reference=reference,
        activations=activations, attention_scores=scores, logits=logits, settings=settings,
    )


def edge_bytes(shape: ModelShape, *, act: int, norm: str) -> int:
    """Saved bytes per token once per model: the final norm, the output layer's input, the embedding's int64 ids."""
    return _norm_bytes(shape.hidden, act, norm) + act * shape.hidden + 8


def saved_tensor_bytes(
    shape: ModelShape, *, rows: int, seq: int, tp: int = 1, act: int = 2, norm: str = "fused",
    attention: str = "local",
) -> int:
    """What autograd keeps after one forward without recompute (the benchmark's measured quantity): every layer's
    saved tensors, the edges, the shared causal mask and the loss's fp32 softmax (no transients, no reference)."""
    tokens = rows * seq
    per = layer_activation_bytes(shape, tp=tp, act=act, norm=norm, attention=attention, seq=seq)
    mask = seq * seq if attention == "local" else 0
    return (shape.layers * (tokens * (per["linear"] + per["scores"]) + seq * per["rope_per_position"])
            + tokens * edge_bytes(shape, act=act, norm=norm) + mask + tokens * (shape.padded_vocab(tp) // tp) * FP32)


def _embedding_params(shape: ModelShape, tp: int) -> int:
    embed = shape.padded_vocab(tp) // tp * shape.hidden
    return embed * (1 if shape.tied_embeddings else 2) + shape.hidden  # + the final norm


def _core_attention_bytes(shape: ModelShape, *, tp: int, act: int, attention: str, seq: int) -> dict:
    """What the attention core alone saves per token (the part selective recompute drops)."""
    a_t, g_t, d = shape.heads // tp, shape.kv_heads // tp, shape.head_dim
    if attention == "local":
        return {"linear": 3 * act * a_t * d, "scores": a_t * seq * (FP32 + (act if act != FP32 else 0))}
    return {"linear": act * (2 * a_t + 2 * g_t) * d + FP32 * a_t, "scores": 0}


def fits(memory: RankMemory, gpu_memory_gib: float, headroom: float = 0.1) -> bool:
    """Whether the modelled peak leaves `headroom` (a fraction of the GPU's memory, for the CUDA context, NCCL and
    allocator fragmentation, which the model does not count) free on a GPU of `gpu_memory_gib` GiB (nvidia-smi's
    MiB / 1024: an 80 GB H100 has 80 GiB, an H200 about 140)."""
    if gpu_memory_gib <= 0 or not 0 <= headroom < 1:
        raise ValueError(f"need gpu_memory_gib > 0 and 0 <= headroom < 1, got {gpu_memory_gib}, {headroom}")
    return memory.total <= gpu_memory_gib * GIB * (1 - headroom)


def refusal(memory: RankMemory, gpu_memory_gib: float, headroom: float = 0.1) -> str:
    """A message with the figures: the modelled peak per part against the usable memory."""
    usable = gpu_memory_gib * (1 - headroom)
    return (
        f"modelled peak {memory.gib('total'):.1f} GiB per rank exceeds {usable:.1f} GiB usable "
        f"({gpu_memory_gib:g} GiB GPU, {headroom:.0%} headroom) by {memory.gib('total') - usable:.1f} GiB:\n"
        f"{memory.table()}\n"
        "Levers: attention='fused' removes the s x s terms, recompute='selective' / 'full' drops kept activations, "
        "distributed_optimizer shards main weights and moments over dp, tp splits weights and activations, "
        "a smaller micro_batch_tokens / max response shrinks the activations."
    )


def check_fits(memory: RankMemory, gpu_memory_gib: float, headroom: float = 0.1) -> None:
    """Raise `MemoryBudgetError` (with `refusal`'s figures) when `fits` says no."""
    if not fits(memory, gpu_memory_gib, headroom):
        raise MemoryBudgetError(refusal(memory, gpu_memory_gib, headroom))
