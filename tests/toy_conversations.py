"""Synthetic tool-call conversations ("what is a+b?") for tests and benchmarks (a test fixture: no production code uses it).

They have the shape the toolcall env's demonstrations have: system, user, an assistant turn with a python tool call,
the tool's answer (role "tool"), and an assistant turn with the boxed result.
"""

from __future__ import annotations

import json
import random
from typing import Any

SYSTEM_PROMPT = "You are a careful agent. Use the python tool, then give the final answer as \\boxed{n}."


def addition_conversation(a: int, b: int) -> list[dict[str, Any]]:
    call = {"name": "python", "arguments": {"code": f"print({a}+{b})"}}
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"What is {a}+{b}?"},
        {"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"},
        {"role": "tool", "content": str(a + b)},
        {"role": "assistant", "content": f"The answer is \\boxed{{{a + b}}}."},
    ]


def addition_conversations(n: int, seed: int = 0, max_operand: int = 999) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [addition_conversation(rng.randint(0, max_operand), rng.randint(0, max_operand)) for _ in range(n)]


__all__ = ["SYSTEM_PROMPT", "addition_conversation", "addition_conversations"]
