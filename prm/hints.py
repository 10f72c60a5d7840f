"""Directive signals (pure functions): the hint a judge reads from a next state, which hint a step keeps, the teacher's
context with the hint in it, and the rule judge's hints from the env's structured signals.

A hint says how the action should have been different ("the call should have been 12 + 7", "ModuleNotFoundError: no
module named 'yaml'"). The LLM judge's hint template asks for `\\boxed{1}` and a hint between `[HINT_START]` and
`[HINT_END]` when the next state holds such information, `\\boxed{-1}` otherwise (paper, "Directive signals"); the rule
judge writes the same from the facts the env knows for sure. Of a step's hint votes, the longest valid hint (at least
`min_chars` characters) among those voting +1 is kept (`select_hint`); none: the step has no hint.

Which steps get hints (`HINT_STEPS`): `wrong` hints only where the signals say how the action should have differed
(`rule_hint`); `directive` also hints right steps whose next state says what to do next (`rule_directive_hint`: "the
result 37 is right; the next step is ..."), OpenClaw-RL's gate ("the next state carries directive information"), so
the directive loss also pulls right tokens up, not only wrong ones down.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from envs.base import ERROR, PARSE_ERROR, PROGRESS, WRONG
from prm.voting import strip_reasoning

HINT_START, HINT_END = "[HINT_START]", "[HINT_END]"
MIN_HINT_CHARS = 10  # the paper's: shorter hints are dropped
HINT_LABEL = "Hint (hindsight):"  # what precedes the hint in the teacher's context
RULE_HINT_CHARS = 400  # a rule hint is cut to this length
_HINT = re.compile(re.escape(HINT_START) + r"(.*?)" + re.escape(HINT_END), re.DOTALL)
SCREEN_CHANGED = "screen_changed"  # the GUI env's signal (envs/gui/env.py)
HINT_STEPS = ("wrong", "directive")  # which steps get hints: judge.hint_steps (module docstring)


def check_hint_steps(value: str) -> str:
    """`value` if it is one of HINT_STEPS, else a ValueError naming them."""
    if value not in HINT_STEPS:
        raise ValueError(f"unknown judge.hint_steps {value!r}: use {' or '.join(HINT_STEPS)}")
    return value


def parse_hint(text: str | None, *, strip_think: bool = True) -> str | None:
    """The text between the first `[HINT_START]` and the next `[HINT_END]` (stripped), looked for after the reasoning
    when `strip_think`; None when there is none or it is empty."""
    if text and strip_think:
        text = strip_reasoning(text)
    if not text:
        return None
    m = _HINT.search(text)
    hint = m.group(1).strip() if m else ""
    return hint or None


def select_hint(votes: Sequence[int | None], hints: Sequence[str | None], min_chars: int = MIN_HINT_CHARS) -> str | None:
    """The longest hint of at least `min_chars` characters among the votes that are +1 (the first of equal length);
    None if no vote qualifies."""
    if len(votes) != len(hints):
        raise ValueError(f"{len(votes)} hint votes for {len(hints)} hints")
    best: str | None = None
    for vote, hint in zip(votes, hints):
        if vote == 1 and hint is not None and len(hint) >= min_chars and (best is None or len(hint) > len(best)):
            best = hint
    return best


def with_hint(messages: Sequence[Mapping[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The teacher's context: `messages` (a turn's context, ending before the action) with the hint appended to the
    last message that is not the assistant's (the turn's user or tool message). The messages are copied."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") != "assistant" and m.get("role") != "system":
            m["content"] = f"{_text(m.get('content'))}\n\n{HINT_LABEL} {hint}"
            return out
    raise ValueError("the context has no user or tool message to append the hint to")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))


def rule_hint(signals: Mapping[str, Any]) -> str | None:
    """A hint from the facts an env puts in `signals` (None when they say nothing about how the action should have
    differed): the parse error's reason, the expected vs the shown value, a timeout, the exit code with the stderr
    tail, the exception, the failing tests and their assertion, a failed tool or GUI action, a wrong answer, hidden
    tests still failing at submission, an unchanged screen, the milestone still missing."""
    s = signals
    parts: list[str] = []
    if s.get(PARSE_ERROR):
        why = s.get("parse_message")
        parts.append(f"The action could not be parsed{f' ({why})' if why else ''}: reply in the expected format.")
    expected, shown = s.get("expected"), s.get("shown")
    if expected is not None and str(expected) != str(shown):
        parts.append(f"It should have been {expected}" + (f", not {shown}." if shown is not None else "."))
    if s.get("timed_out"):
        parts.append("The command timed out: run something that finishes quickly.")
    elif s.get(ERROR) and isinstance(s.get("exit_code"), int) and s["exit_code"] != 0:
        tail = s.get("stderr_tail")
        parts.append(f"It exited with code {s['exit_code']}" + (f": {tail}" if tail else "."))
    exception = s.get("exception")
    if exception and exception not in " ".join(parts):
        parts.append(f"It raised {exception}.")
    failed = list(s.get("failed_tests") or [])
    assertion = s.get("assertion")
    if failed:
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        parts.append(f"Failing tests: {', '.join(map(str, failed[:3]))}{more}" + (f" ({assertion})." if assertion else "."))
    elif assertion:
        parts.append(f"Assertion failed: {assertion}.")
    for key in ("error_reason", "error_message"):  # a failed tool run or GUI action, an empty or unappliable patch
        if s.get(key) and str(s[key]) not in " ".join(parts):
            parts.append(f"It failed: {s[key]}.")
    if s.get("correct") is False and s.get("answer") is not None and expected is None:
        parts.append(f"The answer {s['answer']} is not correct.")
    if s.get("submitted") and isinstance(s.get("tests_total"), int) and (s.get("tests_passed") or 0) < s["tests_total"]:
        if not failed:
            parts.append(f"Submitted with {s['tests_total'] - (s.get('tests_passed') or 0)} of {s['tests_total']} "
                         "hidden tests failing: keep working before submitting.")
    if s.get(SCREEN_CHANGED) is False and not s.get(PARSE_ERROR) and not s.get(ERROR) and not s.get(PROGRESS):
        parts.append("The action did not change the screen: act on another element or position.")
    if s.get("milestone_missing") and not s.get(PROGRESS):
        parts.append(f"Still to do: {s['milestone_missing']}.")
    hint = " ".join(parts).strip()
    return _cut(hint) if hint else None


def rule_directive_hint(signals: Mapping[str, Any]) -> str | None:
    """A right step's hint: the step as done and the right step after it (chain tasks: `confirmed`, `next_step`);
    None when the step went wrong or the signals do not say what comes next (e.g. the final answer)."""
    s = signals
    if s.get(PARSE_ERROR) or s.get(ERROR) or s.get(WRONG) or not s.get(PROGRESS):
        return None
    done, after = s.get("confirmed"), s.get("next_step")
    if not done or not after:
        return None
    return _cut(f"{done} is right; the next step is {after}.")


def step_rule_hint(signals: Mapping[str, Any], hint_steps: str = "wrong") -> str | None:
    """The rule judge's hint for a step: the wrong-step hint, and with `hint_steps=directive` a right step's one
    where there is none."""
    hint = rule_hint(signals)
    if hint is None and check_hint_steps(hint_steps) == "directive":
        hint = rule_directive_hint(signals)
    return hint


def _cut(hint: str) -> str:
    return hint if len(hint) <= RULE_HINT_CHARS else hint[: RULE_HINT_CHARS - 3].rstrip() + "..."


__all__ = ["HINT_END", "HINT_LABEL", "HINT_START", "HINT_STEPS", "MIN_HINT_CHARS", "check_hint_steps", "parse_hint",
           "rule_directive_hint", "rule_hint", "select_hint", "step_rule_hint", "with_hint"]
