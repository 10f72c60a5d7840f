"""Trainer backends behind one protocol: `torch` (CPU / one GPU, HF model) and `megatron` (megatron-core)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from train.records import TeacherTopK, TrainSample


@runtime_checkable
class Trainer(Protocol):
    """What the rollout <-> train loop needs of a trainer. The optional members have defaults here: a backend that
    subclasses Trainer gets them, and overrides what it supports."""

    version: int  # weight version after the last update (0 = initial weights)

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]: ...

    def export_weights(self, path: str) -> str: ...

    def state_dict(self) -> dict[str, Any]: ...

    # ----- optional -----
    def save_checkpoint(self, directory: str | Path) -> Path:
        """A full checkpoint (weights, reference model, optimizer, version) a failed run can resume from."""
        raise NotImplementedError(f"{type(self).__name__} writes no checkpoints (its weights can still be exported)")

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what `save_checkpoint` wrote (a resumed run continues from it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot load checkpoints, so its runs cannot be resumed")

    def close(self) -> None:
        """Release what the trainer holds beyond memory (megatron: its process group and parallel state)."""
        return None

    def compute_logprobs(self, samples: Sequence[TrainSample], reference: bool = False) -> list[list[float]]:
        """Per-token log-probs under the current weights (`reference`: the frozen initial weights of the KL anchor),
        aligned like TrainSample.rollout_logprobs (0.0 at token 0)."""
        raise NotImplementedError(f"{type(self).__name__} computes no log-probs (directive signals need them: "
                                  "trainer=torch or trainer=megatron, or reward.teacher=policy with an SGLang policy)")

    def compute_topk(self, samples: Sequence[TrainSample], k: int, reference: bool = False) -> list[TeacherTopK]:
        """At each loss token of each sample: the top-k of the distribution that predicts it, at the sampling
        temperature, and the token's own log-prob (current weights; `reference`: the frozen initial ones)."""
        raise NotImplementedError(f"{type(self).__name__} gives no top-k (reward.opd_signal=teacher_topk needs the "
                                  "teacher's logits: trainer=torch, or reward.teacher=policy with an SGLang policy)")

    def action_logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
                        reference: bool = False) -> list[list[float]]:
        """For each (context ids, action ids): the log-prob of every action token under the current weights
        (`reference`: the frozen initial ones), forced on the given tokens (no generation), in micro-batches: the
        teacher's log-probs of directive signals."""
        samples = action_samples(sequences)
        logprobs = self.compute_logprobs(samples, reference) if samples else []
        return [lp[len(c): len(c) + len(a)] for lp, (c, a) in zip(logprobs, sequences)]

    def action_topk(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], k: int,
                    reference: bool = False) -> list[TeacherTopK]:
        """For each (context ids, action ids): the teacher's top-k at every action token (reward.opd_signal=
        teacher_topk), forced on the given tokens, as `compute_topk` gives them."""
        samples = action_samples(sequences)
        return self.compute_topk(samples, k, reference) if samples else []


def action_samples(sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TrainSample]:
    """(context, action) pairs as samples whose loss tokens are the action's (what the teacher scores)."""
    samples = []
    for context, action in sequences:
        if not context:
            raise ValueError("the teacher needs a non-empty context before the action")
        n_c, n_a = len(context), len(action)
        samples.append(TrainSample(tokens=[*context, *action], loss_mask=[0] * n_c + [1] * n_a,
                                   advantages=[0.0] * (n_c + n_a), rollout_logprobs=[0.0] * (n_c + n_a)))
    return samples


def frozen_reference(ref_model: Any) -> Any:
    """A backend's KL anchor, the frozen initial weights `compute_logprobs(..., reference=True)` scores with; a clear
    error where trainer.kl_coef=0 built none."""
    if ref_model is None:
        raise ValueError("the frozen initial weights are the KL anchor's, and trainer.kl_coef=0 keeps none: "
                         "set trainer.kl_coef > 0 (e.g. 1e-3), or use reward.teacher=trainer")
    return ref_model


def with_recomputed_logprobs(
    samples: Sequence[TrainSample], recomputed: Sequence[Sequence[float]]
) -> tuple[list[TrainSample], dict[str, float]]:
    """`trainer.old_logprobs=recompute`: the samples with the trainer's own logprobs (computed before the update) as the
    old ones, and how far the rollout's were from them on the loss tokens (`rollout_logprob_diff`, `..._max`).

    A sampler's logprobs differ in their last bits with the shape of the batch it ran in (padding, which requests
    shared it), so using them makes an update depend on the policy's batching; the trainer's forward on the same
    samples, in the same order, does not."""
    out, total, count, worst = [], 0.0, 0, 0.0
    for s, lp in zip(samples, recomputed, strict=True):
        for m, a, b in zip(s.loss_mask[1:], lp[1:], s.rollout_logprobs[1:]):
            if m:
                d = abs(a - b)
                total, count, worst = total + d, count + 1, max(worst, d)
        out.append(replace(s, rollout_logprobs=[0.0] + list(lp[1:])))
    return out, {"rollout_logprob_diff": total / max(count, 1), "rollout_logprob_diff_max": worst}
