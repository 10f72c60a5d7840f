"""The chained-calculator task set (`task_set=chain`): Table 4's tool-call analogue for a ~0.5M-parameter policy.

A task is `Q a op b op c op d ?` (operands 0-29, ops + and -). The agent gets each intermediate value by one calculator
call on the previous result (`a op b`, then `<result> op c`, then `<result> op d`) and then answers `\\boxed{<result>}`.
The env knows the ground truth, so every step gets a verdict the rule judge turns into a vote:

- +1 the step produced the right next value (or the right answer): `signals.progress`;
-  0 the right op and operand on the agent's own, already wrong, value (a consistent step after an earlier mistake);
- -1 malformed, a wrong value, an extra call, a premature or stale answer: `signals.wrong` (or `parse_error` / `error`).

`signals.mistake` names what happened (`STEP_LABELS`), so mistake rates can be counted from trajectories. On every
step that was not right, `signals.expected` says what the right step was (`expected_step`) and `signals.shown` what the
agent's step did: the facts a rule judge's hint states ("it should have been calculator(12 + 7) = 19, not ..."). On a
right call, `signals.confirmed` is the call as done and `signals.next_step` the right step after it: what a right
step's directive hint states (`judge.hint_steps=directive`: "calculator(12 + 7) = 19 is right; the next step is ...").

Demonstrations (for the SFT warm start) are real conversations through the calculator. Noisy ones inject one dominant
mistake per step with a given probability (default: a flipped operator, a reused operand instead of the last result, a
flipped operator, a stale final answer) and continue consistently from the wrong value, like a real agent would.
Hint-following ones (`ChainHints`) stop at one step whose context ends with a hint about a wrong alternative of that
step, followed by the right step: what a policy needs to have seen to read the hint of directive signals.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from envs.base import HINT_SIGNALS, PROGRESS
from envs.toolcall.parsing import parse_action
from envs.toolcall.tools import CalculatorTool

Task = dict[str, Any]

CHAIN_SEED = 4402
N_OPS = 3
MAX_OPERAND = 29
N_TRAIN = 10_000
N_EVAL = 512
OPS = ("+", "-")

#: What one step of a chain episode was (signals["mistake"]); "ok" and "propagated" are not mistakes of that step.
STEP_LABELS = (
    "ok",  # right next value / right answer (+1)
    "propagated",  # right op and operand on the agent's own wrong value, or answering that value (0)
    "flipped_op",  # the other operator (-1)
    "reused_operand",  # an operand of the question instead of the last result (-1)
    "wrong_call",  # any other wrong value (-1)
    "extra_call",  # a call after the last operation (-1)
    "early_answer",  # an answer before the last operation (-1)
    "stale_answer",  # the previous value as the final answer (-1)
    "wrong_answer",  # any other wrong answer (-1)
    "malformed",  # the turn could not be parsed (-1)
    "tool_error",  # the calculator failed on the expression (-1)
)
VOTE = {"ok": 1, "propagated": 0}  # every other label votes -1

#: The default dominant mistake of each step (3 calls, then the answer).
DEFAULT_MISTAKES = ("flipped_op", "reused_operand", "flipped_op", "stale_answer")
INJECTABLE = ("flipped_op", "reused_operand", "stale_answer")

# Short on purpose: every step's training sample repeats it (the format itself is learned from the demonstrations).
SYSTEM_PROMPT = "Call the calculator on the last result, one call per turn, then answer \\boxed{n}."

_EXPR = re.compile(r"^\s*(-?\d+)\s*([+\-])\s*(-?\d+)\s*$")


# ----- tasks -----
def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def make_chain(rng: random.Random, n_ops: int = N_OPS, max_operand: int = MAX_OPERAND) -> tuple[list[int], list[str]]:
    """Operands and ops of one chain; a '-' that would go below zero becomes '+' (values stay non-negative)."""
    operands = [rng.randint(0, max_operand) for _ in range(n_ops + 1)]
    ops: list[str] = []
    value = operands[0]
    for x in operands[1:]:
        op = rng.choice(OPS)
        if op == "-" and value - x < 0:
            op = "+"
        ops.append(op)
        value = _apply(value, op, x)
    return operands, ops


def chain_task(task_id: str, operands: Sequence[int], ops: Sequence[str]) -> Task:
    values: list[int] = []
    value = operands[0]
    for op, x in zip(ops, operands[1:]):
        value = _apply(value, op, x)
        values.append(value)
    shown = " ".join([str(operands[0])] + [f"{op} {x}" for op, x in zip(ops, operands[1:])])
    return {
        "id": task_id,
        "prompt": f"Q {shown} ?",
        "answer": str(values[-1]),
        "intermediates": values,
        "chain": {"operands": list(operands), "ops": list(ops)},
    }


def generate_chain_tasks(
    seed: int = CHAIN_SEED, n_train: int = N_TRAIN, n_eval: int = N_EVAL, n_ops: int = N_OPS
) -> dict[str, list[Task]]:
    """Deterministic train / eval sets with disjoint prompts (the eval prompts are drawn first)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[Task]] = {"eval": [], "train": []}
    for split, n in (("eval", n_eval), ("train", n_train)):
        while len(out[split]) < n:
            task = chain_task(f"chain-{split}-{len(out[split]):05d}", *make_chain(rng, n_ops))
            if task["prompt"] in seen:
                continue
            seen.add(task["prompt"])
            out[split].append(task)
    return out


