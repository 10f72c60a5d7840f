"""Tool-call tasks: the bundled arithmetic / word-problem set (generated deterministically) and task-dict validation.

A task is `{id, prompt, answer}` (DAPO / AIME style) plus, optionally:
- `intermediates`: the correct intermediate values in order (the env reads progress from them; the last is the answer);
- `solution_code`: reference Python that prints the intermediates (what a demonstration runs);
- `solution_output`: that code's exact stdout (lets a demonstration skip running it; bundled tasks carry it).

The bundled set is small-integer arithmetic a ~0.5M-parameter model can learn after SFT: left-to-right chains, chains
with the usual precedence, and short word problems (shop stock, distances, money, sharing), 2-4 operations, integer
answers. Each solution computes one operation per line into a, b, c, d and prints them all, so its output shows every
step.
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

Task = dict[str, Any]

BUNDLED_SEED = 2603
N_TRAIN = 1000
N_EVAL = 200
MAX_PROMPT_CHARS = 200
VARS = "abcd"

PROMPT_ALIASES = ("prompt", "problem", "question", "Problem", "Question")
ANSWER_ALIASES = ("answer", "Answer", "ground_truth", "final_answer")
ID_ALIASES = ("id", "ID", "task_id", "idx", "index")


# ----- the generator -----
class _Builder:
    """Accumulates one operation per line; the values become `intermediates`, the lines `solution_code`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.values: list[int] = []

    def op(self, left: int | str, sym: str, right: int | str) -> str:
        env = dict(zip(VARS, self.values))
        value = eval(f"{left} {sym} {right}", {}, env)  # our own generated integer expressions
        var = VARS[len(self.values)]
        self.lines.append(f"{var} = {left} {sym} {right}")
        self.values.append(int(value))
        return var

    def value(self, var: str) -> int:
        return self.values[VARS.index(var)]

    def code(self) -> str:
        return "\n".join(self.lines + [f"print({', '.join(VARS[: len(self.values)])})"])


_PY_OP = {"+": "+", "-": "-", "*": "*", "/": "//"}


