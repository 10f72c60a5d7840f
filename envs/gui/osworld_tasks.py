"""OSWorld's task tree as a task source: `evaluation_examples/` with `test_all.json` (domain -> task ids) and
`examples/<domain>/<id>.json`.

The paper's GUI setting is OSWorld-Verified without the Chrome and multi-app domains: `load_osworld_examples(root)`
excludes those by default; `index=None` takes every example file instead of the ids `test_all.json` lists (OSWorld's
`os` domain has 36 files, 24 of them listed). Tasks this env cannot run are skipped and counted, never silently kept:
`OSWorldTaskSet.skipped` names each with a one-line reason: setup steps or evaluator functions it lacks (cloud-drive
steps, a few multi_apps metrics), an evaluator with no metric, a file on a web host when this machine is offline
(see `envs.gui.getters.fetch_source` for the local mirror and the opt-in to fetch), a web page the desktop's browser
must open when the desktop has no network (the local and docker backends never have one), or an app the desktop
lacks (`has_program`: VS Code's `code` unless it was added to the guest root).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.gui.getters import fetching_allowed, is_remote, mirrored, offline_refusal
from envs.gui.setup_steps import APP_PROGRAMS, HISTORY_TEMPLATE_URL, STAND_INS, not_installed, program_of
from envs.gui.tasks import validate_task
from envs.taskfile import TaskFileError

PAPER_EXCLUDED_DOMAINS = ("chrome", "multi_apps")


@dataclass
class OSWorldTaskSet:
    tasks: list[dict[str, Any]]
    skipped: dict[str, str] = field(default_factory=dict)  # task id -> why it cannot run here
    skipped_kinds: dict[str, str] = field(default_factory=dict)  # task id -> the kind of that reason (SKIP_KINDS)
    domains: dict[str, int] = field(default_factory=dict)  # domain -> tasks kept

    def skip(self, tid: str, kind: str, reason: str) -> None:
        self.skipped[tid], self.skipped_kinds[tid] = reason, kind


# what keeps a task from running here, as the summary line counts them
MISSING, UNSUPPORTED, WEB_FILES, WEB_PAGES, NO_APP = (
    "are missing", "are not valid or use a step, getter or metric NextState lacks", "need files from the web",
    "open web pages", "start an app the desktop lacks")


def remote_files(task: dict[str, Any]) -> list[str]:
    """The http(s) URLs a task's setup, postconfig and getters fetch."""
    urls: list[str] = []
    steps = list(task.get("config") or []) + list((task.get("evaluator") or {}).get("postconfig") or [])
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "update_browse_history":
            urls.append(HISTORY_TEMPLATE_URL)  # the empty History database it fills
        if isinstance(step, dict) and step.get("type") == "download":
            urls += [f.get("url", "") for f in (step.get("parameters") or {}).get("files", []) if isinstance(f, dict)]
    ev = task.get("evaluator") or {}
    for key in ("result", "expected"):
        specs = ev.get(key)
        for spec in specs if isinstance(specs, list) else [specs]:
            if isinstance(spec, dict) and spec.get("type") == "cloud_file":
                paths = spec.get("path")
                urls += paths if isinstance(paths, list) else [paths]
    return [u for u in urls if isinstance(u, str) and is_remote(u)]


PAGE_GETTERS = ("page_info", "pdf_from_url", "info_from_website")  # getters that load their `url` in the browser


def web_pages(task: dict[str, Any]) -> list[str]:
    """The web pages the desktop's browser must open: the tabs its setup opens, the pages its getters load."""
    urls: list[str] = []
    for step in list(task.get("config") or []) + list((task.get("evaluator") or {}).get("postconfig") or []):
        if isinstance(step, dict) and step.get("type") == "chrome_open_tabs":
            urls += [str(u) for u in (step.get("parameters") or {}).get("urls_to_open", [])]
    ev = task.get("evaluator") or {}
    for key in ("result", "expected"):
        specs = ev.get(key)
        for spec in specs if isinstance(specs, list) else [specs]:
            if isinstance(spec, dict) and spec.get("type") in PAGE_GETTERS and isinstance(spec.get("url"), str):
                urls.append(spec["url"])
    return [u for u in urls if is_remote(u)]