@lru_cache(maxsize=2)
def _bundled(seed: int) -> dict[str, tuple[Task, ...]]:
    return {k: tuple(v) for k, v in generate_chain_tasks(seed).items()}


def chain_tasks(split: str = "train") -> list[Task]:
    """The bundled chain set: `train` 10,000 tasks, `eval` 512 held-out prompts (fresh copies)."""
    sets = _bundled(CHAIN_SEED)
    if split not in sets:
        raise ValueError(f"unknown split {split!r}: use 'train' or 'eval'")
    return [_copy(t) for t in sets[split]]


def _copy(task: Task) -> Task:
    c = task["chain"]
    return {**task, "intermediates": list(task["intermediates"]),
            "chain": {"operands": list(c["operands"]), "ops": list(c["ops"])}}


def is_chain_task(task: Mapping[str, Any]) -> bool:
    return isinstance(task.get("chain"), Mapping)


# ----- verdicts -----
@dataclass
class ChainState:
    """What the env tracks through a chain episode: calls that produced a value, and the agent's own last value."""

    calls: int = 0
    own: list[float] | None = None  # values the agent's calls produced, in order

    def own_last(self, task: Mapping[str, Any]) -> float:
        return self.own[-1] if self.own else float(task["chain"]["operands"][0])


def _close(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) < 1e-9


def call_verdict(task: Mapping[str, Any], state: ChainState, expression: str, value: float | None) -> str:
    """Label a calculator call (`value` is its result, None when the calculator failed); advances `state`."""
    chain = task["chain"]
    operands, ops, inter = chain["operands"], chain["ops"], task["intermediates"]
    k = state.calls
    if value is None:
        return "tool_error"
    own_prev = state.own_last(task)
    state.calls += 1
    state.own = [*(state.own or []), float(value)]
    if k >= len(ops):
        return "extra_call"
    if _close(value, inter[k]):
        return "ok"
    m = _EXPR.match(expression)
    if m:
        a, op, b = float(m.group(1)), m.group(2), float(m.group(3))
        right_operand = _close(b, operands[k + 1])
        if _close(a, own_prev) and right_operand:
            return "propagated" if op == ops[k] else "flipped_op"
        if right_operand and op == ops[k] and not _close(a, own_prev) and any(_close(a, x) for x in operands):
            return "reused_operand"
    return "wrong_call"


def expected_step(task: Mapping[str, Any], calls: int) -> str:
    """The right step after `calls` calls that produced a value: the next call on the right running value and what it
    gives, or the final answer once every operation is done."""
    chain = task["chain"]
    operands, ops, inter = chain["operands"], chain["ops"], task["intermediates"]
    if calls >= len(ops):
        return f"\\boxed{{{task['answer']}}}"
    left = inter[calls - 1] if calls > 0 else operands[0]
    return f"calculator({left} {ops[calls]} {operands[calls + 1]}) = {inter[calls]}"


def shown_call(expression: str, value: float | None) -> str:
    """A calculator call as `expected_step` writes one."""
    if value is None:
        return f"calculator({expression}) failing"
    return f"calculator({expression}) = {int(value) if float(value).is_integer() else value}"


