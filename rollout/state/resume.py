"""Resuming a run (`run.resume=outputs/<run>`): which config it continues with, and which of its records stay.

- The config: the run's own `config.yaml`. Options given on the command line must agree with it, except those that may
  change between attempts (`RESUME_MAY_CHANGE`: more iterations, the checkpoint cadence, loggers, where servers are);
  anything else that differs is an error naming each key, so a resumed run is the run that was started.
- The records: the run state (rollout/state/run_state.py) says what the last checkpoint covers. Every line of
  `episodes.jsonl`, `trajectories.jsonl`, `eval_trajectories.jsonl` and `metrics.jsonl` that belongs to a later
  iteration or an evaluation after it (and a line cut short by the kill) is moved to `superseded/resume<r>/<file>`,
  so the main files hold each iteration once and nothing is lost; a `kind: resume` row in metrics.jsonl says what was
  redone. Each file is rewritten through a temporary file and a rename, and the moved lines are written before the
  main file is replaced, so a resume that is itself killed can simply be run again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rollout.config import override_key
from rollout.state.run_state import CHECKPOINT_PREFIX, CHECKPOINTS_DIR, RunState, atomic_write, fsync_dir, read_state

RECORD_FILES = ("episodes.jsonl", "trajectories.jsonl", "eval_trajectories.jsonl", "metrics.jsonl")
SUPERSEDED_DIR = "superseded"
TORN_SUFFIX = ".torn"  # lines cut short by the kill, kept as they were

#: options that may differ from the run's config.yaml when it is resumed (a key covers its sub-keys)
RESUME_MAY_CHANGE = (
    "loop.iterations", "run.checkpoint_every", "run.keep_checkpoints", "run.loggers", "run.wandb", "log_level",
    "farm.num_envs", "farm.ray_address", "policy.urls", "policy.url", "judge.urls", "judge.url",
)
#: set by the resume itself: the run keeps its name and directory
RESUME_OWN_KEYS = ("run.resume", "run.name", "run.out_dir")


class ResumeError(ValueError):
    """The run cannot be resumed as asked (the message says why and what to do)."""


# ----- the config -----
def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _covered(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _set(node: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def resume_config(saved: dict[str, Any], composed: dict[str, Any], overrides: Iterable[str]
                  ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(the config the resumed run runs with, key -> [the run's value, the new value] for what changed).

    `saved` is the run's config.yaml, `composed` the command line's config and `overrides` the command line's own
    overrides: only the keys they name are compared (a key left out keeps the run's value)."""
    flat_saved, flat_new = flatten(saved), flatten(composed)
    named = [k for k in (override_key(o) for o in overrides) if not _covered(k, RESUME_OWN_KEYS)]
    changed: dict[str, list[Any]] = {}
    conflicts: list[str] = []
    for leaf in sorted(set(flat_saved) | set(flat_new)):
        if not _covered(leaf, named) or _covered(leaf, RESUME_OWN_KEYS):
            continue
        old, new = flat_saved.get(leaf, "<unset>"), flat_new.get(leaf, "<unset>")
        if old == new:
            continue
        if _covered(leaf, RESUME_MAY_CHANGE):
            changed[leaf] = [old, new]
        else:
            conflicts.append(f"{leaf}: the run has {old!r}, this command line {new!r}")
    if conflicts:
        raise ResumeError(
            "run.resume continues the run as it was configured; these options differ from its config.yaml:\n  "
            + "\n  ".join(conflicts)
            + f"\nleave them out (or set them as the run has them), or start a new run. Options that may change on "
              f"resume: {', '.join(RESUME_MAY_CHANGE)}"
        )
    out = json.loads(json.dumps(saved))  # a deep copy of plain data
    for leaf, (_, new) in changed.items():
        _set(out, leaf, new)
    return out, changed


# ----- the records -----
def committed(record: Mapping[str, Any], file: str, state: RunState) -> bool:
    """Whether the run state covers this line of `file` (else it is superseded on resume)."""
    it = record.get("iteration")
    if file == "episodes.jsonl":
        if record.get("split") == "eval":
            return it in state.evals_done
        return isinstance(it, int) and it < state.iterations_done
    if file == "trajectories.jsonl":
        return isinstance(it, int) and it < state.iterations_done
    if file == "eval_trajectories.jsonl":
        return it in state.evals_done
    kind = record.get("kind")
    if kind == "train":
        return isinstance(it, int) and it < state.iterations_done
    if kind == "eval":
        return it in state.evals_done
    if kind == "resume":
        return int(record.get("resume", 0)) <= state.resumes
    return False  # an error row: the failure of an attempt that is now redone


def _split_file(path: Path, state: RunState, moved_dir: Path) -> None:
    """Rewrite `path` with its committed lines; the others go to `moved_dir/<name>` (and `.torn` for cut lines)."""
    name = path.name
    kept_tmp = path.with_name(f".{name}.resume.tmp")
    moved: list[bytes] = []
    torn: list[bytes] = []
    with path.open("rb") as src, kept_tmp.open("wb") as kept:
        for raw in src:
            line = raw.rstrip(b"\n")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                torn.append(line)
                continue
            if isinstance(record, dict) and committed(record, name, state):
                kept.write(line + b"\n")
            else:
                moved.append(line)
        kept.flush()
        os.fsync(kept.fileno())
    if not moved and not torn:
        kept_tmp.unlink()
        return
    moved_dir.mkdir(parents=True, exist_ok=True)
    # the moved lines first: if this is killed now, the main file still has them and a second resume moves them again
    if moved:
        atomic_write(moved_dir / name, _appended(moved_dir / name, moved))
    if torn:
        atomic_write(moved_dir / f"{name}{TORN_SUFFIX}", _appended(moved_dir / f"{name}{TORN_SUFFIX}", torn))
    kept_tmp.replace(path)
    fsync_dir(path.parent)


