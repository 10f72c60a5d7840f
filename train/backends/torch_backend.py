"""The torch Trainer backend: an HF causal LM (or a vision-language model) trained with the policy loss, in this
process or as one rank of a data-parallel group.

One `train_step(batch)` = `ppo_epochs` passes over the batch split into `minibatches`; each minibatch is one AdamW step
whose gradient is accumulated over micro-batches (packed by token budget, right-padded) and equals the gradient of the
minibatch's loss as one piece: token-mean per sample, then mean over the samples that have loss tokens.
The old policy is the rollout policy (old logprobs = the logprobs recorded at sampling time); the KL reference is a frozen
copy of the model as it was when the trainer was built.

Data parallelism (dp_size > 1, the ranks started as a Ray actor group by rollout/trainer_group.py, which also creates
the process group): every rank gets the whole batch and trains its shard of it (train/backends/data_parallel.py);
`dp_mode=ddp` wraps the model in torch's DistributedDataParallel (a full replica per rank), `dp_mode=fsdp` shards
parameters, gradients and optimizer state with torch's FSDP2 (`fully_shard` per decoder layer), fp32 master weights
with bf16 compute when `bf16=True`. Rank 0 writes exported weights and checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from train.backends import Trainer, frozen_reference, with_recomputed_logprobs
from train.backends.data_parallel import StepMetrics, combine_steps, mismatch_of, rank_micro_batches
from train.backends.microbatch import (
    MicroBatch,
    has_loss_tokens,
    loss_token_count,
    make_micro_batches,
    minibatch_parts,
    pack_by_token_budget,
)
from train.config import TorchTrainerConfig
from train.loss import policy_loss
from train.records import TeacherTopK, TrainSample
from train.topk_distill import distill_loss, entropy_of_logprobs, topk_divergence

log = logging.getLogger(__name__)

CHECKPOINT_STATE = "trainer_state.pt"  # written last: its presence marks a complete checkpoint


# the packing both backends use (kept importable from here: older callers take it from this module)
pack_micro_batches = pack_by_token_budget


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but torch sees no CUDA device; use device=cpu or auto")
    return torch.device(device)


def is_vision_model(model: torch.nn.Module) -> bool:
    """A vision-language model (Qwen-VL: a vision tower and an image placeholder token)."""
    return getattr(model.config, "vision_config", None) is not None


def model_inputs(model: torch.nn.Module, input_ids: torch.Tensor, vision: dict[str, torch.Tensor] | None) -> dict:
    """The forward's keyword arguments: the token ids, and for a vision-language model the rows' images and which
    tokens are their placeholders (what its multimodal RoPE positions are computed from)."""
    if not vision:
        return {"input_ids": input_ids}
    image_token = int(model.config.image_token_id)
    return {"input_ids": input_ids, "pixel_values": vision["pixel_values"], "image_grid_thw": vision["image_grid_thw"],
            "mm_token_type_ids": (input_ids == image_token).to(torch.int32)}


def next_token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    temperature: float,
    bf16: bool = False,
    vision: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """log softmax(logits / temperature) over the vocabulary at each position: [B, T-1, V] (position t: the
    distribution of token t+1). Right padding needs no attention mask."""
    device_type = input_ids.device.type
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(**model_inputs(_unwrapped(model), input_ids, vision)).logits[:, :-1]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    bf16: bool = False,
    vision: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """log softmax(logits / temperature) at each next token: [B, T-1]. Right padding needs no attention mask."""
    logp = next_token_logprobs(model, input_ids, temperature, bf16, vision)
    return logp.gather(-1, targets[..., None]).squeeze(-1)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class TorchTrainer(Trainer):
    """Implements train.backends.Trainer with torch: one device, or one rank of `dp_size` data-parallel ranks."""

    def __init__(
        self,
        model: PreTrainedModel,
        cfg: TorchTrainerConfig | None = None,
        tokenizer: PreTrainedTokenizerBase | Any | None = None,
    ):
        self.cfg = cfg = cfg or TorchTrainerConfig()
        self.tokenizer = tokenizer  # or a processor (vision-language models): saved next to exported weights
        self.device = resolve_device(cfg.device)
        self.model = model.to(self.device)
        self.model_class = type(model)
        self.pad_id = int(getattr(_text_config(model.config), "pad_token_id", None) or 0)
        self.rank, self.world = 0, 1
        if cfg.dp_size > 1:
            if not dist.is_initialized() or dist.get_world_size() != cfg.dp_size:
                raise RuntimeError(
                    f"trainer dp_size={cfg.dp_size} needs a process group of {cfg.dp_size} ranks: "
                    "`python -m rollout.launch` starts them (rollout/trainer_group.py)"
                )
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if cfg.gradient_checkpointing:  # before the reference copy: it runs under no_grad and keeps nothing anyway
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ref_model: PreTrainedModel | None = None
        if cfg.kl_coef != 0.0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self._train_model: torch.nn.Module = self.model  # what the loss's forward runs through
        if self.world > 1:
            self._wrap_data_parallel()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
        self.version = 0

    def _wrap_data_parallel(self) -> None:
        if self.cfg.dp_mode == "ddp":
            self._train_model = torch.nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index or 0] if self.device.type == "cuda" else None,
                broadcast_buffers=False,  # rotary tables only: the same on every rank
                # a vision tower gets no gradient from a batch without images
                find_unused_parameters=is_vision_model(self.model),
            )
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.cfg.bf16 else None
        for model in (self.model, self.ref_model):
            if model is None:
                continue
            blocks = set(getattr(model, "_no_split_modules", None) or ())  # decoder layers, vision blocks
            for module in model.modules():
                if type(module).__name__ in blocks:
                    fully_shard(module, **({"mp_policy": mp} if mp else {}))
            fully_shard(model, **({"mp_policy": mp} if mp else {}))

    @property
    def _fsdp(self) -> bool:
        return self.world > 1 and self.cfg.dp_mode == "fsdp"

    @property
    def _autocast(self) -> bool:
        return self.cfg.bf16 and not self._fsdp  # FSDP casts the parameters itself

    # ----- the Trainer protocol -----
    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """One policy update from `batch`; `version` goes up by one when any sample has a loss token. Every rank of a
        data-parallel group calls it with the same batch."""
        t0 = time.perf_counter()
        usable = [s for s in batch if loss_token_count(s) > 0]
        metrics: dict[str, float] = {
            "samples": float(len(batch)),
            "samples_used": float(len(usable)),
            "images": float(sum(s.vision.num_images for s in usable if s.vision is not None)),  # seen by the trainer
        }
        if not usable:
            log.warning("train_step: none of the %d samples has a loss token; no update", len(batch))
            return {**metrics, "skipped": 1.0, "version": float(self.version)}
        recomputed: dict[str, float] = {}
        if self.cfg.old_logprobs == "recompute":
            usable, recomputed = with_recomputed_logprobs(usable, self.compute_logprobs(usable))
        parts = minibatch_parts(usable, self.cfg.minibatches)
        steps = []
        self.model.train()
        for epoch in range(self.cfg.ppo_epochs):
            for part in parts:
                self.optimizer.zero_grad(set_to_none=True)
                m = self.accumulate_gradients(part, record_mismatch=epoch == 0)
                m["grad_norm"] = self._clip()
                self.optimizer.step()
                steps.append(m)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.version += 1
        metrics.update(combine_steps(steps))
        seconds = time.perf_counter() - t0
        # rollout_logprob_diff: |recomputed - rollout| logprob on loss tokens at each sample's first forward: ~0 when
        # on-policy (with minibatches > 1, later minibatches are measured after the earlier ones' updates)
        metrics.update(
            {
                "seconds": seconds,
                "tokens_per_s": metrics["tokens"] / seconds if seconds > 0 else 0.0,
                "lr": float(self.optimizer.param_groups[0]["lr"]),
                "version": float(self.version),
                **recomputed,  # the rollout's mismatch against the old logprobs used (recompute)
            }
        )
        return metrics

    def export_weights(self, path: str | Path) -> str:
        """Save the model (HF save_pretrained, safetensors) and the tokenizer (or processor) if the trainer has one.
        Every rank of a group calls it; rank 0 writes."""
        path = Path(path)
        state = self.state_dict() if self._fsdp else None  # FSDP: the full weights, gathered on rank 0
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(str(path), **({"state_dict": state} if state is not None else {}))
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(str(path))
        self._barrier()
        return str(path)

    def state_dict(self) -> dict[str, Any]:
        """A CPU copy of the model weights (safe to hand to a policy while training continues). Under FSDP every rank
        calls it and rank 0 gets the full weights (the others an empty dict)."""
        if self._fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[TrainSample], reference: bool = False) -> list[list[float]]:
        """Per-token logprobs under the current weights (`reference`: the frozen initial weights of the KL anchor),
        aligned like TrainSample.rollout_logprobs (0.0 at token 0)."""
        model = frozen_reference(self.ref_model) if reference else self.model
        was_training = self.model.training
        self.model.eval()
        out: list[list[float]] = [[0.0] * len(s.tokens) for s in samples]
        for mb in make_micro_batches(samples, self.cfg.micro_batch_tokens, pad_id=self.pad_id, only_with_loss=False):
            mb = mb.to(self.device)
            lp = token_logprobs(model, mb.tokens, mb.targets, self.cfg.temperature, self._autocast,
                                mb.vision).cpu()
            for row, (i, n) in enumerate(zip(mb.indices, mb.lengths)):
                out[i] = [0.0] + lp[row, : n - 1].tolist()
        self.model.train(was_training)
        return out

    @torch.no_grad()
    def compute_topk(self, samples: Sequence[TrainSample], k: int, reference: bool = False) -> list[TeacherTopK]:
        """At each loss token of each sample: the top-k of the distribution that predicts it (softmax of the logits
        over the sampling temperature, the rollout's) and the log-prob of the token itself; the current weights, or
        the frozen initial ones (`reference`)."""
        model = frozen_reference(self.ref_model) if reference else self.model
        was_training = self.model.training
        self.model.eval()
        out: list[TeacherTopK | None] = [None] * len(samples)
        for mb in make_micro_batches(samples, self.cfg.micro_batch_tokens, pad_id=self.pad_id, only_with_loss=False):
            mb = mb.to(self.device)
            logp = next_token_logprobs(model, mb.tokens, self.cfg.temperature, self._autocast, mb.vision)
            vals, ids = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
            picked = logp.gather(-1, mb.targets[..., None]).squeeze(-1)
            for row, i in enumerate(mb.indices):
                where = mb.loss_mask[row].nonzero().squeeze(-1)
                out[i] = TeacherTopK(ids[row, where].tolist(), vals[row, where].tolist(), picked[row, where].tolist())
        self.model.train(was_training)
        return [t if t is not None else TeacherTopK([], [], []) for t in out]

    # ----- resume -----
    def save_checkpoint(self, directory: str | Path) -> Path:
        """Model (HF format), optimizer, version, config and the KL reference weights, for an exact resume. Every rank
        of a group calls it (FSDP gathers the full states); rank 0 writes."""
        d = Path(directory)
        if self.rank == 0:
            d.mkdir(parents=True, exist_ok=True)
            (d / CHECKPOINT_STATE).unlink(missing_ok=True)
        self.export_weights(d / "model")
        optimizer, ref = self._full_states()
        if self.rank == 0:
            state = {"version": self.version, "optimizer": optimizer, "config": asdict(self.cfg), "ref_model": ref}
            torch.save(state, d / CHECKPOINT_STATE)
            (d / "trainer.json").write_text(json.dumps({"version": self.version, "config": asdict(self.cfg)},
                                                       indent=2))
        self._barrier()
        return d

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore weights, optimizer, version and KL reference from `save_checkpoint`'s directory (every rank)."""
        d = Path(directory)
        if not (d / CHECKPOINT_STATE).exists():
            raise FileNotFoundError(f"{d} is not a complete trainer checkpoint (no {CHECKPOINT_STATE})")
        state = torch.load(d / CHECKPOINT_STATE, map_location="cpu", weights_only=False)
        dtype = next(iter(self.model.state_dict().values())).dtype
        weights = self.model_class.from_pretrained(str(d / "model"), dtype=dtype).state_dict()
        if self._fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            full = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.model, weights, options=full)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=full)
            if self.ref_model is not None and state["ref_model"] is not None:
                set_model_state_dict(self.ref_model, state["ref_model"], options=full)
        else:
            self.model.load_state_dict(weights)
            self.optimizer.load_state_dict(state["optimizer"])
            if self.ref_model is not None and state["ref_model"] is not None:
                self.ref_model.load_state_dict(state["ref_model"])
        self.version = int(state["version"])

    def _full_states(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(optimizer state, KL reference weights) as one rank would hold them (FSDP: gathered on rank 0)."""
        if not self._fsdp:
            return self.optimizer.state_dict(), (self.ref_model.state_dict() if self.ref_model is not None else None)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=full)
        ref = get_model_state_dict(self.ref_model, options=full) if self.ref_model is not None else None
        return optimizer, ref

    def _barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    # ----- the update, in parts (tests call accumulate_gradients directly) -----
    def accumulate_gradients(self, samples: Sequence[TrainSample], record_mismatch: bool = False) -> dict[str, float]:
        """Add d(loss)/d(params) of `samples` as one minibatch to the parameters' .grad; returns its metrics. In a
        data-parallel group every rank passes the same minibatch and adds the gradient of its shard: the reduction over
        the ranks (DDP / FSDP) makes every rank's gradient the whole minibatch's."""
        cfg = self.cfg
        usable = [s for s in samples if has_loss_tokens(s)]
        if not usable:
            return {}
        mbs = rank_micro_batches(usable, self.rank, self.world, cfg.micro_batch_tokens, self.pad_id,
                                 same_count=self._fsdp)  # FSDP: each forward all-gathers, so every rank runs as many
        step = StepMetrics()
        for i, mb in enumerate(mbs):
            with self._gradient_sync(i == len(mbs) - 1):  # the ranks' gradients are reduced once, at the last one
                mb = mb.to(self.device)
                full = next_token_logprobs(self._train_model, mb.tokens, cfg.temperature, self._autocast, mb.vision)
                logp = full.gather(-1, mb.targets[..., None]).squeeze(-1)
                ref = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref = token_logprobs(self.ref_model, mb.tokens, mb.targets, cfg.temperature, self._autocast,
                                             mb.vision)
                loss, m = policy_loss(logp, mb.old_logprobs, mb.advantages, mb.loss_mask, ref, cfg.loss)
                # the minibatch loss is a mean over samples; DDP / FSDP average the ranks' gradients: undo it, the
                # weights already make the sum over ranks the minibatch's gradient
                total = loss * mb.weight * self.world
                if mb.distill is not None:  # its own mean over the samples with targets, so its own weight
                    d_loss, d_metrics = self._distill_term(full, mb)
                    total = total + d_loss * mb.distill.weight * self.world
                    m.update(d_metrics)
                total.backward()
            step.add(m, mb.weight, mb.real_tokens, mismatch_of(logp, mb) if record_mismatch else None)
        step.reduce(None, self.world, self.device)
        return step.result()

    def _distill_term(self, full: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The distillation loss of one micro-batch (train/topk_distill.py) and its sums for the metrics: the
        divergence (reward.topk_divergence) between the teacher's top-k (+ tail) and the student's log-probs on the
        same ids, at the masked positions only (the hinted steps' action tokens), and the student's entropy there."""
        d = mb.distill
        assert d is not None
        where = d.mask > 0
        student = full[where].gather(-1, d.token_ids[where])  # [N, k], with gradient
        clamp = d.clamp[where]
        rows = topk_divergence(d.logprobs[where], student, d.divergence, clamp)
        per_token = torch.zeros_like(d.mask).index_put((*where.nonzero(as_tuple=True),), rows)
        loss = distill_loss(per_token, d.mask, d.scale)
        with torch.no_grad():
            raw = topk_divergence(d.logprobs[where], student.detach(), d.divergence)  # before the clamp: its spread
            metrics = {
                "distill_loss": float(loss.detach()),
                "distill_weight": d.weight,
                "distill_tokens": float(where.sum()),
                "distill_kl_sum": float(raw.sum()),
                "distill_kl_sq": float((raw * raw).sum()),
                "distill_clamped": float((raw > clamp).sum()),
                "distill_student_mass": float(student.detach().exp().sum(-1).sum()),
                "distill_entropy_sum": float(entropy_of_logprobs(full.detach()[where]).sum()),
            }
        return loss, metrics

    def _gradient_sync(self, sync: bool) -> contextlib.AbstractContextManager:
        if self.world == 1 or sync:
            if self._fsdp:
                self.model.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if self._fsdp:
            self.model.set_requires_gradient_sync(False)
            return contextlib.nullcontext()
        return self._train_model.no_sync()

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        if self.cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP: a DTensor


__all__ = [
    "MicroBatch",
    "TorchTrainer",
    "TorchTrainerConfig",
    "loss_token_count",
    "next_token_logprobs",
    "pack_micro_batches",
    "token_logprobs",
]
