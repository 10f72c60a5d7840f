"""Distribution-level directive loss (`reward.opd_signal=teacher_topk`), pure tensor math: the teacher's top-k (+ one
tail bin holding the rest of its mass) at each action token of a hinted step, and the divergence that pulls the
student's distribution there toward it. See docs/training/directive.md ("Distribution-level signal").

Per action token, with the teacher's top-k log-probs t_1..t_k (p_i = exp t_i, tail p_T = 1 - sum p_i) and the
student's log-probs s_1..s_k on the same token ids (q_i = exp s_i, tail q_T = 1 - sum q_i), the default
(`reward.topk_divergence=reverse`):

    KL(student || teacher) = sum_i q_i (s_i - t_i) + q_T (log q_T - log p_T),   clamped: min(KL, c)

`topk_divergence` also gives forward KL(teacher || student) (mass-covering: it copies the hinted teacher's
uncertainty on every token into the student, which is why it is not the default; docs/training/directive.md) and
JSD; the tail bin keeps a student from hiding its mass outside the set under each.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from train.loss import masked_sample_mean
from train.records import DEFAULT_DIVERGENCE, DIVERGENCES

#: the floor of a tail probability before its log (a teacher or student with all its mass inside the top-k)
TAIL_FLOOR = 1e-12


class TopK(NamedTuple):
    token_ids: torch.Tensor  # [..., k] int64, most likely first
    logprobs: torch.Tensor  # [..., k] float32


def topk_of_logits(logits: torch.Tensor, k: int, temperature: float = 1.0) -> TopK:
    """The top-k tokens and their log-probs of softmax(logits / temperature) over the last dim (k capped at the
    vocabulary): what the teacher gives at each position, scored at the rollout temperature."""
    if k < 1:
        raise ValueError(f"top-k needs k >= 1, got {k}")
    if temperature <= 0:
        raise ValueError(f"the teacher is scored at the rollout temperature, which must be > 0 (got {temperature})")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    vals, ids = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
    return TopK(ids, vals)


def tail_prob(logprobs: torch.Tensor) -> torch.Tensor:
    """1 - sum_i exp(logprobs_i) over the last dim, in [0, 1]: the mass outside the set (differentiable)."""
    return (-torch.expm1(torch.logsumexp(logprobs, dim=-1))).clamp(0.0, 1.0)


def topk_forward_kl(teacher: torch.Tensor, student: torch.Tensor,
                    clamp: float | torch.Tensor | None = None) -> torch.Tensor:
    """Per token KL(teacher || student) over the k bins + the tail bin; teacher, student: [..., k] log-probs on the
    same token ids (the student's with gradient). `clamp` c (a number, or one per token; inf: none): min(KL, c) per
    token (a token above c gets no gradient: an outlier, e.g. a format token the hint changes a lot, cannot dominate
    the step). Returns [...]."""
    if teacher.shape != student.shape:
        raise ValueError(f"teacher log-probs {tuple(teacher.shape)} and student {tuple(student.shape)} differ")
    if clamp is not None and not bool(torch.all(torch.as_tensor(clamp) > 0)):
        raise ValueError(f"the divergence clamp must be > 0 (got {clamp}), or None for none")
    teacher = teacher.detach().float()
    student = student.float()
    # a bin the teacher gives no mass (log-prob -inf) adds 0, not nan
    inside = torch.where(teacher > float("-inf"), teacher.exp() * (teacher - student), 0.0).sum(-1)
    p_tail = tail_prob(teacher)
    q_tail = tail_prob(student).clamp_min(TAIL_FLOOR)
    # p_T log p_T is 0 when the teacher has no tail (xlogy), and only the student's tail carries a gradient
    tail = torch.special.xlogy(p_tail, p_tail) - p_tail * torch.log(q_tail)
    kl = inside + tail
    if clamp is None:
        return kl
    return torch.minimum(kl, torch.as_tensor(clamp, dtype=kl.dtype, device=kl.device))


def _bins(logprobs: torch.Tensor) -> torch.Tensor:
    """[..., k] log-probs -> [..., k + 1] probabilities: the k tokens and the tail bin (floored, so a log is finite)."""
    return torch.cat([logprobs.exp(), tail_prob(logprobs).clamp_min(TAIL_FLOOR).unsqueeze(-1)], dim=-1)


def _floored_log(probs: torch.Tensor) -> torch.Tensor:
    """log of probabilities floored at TAIL_FLOOR: a bin of probability 0 (a teacher's top-k token at log-prob -inf,
    or a student's that underflowed) has a finite log, so 0 * log 0 is 0 and its gradient 0, never nan; and a student
    bin the teacher gives no mass costs q * (log q - log 1e-12) (large, finite, clamped like any other token) instead
    of inf."""
    return probs.clamp_min(TAIL_FLOOR).log()


def topk_divergence(teacher: torch.Tensor, student: torch.Tensor, kind: str = DEFAULT_DIVERGENCE,
                    clamp: float | torch.Tensor | None = None) -> torch.Tensor:
    """Per token, over the k bins + the tail bin (teacher, student: [..., k] log-probs on the same ids, the student's
    with gradient), clamped like `topk_forward_kl`:

    - `forward`: KL(teacher || student) (`topk_forward_kl`): mass-covering, the student spreads over every token the
      teacher gives mass to (its entropy is pulled toward the teacher's);
    - `reverse`: KL(student || teacher) = sum_b q_b (log q_b - log p_b): mode-seeking, the student may stay sharp on
      one of the teacher's modes (OpenClaw-RL's top-k loss); the tail bin keeps it from hiding mass outside the set;
    - `jsd`: the Jensen-Shannon divergence with beta 0.5 against the mixture m = (p + q) / 2 (slime's
      self-distillation): bounded by log 2 per token, in between the two.
    """
    if kind not in DIVERGENCES:
        raise ValueError(f"reward.topk_divergence={kind!r}: use one of {', '.join(DIVERGENCES)}")
    if kind == "forward":
        return topk_forward_kl(teacher, student, clamp)
    if teacher.shape != student.shape:
        raise ValueError(f"teacher log-probs {tuple(teacher.shape)} and student {tuple(student.shape)} differ")
    if clamp is not None and not bool(torch.all(torch.as_tensor(clamp) > 0)):
        raise ValueError(f"the divergence clamp must be > 0 (got {clamp}), or None for none")
    p, q = _bins(teacher.detach().float()), _bins(student.float())
    log_p, log_q = _floored_log(p), _floored_log(q)
    if kind == "reverse":
        value = (q * (log_q - log_p)).sum(-1)
    else:
        log_m = _floored_log(0.5 * (p + q))
        value = 0.5 * (p * (log_p - log_m)).sum(-1) + 0.5 * (q * (log_q - log_m)).sum(-1)
    if clamp is None:
        return value
    return torch.minimum(value, torch.as_tensor(clamp, dtype=value.dtype, device=value.device))


def distill_loss(divergence: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The distillation term of a micro-batch: each token's divergence (`topk_divergence`) times its weight (`scale`,
    the step's w_opd), mean over the masked tokens within each sample, then over the samples that have any. Unmasked
    tokens (steps without a hint) add nothing and are not counted. divergence, mask, scale: [B, T]."""
    values = divergence * scale if scale is not None else divergence
    return masked_sample_mean(values.masked_fill(mask <= 0, 0.0), mask)  # masked_fill: a nan outside cannot leak in


def entropy_of_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """-sum p log p over the last dim of full-vocabulary log-probs (the policy's entropy at each position)."""
    return -(logprobs.exp() * logprobs).sum(-1)


__all__ = ["DIVERGENCES", "TAIL_FLOOR", "TopK", "distill_loss", "entropy_of_logprobs", "tail_prob", "topk_divergence",
           "topk_forward_kl", "topk_of_logits"]
