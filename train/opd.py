"""Per-token advantages from directive signals (pure functions, no I/O): hindsight-guided on-policy distillation (OPD)
and its combinations with the step-wise PRM. See docs/training/directive.md.

A step with a hint (prm/hints.py) has teacher log-probs: the same policy weights on the action's tokens under the turn's
context with the hint appended. Its gap is, per output token k, log pi_teacher(a_k) - log pi_old(a_k) (pi_old: the
rollout's log-probs); > 0 where the hint makes the token more likely. The modes (`reward.mode`), all through the same
PPO loss, give each step of one trajectory a `TokenAdvantage` (per-token values, or None: no gradient):

- `opd`: the gap on steps with a hint; other steps get no gradient.
- `combined`: w_step * A_step + w_opd * gap, A_step the step-index normalized integrated reward; a missing part counts
  as 0, and a step with neither gets no gradient.
- `gated`: the PRM as a validity gate, in step order: a step scored > 0 gets its gap (no hint: no gradient), the
  first step scored < 0 gets a uniform -gate_penalty on every token, every later step gets no gradient (a wrong step's
  cascade is not trained on); a step scored 0 before it gets no gradient.
- `multiplicative`: the step score times the gap, on steps with a hint (a negative score flips the gap's sign).

`gap_clip` (None: off, the paper's form) bounds each token's gap to [-gap_clip, gap_clip] before any mode uses it, so
one token the teacher finds very unlikely (a gap of -10 on a format token) cannot dominate a step's update.

`reward.opd_signal=teacher_topk` replaces the gap by a distribution-level term (train/topk_distill.py): a hinted step
is not given the gap as its advantage but a distillation weight, and the trainer pulls the student's distribution at
its action tokens toward the hinted teacher's top-k. `distill_advantages` is the modes' rule for it: where the gap
would go, the step gets the distillation term (its PPO part 0); every other part of the mode stays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

OPD_MODES = ("opd", "combined", "gated", "multiplicative")
#: `reward.opd_signal`: the gap on the sampled tokens (as advantages), or the distillation term on the teacher's top-k
OPD_SIGNALS = ("sampled", "teacher_topk")
#: the modes a distribution-level signal supports (multiplicative would scale a divergence by a signed score: pushing
#: the student away from the teacher's whole distribution has no minimum)
TOPK_MODES = ("opd", "combined", "gated")

#: `TokenAdvantage.mode`: what gave a step its advantage (APPLIED: it has token advantages) or why it has none
#: (NO_GRADIENT: its values are None)
APPLIED = ("opd", "step", "step+opd", "gate_negative", "multiplicative", "distill", "step+distill")
NO_GRADIENT = ("no_hint", "no_signal", "gate_closed", "gate_cut")


@dataclass(frozen=True)
class TokenAdvantage:
    values: list[float] | None  # one per output token of the step; None: the step gets no gradient
    mode: str  # one of APPLIED (values set) or NO_GRADIENT (values None)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None


def teacher_gap(teacher_logprobs: Sequence[float], old_logprobs: Sequence[float]) -> list[float]:
    """log pi_teacher - log pi_old per token of one action."""
    if len(teacher_logprobs) != len(old_logprobs):
        raise ValueError(f"{len(teacher_logprobs)} teacher log-probs for {len(old_logprobs)} action tokens")
    gap = [float(t) - float(o) for t, o in zip(teacher_logprobs, old_logprobs)]
    if any(not math.isfinite(g) for g in gap):
        raise ValueError("non-finite teacher-student gap (a log-prob of -inf or nan)")
    return gap


def gap_summary(gap: Sequence[float] | None) -> dict[str, float] | None:
    """mean, min, max and the mean square (`sq`: a spread over any set of steps' tokens) of a step's gap (None for a
    step without one or without tokens)."""
    if not gap:
        return None
    return {"mean": sum(gap) / len(gap), "min": min(gap), "max": max(gap), "sq": sum(x * x for x in gap) / len(gap),
            "tokens": len(gap)}


def clip_gap(gap: Sequence[float], bound: float | None) -> list[float]:
    """The gap with every token's value clipped to [-bound, bound] (bound None: unchanged)."""
    if bound is None:
        return list(gap)
    if bound <= 0:
        raise ValueError(f"gap_clip={bound}: use a positive bound (or None for no clipping)")
    return [min(max(x, -bound), bound) for x in gap]


def opd_advantages(gaps: Sequence[Sequence[float] | None]) -> list[TokenAdvantage]:
    return [TokenAdvantage(list(g), "opd") if g is not None else TokenAdvantage(None, "no_hint") for g in gaps]


def combined_advantages(
    step_advantages: Sequence[float | None],
    gaps: Sequence[Sequence[float] | None],
    lengths: Sequence[int],
    w_step: float = 1.0,
    w_opd: float = 1.0,
) -> list[TokenAdvantage]:
    out = []
    for a, g, n in zip(step_advantages, gaps, lengths, strict=True):
        if a is None and g is None:
            out.append(TokenAdvantage(None, "no_signal"))
            continue
        step_part = w_step * a if a is not None else 0.0
        opd_part = [w_opd * x for x in g] if g is not None else [0.0] * n
        mode = "step+opd" if a is not None and g is not None else ("step" if a is not None else "opd")
        out.append(TokenAdvantage([step_part + x for x in opd_part], mode))
    return out


def gated_advantages(
    step_scores: Sequence[float],
    gaps: Sequence[Sequence[float] | None],
    lengths: Sequence[int],
    gate_penalty: float = 1.0,
) -> list[TokenAdvantage]:
    out = []
    cut = False
    for score, g, n in zip(step_scores, gaps, lengths, strict=True):
        if cut:
            out.append(TokenAdvantage(None, "gate_cut"))
        elif score < 0:
            out.append(TokenAdvantage([-gate_penalty] * n, "gate_negative"))
            cut = True
        elif score > 0:
            out.append(TokenAdvantage(list(g), "opd") if g is not None else TokenAdvantage(None, "no_hint"))
        else:
            out.append(TokenAdvantage(None, "gate_closed"))
    return out


def multiplicative_advantages(
    step_scores: Sequence[float], gaps: Sequence[Sequence[float] | None]
) -> list[TokenAdvantage]:
    return [TokenAdvantage([s * x for x in g], "multiplicative") if g is not None else TokenAdvantage(None, "no_hint")
            for s, g in zip(step_scores, gaps, strict=True)]


def token_advantages(
    mode: str,
    *,
    step_advantages: Sequence[float | None],
    step_scores: Sequence[float],
    gaps: Sequence[Sequence[float] | None],
    lengths: Sequence[int],
    w_step: float = 1.0,
    w_opd: float = 1.0,
    gate_penalty: float = 1.0,
    gap_clip: float | None = None,
) -> list[TokenAdvantage]:
    """The steps of one trajectory under `mode` (one of OPD_MODES); every argument has one entry per step."""
    for name, seq in (("step_scores", step_scores), ("gaps", gaps), ("lengths", lengths)):
        if len(seq) != len(step_advantages):
            raise ValueError(f"{name} has {len(seq)} entries for {len(step_advantages)} steps")
    for g, n in zip(gaps, lengths):
        if g is not None and len(g) != n:
            raise ValueError(f"a step's gap has {len(g)} entries for its {n} tokens")
    gaps = [clip_gap(g, gap_clip) if g is not None else None for g in gaps]
    if mode == "opd":
        return opd_advantages(gaps)
    if mode == "combined":
        return combined_advantages(step_advantages, gaps, lengths, w_step, w_opd)
    if mode == "gated":
        return gated_advantages(step_scores, gaps, lengths, gate_penalty)
    if mode == "multiplicative":
        return multiplicative_advantages(step_scores, gaps)
    raise ValueError(f"unknown directive mode {mode!r}: use one of {', '.join(OPD_MODES)}")


@dataclass(frozen=True)
class StepSignal:
    """A step's part of the loss under reward.opd_signal=teacher_topk: its PPO token advantages and the weight of its
    distillation term (None: the step is masked out of that term: it has no hint)."""

    advantage: TokenAdvantage
    distill: float | None


def distill_advantages(
    mode: str,
    *,
    step_advantages: Sequence[float | None],
    step_scores: Sequence[float],
    hinted: Sequence[bool],
    lengths: Sequence[int],
    w_step: float = 1.0,
    w_opd: float = 1.0,
    gate_penalty: float = 1.0,
) -> list[StepSignal]:
    """The steps of one trajectory under `mode` (one of TOPK_MODES) with the distribution-level signal; `hinted`:
    the step has the teacher's top-k. opd: a hinted step is distilled (weight 1), its PPO advantage 0; combined:
    w_step * A_step as the PPO advantage and, on hinted steps, the distillation term with weight w_opd; gated: as
    with the gap, the distillation term taking the gap's place on steps scored > 0."""
    for name, seq in (("step_scores", step_scores), ("hinted", hinted), ("lengths", lengths)):
        if len(seq) != len(step_advantages):
            raise ValueError(f"{name} has {len(seq)} entries for {len(step_advantages)} steps")
    out: list[StepSignal] = []
    if mode == "opd":
        return [StepSignal(TokenAdvantage([0.0] * n, "distill"), 1.0) if h else StepSignal(TokenAdvantage(None,
                "no_hint"), None) for h, n in zip(hinted, lengths)]
    if mode == "combined":
        for a, h, n in zip(step_advantages, hinted, lengths):
            if a is None and not h:
                out.append(StepSignal(TokenAdvantage(None, "no_signal"), None))
                continue
            value = w_step * a if a is not None else 0.0
            rule = "step+distill" if a is not None and h else ("step" if a is not None else "distill")
            out.append(StepSignal(TokenAdvantage([value] * n, rule), w_opd if h else None))
        return out
    if mode == "gated":
        gaps = [[0.0] * n if h else None for h, n in zip(hinted, lengths)]
        for r, h in zip(gated_advantages(step_scores, gaps, lengths, gate_penalty), hinted):
            if r.mode == "opd":
                out.append(StepSignal(TokenAdvantage(r.values, "distill"), 1.0))
            else:
                out.append(StepSignal(r, None))
        return out
    raise ValueError(f"reward.opd_signal=teacher_topk supports the modes {', '.join(TOPK_MODES)}, not {mode!r}")


def topk_summary(token_ids: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]],
                 action_ids: Sequence[int]) -> dict[str, float] | None:
    """What a step's teacher top-k says about the sampled tokens: `sampled_mass` (the teacher's probability of the
    sampled token, counted where it is in the top-k, else 0), `sampled_in_topk` (the fraction of sampled tokens that
    are), `tail` (the mean mass outside the top-k), per token on average; None for a step without tokens."""
    if not action_ids:
        return None
    if len(token_ids) != len(action_ids) or len(logprobs) != len(action_ids):
        raise ValueError(f"a top-k of {len(token_ids)} rows for {len(action_ids)} action tokens")
    mass = inside = tail = 0.0
    for ids, lps, a in zip(token_ids, logprobs, action_ids):
        probs = [math.exp(x) for x in lps]
        hit = [p for i, p in zip(ids, probs) if i == a]
        mass += hit[0] if hit else 0.0
        inside += 1.0 if hit else 0.0
        tail += max(0.0, 1.0 - sum(probs))
    n = len(action_ids)
    return {"sampled_mass": mass / n, "sampled_in_topk": inside / n, "tail": tail / n, "tokens": n}


__all__ = ["APPLIED", "NO_GRADIENT", "OPD_MODES", "OPD_SIGNALS", "TOPK_MODES", "StepSignal", "TokenAdvantage",
           "distill_advantages", "topk_summary", "clip_gap", "combined_advantages", "gap_summary",
           "gated_advantages", "multiplicative_advantages", "opd_advantages", "teacher_gap", "token_advantages"]
