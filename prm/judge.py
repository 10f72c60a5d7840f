"""The Judge protocol and the RuleJudge (structured env signals, no LLM)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envs.base import ERROR, PARSE_ERROR, PROGRESS, WRONG
from prm.hints import HINT_END, HINT_START, MIN_HINT_CHARS, check_hint_steps, select_hint, step_rule_hint
from prm.voting import aggregate


@dataclass
class StepContext:
    """Everything a judge may look at for one step."""

    family: str  # "terminal" | "gui" | "swe" | "toolcall" | "generic" (plugins)
    task_id: str
    instruction: str  # the task as the agent first saw it
    history: list[dict[str, Any]]  # messages before this step's action (system, user, assistant, tool ...)
    action: str  # the policy's full output for this step
    next_state: dict[str, str]  # {"role", "content"} as the env answered
    signals: dict[str, Any] = field(default_factory=dict)
    step_index: int = 0
    image_before: Any = None  # GUI: screenshot before the action (H×W×3 uint8)
    image_after: Any = None  # GUI: screenshot after it
    episode_id: str = ""  # which episode the step belongs to (set by the runner; e.g. seeds per-step judge noise)


@dataclass
class Judgement:
    score: float
    votes: list[int | None]
    raw: list[str]
    # the directive signal (prm/hints.py): the longest valid hint among the hint votes that are +1; None: no hint
    hint: str | None = None
    hint_votes: list[int | None] = field(default_factory=list)  # +1: the next state says how the action should differ
    hint_raw: list[str] = field(default_factory=list)  # each hint vote's raw text
    # what the verdict cost (LLM judges; 0 for rule judges): wall seconds from the score() call to the verdict, request
    # slot queueing included, and the tokens the judge server reported in its `usage` field, summed over the votes
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False  # an identical step was judged before (or at the same time): no request was made for this one


@runtime_checkable
class Judge(Protocol):
    """What the runner needs of a judge. The optional member has its default here: a judge that subclasses Judge gets
    it, and overrides it when it keeps counts."""

    async def score(self, ctx: StepContext) -> Judgement: ...

    async def close(self) -> None: ...

    # ----- optional -----
    def metrics(self) -> dict[str, int]:
        """Counters as flat `judge/*` keys (requests, cache hits, ...)."""
        return {}


class RuleJudge(Judge):
    """Scores a step from `signals`: parse error, error or wrong -> -1, progress -> +1, otherwise 0.

    It records one vote and a raw string in the same shape as an LLM judge so that records and statistics are uniform.
    With `hints`, it also gives the step's hint from the same signals (`prm.hints.rule_hint`): one hint vote, +1 with
    the hint when the signals say how the action should have differed (`hint_steps=directive`: or, on a right step,
    what to do next), -1 otherwise.
    """

    def __init__(self, aggregate_mode: str = "mean", hints: bool = False, min_hint_chars: int = MIN_HINT_CHARS,
                 hint_steps: str = "wrong"):
        self.aggregate_mode = aggregate_mode
        self.hints = hints
        self.min_hint_chars = min_hint_chars
        self.hint_steps = check_hint_steps(hint_steps)

    async def score(self, ctx: StepContext) -> Judgement:
        return self.score_now(ctx)

    def score_now(self, ctx: StepContext) -> Judgement:
        s = ctx.signals
        if s.get(PARSE_ERROR):
            vote, why = -1, "the action could not be parsed"
        elif s.get(ERROR):
            vote, why = -1, "the action failed"
        elif s.get(WRONG):
            vote, why = -1, "the env says the step went wrong"
        elif s.get(PROGRESS):
            vote, why = 1, "the next state shows progress"
        else:
            vote, why = 0, "no error and no sure sign of progress"
        judgement = Judgement(aggregate([vote], self.aggregate_mode), [vote], [f"rule: {why} \\boxed{{{vote}}}"])
        if self.hints:
            text = step_rule_hint(s, self.hint_steps)
            hint_vote = 1 if text else -1
            judgement.hint_votes = [hint_vote]
            judgement.hint_raw = [f"rule hint: \\boxed{{{hint_vote}}}" + (f" {HINT_START}{text}{HINT_END}" if text else "")]
            judgement.hint = select_hint([hint_vote], [text], self.min_hint_chars)
        return judgement

    async def close(self) -> None:
        return None
