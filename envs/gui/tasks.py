"""The gui family's task format (OSWorld's task JSON) and its bundled task sets.

A task is OSWorld's JSON: `id`, `instruction`, `config` (setup steps), `evaluator` ({func, result, expected, options,
conj, postconfig}). NextState reads one optional extra key, ignored by OSWorld:

    "nextstate": {
      "split": "train" | "eval",
      "ready": {"window": "Sign-up form", "a11y": true},   # wait for this window (and its a11y tree) after setup
      "solution": [step, ...],    # a scripted reference solution (evaluator says 1)
      "wrong": [step, ...],       # a scripted wrong solution (evaluator says 0)
      "progress": [check, ...],   # milestones {func, result, expected?, options?} for the step-level progress signal
      "violations": [check, ...], # checks that are true once a step went wrong (the step-level `wrong` signal)
      "files": "generated"        # relative task files come from envs.gui.app_files' generated directory
    }

Solution steps are action strings, or {"click": "<element name>", "role": ..., "index": ...} / {"write": text} /
{"press": key} / {"hotkey": [keys]} / {"click_window": "<title>", "dx": .., "dy": ..}, resolved against the live
observation into plain pyautogui code (see envs.gui.solution), or {"wait_window": "<title>"}: WAIT until that window
is on screen and focused (a dialog that opens a moment after the keys asking for it), or {"wait_element": "<name>",
"role": ...}: WAIT until that element is in the accessibility tree (a dialog's field that takes keys a moment later).

Bundled sets: `train` and `eval`: the hand-written tasks of tasks/bundled.json (27; 14 train, 13 eval) plus seeded
variants of the same templates (envs.gui.task_builders; 48 train, 24 eval) whose names, words, files and numbers come
from disjoint pools per split, so held-out success means generalization; and `osworld` (tasks/osworld_os.json: three
project-written tasks in the manner of OSWorld's `os` domain, not OSWorld's own: a folder to rename, a background script
to stop and an infeasible request, whose setup and evaluation need only a shell and an X display and use OSWorld's
conventions, user `user` with password `password`). `hand-written` is the 27 alone. OSWorld's own task files are not
in the repository (its benchmark tasks carry a do-not-train canary): load a tree of them with
`GUIEnv.load_task_file(<evaluation_examples>, "osworld")` (envs.gui.osworld_tasks).
The per-domain app tasks (LibreOffice, GIMP, VLC, ...) are another set: envs.gui.app_tasks (`task_set=apps`).

Relative file paths in a task (`download` urls, `cloud_file` paths) resolve under `files_dir_for(task)`: the bundled
files (tasks/files), or for `"files": "generated"` the directory envs.gui.app_files generates.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from envs.gui.evaluator import check_supported
from envs.gui.setup_steps import check_steps
from envs.gui.task_builders import variants

PACKAGE_DIR = Path(__file__).resolve().parent
TASKS_DIR = PACKAGE_DIR / "tasks"
FILES_DIR = TASKS_DIR / "files"
APPS_DIR = PACKAGE_DIR / "apps"
APPS_BIN = APPS_DIR / "bin"
SPLITS = ("train", "eval", "osworld", "hand-written", "all")
FILE_SOURCES = ("bundled", "generated")  # nextstate.files: where a task's relative file paths resolve
VARIANTS_PER_FAMILY = {"train": 6, "eval": 3}

Task = dict[str, Any]


@lru_cache(maxsize=4)
def _read(name: str) -> tuple[Task, ...]:
    data = json.loads((TASKS_DIR / name).read_text(encoding="utf-8"))
    return tuple(validate_task(t) for t in data)


@lru_cache(maxsize=4)
def _variants(split: str) -> tuple[Task, ...]:
    return tuple(validate_task(t) for t in variants(split, VARIANTS_PER_FAMILY[split]))


def bundled_tasks(split: str = "train") -> list[Task]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the gui family has {', '.join(SPLITS)}")
    if split == "osworld":
        return [dict(t) for t in _read("osworld_os.json")]
    hand = [dict(t) for t in _read("bundled.json")]
    if split == "hand-written":
        return hand
    if split == "all":
        return hand + [dict(t) for s in ("train", "eval") for t in _variants(s)]
    return [t for t in hand if t.get("nextstate", {}).get("split") == split] + [dict(t) for t in _variants(split)]


def validate_task(task: Task) -> Task:
    """Check an OSWorld task dict; raise ValueError naming what is wrong or unsupported."""
    if not isinstance(task, dict):
        raise TypeError(f"a gui task is a JSON object, got {type(task).__name__}")
    for key in ("id", "instruction", "evaluator"):
        if key not in task:
            raise ValueError(f"gui task {task.get('id', '?')!r} has no {key!r} field (OSWorld task JSON)")
    if not isinstance(task["instruction"], str) or not task["instruction"].strip():
        raise ValueError(f"gui task {task['id']!r}: 'instruction' must be a non-empty string")
    if not isinstance(task["evaluator"], dict):
        raise ValueError(f"gui task {task['id']!r}: 'evaluator' must be an object")
    try:
        check_steps(task.get("config", []), "config")
        check_steps(task["evaluator"].get("postconfig", []), "evaluator.postconfig")
        check_supported(task["evaluator"])
        ns = task.get("nextstate", {})
        if not isinstance(ns, dict):
            raise ValueError("'nextstate' must be an object")
        if ns.get("split") not in (None, "train", "eval"):
            raise ValueError(f"nextstate.split must be 'train' or 'eval', got {ns.get('split')!r}")
        if ns.get("files", "bundled") not in FILE_SOURCES:
            raise ValueError(f"nextstate.files must be one of {', '.join(FILE_SOURCES)}, got {ns.get('files')!r}")
        for key in ("solution", "wrong", "progress", "violations"):
            if key in ns and not isinstance(ns[key], list):
                raise ValueError(f"nextstate.{key} must be a list")
        for check in [*ns.get("progress", []), *ns.get("violations", [])]:
            check_supported({k: check.get(k) for k in ("func", "result", "expected", "options")})
    except ValueError as exc:
        raise ValueError(f"gui task {task['id']!r}: {exc}") from None
    return task


def files_dir_for(task: Task) -> Path:
    """Where `task`'s relative file paths resolve: the bundled files, or the generated app files (built on first
    use)."""
    if task.get("nextstate", {}).get("files") == "generated":
        from envs.gui.app_files import generated_dir

        return generated_dir()
    return FILES_DIR