def apps_started(task: dict[str, Any]) -> list[str]:
    """OSWorld's apps (setup_steps.APP_PROGRAMS) the task's setup and postconfig start, in order, once each."""
    found: list[str] = []
    for step in list(task.get("config") or []) + list((task.get("evaluator") or {}).get("postconfig") or []):
        if isinstance(step, dict) and step.get("type") in ("launch", "execute", "command"):
            params = step.get("parameters") or {}
            prog = program_of(params.get("command") or "", bool(params.get("shell")))
            if prog in APP_PROGRAMS and prog not in found:
                found.append(prog)
    return found


def app_problem(task: dict[str, Any], has_program: Callable[[str], bool]) -> str | None:
    """Why the task cannot run on a desktop with these programs (an app it starts, with no stand-in), or None."""
    for prog in apps_started(task):
        stand_in = STAND_INS.get(prog)
        if not has_program(prog) and not (stand_in and has_program(stand_in)):
            return f"it starts an app: {not_installed(prog)}"
    return None


def offline_problem(task: dict[str, Any]) -> str | None:
    """Why the task cannot run on this machine offline (a remote file neither mirrored nor fetchable), or None."""
    if fetching_allowed():
        return None
    missing = [u for u in remote_files(task) if mirrored(u) is None]
    if not missing:
        return None
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return offline_refusal(missing[0]) + more


def _example_files(root: Path, index: str | None) -> Iterator[tuple[str, str, Path]]:
    """(domain, task id, path) for every task the index lists, or for every example file when `index` is None."""
    if index is None:
        examples = root / "examples"
        if not examples.is_dir():
            raise TaskFileError(f"{examples} does not exist (expected OSWorld's evaluation_examples directory)")
        for path in sorted(examples.glob("*/*.json")):
            yield path.parent.name, path.stem, path
        return
    index_path = root / index
    if not index_path.exists():
        raise TaskFileError(f"{index_path} does not exist (expected OSWorld's evaluation_examples directory)")
    try:
        by_domain = json.loads(index_path.read_text())
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{index_path}: invalid JSON ({exc.msg})") from exc
    for domain, ids in by_domain.items():
        for tid in ids:
            yield domain, str(tid), root / "examples" / domain / f"{tid}.json"


def load_osworld_examples(
    root: str | Path,
    *,
    exclude_domains: Sequence[str] = PAPER_EXCLUDED_DOMAINS,
    domains: Sequence[str] | None = None,
    index: str | None = "test_all.json",
    desktop_online: bool = False,
    has_program: Callable[[str], bool] | None = None,
) -> OSWorldTaskSet:
    """The runnable tasks of an OSWorld tree (`domains`: only these; `index=None`: every example file).
    `desktop_online`: the desktop's browser reaches the web (an OSWorld VM may; our sandboxed and docker desktops never
    do); `has_program`: whether the desktop has a program (None: not known here, so an app it lacks is refused when
    the task starts)."""
    root = Path(root)
    out = OSWorldTaskSet([])
    for domain, tid, path in _example_files(root, index):
        if domain in exclude_domains or (domains is not None and domain not in domains):
            continue
        if not path.exists():
            out.skip(tid, MISSING, f"{path} is missing")
            continue
        try:
            task = validate_task(json.loads(path.read_text()))
        except (ValueError, TypeError, json.JSONDecodeError) as exc:
            out.skip(tid, UNSUPPORTED, str(exc).splitlines()[0])
            continue
        problem = offline_problem(task)
        kind = WEB_FILES
        pages = web_pages(task)
        if problem is None and pages and not desktop_online:
            more = f" (and {len(pages) - 1} more)" if len(pages) > 1 else ""
            problem = (f"opens {pages[0][:80]}{more} in the browser, and this desktop has no network (local and "
                       "docker backends); run it on backend=osworld with a VM that reaches the web")
            kind = WEB_PAGES
        if problem is None and has_program is not None:
            problem, kind = app_problem(task, has_program), NO_APP
        if problem is not None:
            out.skip(tid, kind, f"gui task {tid!r}: {problem}")
            continue
        task.setdefault("domain", domain)
        out.tasks.append(task)
        out.domains[domain] = out.domains.get(domain, 0) + 1
    if not out.tasks:
        raise TaskFileError(f"{root}: no runnable task among {len(out.skipped)} (first reasons: "
                            f"{list(out.skipped.items())[:3]})")
    return out