def _chain_left_to_right(rng: random.Random) -> tuple[str, _Builder] | None:
    n_ops = rng.randint(2, 4)
    b = _Builder()
    first = rng.randint(2, 30)
    shown = [str(first)]
    acc: int | str = first
    for _ in range(n_ops):
        cur = first if isinstance(acc, int) else b.value(acc)
        sym = rng.choice("+-*/")
        if sym == "+":
            x = rng.randint(1, 30)
        elif sym == "-":
            if cur < 2:
                return None
            x = rng.randint(1, min(cur, 30))
        elif sym == "*":
            x = rng.randint(2, 9)
            if cur * x > 999:
                return None
        else:
            divisors = [d for d in range(2, 10) if cur % d == 0 and cur // d >= 1]
            if not divisors:
                return None
            x = rng.choice(divisors)
        acc = b.op(acc, _PY_OP[sym], x)
        shown.append(f"{sym} {x}")
    return f"Compute {' '.join(shown)} from left to right (ignore operator precedence).", b


def _chain_precedence(rng: random.Random) -> tuple[str, _Builder] | None:
    """A + B * C - D style: multiplications and divisions first, then + and - from left to right."""
    n_ops = rng.randint(2, 4)
    nums = [rng.randint(1, 30)]
    syms: list[str] = []
    for _ in range(n_ops):
        sym = rng.choice("+-*")
        syms.append(sym)
        nums.append(rng.randint(2, 9) if sym == "*" else rng.randint(1, 30))
    if "*" not in syms:
        return None
    text = " ".join([str(nums[0])] + [f"{s} {n}" for s, n in zip(syms, nums[1:])])
    b = _Builder()
    # Collapse runs of * into terms, then add / subtract the terms left to right.
    terms: list[int | str] = [nums[0]]
    signs: list[str] = []
    for sym, n in zip(syms, nums[1:]):
        if sym == "*":
            terms[-1] = b.op(terms[-1], "*", n)
        else:
            signs.append(sym)
            terms.append(n)
    acc = terms[0]
    for sym, term in zip(signs, terms[1:]):
        acc = b.op(acc, sym, term)
    if any(v < 0 or v > 999 for v in b.values):
        return None
    return f"Compute {text} with the usual precedence (* before + and -).", b


_NAMES = [
    "Ana",
    "Ben",
    "Cara",
    "Dev",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivo",
    "Jo",
    "Kim",
    "Lea",
    "Max",
    "Nia",
    "Omar",
    "Pia",
]
_GOODS = ["apples", "pens", "books", "cups", "eggs", "lamps", "shirts", "toys", "bottles", "mugs"]
_VEHICLES = ["car", "bus", "train", "bike", "truck"]


def _shop(rng: random.Random) -> tuple[str, _Builder] | None:
    item = rng.choice(_GOODS)
    stock, sold, boxes, per = rng.randint(20, 90), rng.randint(5, 19), rng.randint(2, 6), rng.randint(3, 12)
    b = _Builder()
    a = b.op(stock, "-", sold)
    c = b.op(boxes, "*", per)
    b.op(a, "+", c)
    prompt = (
        f"A shop has {stock} {item}. It sells {sold}, then gets {boxes} boxes of {per} {item}. "
        f"How many {item} does it have now?"
    )
    if rng.random() < 0.5:
        return prompt, b
    # A 3-step variant: a second sale at the end.
    more = rng.randint(1, min(15, b.value(VARS[2])))
    b.op(VARS[2], "-", more)
    prompt = prompt.replace("How many", f"Then it sells {more} more. How many")
    return prompt, b


def _distance(rng: random.Random) -> tuple[str, _Builder] | None:
    who, hours, speed, extra = rng.choice(_VEHICLES), rng.randint(2, 6), rng.randint(3, 9) * 10, rng.randint(5, 60)
    b = _Builder()
    a = b.op(hours, "*", speed)
    if rng.random() < 0.5:
        b.op(a, "+", extra)
        prompt = f"A {who} drives {hours} hours at {speed} km/h, then {extra} km more. How many km does it drive?"
    else:
        trips = rng.randint(2, 4)
        c = b.op(a, "+", extra)
        b.op(c, "*", trips)
        prompt = (
            f"A {who} drives {hours} hours at {speed} km/h, then {extra} km more. It does this trip {trips} times. "
            f"How many km in total?"
        )
    return prompt, b


def _money(rng: random.Random) -> tuple[str, _Builder] | None:
    name, item = rng.choice(_NAMES), rng.choice(_GOODS[:8])
    n, price, other = rng.randint(2, 9), rng.randint(2, 9), rng.randint(3, 20)
    cash = rng.randint(n * price + other + 1, n * price + other + 60)
    b = _Builder()
    a = b.op(n, "*", price)
    c = b.op(cash, "-", a)
    b.op(c, "-", other)
    prompt = (
        f"{name} has {cash} dollars, buys {n} {item} at {price} dollars each and a bag for {other} dollars. "
        f"How many dollars are left?"
    )
    return prompt, b


def _sharing(rng: random.Random) -> tuple[str, _Builder] | None:
    name, bags, per = rng.choice(_NAMES), rng.randint(2, 9), rng.randint(2, 12)
    friends = rng.choice([d for d in range(2, 10) if (bags * per) % d == 0] or [0])
    if not friends:
        return None
    b = _Builder()
    a = b.op(bags, "*", per)
    b.op(a, "//", friends)
    return (
        f"{name} has {bags} bags of {per} marbles and shares them equally among {friends} friends. "
        f"How many marbles does each friend get?"
    ), b


_TEMPLATES: list[tuple[str, Callable[[random.Random], tuple[str, _Builder] | None], float]] = [
    ("chain_ltr", _chain_left_to_right, 0.3),
    ("chain_prec", _chain_precedence, 0.25),
    ("shop", _shop, 0.15),
    ("distance", _distance, 0.1),
    ("money", _money, 0.1),
    ("sharing", _sharing, 0.1),
]


def _solution_output(code: str) -> str:
    """stdout of our own generated solution (integer arithmetic and one print), computed in process."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "main.py", "exec"), {"__name__": "__main__"})
    return buf.getvalue()


def generate_tasks(seed: int = BUNDLED_SEED, n_train: int = N_TRAIN, n_eval: int = N_EVAL) -> dict[str, list[Task]]:
    """Deterministic train / eval sets from `seed`: unique prompts, so eval never repeats a train prompt."""
    rng = random.Random(seed)
    names = [t[0] for t in _TEMPLATES]
    weights = [t[2] for t in _TEMPLATES]
    makers = {t[0]: t[1] for t in _TEMPLATES}
    seen: set[str] = set()
    made: list[Task] = []
    while len(made) < n_train + n_eval:
        kind = rng.choices(names, weights)[0]
        out = makers[kind](rng)
        if out is None:
            continue
        prompt, b = out
        if prompt in seen or len(prompt) > MAX_PROMPT_CHARS:
            continue
        seen.add(prompt)
        code = b.code()
        made.append(
            {
                "prompt": prompt,
                "answer": str(b.values[-1]),
                "intermediates": list(b.values),
                "solution_code": code,
                "solution_output": _solution_output(code),
                "template": kind,
            }
        )
    train = [{"id": f"toolcall-train-{i:04d}", **t} for i, t in enumerate(made[:n_train])]
    evals = [{"id": f"toolcall-eval-{i:04d}", **t} for i, t in enumerate(made[n_train:])]
    return {"train": train, "eval": evals}


@lru_cache(maxsize=4)
def _bundled(seed: int) -> dict[str, tuple[Task, ...]]:
    return {k: tuple(v) for k, v in generate_tasks(seed).items()}


def bundled_tasks(split: str = "train") -> list[Task]:
    """The bundled set for `split` ("train": 1,000 tasks, "eval": 200), fresh dict copies."""
    sets = _bundled(BUNDLED_SEED)
    if split not in sets:
        raise ValueError(f"unknown split {split!r}: use 'train' or 'eval'")
    return [dict(t, intermediates=list(t["intermediates"])) for t in sets[split]]


# ----- validation of tasks from files (DAPO / AIME style) -----
def _first(task: Mapping[str, Any], keys: Sequence[str]) -> tuple[str | None, Any]:
    for k in keys:
        if k in task and task[k] is not None:
            return k, task[k]
    return None, None


def _prompt_text(value: Any) -> str | None:
    """A prompt string, or the last user message of a chat-format prompt (DAPO's verl parquet uses one)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def validate_task(task: Mapping[str, Any]) -> Task:
    """Normalize a task dict to {id, prompt, answer, ...}; raise ValueError naming the problem and the fields found."""
    fields = sorted(task)
    out: Task = dict(task)
    key, tid = _first(task, ID_ALIASES)
    if key is None and isinstance(task.get("extra_info"), Mapping):
        key, tid = _first(task["extra_info"], ("index", "id"))
    if key is None:
        raise ValueError(f"task has no id (looked for {', '.join(ID_ALIASES)}; fields: {fields})")
    out["id"] = str(tid)
    key, raw = _first(task, PROMPT_ALIASES)
    if key is None:
        raise ValueError(f"task {tid!r} has no prompt (looked for {', '.join(PROMPT_ALIASES)}; fields: {fields})")
    prompt = _prompt_text(raw)
    if not prompt or not prompt.strip():
        raise ValueError(f"task {tid!r}: {key!r} must be a non-empty string (or a list of chat messages)")
    out["prompt"] = prompt
    key, answer = _first(task, ANSWER_ALIASES)
    if key is None and isinstance(task.get("reward_model"), Mapping):
        key, answer = _first(task["reward_model"], ("ground_truth",))
    if key is None:
        raise ValueError(
            f"task {tid!r} has no answer (looked for {', '.join(ANSWER_ALIASES)}, reward_model.ground_truth; "
            f"fields: {fields})"
        )
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
        raise ValueError(f"task {tid!r}: the answer must be a non-empty string or a number, got {answer!r}")
    out["answer"] = str(answer).strip()
    inter = task.get("intermediates")
    if inter is not None:
        if not isinstance(inter, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in inter
        ):
            raise ValueError(f"task {tid!r}: 'intermediates' must be a list of numbers, got {inter!r}")
    for opt in ("solution_code", "solution_output"):
        if opt in task and not isinstance(task[opt], str):
            raise ValueError(f"task {tid!r}: {opt!r} must be a string")
    return out