def _appended(path: Path, lines: list[bytes]) -> bytes:
    """`path`'s lines followed by `lines` that it does not hold yet (a resume run twice moves a line once)."""
    old = path.read_bytes().splitlines() if path.exists() else []
    have = set(old)
    return b"".join(line + b"\n" for line in [*old, *(ln for ln in lines if ln not in have)])


def superseded_counts(moved_dir: Path) -> dict[str, int]:
    """file -> lines moved aside by this resume (counted from the files, so a resume done twice reports the same)."""
    counts = {}
    if moved_dir.is_dir():
        for p in sorted(moved_dir.iterdir()):
            counts[p.name] = sum(1 for line in p.read_bytes().splitlines() if line.strip())
    return counts


def supersede_uncommitted(run_dir: Path, state: RunState) -> tuple[Path, dict[str, int]]:
    """Move every record the state does not cover to `superseded/resume<r>/` (r = this resume's number); returns
    that folder (relative to the run dir) and the lines moved per file."""
    rel = Path(SUPERSEDED_DIR) / f"resume{state.resumes + 1}"
    for name in RECORD_FILES:
        path = run_dir / name
        if path.exists():
            _split_file(path, state, run_dir / rel)
    return rel, superseded_counts(run_dir / rel)


def remove_unreferenced_checkpoints(run_dir: Path, state: RunState) -> list[str]:
    """Delete `checkpoints/it*` folders the state does not name (one a kill cut short, or older commits)."""
    root = run_dir / CHECKPOINTS_DIR
    gone = []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and f"{CHECKPOINTS_DIR}/{p.name}" != state.checkpoint:
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p.name)
    return gone




# ----- opening a run to resume -----
@dataclass
class Resumed:
    """A run opened for resuming: its config, the state it continues from, and what the resume set aside."""

    config: dict[str, Any]
    state: RunState
    changed: dict[str, list[Any]] = field(default_factory=dict)
    superseded_dir: str = ""
    superseded: dict[str, int] = field(default_factory=dict)  # file -> lines moved aside
    removed_checkpoints: list[str] = field(default_factory=list)
    train_rows: list[dict[str, Any]] = field(default_factory=list)  # the kept metrics rows
    eval_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state.finished

    def row(self) -> dict[str, Any]:
        """The `kind: resume` line of metrics.jsonl: where the run continues and what it redoes."""
        return {
            "kind": "resume", "resume": self.state.resumes + 1, "from_iteration": self.state.iterations_done,
            "weight_version": self.state.weight_version, "checkpoint": self.state.checkpoint,
            "evals_kept": list(self.state.evals_done), "superseded": dict(self.superseded),
            "superseded_dir": self.superseded_dir, "changed": dict(self.changed),
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        }


def saved_config_file(run_dir: Path) -> Path:
    """The config a run wrote at its start; a ResumeError naming what to give when `run_dir` holds no run."""
    config_file = run_dir / "config.yaml"
    if not config_file.exists():
        raise ResumeError(f"run.resume={run_dir}: no run there (no {config_file}); name a directory under outputs/")
    return config_file


def open_resume(composed: dict[str, Any], overrides: Iterable[str]) -> Resumed:
    """Open `composed["run"]["resume"]` for resuming: its config (`resume_config`), its state, and its records with
    every line the state does not cover set aside (`supersede_uncommitted`). A finished run is opened as it is."""
    run_dir = Path(composed["run"]["resume"])
    config_file = saved_config_file(run_dir)
    saved = yaml.safe_load(config_file.read_text()) or {}
    config, changed = resume_config(saved, composed, overrides)
    config["run"].update(resume=str(run_dir), out_dir=str(run_dir))
    try:
        state = read_state(run_dir)
    except ValueError as exc:
        raise ResumeError(str(exc)) from exc
    if state is None:  # killed before its first commit: it starts over, its records all set aside
        state = RunState(run_name=str(config["run"].get("name", "")))
    planned = int(config.get("loop", {}).get("iterations", 0))
    if planned < state.iterations_done:
        raise ResumeError(f"loop.iterations={planned} is below the {state.iterations_done} iterations the run has "
                          "trained: resume with at least as many")
    if state.finished and planned == state.iterations_done:
        return Resumed(config, state, changed)
    state.finished = False  # more iterations asked for: the run goes on
    removed = remove_unreferenced_checkpoints(run_dir, state)
    rel, counts = supersede_uncommitted(run_dir, state)
    rows = read_records(run_dir / "metrics.jsonl")
    return Resumed(config, state, changed, str(rel), counts, removed,
                   train_rows=[r for r in rows if r.get("kind") == "train"],
                   eval_rows=[r for r in rows if r.get("kind") == "eval"])


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


__all__ = [
    "RECORD_FILES", "RESUME_MAY_CHANGE", "RESUME_OWN_KEYS", "ResumeError", "Resumed", "SUPERSEDED_DIR", "committed", "flatten",
    "open_resume", "read_records", "remove_unreferenced_checkpoints", "resume_config",
    "superseded_counts", "supersede_uncommitted",
]
