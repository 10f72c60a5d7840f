"""Scored trajectories -> TrainSamples, in one of two layouts (`loop.sample_layout`).

- `step` ("dynamic history"): one sample per step = that step's prompt + output; the step's advantage on its output.
- `trajectory`: one sample per trajectory = the last scored step's prompt + output, in which every earlier step's output
  appears at its own span; observation tokens (tool results, chat-template tokens, the next prompt) are masked, and the
  advantage of step t covers exactly the output span of step t. Valid only when each step's prompt extends the previous
  step's prompt + output token for token (the policy re-rendered the history to the ids it produced). Where it does not
  (a chat template that re-renders history differently, a non-canonical tokenization that re-encodes differently, a
  truncated prompt), that trajectory falls back to per-step samples and is counted.

The token ids are exactly those the policy saw and produced; nothing is re-tokenized. A step's advantage covers its
output tokens: its per-token advantages when it has them (the directive modes, train/opd.py), else the step's one value
on every token. A vision-language policy's samples carry the images of their prompt (`TrainSample.vision`), so the
trainer sees the pixels the sampler saw. A step with a distillation weight and the teacher's top-k
(reward.opd_signal=teacher_topk) adds a `DistillTarget` over its output span; other steps are masked out of that term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from train.records import DEFAULT_DIVERGENCE, DistillTarget, Step, TokenSpan, TrainSample, Trajectory

LAYOUTS = ("step", "trajectory")


@dataclass
class LayoutStats:
    layout: str
    samples: int = 0
    trajectories: int = 0  # trajectories with at least one step that has a gradient
    trajectory_samples: int = 0  # trajectories trained as one sample (layout=trajectory)
    fallback_trajectories: int = 0  # layout=trajectory, but a prompt did not extend the history: per-step samples
    sample_tokens: int = 0  # tokens in all samples (what the trainer runs forward on)

    def as_metrics(self) -> dict[str, float | str]:
        return {
            "sample_layout": self.layout,
            "layout/trajectories": self.trajectories,
            "layout/trajectory_samples": self.trajectory_samples,
            "layout/fallback_trajectories": self.fallback_trajectories,
            "layout/sample_tokens": self.sample_tokens,
        }


def _scored(step: Step) -> bool:
    return step.advantage is not None and bool(step.output_ids)


def output_advantages(step: Step) -> list[float]:
    """The advantage of each output token of a scored step."""
    n = len(step.output_ids)
    if step.token_advantages is not None:
        if len(step.token_advantages) != n:
            raise ValueError(f"step {step.step_index} of {step.episode_id}: {len(step.token_advantages)} token "
                             f"advantages for {n} output tokens")
        return [float(a) for a in step.token_advantages]
    return [float(step.advantage)] * n if step.advantage is not None else [0.0] * n


def distill_target(step: Step, start: int, clamp: float | None = None,
                   divergence: str = DEFAULT_DIVERGENCE) -> list[DistillTarget]:
    """The step's distillation target at output span [start, start + n) (none: no weight or no top-k)."""
    if step.distill_weight is None or step.teacher_topk is None or step.advantage is None or not step.output_ids:
        return []
    if len(step.teacher_topk.sampled) != len(step.output_ids):
        raise ValueError(f"step {step.step_index} of {step.episode_id}: a top-k of {len(step.teacher_topk.sampled)} "
                         f"rows for {len(step.output_ids)} output tokens")
    return [DistillTarget(start, start + len(step.output_ids), step.teacher_topk, step.distill_weight, clamp,
                          divergence)]


