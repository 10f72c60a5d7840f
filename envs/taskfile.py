"""Load task sets from JSON / JSONL files with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Task = dict[str, Any]


class TaskFileError(ValueError):
    """A task file that cannot be read; the message names the file and, for JSONL, the line."""


def load_tasks(path: str | Path, validate: Callable[[Task], Task] | None = None) -> list[Task]:
    """Read tasks from `.json` (a list, one object, or {"tasks": [...]}) or `.jsonl` (one object per line).

    `validate` is applied to every task (a family's `validate_task`); its ValueError/KeyError/TypeError is re-raised as a
    TaskFileError naming the file and line. Ids must be unique.
    """
    path = Path(path)
    if not path.exists():
        raise TaskFileError(f"task file {path} does not exist")
    if path.suffix == ".jsonl":
        located = list(_read_jsonl(path))
    elif path.suffix == ".json":
        located = _read_json(path)
    elif path.suffix == ".parquet":
        located = _read_parquet(path)
    else:
        raise TaskFileError(f"task file {path}: unknown format {path.suffix!r} (use .json, .jsonl or .parquet)")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, obj in located:
        if not isinstance(obj, dict):
            raise TaskFileError(f"{path} {where}: expected a JSON object, got {type(obj).__name__}")
        try:
            task = validate(obj) if validate else obj
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskFileError(f"{path} {where}: {exc}") from exc
        if "id" not in task:
            raise TaskFileError(f"{path} {where}: task has no 'id' field (fields: {sorted(task)})")
        tid = str(task["id"])
        if tid in seen:
            raise TaskFileError(f"{path} {where}: duplicate task id {tid!r} (first at {seen[tid]})")
        seen[tid] = where
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"task file {path} holds no tasks")
    return tasks


def _read_jsonl(path: Path):
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFileError(f"{path} line {lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from exc


def _read_json(path: Path) -> list[tuple[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{path} line {exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
    if isinstance(data, dict) and isinstance(data.get("tasks"), list):
        data = data["tasks"]
    if isinstance(data, dict):
        return [("(the only task)", data)]
    if not isinstance(data, list):
        raise TaskFileError(f"{path}: expected a list of tasks, got {type(data).__name__}")
    return [(f"task #{i}", obj) for i, obj in enumerate(data)]


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TaskFileError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from exc
    rows = pq.read_table(path).to_pylist()
    return [(f"row {i}", row) for i, row in enumerate(rows)]