def answer_verdict(task: Mapping[str, Any], state: ChainState, answer: str, correct: bool) -> str:
    """Label a final answer."""
    if correct:
        return "ok"
    if state.calls < len(task["chain"]["ops"]):
        return "early_answer"
    try:
        given = float(answer)
    except ValueError:
        return "wrong_answer"
    own = state.own or []
    if own and _close(given, own[-1]):
        return "propagated"
    if len(own) >= 2 and _close(given, own[-2]):
        return "stale_answer"
    return "wrong_answer"


# ----- demonstrations -----
@dataclass(frozen=True)
class ChainNoise:
    """One dominant mistake per step (`mistakes[i]` with probability `rates[i]`), drawn per task from `seed`."""

    rates: tuple[float, ...] = ()
    mistakes: tuple[str, ...] = DEFAULT_MISTAKES
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", tuple(float(r) for r in self.rates))
        object.__setattr__(self, "mistakes", tuple(self.mistakes))
        bad = [m for m in self.mistakes if m not in INJECTABLE]
        if bad:
            raise ValueError(f"mistakes {bad} cannot be injected; choose from {', '.join(INJECTABLE)}")
        if any(not 0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"mistake rates must be in [0, 1], got {list(self.rates)}")
        if self.rates and len(self.rates) != len(self.mistakes):
            raise ValueError(f"{len(self.rates)} rates for {len(self.mistakes)} steps: give one rate per step")

    def draws(self, task_id: str) -> list[bool]:
        digest = hashlib.sha256(f"{self.seed}:{task_id}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        return [rng.random() < r for r in self.rates] if self.rates else []


@dataclass(frozen=True)
class ChainHints:
    """Hint-following demonstrations: each task's conversation, with probability `rate` (drawn per task from `seed`),
    stops at one of its steps (drawn uniformly); that step's context ends with the signals of a hint (`HINT_SIGNALS`:
    the right step and a wrong alternative the agent could have taken there, as the env reports them after such a
    step), and the step itself is the right one. The warm start writes the hint into that message as the teacher's
    context has it, so the policy has seen hints, and what follows them, before directive signals use it as teacher."""

    rate: float = 0.0
    seed: int = 0
    # share of the hinted demonstrations whose hint is a right step's (`judge.hint_steps=directive`: "<the step> is
    # right; the next step is ..."), the rest a wrong alternative's; the step after either hint is the right one. A
    # teacher that has only seen wrong-step hints reads "the next step is Y" as "do Y now" and skips a step
    right: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rate", "right"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise ValueError(f"hint {name} must be in [0, 1], got {getattr(self, name)}")

    def draw(self, task_id: str, n_steps: int) -> tuple[int, random.Random] | None:
        """(the hinted step, the task's generator for the alternative), or None for a task without a hint."""
        digest = hashlib.sha256(f"hints:{self.seed}:{task_id}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        if rng.random() >= self.rate:
            return None
        return rng.randrange(n_steps), rng


def _wrong_alternatives(task: Mapping[str, Any], k: int, values: Sequence[int]) -> list[str]:
    """What a wrong step k could have shown (`shown_call` / a boxed answer, as the env's signals write them), given the
    values the conversation's calls produced before it: the step's usual mistakes, on the agent's own last value."""
    chain = task["chain"]
    operands, ops, inter = chain["operands"], chain["ops"], task["intermediates"]
    calc = CalculatorTool()
    if k >= len(ops):  # the answer
        own = list(values)
        answers = {own[-1], own[-2] if len(own) >= 2 else operands[0], int(task["answer"]) + 1}
        return [f"\\boxed{{{a}}}" for a in sorted(answers) if str(a) != str(task["answer"])]
    left = values[k - 1] if k > 0 else operands[0]
    x = operands[k + 1]
    flipped = "-" if ops[k] == "+" else "+"
    exprs = [f"{left} {flipped} {x}", f"{left} {ops[k]} {x}"]
    if k > 0:
        exprs.append(f"{operands[k]} {ops[k]} {x}")
    out = []
    for e in dict.fromkeys(exprs):
        value = int(calc.run({"expression": e}).content)
        if value != inter[k]:
            out.append(shown_call(e, value))
    return out


def hinted_turn(task: Mapping[str, Any], messages: list[dict[str, Any]], hints: ChainHints) -> list[dict[str, Any]]:
    """A demonstration cut at its hinted step (`hints.draw`), or `messages` unchanged for a task without a hint."""
    chain = task["chain"]
    operands, ops, inter = chain["operands"], chain["ops"], task["intermediates"]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    drawn = hints.draw(str(task["id"]), len(turns))
    if drawn is None:
        return messages
    k, rng = drawn
    expression = f"{inter[k - 1] if k > 0 else operands[0]} {ops[k]} {operands[k + 1]}" if k < len(ops) else None
    right = _call_text(expression) if expression else f"\\boxed{{{task['answer']}}}"
    context = [dict(m) for m in messages[: turns[k]]]
    # a right step's hint (a call: the final answer has no next step), drawn only where asked so that starts
    # without it stay what they were
    if expression and hints.right > 0 and rng.random() < hints.right:
        context[-1][HINT_SIGNALS] = {PROGRESS: True, "confirmed": shown_call(expression, inter[k]),
                                     "next_step": expected_step(task, k + 1)}
        return [*context, {"role": "assistant", "content": right}]
    values = [int(m["content"]) for m in messages[: turns[k]] if m["role"] == "tool"]
    shown = _wrong_alternatives(task, k, values)
    if not shown:  # every alternative happens to be right (e.g. x + 0): no hint to give
        return messages
    context[-1][HINT_SIGNALS] = {"expected": expected_step(task, k), "shown": rng.choice(shown)}
    return [*context, {"role": "assistant", "content": right}]


def _call_text(expression: str) -> str:
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{call}\n</tool_call>"


def demonstration(task: Mapping[str, Any], system_prompt: str, noise: ChainNoise | None = None,
                  hints: ChainHints | None = None) -> list[dict[str, Any]]:
    """A conversation through the calculator: clean (noise None or all rates 0) or with the injected mistakes; with
    `hints`, possibly cut at a hinted step (`hinted_turn`).

    The tool turns hold exactly what the env's calculator returns for those expressions.
    """
    chain = task["chain"]
    operands, ops = chain["operands"], chain["ops"]
    if len(ops) + 1 != len(operands):
        raise ValueError(f"task {task['id']!r}: {len(operands)} operands for {len(ops)} ops")
    draws = noise.draws(str(task["id"])) if noise else []
    inject = {i: noise.mistakes[i] for i, hit in enumerate(draws) if hit} if noise else {}
    calc = CalculatorTool()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": task["prompt"]},
    ]
    values: list[int] = []
    for k, (op, x) in enumerate(zip(ops, operands[1:])):
        left = values[-1] if values else operands[0]
        mistake = inject.get(k)
        if mistake == "flipped_op":
            op = "-" if op == "+" else "+"
        elif mistake == "reused_operand" and k > 0:
            left = operands[k]
        expression = f"{left} {op} {x}"
        out = calc.run({"expression": expression})
        values.append(int(out.content))
        messages.append({"role": "assistant", "content": _call_text(expression)})
        messages.append({"role": "tool", "content": out.content})
    final = values[-1]
    if inject.get(len(ops)) == "stale_answer" and len(values) >= 2:
        final = values[-2]
    messages.append({"role": "assistant", "content": f"\\boxed{{{final}}}"})
    return hinted_turn(task, messages, hints) if hints is not None and hints.rate > 0 else messages


def label_conversation(task: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The verdict of every assistant turn of a conversation (e.g. a demonstration), replayed with the calculator."""
    calc = CalculatorTool()
    schemas = {"calculator": calc.spec.parameters}
    state = ChainState()
    labels: list[str] = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        parsed = parse_action(str(m.get("content", "")), schemas)
        if parsed.kind == "error":
            labels.append("malformed")
        elif parsed.kind == "answer":
            assert parsed.answer is not None
            labels.append(answer_verdict(task, state, parsed.answer, _close(_num(parsed.answer), _num(task["answer"]))))
        else:
            expr = str(parsed.arguments.get("expression", ""))
            out = calc.run({"expression": expr})
            labels.append(call_verdict(task, state, expr, None if out.error else _num(out.content)))
    return labels


def _num(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def label_rates(labels_per_conversation: Sequence[Sequence[str]]) -> dict[int, dict[str, float]]:
    """Per step index: the fraction of conversations whose step had each label (steps that exist)."""
    counts: dict[int, Counter] = {}
    for labels in labels_per_conversation:
        for i, lab in enumerate(labels):
            counts.setdefault(i, Counter())[lab] += 1
    return {i: {lab: n / sum(c.values()) for lab, n in sorted(c.items())} for i, c in sorted(counts.items())}
