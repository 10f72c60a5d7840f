"""Data parallelism, the same for both backends: every data-parallel (DP) rank receives the whole batch and takes its
shard, and weighs its micro-batches by their share of the whole batch's samples. The sum of the ranks' gradients is
then the gradient of the whole batch's loss (token-mean per sample, mean over samples): the gradient a world of one
computes, whatever the split. Metrics are summed over the ranks the same way, so every rank reports the batch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from train.backends.microbatch import MicroBatch, has_distill, make_micro_batches, pack_by_token_budget
from train.records import TrainSample


def shard(samples: Sequence[TrainSample], rank: int, size: int) -> list[TrainSample]:
    """Rank `rank`'s share of `samples`, the same split on every rank: longest first, each sample to the rank with the
    fewest tokens so far (ties: the lowest rank), so the ranks run about the same number of tokens."""
    if size == 1:
        return list(samples)
    load = [0] * size
    mine = []
    for i in sorted(range(len(samples)), key=lambda i: (-len(samples[i].tokens), i)):
        r = min(range(size), key=lambda r: (load[r], r))
        load[r] += len(samples[i].tokens)
        if r == rank:
            mine.append(samples[i])
    return mine


def rank_micro_batches(
    part: Sequence[TrainSample], rank: int, size: int, max_tokens: int, pad_id: int, same_count: bool = False
) -> list[MicroBatch]:
    """This rank's micro-batches of one optimizer step's `part` (samples that all have loss tokens), weighted against
    the whole part. A rank whose shard is empty gets one micro-batch of weight 0 (its gradient is zero): every rank
    must take part in the step's gradient reduction. `same_count`: every rank gets as many micro-batches as the rank
    with the most (zero-weight ones added), for backends whose every forward is a collective (FSDP's all-gathers)."""
    mine = shard(part, rank, size)
    mbs = make_micro_batches(mine, max_tokens, pad_id=pad_id, total=len(part),
                             distill_total=sum(1 for s in part if has_distill(s))) if mine else []
    want = max(1, len(mbs))
    if same_count:
        want = max(want, *(len(pack_by_token_budget([len(s.tokens) for s in shard(part, r, size)], max_tokens))
                           for r in range(size)))
    if len(mbs) < want:
        filler = make_micro_batches(part[:1], max_tokens, pad_id=pad_id)[0]
        filler = dataclasses.replace(filler, weight=0.0, distill=dataclasses.replace(filler.distill, weight=0.0)
                                     if filler.distill is not None else None)
        mbs += [filler] * (want - len(mbs))
    return mbs


SUM_KEYS = ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "loss_tokens", "tokens", "micro_batches",
            "mismatch_sum", "mismatch_tokens")
# reward.opd_signal=teacher_topk (train/topk_distill.py): the distillation term's loss (weighted by each micro-batch's
# share of the samples with targets) and sums over its tokens, from which the batch's mean and spread follow
DISTILL_KEYS = ("distill_loss", "distill_tokens", "distill_kl_sum", "distill_kl_sq", "distill_clamped",
                "distill_student_mass", "distill_entropy_sum")


