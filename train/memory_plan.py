"""A trainer config + the model's HF config -> the modelled GPU memory of one of its ranks (train/memory_model.py), and
the verdict against `trainer.gpu_memory_gb`: what `run.dry_run=true` prints and refuses on. Pure arithmetic, no torch.

How each backend maps onto the memory model:
- trainer=megatron: `rank_memory` as is, with the config's tp / dp / pp, attention (local; fused and te keep no s x s
  terms: 'fused'), recompute_granularity, use_distributed_optimizer, bf16 (bf16 weights, fp32 grads, fp32 main
  weights) and the reference model when kl_coef != 0; the GPU's fused RMSNorm.
- trainer=torch: fp32 parameters (bf16 is autocast / FSDP's compute dtype), so per parameter 4 (weights) + 4 (fp32
  grads) + 8 (AdamW moments) + 4 (the fp32 reference copy, kl_coef != 0), all divided by dp under dp_mode=fsdp (FSDP2
  shards parameters, gradients, optimizer state and the reference) and whole under ddp. Activations are the memory
  model's for an HF Qwen3 with sdpa attention ('fused'), recompute 'full' with gradient_checkpointing, in bf16 when
  bf16 is on; FSDP adds two layers' gathered parameters in flight. A vision-language model's vision tower is counted
  in the static state (its parameters from `vision_config`), not in activations (a few thousand patches per sample).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from train.config import MegatronTrainerConfig, TorchTrainerConfig
from train.memory_model import FP32, GIB, ModelShape, RankMemory, fits, rank_memory, refusal

HEADROOM = 0.1  # of the GPU's memory, left for the CUDA context, NCCL and allocator fragmentation (memory_model.fits)


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's modelled peak and the GPU memory it is checked against (None: no budget known)."""

    memory: RankMemory
    layout: str  # e.g. "tp2 x dp4 x pp1 (megatron)"
    gpu_memory_gb: float | None
    gpu_source: str  # where the budget came from: "trainer.gpu_memory_gb", "the visible GPU", "none"
    headroom: float = HEADROOM

    @property
    def fits(self) -> bool:
        return self.gpu_memory_gb is None or fits(self.memory, self.gpu_memory_gb, self.headroom)

    def describe(self) -> str:
        m = self.memory
        parts = (f"weights {m.gib('weights'):.1f}, grads {m.gib('grads'):.1f}, optimizer "
                 f"{m.gib('main_weights') + m.gib('optimizer'):.1f}, reference {m.gib('reference'):.1f}, activations "
                 f"{m.gib('activations') + m.gib('attention_scores') + m.gib('logits'):.1f}")
        if self.gpu_memory_gb is None:
            budget = "not checked: no trainer.gpu_memory_gb and no visible GPU"
        else:
            budget = (f"{'fits' if self.fits else 'EXCEEDS'} {self.gpu_memory_gb * (1 - self.headroom):.1f} GiB usable "
                      f"of {self.gpu_memory_gb:g} GiB ({self.gpu_source}, {self.headroom:.0%} headroom)")
        return f"per rank, {self.layout}: {m.gib('total'):.1f} GiB modelled ({parts} GiB); {budget}"

    def refusal(self) -> str:
        levers = ("trainer=torch: trainer.gradient_checkpointing=true, trainer.dp_mode=fsdp over more trainer.dp_size "
                  "ranks, a smaller trainer.micro_batch_tokens" if "torch" in self.layout else
                  "trainer=megatron: trainer.attention=fused|te, trainer.recompute_granularity=selective|full, "
                  "trainer.use_distributed_optimizer=true, trainer.tp_size, trainer.dp_size")
        return (f"{self.layout}: " + refusal(self.memory, self.gpu_memory_gb, self.headroom)
                + f"\nOptions: {levers}.")


def model_shape(model_config: Mapping[str, Any]) -> ModelShape:
    """The text model's shape from an HF config dict, with a clear error when the config lacks it."""
    try:
        return ModelShape.from_hf_config(model_config)
    except KeyError as exc:
        raise ValueError(f"the model's config.json has no {exc.args[0]!r}: the trainer's memory cannot be estimated "
                         "(point policy.model_path at the real model directory)") from None


