"""The terminal task format and the bundled task set.

A task: `{id, instruction, setup: [cmd], tests: [cmd] | "script", timeout}` plus optional `solution: [cmd]` (a reference
solution, never shown to the agent), `category` and `split`. Setup commands prepare the workdir; each test is a hidden
check that passes when it exits 0 (a test script given as one string is one test). All run in the sandbox, in the
workdir, after the agent is done (tests) or before it starts (setup).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

DEFAULT_TIMEOUT_S = 30.0
SPLITS = ("train", "eval")


def validate_terminal_task(task: dict[str, Any]) -> dict[str, Any]:
    """Check one task and normalize it (tests as a list, setup/solution lists, timeout a float)."""
    if "id" not in task:
        raise ValueError(f"terminal task has no 'id' (fields: {sorted(task)})")
    tid = task["id"]
    if not isinstance(task.get("instruction"), str) or not task["instruction"].strip():
        raise ValueError(f"terminal task {tid!r}: 'instruction' must be a non-empty string")
    out = dict(task)
    tests = task.get("tests")
    if isinstance(tests, str):
        tests = [tests]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
        raise ValueError(f"terminal task {tid!r}: 'tests' must be a non-empty list of shell commands or a test script")
    out["tests"] = tests
    for key in ("setup", "solution"):
        value = task.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise ValueError(f"terminal task {tid!r}: '{key}' must be a list of shell commands")
        out[key] = value
    try:
        out["timeout"] = float(task.get("timeout", DEFAULT_TIMEOUT_S))
    except (TypeError, ValueError):
        raise ValueError(f"terminal task {tid!r}: 'timeout' must be a number of seconds") from None
    if out["timeout"] <= 0:
        raise ValueError(f"terminal task {tid!r}: 'timeout' must be positive")
    return out


@lru_cache(maxsize=1)
def _bundled() -> tuple[dict[str, Any], ...]:
    text = resources.files("envs.terminal").joinpath("data/tasks.yaml").read_text(encoding="utf-8")
    return tuple(validate_terminal_task(t) for t in yaml.safe_load(text))


def bundled_tasks(split: str = "train") -> list[dict[str, Any]]:
    """The bundled tasks of `split` ("train", "eval", or "all")."""
    if split not in (*SPLITS, "all"):
        raise ValueError(f"split {split!r}: use 'train', 'eval' or 'all'")
    return [dict(t) for t in _bundled() if split == "all" or t.get("split", "train") == split]
