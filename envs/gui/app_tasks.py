"""The bundled per-domain app tasks (`env.task_set=apps`): project-written tasks in OSWorld's format for OSWorld's
application domains, one file per domain, `envs/gui/tasks/apps/<domain>.json` (ids `ns-<domain>-<slug>`).

Each task opens files generated on this machine (`envs.gui.app_files`: `"nextstate": {"files": "generated"}`), has
a scripted reference solution (keyboard and pyautogui actions that really play to 1 on the app in the desktop's guest
root) and scores 0 on an untouched desktop; `nextstate.split` puts it in `train` or `eval`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from envs.gui.tasks import TASKS_DIR, Task, validate_task

APP_TASKS_DIR = TASKS_DIR / "apps"
APP_SPLITS = ("train", "eval", "all")


def app_domains() -> list[str]:
    """The domains with a task file, sorted."""
    return sorted(p.stem for p in APP_TASKS_DIR.glob("*.json"))


@lru_cache(maxsize=16)
def _read(path: Path) -> tuple[Task, ...]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: an app task file is a JSON list of OSWorld tasks")
    domain = path.stem
    for t in data:
        validate_task(t)
        if not str(t["id"]).startswith(f"ns-{domain}-"):
            raise ValueError(f"gui task {t['id']!r} in {path.name}: app task ids start with 'ns-{domain}-'")
        if t.get("nextstate", {}).get("split") not in ("train", "eval"):
            raise ValueError(f"gui task {t['id']!r} in {path.name}: nextstate.split must be 'train' or 'eval'")
    return tuple(data)


def domain_tasks(domain: str) -> list[Task]:
    path = APP_TASKS_DIR / f"{domain}.json"
    if not path.exists():
        raise ValueError(f"no app tasks for domain {domain!r}; domains: {', '.join(app_domains())}")
    return [dict(t) for t in _read(path)]


def app_tasks(split: str = "train") -> list[Task]:
    """Every domain's tasks of `split` (`train`, `eval`, or `all`), in domain order."""
    if split not in APP_SPLITS:
        raise ValueError(f"unknown split {split!r} for the app tasks; use {', '.join(APP_SPLITS)}")
    out = [t for d in app_domains() for t in domain_tasks(d)]
    return out if split == "all" else [t for t in out if t["nextstate"]["split"] == split]


__all__ = ["APP_SPLITS", "APP_TASKS_DIR", "app_domains", "app_tasks", "domain_tasks"]
