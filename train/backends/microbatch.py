"""TrainSamples -> right-padded micro-batches within a token budget, aligned for next-token logprobs (every backend).

Position t of every [B, T-1] tensor refers to token t+1 of the sample (the token predicted from tokens 0..t), so the
first token of a sequence is never a target; `loss_mask`, `advantages` and `rollout_logprobs` are shifted the same way.
The loss averages tokens within a sample, then samples: a micro-batch's loss is weighted by its share of the batch's
samples that have loss tokens, so summing micro-batch losses gives the batch loss whatever the split.
Samples are packed longest first (less padding when lengths vary, as they do for per-step samples); `indices` maps
each row back to its position in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from train.records import DEFAULT_DIVERGENCE, TrainSample


@dataclass
class DistillBatch:
    """The micro-batch's distillation targets (reward.opd_signal=teacher_topk), aligned like its [B, T-1] tensors:
    position t holds the teacher's top-k of the distribution that predicts token t+1."""

    token_ids: torch.Tensor  # [B, T-1, k] int64 (0 where masked)
    logprobs: torch.Tensor  # [B, T-1, k] float (0 where masked)
    mask: torch.Tensor  # [B, T-1] float, 1 on the hinted steps' action tokens
    scale: torch.Tensor  # [B, T-1] float, each target's weight (w_opd)
    clamp: torch.Tensor  # [B, T-1] float, each target's per-token divergence clamp (inf: none)
    weight: float  # share of the batch's samples with distillation targets that are in this micro-batch
    divergence: str = DEFAULT_DIVERGENCE  # reward.topk_divergence, one per micro-batch

    def to(self, device: torch.device | str) -> DistillBatch:
        return DistillBatch(self.token_ids.to(device), self.logprobs.to(device), self.mask.to(device),
                            self.scale.to(device), self.clamp.to(device), self.weight, self.divergence)


def has_distill(sample: TrainSample) -> bool:
    return any(d.end > d.start for d in sample.distill)


def distill_batch(chosen: Sequence[TrainSample], t: int, weight: float) -> DistillBatch | None:
    """[B, T-1(, k)] tensors of the samples' targets (None: none has any). One k per micro-batch: both teachers give
    exactly reward.topk entries per position (fewer only for a vocabulary smaller than k)."""
    ks = {d.topk.k for s in chosen for d in s.distill if d.end > d.start}
    if not ks:
        return None
    if len(ks) > 1:
        raise ValueError(f"distillation targets with different k in one micro-batch: {sorted(ks)}")
    k = ks.pop()
    b = len(chosen)
    ids = torch.zeros(b, t - 1, k, dtype=torch.long)
    lps = torch.zeros(b, t - 1, k)
    mask = torch.zeros(b, t - 1)
    scale = torch.zeros(b, t - 1)
    clamp = torch.full((b, t - 1), float("inf"))
    for r, s in enumerate(chosen):
        for d in s.distill:
            if d.end == d.start:
                continue
            rows = slice(d.start - 1, d.end - 1)  # position t predicts token t+1
            ids[r, rows] = torch.tensor(d.topk.token_ids, dtype=torch.long)
            lps[r, rows] = torch.tensor(d.topk.logprobs, dtype=torch.float32)
            mask[r, rows] = 1.0
            scale[r, rows] = float(d.weight)
            if d.clamp is not None:
                clamp[r, rows] = float(d.clamp)
    kinds = {d.divergence for s in chosen for d in s.distill if d.end > d.start}
    if len(kinds) > 1:
        raise ValueError(f"distillation targets with different divergences in one micro-batch: {sorted(kinds)}")
    return DistillBatch(ids, lps, mask, scale, clamp, weight, kinds.pop())


@dataclass
class MicroBatch:
    tokens: torch.Tensor  # [B, T] int64, right-padded with pad_id
    loss_mask: torch.Tensor  # [B, T-1] float, 1 where token t+1 gets a gradient
    advantages: torch.Tensor  # [B, T-1]
    old_logprobs: torch.Tensor  # [B, T-1] rollout logprobs of token t+1
    lengths: list[int]  # real length of each sample
    indices: list[int]  # positions of these samples in the batch
    weight: float  # share of the batch's samples with loss tokens that are in this micro-batch
    # the rows' images, concatenated in row order (vision-language samples): {"pixel_values", "image_grid_thw"}
    vision: dict[str, torch.Tensor] | None = None
    distill: DistillBatch | None = None  # reward.opd_signal=teacher_topk: the hinted steps' teacher top-k

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def targets(self) -> torch.Tensor:
        """[B, T-1]: the token each position predicts."""
        return self.tokens[:, 1:]

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(
            self.tokens.to(device),
            self.loss_mask.to(device),
            self.advantages.to(device),
            self.old_logprobs.to(device),
            self.lengths,
            self.indices,
            self.weight,
            {k: v.to(device) for k, v in self.vision.items()} if self.vision else None,
            self.distill.to(device) if self.distill is not None else None,
        )


