"""The torch Trainer backend: an HF causal LM trained in this process (CPU or one GPU) with the policy loss.

One `train_step(batch)` = `ppo_epochs` passes over the batch split into `minibatches`; each minibatch is one AdamW step
whose gradient is accumulated over micro-batches (packed by token budget, right-padded) and equals the gradient of the
minibatch's loss as one piece: token-mean per sample, then mean over the samples that have loss tokens.
The old policy is the rollout policy (old logprobs = the logprobs recorded at sampling time); the KL reference is a frozen
copy of the model as it was when the trainer was built.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from train.backends import Trainer, with_recomputed_logprobs
from train.backends.microbatch import (
    MicroBatch,
    loss_token_count,
    make_micro_batches,
    minibatch_parts,
    pack_by_token_budget,
)
from train.config import TorchTrainerConfig
from train.loss import policy_loss
from train.records import TrainSample

log = logging.getLogger(__name__)

CHECKPOINT_STATE = "trainer_state.pt"  # written last: its presence marks a complete checkpoint


# the packing both backends use (kept importable from here: older callers take it from this module)
pack_micro_batches = pack_by_token_budget


def token_logprobs(
    model: PreTrainedModel, input_ids: torch.Tensor, targets: torch.Tensor, temperature: float, bf16: bool = False
) -> torch.Tensor:
    """log softmax(logits / temperature) at each next token: [B, T-1]. Right padding needs no attention mask."""
    device_type = input_ids.device.type
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=input_ids).logits[:, :-1]
    logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


class TorchTrainer(Trainer):
    """Implements train.backends.Trainer with torch on one device."""

    def __init__(
        self,
        model: PreTrainedModel,
        cfg: TorchTrainerConfig | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ):
        self.cfg = cfg or TorchTrainerConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self.ref_model: PreTrainedModel | None = None
        if self.cfg.kl_coef != 0.0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=self.cfg.lr,
            betas=self.cfg.betas,
            eps=self.cfg.eps,
            weight_decay=self.cfg.weight_decay,
        )
        self.version = 0

    # ----- the Trainer protocol -----
    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """One policy update from `batch`; `version` goes up by one when any sample has a loss token."""
        t0 = time.perf_counter()
        usable = [s for s in batch if loss_token_count(s) > 0]
        metrics: dict[str, float] = {"samples": float(len(batch)), "samples_used": float(len(usable))}
        if not usable:
            log.warning("train_step: none of the %d samples has a loss token; no update", len(batch))
            return {**metrics, "skipped": 1.0, "version": float(self.version)}
        recomputed: dict[str, float] = {}
        if self.cfg.old_logprobs == "recompute":
            usable, recomputed = with_recomputed_logprobs(usable, self.compute_logprobs(usable))
        parts = minibatch_parts(usable, self.cfg.minibatches)
        totals: dict[str, float] = {}
        mismatch = {"sum": 0.0, "tokens": 0.0, "max": 0.0}
        steps = 0
        self.model.train()
        for epoch in range(self.cfg.ppo_epochs):
            for part in parts:
                self.optimizer.zero_grad(set_to_none=True)
                m = self.accumulate_gradients(part, record_mismatch=epoch == 0)
                m["grad_norm"] = self._clip()
                self.optimizer.step()
                steps += 1
                mismatch["sum"] += m.pop("_mismatch_sum", 0.0)
                mismatch["tokens"] += m.pop("_mismatch_tokens", 0.0)
                mismatch["max"] = max(mismatch["max"], m.pop("_mismatch_max", 0.0))
                for k, v in m.items():
                    totals[k] = totals.get(k, 0.0) + v
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.version += 1
        tokens = totals.pop("tokens", 0.0)
        metrics.update({k: v / steps for k, v in totals.items()})  # means over optimizer steps
        seconds = time.perf_counter() - t0
        metrics.update(
            {
                # |recomputed - rollout| logprob on loss tokens at each sample's first forward: ~0 when on-policy
                # (with minibatches > 1, later minibatches are measured after the earlier ones' updates)
                "rollout_logprob_diff": mismatch["sum"] / max(mismatch["tokens"], 1.0),
                "rollout_logprob_diff_max": mismatch["max"],
                "tokens": tokens,
                "optimizer_steps": float(steps),
                "seconds": seconds,
                "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                "lr": float(self.optimizer.param_groups[0]["lr"]),
                "version": float(self.version),
                **recomputed,  # the rollout's mismatch against the old logprobs used (recompute)
            }
        )
        return metrics

    def export_weights(self, path: str | Path) -> str:
        """Save the model (HF save_pretrained, safetensors) and the tokenizer if the trainer has one."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(path))
        return str(path)

    def state_dict(self) -> dict[str, Any]:
        """A CPU copy of the model weights (safe to hand to a policy while training continues)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """Per-token logprobs under the current weights, aligned like TrainSample.rollout_logprobs (0.0 at token 0)."""
        was_training = self.model.training
        self.model.eval()
        out: list[list[float]] = [[0.0] * len(s.tokens) for s in samples]
        for mb in make_micro_batches(samples, self.cfg.micro_batch_tokens, pad_id=self.pad_id, only_with_loss=False):
            mb = mb.to(self.device)
            lp = token_logprobs(self.model, mb.tokens, mb.targets, self.cfg.temperature, self.cfg.bf16).cpu()
            for row, (i, n) in enumerate(zip(mb.indices, mb.lengths)):
                out[i] = [0.0] + lp[row, : n - 1].tolist()
        self.model.train(was_training)
        return out

    # ----- resume -----
    def save_checkpoint(self, directory: str | Path) -> Path:
        """Model (HF format), optimizer, version, config and the KL reference weights, for an exact resume."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / CHECKPOINT_STATE).unlink(missing_ok=True)
        self.export_weights(d / "model")
        state = {
            "version": self.version,
            "optimizer": self.optimizer.state_dict(),
            "config": asdict(self.cfg),
            "ref_model": self.ref_model.state_dict() if self.ref_model is not None else None,
        }
        torch.save(state, d / CHECKPOINT_STATE)
        (d / "trainer.json").write_text(json.dumps({"version": self.version, "config": asdict(self.cfg)}, indent=2))
        return d

    def load_checkpoint(self, directory: str | Path) -> None:
        d = Path(directory)
        if not (d / CHECKPOINT_STATE).exists():
            raise FileNotFoundError(f"{d} is not a complete trainer checkpoint (no {CHECKPOINT_STATE})")
        state = torch.load(d / CHECKPOINT_STATE, map_location=self.device, weights_only=False)
        loaded = AutoModelForCausalLM.from_pretrained(str(d / "model"), dtype=next(self.model.parameters()).dtype)
        self.model.load_state_dict(loaded.state_dict())
        self.optimizer.load_state_dict(state["optimizer"])
        if self.ref_model is not None and state["ref_model"] is not None:
            self.ref_model.load_state_dict(state["ref_model"])
        self.version = int(state["version"])

    # ----- the update, in parts (tests call accumulate_gradients directly) -----
    def accumulate_gradients(self, samples: Sequence[TrainSample], record_mismatch: bool = False) -> dict[str, float]:
        """Add d(loss)/d(params) of `samples` as one minibatch to the parameters' .grad; returns its metrics."""
        cfg = self.cfg
        sums: dict[str, float] = {}
        for mb in make_micro_batches(samples, cfg.micro_batch_tokens, pad_id=self.pad_id):
            mb = mb.to(self.device)
            logp = token_logprobs(self.model, mb.tokens, mb.targets, cfg.temperature, cfg.bf16)
            ref = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref = token_logprobs(self.ref_model, mb.tokens, mb.targets, cfg.temperature, cfg.bf16)
            loss, m = policy_loss(logp, mb.old_logprobs, mb.advantages, mb.loss_mask, ref, cfg.loss)
            (loss * mb.weight).backward()  # the minibatch loss is a mean over samples
            tok = m["loss_tokens"]
            for k in ("loss", "pg_loss", "kl"):
                sums[k] = sums.get(k, 0.0) + m[k] * mb.weight
            for k in ("clip_frac", "ratio_mean"):
                sums[f"_{k}"] = sums.get(f"_{k}", 0.0) + m[k] * tok
            sums["loss_tokens"] = sums.get("loss_tokens", 0.0) + tok
            sums["tokens"] = sums.get("tokens", 0.0) + mb.real_tokens
            if record_mismatch:
                with torch.no_grad():
                    diff = (logp.detach() - mb.old_logprobs).abs() * mb.loss_mask
                sums["_mismatch_sum"] = sums.get("_mismatch_sum", 0.0) + float(diff.sum())
                sums["_mismatch_tokens"] = sums.get("_mismatch_tokens", 0.0) + float(mb.loss_mask.sum())
                sums["_mismatch_max"] = max(sums.get("_mismatch_max", 0.0), float(diff.max()))
        if not sums:
            return {}
        tok = max(sums.get("loss_tokens", 0.0), 1.0)
        for k in ("clip_frac", "ratio_mean"):
            sums[k] = sums.pop(f"_{k}", 0.0) / tok
        return sums

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        if self.cfg.grad_clip > 0:
            return float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip))
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))


__all__ = [
    "MicroBatch",
    "TorchTrainer",
    "TorchTrainerConfig",
    "loss_token_count",
    "pack_micro_batches",
    "token_logprobs",
]