class StepMetrics:
    """One optimizer step's metrics: sums over this rank's micro-batches, summed over the DP ranks by `reduce`, then
    the batch's values (`result`): the loss terms are sample-weighted, clip fraction and ratio token-weighted."""

    def __init__(self) -> None:
        self.sums = dict.fromkeys(SUM_KEYS + DISTILL_KEYS, 0.0)
        self.mismatch_max = 0.0

    def add(self, m: Mapping[str, float], weight: float, real_tokens: int,
            mismatch: tuple[float, float, float] | None = None) -> None:
        """`m`: train.loss.policy_loss's metrics of one micro-batch of `weight`; `mismatch`: (sum, tokens, max) of
        |recomputed - rollout| logprobs on its loss tokens."""
        if weight == 0.0:  # the zero-gradient micro-batch of an empty shard: not part of the batch
            return
        s, tok = self.sums, m["loss_tokens"]
        for k in ("loss", "pg_loss", "kl"):
            s[k] += m[k] * weight
        s["clip_frac"] += m["clip_frac"] * tok
        s["ratio_mean"] += m["ratio_mean"] * tok
        s["loss_tokens"] += tok
        s["tokens"] += real_tokens
        s["micro_batches"] += 1
        if "distill_tokens" in m:  # sums over the micro-batch's targets, and its loss with its own weight
            s["distill_loss"] += m["distill_loss"] * m["distill_weight"]
            for k in DISTILL_KEYS[1:]:
                s[k] += m[k]
        if mismatch is not None:
            s["mismatch_sum"] += mismatch[0]
            s["mismatch_tokens"] += mismatch[1]
            self.mismatch_max = max(self.mismatch_max, mismatch[2])

    def reduce(self, group: Any, size: int, device: torch.device) -> None:
        """Sum over the DP ranks of `group` (every rank calls it; nothing to do for one rank)."""
        if size == 1:
            return
        keys = SUM_KEYS + DISTILL_KEYS
        vec = torch.tensor([self.sums[k] for k in keys], dtype=torch.float64, device=device)
        dist.all_reduce(vec, group=group)
        top = torch.tensor([self.mismatch_max], dtype=torch.float64, device=device)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        self.sums = dict(zip(keys, vec.tolist()))
        self.mismatch_max = float(top)

    def result(self) -> dict[str, float]:
        s = self.sums
        tok = s["loss_tokens"]
        return {
            "loss": s["loss"],
            "pg_loss": s["pg_loss"],
            "kl": s["kl"],
            "clip_frac": s["clip_frac"] / tok if tok else 0.0,
            "ratio_mean": s["ratio_mean"] / tok if tok else 0.0,
            "loss_tokens": tok,
            "tokens": s["tokens"],
            "micro_batches": s["micro_batches"],
            "_mismatch_sum": s["mismatch_sum"],
            "_mismatch_tokens": s["mismatch_tokens"],
            "_mismatch_max": self.mismatch_max,
            **{f"_{k}": s[k] for k in DISTILL_KEYS},
        }


def mismatch_of(logprobs: torch.Tensor, mb: MicroBatch) -> tuple[float, float, float]:
    """(sum, tokens, max) of |recomputed - rollout| logprobs on a micro-batch's loss tokens."""
    with torch.no_grad():
        diff = (logprobs.detach() - mb.old_logprobs).abs() * mb.loss_mask
    return float(diff.sum()), float(mb.loss_mask.sum()), float(diff.max())


def combine_steps(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A train_step's metrics from its optimizer steps' `StepMetrics.result()` (each with `grad_norm`): means over the
    steps, token counts and the logprob mismatch (measured at each sample's first forward) over all of them."""
    out = {k: sum(s[k] for s in steps) / len(steps) for k in ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean",
                                                              "grad_norm", "loss_tokens")}
    mismatch_tokens = sum(s["_mismatch_tokens"] for s in steps)
    out.update(
        tokens=sum(s["tokens"] for s in steps),
        micro_batches=sum(s["micro_batches"] for s in steps),
        optimizer_steps=float(len(steps)),
        # |recomputed - rollout| logprob on loss tokens at the first forward: ~0 when trainer and policy agree
        rollout_logprob_diff=sum(s["_mismatch_sum"] for s in steps) / max(mismatch_tokens, 1.0),
        rollout_logprob_diff_max=max(s["_mismatch_max"] for s in steps),
    )
    out.update(distill_metrics(steps))
    return out


def distill_metrics(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The distillation term's figures over a train_step's optimizer steps (none when no sample had a target): its
    loss (mean over the steps); over the distilled tokens (the hinted steps' action tokens), the per-token divergence's
    mean and standard deviation (`kl_*`: a KL unless reward.topk_divergence=jsd), the fraction of tokens at the clamp,
    the student's mass on the teacher's top-k and the student's entropy."""
    tot = {k: sum(s.get(f"_{k}", 0.0) for s in steps) for k in DISTILL_KEYS}
    n = tot["distill_tokens"]
    if not n:
        return {}
    mean = tot["distill_kl_sum"] / n
    return {
        "distill/loss": tot["distill_loss"] / len(steps),
        "distill/kl_mean": mean,
        "distill/kl_std": max(tot["distill_kl_sq"] / n - mean * mean, 0.0) ** 0.5,
        "distill/clamped_frac": tot["distill_clamped"] / n,
        "distill/student_topk_mass": tot["distill_student_mass"] / n,
        "distill/tokens": n,
        "distill/entropy": tot["distill_entropy_sum"] / n,
    }


__all__ = ["DISTILL_KEYS", "StepMetrics", "combine_steps", "distill_metrics", "mismatch_of", "rank_micro_batches", "shard"]
