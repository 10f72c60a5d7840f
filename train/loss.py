"""The policy loss (pure tensor math, no I/O): PPO clipped surrogate with an asymmetric clip and the k3 KL estimator.

L = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A) + kl_coef * k3,  k3 = exp(-d) - 1 + d,  d = logp - logp_ref.
Token losses are averaged within each sample (token-mean per sample), then over the samples that have any loss token.
"""

from __future__ import annotations

import torch

from train.config import LossConfig


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from samples of pi: exp(-d) - 1 + d with d = logp - logp_ref (>= 0)."""
    d = logprobs - ref_logprobs
    return torch.exp(-d) - 1.0 + d


def masked_sample_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over tokens within each sample, then over samples with at least one token. values, mask: [B, T]."""
    mask = mask.to(values.dtype)
    tokens = mask.sum(-1)
    per_sample = (values * mask).sum(-1) / tokens.clamp(min=1.0)
    has = tokens > 0
    if not bool(has.any()):
        return values.sum() * 0.0  # keeps the graph; no loss tokens at all
    return per_sample[has].mean()


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    cfg: LossConfig = LossConfig(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """All inputs [B, T] over the same token positions; `mask` is 1 on tokens that get a gradient."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * advantages
    pg = -torch.minimum(unclipped, clipped)
    loss_tokens = pg
    kl = None
    if ref_logprobs is not None and cfg.kl_coef != 0.0:
        kl = k3_kl(logprobs, ref_logprobs)
        loss_tokens = pg + cfg.kl_coef * kl
    loss = masked_sample_mean(loss_tokens, mask)
    with torch.no_grad():
        m = mask.to(logprobs.dtype)
        n = m.sum().clamp(min=1.0)
        metrics = {
            "loss": float(loss.detach()),
            "pg_loss": float(masked_sample_mean(pg.detach(), mask)),
            "kl": float(masked_sample_mean(kl.detach(), mask)) if kl is not None else 0.0,
            "clip_frac": float(((clipped < unclipped).to(m.dtype) * m).sum() / n),  # tokens whose gradient is clipped
            "ratio_mean": float((ratio * m).sum() / n),
            "loss_tokens": float(m.sum()),
        }
    return loss, metrics
