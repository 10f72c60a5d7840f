"""The record types that cross layers: an episode's steps and trajectory (built by rollout's runner, scored by
train.batch) and the training sample (built by train.sample_layout, consumed by the trainer backends).

They live here, in the lowest layer that needs them (`train`; the judge's verdict on a step is prm's `Judgement`), so
that `train` never imports `rollout`. One JSON object per step (`Step.to_json`) is a line of `trajectories.jsonl`
(fields fixed by docs/architecture.md, "Contracts"); `Trajectory.summary()` is a line of `episodes.jsonl`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any

from prm.judge import Judgement


class EpisodeStatus(str, Enum):
    """queued -> running -> ok | failed | aborted (see `TRANSITIONS`)."""

    QUEUED = "queued"
    RUNNING = "running"
    OK = "ok"  # ended by the env (terminated or truncated)
    FAILED = "failed"  # the policy or judge failed; the env is fine
    ABORTED = "aborted"  # the env or its worker died, hung or raised


TRANSITIONS: dict[EpisodeStatus, set[EpisodeStatus]] = {
    EpisodeStatus.QUEUED: {EpisodeStatus.RUNNING, EpisodeStatus.ABORTED},
    EpisodeStatus.RUNNING: {EpisodeStatus.OK, EpisodeStatus.FAILED, EpisodeStatus.ABORTED},
    EpisodeStatus.OK: set(),
    EpisodeStatus.FAILED: set(),
    EpisodeStatus.ABORTED: set(),
}


@dataclass
class Step:
    run_id: str
    episode_id: str
    group_id: str
    task_id: str
    step_index: int
    action: str
    next_state: dict[str, str]
    signals: dict[str, Any]
    status: str = EpisodeStatus.RUNNING.value
    judge: Judgement | None = None  # the judge's verdict on this step (None: not judged)
    outcome: float | None = None
    reward: float | None = None  # R_t = outcome + coef * step score
    advantage: float | None = None  # None: no gradient for this step
    weight_version: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    prompt_truncated_from: int | None = None  # the prompt's length before the policy cut it to its limit (None: not cut)
    # directive signals (train/opd.py): what gave the step its advantage (train.opd.APPLIED / NO_GRADIENT; None for
    # the step-wise modes) and the teacher-student gap on its tokens ({mean, min, max, tokens}; None: no teacher)
    advantage_mode: str | None = None
    teacher_gap: dict[str, float] | None = None
    iteration: int = 0  # the iteration (training) or evaluation point the episode belongs to
    screenshot: str | None = None  # GUI: the screen after this action, a PNG path relative to the run directory
    # exact token ids / logprobs for training (kept in memory; written only when records.token_ids is on)
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    output_ids: list[int] = field(default_factory=list, repr=False)
    output_logprobs: list[float] = field(default_factory=list, repr=False)
    family: str = ""  # the env family the episode ran in (a run's family name; env=mix runs several)
    # where the step's wall time went, in seconds: policy_s (the policy call), env_s (the env step), runner_s (the
    # runner's own code), judge_s (the judgement, in flight beside the next turns); with loop.trace_requests, each
    # request's phases (policy_server_s, judge_pool_wait_s, ...: prm/client/timing.py)
    timing: dict[str, float] = field(default_factory=dict)
    # per output token: the advantage (None: `advantage` on every token) and the teacher's log-probs (None: no hint);
    # written on every step that has teacher log-probs, with its output_logprobs, so the advantage can be recomputed
    token_advantages: list[float] | None = field(default=None, repr=False)
    teacher_logprobs: list[float] | None = field(default=None, repr=False)
    teacher_prompt_ids: list[int] = field(default_factory=list, repr=False)  # the enhanced context's ids
    # reward.opd_signal=teacher_topk: the teacher's top-k at each action token (in memory only: n x k ids and
    # log-probs per step), the weight of the step's distillation term (None: the step is masked out of it) and what
    # the top-k says about the sampled tokens (train.opd.topk_summary: written)
    teacher_topk: TeacherTopK | None = field(default=None, repr=False)
    distill_weight: float | None = None
    teacher_topk_summary: dict[str, float] | None = None
    # the messages before the action (the teacher's context is built from them); in memory only, never written
    context: list[dict[str, Any]] = field(default_factory=list, repr=False)
    vision: VisionInputs | None = field(default=None, repr=False)  # the prompt's images (in memory only, never written)

    TOKEN_FIELDS = ("prompt_ids", "output_ids", "output_logprobs", "teacher_prompt_ids")
    OPD_FIELDS = ("token_advantages", "teacher_logprobs")

    def to_json(self, token_ids: bool = False) -> dict[str, Any]:
        # field by field (not asdict): the context's screenshots must not be deep-copied for every line written, and
        # the prompt's images (vision) stay in memory: a JSON line holds no pixels
        d = {f.name: _copied(getattr(self, f.name)) for f in fields(self)
             if f.name not in ("context", "vision", "teacher_topk")}
        if not token_ids:
            for k in self.TOKEN_FIELDS:
                if not (k == "output_logprobs" and self.teacher_logprobs is not None):
                    d.pop(k)
            for k in self.OPD_FIELDS:
                if d[k] is None:
                    d.pop(k)
        return d


def _copied(value: Any) -> Any:
    """A value as a JSON line holds it: dataclasses as dicts, containers copied (the writer serializes later)."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


