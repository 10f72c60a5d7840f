"""OSWorld's task tree as a task source: `evaluation_examples/` with `test_all.json` (domain -> task ids) and
`examples/<domain>/<id>.json`.

The paper's GUI setting is OSWorld-Verified without the Chrome and multi-app domains: `load_osworld_examples(root)`
excludes those by default. Tasks whose setup steps or evaluator functions this env cannot run (app-specific metrics
such as LibreOffice's) are skipped and counted, never silently kept: `OSWorldTaskSet.skipped` names each with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.gui.tasks import validate_task
from envs.taskfile import TaskFileError

PAPER_EXCLUDED_DOMAINS = ("chrome", "multi_apps")


@dataclass
class OSWorldTaskSet:
    tasks: list[dict[str, Any]]
    skipped: dict[str, str] = field(default_factory=dict)  # task id -> why it cannot run here
    domains: dict[str, int] = field(default_factory=dict)  # domain -> tasks kept


def load_osworld_examples(
    root: str | Path, *, exclude_domains: Sequence[str] = PAPER_EXCLUDED_DOMAINS, index: str = "test_all.json"
) -> OSWorldTaskSet:
    root = Path(root)
    index_path = root / index
    if not index_path.exists():
        raise TaskFileError(f"{index_path} does not exist (expected OSWorld's evaluation_examples directory)")
    try:
        by_domain = json.loads(index_path.read_text())
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{index_path}: invalid JSON ({exc.msg})") from exc
    out = OSWorldTaskSet([])
    for domain, ids in by_domain.items():
        if domain in exclude_domains:
            continue
        for tid in ids:
            path = root / "examples" / domain / f"{tid}.json"
            if not path.exists():
                out.skipped[str(tid)] = f"{path} is missing"
                continue
            try:
                task = validate_task(json.loads(path.read_text()))
            except (ValueError, TypeError, json.JSONDecodeError) as exc:
                out.skipped[str(tid)] = str(exc)
                continue
            task.setdefault("domain", domain)
            out.tasks.append(task)
            out.domains[domain] = out.domains.get(domain, 0) + 1
    if not out.tasks:
        raise TaskFileError(f"{root}: no runnable task among {len(out.skipped)} (first reasons: "
                            f"{list(out.skipped.items())[:3]})")
    return out
