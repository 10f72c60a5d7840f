"""Loaders for the paper's tool-call data: DAPO-Math-17k (training) and AIME 2024 (evaluation), from local files.

DAPO-Math-17k as published (`BytedTsinghua-SIA/DAPO-Math-17k`, verl's RL parquet): columns `data_source`, `prompt` (a chat
list with one user message), `ability`, `reward_model` ({`ground_truth`, `style`}), `extra_info` ({`index`}); the file
repeats every problem many times (1.79M rows for ~17k problems), so rows are de-duplicated by index. The user message
wraps the problem in an instruction to end with "Answer: $Answer"; our env asks for `\\boxed{}` in its own system prompt,
so the wrapper is stripped by default. slime's JSONL conversion (`{"prompt", "label"}` per line) is read too.

AIME 2024 as JSONL, one problem per line, in either common shape: `{"ID", "Problem", "Solution", "Answer"}` (the
Maxwell-Jia/AIME_2024 export) or slime's `{"prompt", "label"}`. Answers become strings of integers.

Both return task dicts for the toolcall env (`{id, prompt, answer, source}`); errors name the file and row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from envs.taskfile import TaskFileError

Task = dict[str, Any]

# The wrapper DAPO puts around each problem (its header line and its closing reminder).
_DAPO_HEAD = re.compile(r"^\s*Solve the following math problem step by step\..*?\n\s*\n", re.DOTALL)
_DAPO_TAIL = re.compile(r"\n\s*\n\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$", re.DOTALL)


def strip_dapo_instructions(text: str) -> str:
    """The problem without DAPO's "Solve ... Answer: $Answer" header and "Remember to put ..." footer."""
    return _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", text, count=1)).strip()


def _user_text(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def _rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    if not path.exists():
        raise TaskFileError(f"{path} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise TaskFileError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from exc
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"row {i}", row
    elif path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield f"line {lineno}", json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise TaskFileError(f"{path} line {lineno}: invalid JSON ({exc.msg})") from exc
    else:
        raise TaskFileError(f"{path}: expected a .parquet or .jsonl file, got {path.suffix!r}")


def load_dapo_math(path: str | Path, *, strip_instructions: bool = True, limit: int | None = None) -> list[Task]:
    """DAPO-Math-17k tasks from its parquet (or slime's JSONL), de-duplicated, in file order."""
    path = Path(path)
    tasks: list[Task] = []
    seen: set[str] = set()
    for where, row in _rows(path):
        if "reward_model" in row:  # verl parquet
            prompt = _user_text(row.get("prompt"))
            answer = (row.get("reward_model") or {}).get("ground_truth")
            index = (row.get("extra_info") or {}).get("index")
        else:  # slime JSONL
            prompt, answer, index = _user_text(row.get("prompt")), row.get("label"), row.get("index")
        if not prompt or answer is None or str(answer).strip() == "":
            raise TaskFileError(f"{path} {where}: a DAPO row needs a user prompt and a ground truth (keys: {sorted(row)})")
        problem = strip_dapo_instructions(prompt) if strip_instructions else prompt.strip()
        key = str(index) if index is not None else problem
        if key in seen:
            continue
        seen.add(key)
        tid = f"dapo-{index}" if index is not None else f"dapo-{len(tasks):05d}"
        tasks.append({"id": tid, "prompt": problem, "answer": str(answer).strip(), "source": "dapo-math-17k"})
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise TaskFileError(f"{path} holds no DAPO rows")
    return tasks


def load_aime(path: str | Path, *, name: str = "aime2024", strip_instructions: bool = True) -> list[Task]:
    """AIME problems from JSONL ({ID, Problem, Answer} or slime's {prompt, label})."""
    path = Path(path)
    tasks: list[Task] = []
    for n, (where, row) in enumerate(_rows(path)):
        lower = {k.lower(): v for k, v in row.items()}
        prompt = _user_text(lower.get("problem") or lower.get("prompt") or lower.get("question"))
        answer = next((lower[k] for k in ("answer", "label", "ground_truth") if lower.get(k) is not None), None)
        if not prompt or answer is None:
            raise TaskFileError(f"{path} {where}: an AIME row needs a problem and an answer (keys: {sorted(row)})")
        text = str(answer).strip()
        if re.fullmatch(r"\d+", text):
            text = str(int(text))  # "033" and 33 are the same AIME answer
        rid = lower.get("id")
        tasks.append({
            "id": f"{name}-{rid if rid is not None else n}",
            "prompt": strip_dapo_instructions(prompt) if strip_instructions else prompt.strip(),
            "answer": text,
            "source": name,
        })
    if not tasks:
        raise TaskFileError(f"{path} holds no AIME rows")
    if len({t["id"] for t in tasks}) != len(tasks):
        raise TaskFileError(f"{path}: duplicate problem ids")
    return tasks


#: Named loaders the toolcall env's `tasks_format` option selects.
LOADERS = {"dapo_math": load_dapo_math, "aime": load_aime}