@dataclass
class Trajectory:
    run_id: str
    episode_id: str
    group_id: str
    task_id: str
    status: EpisodeStatus = EpisodeStatus.QUEUED
    steps: list[Step] = field(default_factory=list)
    outcome: float | None = None
    reason: str = ""  # why an episode failed or aborted (with the traceback text)
    attempt: int = 0  # retries of the same task slot after an abort
    split: str = "train"
    iteration: int = 0
    wall_s: float = 0.0
    family: str = ""  # the env family (selects the judge template; reported per family)
    screenshot: str | None = None  # GUI: the first screen (before step 0), a PNG path relative to the run directory
    # seconds: lease_wait_s (waiting for an env slot), reset_s (the env's reset), judge_wait_s (after the env was
    # done, waiting for the last judgements: its slot already given back)
    timing: dict[str, float] = field(default_factory=dict)

    def move(self, new: EpisodeStatus, reason: str = "") -> None:
        if new not in TRANSITIONS[self.status]:
            raise ValueError(f"episode {self.episode_id}: illegal status change {self.status.value} -> {new.value}")
        self.status = new
        if reason:
            self.reason = reason
        for s in self.steps:
            s.status = new.value

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "episode_id": self.episode_id,
            "group_id": self.group_id,
            "task_id": self.task_id,
            "family": self.family,
            "status": self.status.value,
            "reason": self.reason,
            "attempt": self.attempt,
            "split": self.split,
            "iteration": self.iteration,
            "num_steps": len(self.steps),
            "outcome": self.outcome,
            "wall_s": round(self.wall_s, 4),
            "timing": {k: round(v, 6) for k, v in self.timing.items()},
            "screenshot": self.screenshot,
        }


@dataclass(frozen=True)
class TokenSpan:
    """The output tokens of one step inside a sample: positions [start, end) of `TrainSample.tokens`."""

    start: int
    end: int
    step_index: int
    weight_version: int
    advantage: float | None  # None: the step gets no gradient (its span is masked)


@dataclass
class VisionInputs:
    """A prompt's images as a vision-language model reads them, in the order of their placeholder tokens in the token
    ids (Qwen-VL: every image's patches concatenated, and each image's (t, h, w) patch grid). Made by the policy that
    rendered the prompt, so the trainer recomputes the logprobs of exactly what the sampler saw."""

    pixel_values: Any  # torch.Tensor [patches, patch_dim], float32
    image_grid_thw: Any  # torch.Tensor [images, 3], int64

    @property
    def num_images(self) -> int:
        return int(self.image_grid_thw.shape[0])


@dataclass
class TeacherTopK:
    """The teacher's distribution at each token of one action, as its top-k (+ the rest of its mass, implied): row j
    is the distribution that predicts action token j, at the rollout temperature. `sampled[j]`: the teacher's log-prob
    of the token the policy sampled there (inside the top-k or not)."""

    token_ids: list[list[int]]  # [n][k], most likely first
    logprobs: list[list[float]]  # [n][k]
    sampled: list[float]  # [n]

    def __post_init__(self) -> None:
        n = len(self.sampled)
        if len(self.token_ids) != n or len(self.logprobs) != n:
            raise ValueError(f"TeacherTopK: {len(self.token_ids)} id rows, {len(self.logprobs)} log-prob rows for {n} "
                             "tokens")
        if any(len(i) != len(lp) or not i for i, lp in zip(self.token_ids, self.logprobs)):
            raise ValueError("TeacherTopK: every row needs as many ids as log-probs, at least one")

    @property
    def k(self) -> int:
        return len(self.token_ids[0]) if self.token_ids else 0


#: `reward.topk_divergence`: what a distillation target's per-token term measures between the teacher's and the
#: student's k + 1 bins (train/topk_distill.py topk_divergence); reverse by default (docs/training/directive.md)
DIVERGENCES = ("forward", "reverse", "jsd")
DEFAULT_DIVERGENCE = "reverse"


@dataclass(frozen=True)
class DistillTarget:
    """A step's distillation target inside a sample: the teacher's top-k of the tokens at positions [start, end) of
    `TrainSample.tokens` (row j: the token at start + j), with the weight of its term in the loss and the per-token
    clamp of its KL (None: none)."""

    start: int
    end: int
    topk: TeacherTopK
    weight: float = 1.0
    clamp: float | None = None
    divergence: str = DEFAULT_DIVERGENCE  # reward.topk_divergence


@dataclass
class TrainSample:
    """One training sequence. All per-token lists have len(tokens); loss_mask is 1 on tokens the policy produced."""

    tokens: list[int]
    loss_mask: list[int]
    advantages: list[float]
    rollout_logprobs: list[float]  # logprob of each token under the policy that sampled it (0 where masked)
    group_id: str = ""
    step_index: int = 0
    weight_version: int = 0  # the oldest weights that produced any of its scored tokens
    meta: dict[str, Any] = field(default_factory=dict)
    spans: list[TokenSpan] = field(default_factory=list)  # each step's output tokens (one per step in the sample)
    vision: VisionInputs | None = field(default=None, repr=False)  # the images of the prompt (vision-language policy)
    # reward.opd_signal=teacher_topk: the hinted steps' teacher top-k (the distillation loss; other tokens are masked)
    distill: list[DistillTarget] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("loss_mask", "advantages", "rollout_logprobs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrainSample.{name} has {len(getattr(self, name))} entries for {n} tokens")
        for sp in self.spans:
            if not 0 <= sp.start <= sp.end <= n:
                raise ValueError(
                    f"TrainSample span [{sp.start}, {sp.end}) of step {sp.step_index} lies outside its {n} tokens"
                )
        for d in self.distill:  # token 0 is never predicted: a target starts at 1 or later
            if not 1 <= d.start <= d.end <= n or d.end - d.start != len(d.topk.sampled):
                raise ValueError(f"TrainSample distillation target [{d.start}, {d.end}) with {len(d.topk.sampled)} "
                                 f"rows does not fit its {n} tokens")
