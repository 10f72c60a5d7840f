"""Resuming an experiment: `python -m rollout.launch run.resume=<experiment dir>` (the experiment's own command line
may be repeated; it must agree with the saved one, bar the options `rollout.state.resume.RESUME_MAY_CHANGE` names).

The experiment's command is taken from its `experiment.json`. A run that finished (a row with exit status 0 in
`runs.jsonl`) is kept as it is, files untouched; every other planned run is restarted from scratch: its directory (a
run the kill interrupted, or one that failed) and its failed rows of runs.jsonl are moved to
`superseded/resume<r>/`, so the experiment's report is built from complete runs only and nothing is lost.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rollout.config import merge_overrides, override_key
from rollout.state.resume import RESUME_MAY_CHANGE, RESUME_OWN_KEYS, SUPERSEDED_DIR, ResumeError
from rollout.state.run_state import atomic_write

EXPERIMENT_FILE = "experiment.json"
RUNS_FILE = "runs.jsonl"


def is_experiment_dir(path: str | Path) -> bool:
    return (Path(path) / EXPERIMENT_FILE).exists()


def _covered(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def experiment_resume_overrides(exp_dir: Path, given: Iterable[str]) -> list[str]:
    """The overrides a resumed experiment runs with: the saved command's, with the given ones that may change on
    resume, and the experiment's own directory and name. A given override that differs from the saved command
    otherwise is an error naming it."""
    info = json.loads((exp_dir / EXPERIMENT_FILE).read_text())
    saved = [o for o in info.get("command", [])[3:] if not _covered(override_key(o), RESUME_OWN_KEYS)]
    by_key = {override_key(o): o for o in saved}
    changes, conflicts = [], []
    for o in given:
        key = override_key(o)
        if _covered(key, RESUME_OWN_KEYS) or by_key.get(key) == o:
            continue
        if _covered(key, RESUME_MAY_CHANGE):
            changes.append(o)
        else:
            conflicts.append(f"{o} (the experiment was started with {by_key.get(key, 'no ' + key)})")
    if conflicts:
        raise ResumeError("run.resume continues the experiment as it was started; these overrides differ from its "
                          "command (experiment.json):\n  " + "\n  ".join(conflicts)
                          + "\nleave them out, or start a new experiment")
    own = [f"run.out_dir={exp_dir}", f"run.resume={exp_dir}"]
    if info.get("run_name"):
        own.append(f"run.name={info['run_name']}")
    return merge_overrides(saved, changes, own)


def _resume_number(exp_dir: Path) -> int:
    root = exp_dir / SUPERSEDED_DIR
    return 1 + (sum(1 for p in root.iterdir() if p.name.startswith("resume")) if root.is_dir() else 0)


def set_aside_unfinished(exp_dir: Path, out_dirs: Iterable[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(out_dir -> runs.jsonl row of each run that finished, the run directories set aside to be restarted)."""
    runs_file = exp_dir / RUNS_FILE
    rows = [json.loads(ln) for ln in runs_file.read_text().splitlines() if ln.strip()] if runs_file.exists() else []
    finished = {r["out_dir"]: r for r in rows if r.get("rc") == 0}
    failed = [r for r in rows if r.get("rc") != 0]
    target = exp_dir / SUPERSEDED_DIR / f"resume{_resume_number(exp_dir)}"
    moved = []
    for out in out_dirs:
        path = Path(out)
        if out in finished or not path.exists():
            continue
        dest = target / path.resolve().relative_to(exp_dir.resolve())
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(dest))
        moved.append(out)
    if failed:
        target.mkdir(parents=True, exist_ok=True)
        atomic_write(target / RUNS_FILE, "".join(json.dumps(r) + "\n" for r in failed).encode())
        atomic_write(runs_file, "".join(json.dumps(r) + "\n" for r in rows if r.get("rc") == 0).encode())
    return finished, moved


__all__ = ["EXPERIMENT_FILE", "RUNS_FILE", "experiment_resume_overrides", "is_experiment_dir", "set_aside_unfinished"]