def step_sample(traj: Trajectory, step: Step, distill_clamp: float | None = None,
                distill_divergence: str = DEFAULT_DIVERGENCE) -> TrainSample:
    """Prompt + output of one step; its advantage on the output tokens."""
    n_p, n_o = len(step.prompt_ids), len(step.output_ids)
    mask = 1 if step.advantage is not None else 0
    return TrainSample(
        tokens=list(step.prompt_ids) + list(step.output_ids),
        loss_mask=[0] * n_p + [mask] * n_o,
        advantages=[0.0] * n_p + (output_advantages(step) if mask else [0.0] * n_o),
        rollout_logprobs=[0.0] * n_p + list(step.output_logprobs),
        group_id=traj.group_id,
        step_index=step.step_index,
        weight_version=step.weight_version,
        spans=[TokenSpan(n_p, n_p + n_o, step.step_index, step.weight_version, step.advantage)],
        vision=step.vision,
        distill=distill_target(step, n_p, distill_clamp, distill_divergence),
    )


def history_break(steps: Sequence[Step]) -> int | None:
    """The first t whose prompt does not start with step t-1's prompt + output ids (None: every prompt extends it)."""
    for t in range(1, len(steps)):
        prev = list(steps[t - 1].prompt_ids) + list(steps[t - 1].output_ids)
        if list(steps[t].prompt_ids[: len(prev)]) != prev:
            return t
    return None


def trajectory_sample(traj: Trajectory, steps: Sequence[Step], distill_clamp: float | None = None,
                      distill_divergence: str = DEFAULT_DIVERGENCE) -> TrainSample:
    """One sample holding `steps` (a prefix-consistent run of the trajectory's steps, see `history_break`)."""
    last = steps[-1]
    tokens = list(last.prompt_ids) + list(last.output_ids)
    n = len(tokens)
    mask, adv, old = [0] * n, [0.0] * n, [0.0] * n
    spans, distill = [], []
    for s in steps:
        start = len(s.prompt_ids)
        end = start + len(s.output_ids)
        spans.append(TokenSpan(start, end, s.step_index, s.weight_version, s.advantage))
        distill += distill_target(s, start, distill_clamp, distill_divergence)
        old[start:end] = list(s.output_logprobs)
        if s.advantage is not None:
            mask[start:end] = [1] * (end - start)
            adv[start:end] = output_advantages(s)
    scored = [sp.weight_version for sp in spans if sp.advantage is not None and sp.end > sp.start]
    return TrainSample(
        tokens=tokens,
        loss_mask=mask,
        advantages=adv,
        rollout_logprobs=old,
        group_id=traj.group_id,
        step_index=steps[0].step_index,
        weight_version=min(scored) if scored else last.weight_version,
        meta={"episode_id": traj.episode_id, "layout": "trajectory"},
        spans=spans,
        vision=last.vision,  # the last prompt holds every image the sequence shows
        distill=distill,
    )


def build_samples(trajs: Sequence[Trajectory], layout: str = "step",
                  distill_clamp: float | None = None,
                  distill_divergence: str = DEFAULT_DIVERGENCE) -> tuple[list[TrainSample], LayoutStats]:
    """TrainSamples of the scored steps of `trajs` (steps with an advantage and output tokens) in `layout`;
    `distill_clamp`, `distill_divergence`: reward.topk_clamp, reward.topk_divergence, carried by each distillation
    target."""
    if layout not in LAYOUTS:
        raise ValueError(f"sample_layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    stats = LayoutStats(layout)
    samples: list[TrainSample] = []
    for tr in trajs:
        scored = [i for i, s in enumerate(tr.steps) if _scored(s)]
        if not scored:
            continue
        stats.trajectories += 1
        if layout == "trajectory":
            steps = tr.steps[: scored[-1] + 1]  # later steps add no gradient: leave them out of the sequence
            if history_break(steps) is None:
                samples.append(trajectory_sample(tr, steps, distill_clamp, distill_divergence))
                stats.trajectory_samples += 1
                continue
            stats.fallback_trajectories += 1
        samples.extend(step_sample(tr, tr.steps[i], distill_clamp, distill_divergence) for i in scored)
    stats.samples = len(samples)
    stats.sample_tokens = sum(len(s.tokens) for s in samples)
    return samples, stats


__all__ = ["LAYOUTS", "LayoutStats", "build_samples", "distill_target", "history_break", "output_advantages", "step_sample",
           "trajectory_sample"]