def loss_token_count(sample: TrainSample) -> int:
    """Tokens that get a gradient: token 0 is never predicted, so only positions 1.. count."""
    return sum(1 for m in sample.loss_mask[1:] if m)


def has_loss_tokens(sample: TrainSample) -> bool:
    return any(sample.loss_mask[1:])


def split_by_token_budget(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Greedy, order-preserving groups whose padded size (count x longest) stays within `max_tokens`.

    A sample longer than the budget gets a micro-batch of its own.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if cur and (len(cur) + 1) * max(longest, n) > max_tokens:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    return groups


def pack_by_token_budget(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped longest first (stable among equal lengths), each group within the padded-token budget."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [[order[j] for j in g] for g in split_by_token_budget([lengths[i] for i in order], max_tokens)]


def pad_samples(samples: Sequence[TrainSample], indices: Sequence[int], weight: float, pad_id: int = 0,
                distill_weight: float = 0.0) -> MicroBatch:
    chosen = [samples[i] for i in indices]
    t = max(len(s.tokens) for s in chosen)
    if t < 2:
        raise ValueError("every micro-batch needs a sample of at least 2 tokens (a context and a target)")
    b = len(chosen)
    tokens = torch.full((b, t), pad_id, dtype=torch.long)
    mask = torch.zeros(b, t - 1)
    adv = torch.zeros(b, t - 1)
    old = torch.zeros(b, t - 1)
    for r, s in enumerate(chosen):
        n = len(s.tokens)
        tokens[r, :n] = torch.tensor(s.tokens, dtype=torch.long)
        if n < 2:
            continue  # nothing to predict
        mask[r, : n - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        adv[r, : n - 1] = torch.tensor(s.advantages[1:], dtype=torch.float32)
        old[r, : n - 1] = torch.tensor(s.rollout_logprobs[1:], dtype=torch.float32)
    images = [s.vision for s in chosen if s.vision is not None and s.vision.num_images]
    vision = None
    if images:  # in row order: the model matches them to the image placeholder tokens in reading order
        vision = {"pixel_values": torch.cat([torch.as_tensor(v.pixel_values) for v in images]),
                  "image_grid_thw": torch.cat([torch.as_tensor(v.image_grid_thw) for v in images])}
    return MicroBatch(tokens, mask, adv, old, [len(s.tokens) for s in chosen], list(indices), weight, vision,
                      distill_batch(chosen, t, distill_weight))


def make_micro_batches(
    samples: Sequence[TrainSample],
    max_tokens: int,
    *,
    pad_id: int = 0,
    only_with_loss: bool = True,
    total: int | None = None,
    distill_total: int | None = None,
) -> list[MicroBatch]:
    """Pack `samples` into micro-batches (longest first). With `only_with_loss`, samples without loss tokens are left
    out (they would add nothing to the loss or its gradient). `total`: the number of samples with loss tokens that the
    weights are shares of (a data-parallel rank's shard weighs its micro-batches against the whole batch); default:
    those in `samples`. `distill_total`: the same for the samples with distillation targets (their term is a mean over
    those samples only: a sample without a hinted step is not in its denominator)."""
    keep = [i for i, s in enumerate(samples) if (has_loss_tokens(s) or not only_with_loss) and len(s.tokens) >= 2]
    n_loss = total if total is not None else sum(1 for i in keep if has_loss_tokens(samples[i]))
    n_distill = distill_total if distill_total is not None else sum(1 for i in keep if has_distill(samples[i]))
    groups = pack_by_token_budget([len(samples[i].tokens) for i in keep], max_tokens)
    out = []
    for g in groups:
        idx = [keep[j] for j in g]
        w = sum(1 for i in idx if has_loss_tokens(samples[i])) / n_loss if n_loss else 0.0
        wd = sum(1 for i in idx if has_distill(samples[i])) / n_distill if n_distill else 0.0
        out.append(pad_samples(samples, idx, w, pad_id, wd))
    return out


def minibatch_parts(samples: Sequence[TrainSample], minibatches: int) -> list[list[TrainSample]]:
    """The batch split into `minibatches` interleaved parts (one optimizer step each); empty parts are left out."""
    if minibatches < 1:
        raise ValueError(f"minibatches must be >= 1, got {minibatches}")
    return [p for p in (list(samples[i::minibatches]) for i in range(minibatches)) if p]


__all__ = [
    "DistillBatch",
    "MicroBatch",
    "distill_batch",
    "has_distill",
    "has_loss_tokens",
    "loss_token_count",
    "make_micro_batches",
    "minibatch_parts",
    "pack_by_token_budget",
    "pad_samples",
    "split_by_token_budget",
]
