"""OSWorld's evaluation, step for step: postconfig, the infeasible rule, single or listed metrics joined by `conj`.

`func` is a metric name or a list of them; `result`, `expected` and `options` are then lists of the same length
(`expected` entries may be null). `conj` "and" stops at the first metric scoring 0 and otherwise averages; "or" stops at
the first scoring 1 and otherwise takes the maximum. A result getter raising FileNotFoundError scores 0. A final FAIL
action scores 1 on an infeasible task and 0 on any other.

`partial_checks` evaluates a list of single checks (the task's progress milestones) for the step-level progress signal.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.gui import app_getters, browser_getters, getters
from envs.gui.getters import EvalContext
from envs.gui.metrics import INFEASIBLE, METRICS
from envs.gui.setup_steps import SetupContext, run_steps

log = logging.getLogger(__name__)

GETTERS = {**browser_getters.GETTERS, **app_getters.GETTERS, **getters.GETTERS}


@dataclass
class Evaluation:
    score: float
    scores: list[float] = field(default_factory=list)  # per metric, in order (fewer when the conjunction stopped early)
    error: str = ""  # set when the evaluator itself failed (a task or environment bug, not the agent's)


def _as_list(value: Any, n: int, what: str) -> list[Any]:
    if value is None:
        return [None] * n
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"evaluator: 'func' is a list of {n}, so '{what}' must be a list of {n} too")
    return value


def normalize(evaluator: dict[str, Any]) -> tuple[list[str], list[Any], list[Any], list[dict[str, Any]], str]:
    """(funcs, result getters, expected getters, options, conj) as lists, with clear errors for malformed shapes."""
    func = evaluator.get("func")
    if isinstance(func, list):
        n = len(func)
        if n == 0:
            raise ValueError("evaluator: 'func' is an empty list")
        results = _as_list(evaluator.get("result"), n, "result")
        expected = _as_list(evaluator.get("expected") or None, n, "expected")
        options = [o or {} for o in _as_list(evaluator.get("options"), n, "options")]
        funcs = list(func)
    elif isinstance(func, str) and func:
        funcs, results = [func], [evaluator.get("result")]
        expected = [evaluator.get("expected") or None]
        options = [evaluator.get("options") or {}]
    elif func == "":
        raise ValueError("the task has no evaluator (its 'func' is empty: nothing can score it)")
    else:
        raise ValueError(f"evaluator: 'func' must be a metric name or a list of them, got {func!r}")
    conj = evaluator.get("conj", "and")
    if conj not in ("and", "or"):
        raise ValueError(f"evaluator: 'conj' must be 'and' or 'or', got {conj!r}")
    return funcs, results, expected, options, conj


def check_supported(evaluator: dict[str, Any]) -> None:
    """Raise ValueError naming any metric or getter this implementation lacks."""
    if evaluator.get("func") == INFEASIBLE:
        return
    funcs, results, expected, _, _ = normalize(evaluator)
    for f in funcs:
        if f not in METRICS:
            raise ValueError(f"evaluator: metric {f!r} is not supported; supported: {', '.join(sorted(METRICS))}")
    for spec in list(results) + list(expected):
        if spec is None:
            continue
        if not isinstance(spec, dict) or "type" not in spec:
            raise ValueError(f"evaluator: a getter entry must be an object with a 'type', got {spec!r}")
        if spec["type"] not in GETTERS:
            raise ValueError(
                f"evaluator: getter {spec['type']!r} is not supported; supported: {', '.join(sorted(GETTERS))}"
            )


def _get(spec: dict[str, Any] | None, ctx: EvalContext) -> Any:
    if spec is None:
        return None
    return GETTERS[spec["type"]](ctx, spec)


def _score_one(func: str, result_spec: Any, expected_spec: Any, options: dict[str, Any], ctx: EvalContext) -> float:
    result = _get(result_spec, ctx)
    metric = METRICS[func]
    if expected_spec:
        return float(metric(result, _get(expected_spec, ctx), **options))
    return float(metric(result, **options))


def evaluate(
    evaluator: dict[str, Any],
    ctx: EvalContext,
    last_action: str | None,
    setup_ctx: SetupContext | None = None,
    run_postconfig: bool = True,
) -> Evaluation:
    """Score the desktop's state for a task (OSWorld's DesktopEnv.evaluate). `last_action` is the agent's final special
    action (DONE / FAIL / WAIT) or None."""
    try:
        if run_postconfig and evaluator.get("postconfig"):
            run_steps(
                evaluator["postconfig"],
                setup_ctx or SetupContext(ctx.desktop, ctx.cache_dir, ctx.files_dir, ctx.client_password),
            )
        if evaluator.get("func") == INFEASIBLE:
            return Evaluation(float(last_action == "FAIL"))
        if last_action == "FAIL":
            return Evaluation(0.0)
        funcs, results, expected, options, conj = normalize(evaluator)
        scores: list[float] = []
        for f, r, e, o in zip(funcs, results, expected, options):
            try:
                s = _score_one(f, r, e, o, ctx)
            except FileNotFoundError as exc:
                log.debug("evaluator: %s: file not found (%s)", f, exc)
                s = 0.0
                if conj == "and" or len(funcs) == 1:
                    return Evaluation(0.0, scores + [0.0])
            scores.append(s)
            if len(funcs) > 1 and conj == "and" and s == 0.0:
                return Evaluation(0.0, scores)
            if len(funcs) > 1 and conj == "or" and s == 1.0:
                return Evaluation(1.0, scores)
        if len(funcs) == 1:
            return Evaluation(scores[0], scores)
        return Evaluation(sum(scores) / len(scores) if conj == "and" else max(scores), scores)
    except Exception as exc:
        log.warning("the evaluator failed (scored 0):\n%s", traceback.format_exc())
        return Evaluation(0.0, error=f"{type(exc).__name__}: {exc}")


def describe_check(check: dict[str, Any]) -> str:
    """A short description of one check (a progress milestone) for a hint: its own `description` if it has one, else
    what the accessibility tree or a command's output should show."""
    if check.get("description"):
        return str(check["description"])
    result, rules = check.get("result") or {}, (check.get("expected") or {}).get("rules")
    if check.get("func") == "check_accessibility_tree" and isinstance(rules, list):
        parts = [f"{r.get('xpath', '?')} shows {r['text']!r}" if "text" in r else f"{r.get('xpath', '?')} exists"
                 for r in rules if isinstance(r, dict)]
        return "the screen element " + " and ".join(parts) if parts else "the accessibility tree check"
    what = f"the output of `{result['command']}`" if result.get("command") else f"the {result.get('type', 'state')}"
    if isinstance(rules, dict) and "expected" in rules:
        return f"{what} is {rules['expected']!r}"
    if isinstance(rules, dict) and rules.get("include"):
        return f"{what} contains {', '.join(map(repr, rules['include']))}"
    return f"{what} passes {check.get('func', 'its check')}"


def partial_checks(checks: Sequence[dict[str, Any]], ctx: EvalContext) -> list[bool]:
    """Each check ({func, result, expected?, options?}) scored on the current state; True where it scores 1."""
    out = []
    for c in checks:
        try:
            out.append(_score_one(c["func"], c.get("result"), c.get("expected"), c.get("options") or {}, ctx) >= 1.0)
        except Exception as exc:
            log.debug("progress check %s failed: %s", c.get("func"), exc)
            out.append(False)
    return out