def vision_params(model_config: Mapping[str, Any]) -> int:
    """Parameters of a Qwen-VL vision tower from `vision_config` (0 for a text model): per block attention (4 h^2)
    and MLP (2 h i), the patch embedding, and the patch merger(s) into the text width (approximate: biases and norms
    left out)."""
    v = model_config.get("vision_config")
    if not isinstance(v, Mapping):
        return 0
    h, i, depth = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["depth"])
    merge = int(v.get("spatial_merge_size", 2)) ** 2
    out = int(v.get("out_hidden_size", h))
    patch = int(v.get("patch_size", 14)) ** 2 * int(v.get("in_channels", 3)) * int(v.get("temporal_patch_size", 2))
    mergers = 1 + len(v.get("deepstack_visual_indexes", ()) or ())
    return depth * (4 * h * h + 2 * h * i) + patch * h + mergers * (merge * h * merge * h + merge * h * out)


def trainer_memory(backend: str, config: TorchTrainerConfig | MegatronTrainerConfig,
                   model_config: Mapping[str, Any]) -> tuple[RankMemory, str]:
    """(modelled peak of one rank, its layout) for the trainer `config` of `backend` on the model `model_config`."""
    shape = model_shape(model_config)
    longest = config.max_sample_tokens or config.micro_batch_tokens
    reference = config.kl_coef != 0.0
    if backend == "megatron":
        c: MegatronTrainerConfig = config  # type: ignore[assignment]
        memory = rank_memory(
            shape, tp=c.tp_size, dp=c.dp_size, pp=c.pp_size, micro_batch_tokens=c.micro_batch_tokens,
            max_sample_tokens=longest, attention="local" if c.attention == "local" else "fused",
            recompute=c.recompute_granularity, distributed_optimizer=c.use_distributed_optimizer,
            reference_model=reference, param_dtype="bf16" if c.bf16 else "fp32", grad_dtype="fp32", norm="fused",
        )
        return memory, f"tp{c.tp_size} x dp{c.dp_size} x pp{c.pp_size} (megatron, attention {c.attention})"
    if backend != "torch":
        raise ValueError(f"no memory model for trainer.backend={backend!r}")
    t: TorchTrainerConfig = config  # type: ignore[assignment]
    fsdp = t.dp_mode == "fsdp" and t.dp_size > 1
    act = rank_memory(
        shape, micro_batch_tokens=t.micro_batch_tokens, max_sample_tokens=longest, attention="fused",
        recompute="full" if t.gradient_checkpointing else "none", reference_model=reference,
        param_dtype="bf16" if t.bf16 else "fp32", norm="fused",
    )
    params = shape.params + vision_params(model_config)
    shard = t.dp_size if fsdp else 1
    gathered = 2 * (shape.params_per_rank(1) // shape.layers) * (2 if t.bf16 else FP32) if fsdp else 0
    memory = replace(
        act, weights=FP32 * params // shard, grads=FP32 * params // shard, main_weights=0,
        optimizer=2 * FP32 * params // shard, reference=FP32 * params // shard if reference else 0,
        activations=act.activations + gathered,
        settings=(("backend", "torch"), ("dp", t.dp_size), ("dp_mode", t.dp_mode), ("bf16", t.bf16),
                  ("gradient_checkpointing", t.gradient_checkpointing), *act.settings[3:]),
    )
    return memory, f"dp{t.dp_size} ({t.dp_mode}, torch{', gradient checkpointing' if t.gradient_checkpointing else ''})"


def plan_memory(backend: str, config: TorchTrainerConfig | MegatronTrainerConfig, model_config: Mapping[str, Any],
                visible_gpu_gb: float | None = None) -> MemoryPlan:
    """The memory plan of one rank: checked against `config.gpu_memory_gb`, else `visible_gpu_gb` (the GPU this
    process sees, GiB), else not checked."""
    memory, layout = trainer_memory(backend, config, model_config)
    if config.gpu_memory_gb is not None:
        budget, source = float(config.gpu_memory_gb), "trainer.gpu_memory_gb"
    elif visible_gpu_gb is not None:
        budget, source = float(visible_gpu_gb), "the visible GPU"
    else:
        budget, source = None, "none"
    return MemoryPlan(memory, layout, budget, source)


__all__ = ["GIB", "HEADROOM", "MemoryPlan", "model_shape", "plan_memory", "trainer_memory", "vision_params"]
