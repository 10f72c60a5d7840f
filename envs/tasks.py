"""An env's task sets as the launcher takes them: the bundled split, a task file (the generic JSON / JSONL / parquet
reader, or one of the env's named formats), and a held-out split of a task list by id hash."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from typing import Any

from envs.base import hook, implements
from envs.taskfile import Task, load_tasks


def bundled_tasks(env_cls: type, split: str, env_options: Mapping[str, Any] | None = None) -> list[Task]:
    """`env_cls.tasks(split, **options)`, the options being those of `env_options` the class lists in `task_options`
    (e.g. toolcall's `task_set`), so the launcher's bundled set is the one the env itself would draw from."""
    picks = {k: v for k, v in (env_options or {}).items() if k in getattr(env_cls, "task_options", ())}
    return [dict(t) for t in env_cls.tasks(split, **picks)]


def load_task_source(env_cls: type, path: str, fmt: str | None = None,
                     env_options: Mapping[str, Any] | None = None) -> list[Task]:
    """A task file: the generic JSON / JSONL / parquet reader, or one of the env's named formats (`tasks_format`, e.g.
    toolcall's dapo_math / aime) through its `load_task_file(path, fmt)`, which is also given the env's options
    (`options=`) when it takes them (what a GUI desktop can run depends on its backend). Every task goes through
    `validate_task`."""
    validate = hook(env_cls, "validate_task")
    if not fmt:
        return load_tasks(path, validate)
    if not implements(env_cls, "load_task_file"):
        raise ValueError(f"{env_cls.__name__} reads no named task formats (tasks_format={fmt!r}); drop the option")
    load = env_cls.load_task_file
    takes_options = "options" in inspect.signature(load).parameters
    loaded = load(path, fmt, options=dict(env_options or {})) if takes_options else load(path, fmt)
    return [validate(dict(t)) for t in loaded]


def holdout_split(tasks: list[Task], fraction: float, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(train, held out): each task goes by a hash of (seed, id), so the split does not depend on file order."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in (0, 1), got {fraction}")
    train, held = [], []
    for t in tasks:
        h = int.from_bytes(hashlib.sha256(f"{seed}:{t['id']}".encode()).digest()[:8], "big") / 2**64
        (held if h < fraction else train).append(t)
    if not train or not held:
        raise ValueError(f"holdout_fraction={fraction} leaves an empty split of {len(tasks)} tasks")
    return train, held


__all__ = ["bundled_tasks", "holdout_split", "load_task_source"]
