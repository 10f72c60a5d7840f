"""The bundled SWE repositories and instances, built from the sources in this package.

Layout (all plain files, reviewable):
- `repos/<owner>__<name>/NN-<message>/...`: one directory per commit, holding the files that commit adds or changes
  (`dot-x` is written as `.x`). Commits get fixed authors and dates, so every build yields the same commit ids.
- `instances/<instance_id>/instance.yaml`: repo, version, problem statement, dates; `fix/` the files as the gold patch
  leaves them, `tests/` the test files as the test patch leaves them, `break/` a variant of the fix that breaks a
  PASS_TO_PASS test (used by the tests to show such a patch does not resolve the instance).
- `specs.yaml`: the per-(repo, version) specs; `instances.jsonl`: the derived SWE-bench instance dicts.

`python -m envs.swe.bundle derive` (envs/swe/bundle.py) rebuilds `instances.jsonl` from these sources.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from envs.swe.git import git

log = logging.getLogger(__name__)

HERE = Path(str(resources.files("envs.swe.bundled")))
REPOS_SRC = HERE / "repos"
INSTANCES_SRC = HERE / "instances"
INSTANCES_FILE = HERE / "instances.jsonl"
BUNDLED_REPOS = {p.name.replace("__", "/", 1) for p in REPOS_SRC.iterdir() if p.is_dir()}
AUTHOR = {
    "GIT_AUTHOR_NAME": "NextState Fixtures",
    "GIT_AUTHOR_EMAIL": "fixtures@nextstate.invalid",
    "GIT_COMMITTER_NAME": "NextState Fixtures",
    "GIT_COMMITTER_EMAIL": "fixtures@nextstate.invalid",
}
EVAL_IDS = {"nextstate__textkit-3", "nextstate__minicalc-2", "nextstate__ledger-2"}  # the bundled eval split


def _copy_overlay(src: Path, dest: Path) -> None:
    for f in sorted(src.rglob("*")):
        if f.is_dir() or "__pycache__" in f.parts:
            continue
        rel = f.relative_to(src)
        name = "." + rel.name[4:] if rel.name.startswith("dot-") else rel.name
        target = dest / rel.parent / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)


def build_repo(repo: str, dest: Path) -> str:
    """Create the git repository of bundled `repo` at `dest` (atomically); return its HEAD commit."""
    src = REPOS_SRC / repo.replace("/", "__")
    if not src.is_dir():
        raise KeyError(f"{repo} is not a bundled repository (bundled: {', '.join(sorted(BUNDLED_REPOS))})")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        work = tmp / "repo"
        git("init", "-q", "-b", "main", str(work))
        for i, commit_dir in enumerate(sorted(p for p in src.iterdir() if p.is_dir())):
            _copy_overlay(commit_dir, work)
            git("add", "-A", cwd=work)
            date = f"2024-01-{i + 1:02d}T12:00:00+0000"
            message = commit_dir.name.split("-", 1)[1].replace("-", " ").capitalize()
            git(
                "commit",
                "-q",
                "--no-verify",
                "-m",
                message,
                cwd=work,
                env={**AUTHOR, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
            )
        git("gc", "-q", cwd=work)
        for root, dirs, files in os.walk(work):  # readable by the sandbox's uid
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        os.chmod(work, 0o755)
        work.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return git("rev-parse", "HEAD", cwd=dest).strip()


def _diff_with_overlay(repo_path: Path, base: str, overlays: list[Path]) -> str:
    """The patch that turns `base` into `base` + the overlay trees (new files included)."""
    with tempfile.TemporaryDirectory(prefix="nextstate-bundle-") as tmp:
        work = Path(tmp) / "w"
        git("clone", "-q", "--shared", "-n", str(repo_path), str(work))
        git("checkout", "-q", "--detach", base, cwd=work)
        for overlay in overlays:
            _copy_overlay(overlay, work)
        git("add", "-A", cwd=work)
        return git("diff", "--cached", "--binary", base, cwd=work)


def source_instance(instance_id: str, repo_path: Path) -> dict[str, Any]:
    """The instance dict from its sources (patches computed; FAIL_TO_PASS / PASS_TO_PASS not yet derived)."""
    src = INSTANCES_SRC / instance_id
    meta = yaml.safe_load((src / "instance.yaml").read_text(encoding="utf-8"))
    base = git("rev-parse", meta.get("base", "HEAD"), cwd=repo_path).strip()
    return {
        "instance_id": instance_id,
        "repo": meta["repo"],
        "base_commit": base,
        "environment_setup_commit": base,
        "version": str(meta["version"]),
        "created_at": meta["created_at"],
        "problem_statement": meta["problem_statement"],
        "hints_text": meta.get("hints_text", ""),
        "patch": _diff_with_overlay(repo_path, base, [src / "fix"]),
        "test_patch": _diff_with_overlay(repo_path, base, [src / "tests"]),
        "split": "eval" if instance_id in EVAL_IDS else "train",
    }


def break_patch(instance_id: str, repo_path: Path, base: str) -> str:
    """The gold fix plus a regression in code a PASS_TO_PASS test covers."""
    return _diff_with_overlay(repo_path, base, [INSTANCES_SRC / instance_id / "break"])


def instance_ids() -> list[str]:
    return sorted(p.name for p in INSTANCES_SRC.iterdir() if (p / "instance.yaml").exists())


def load_bundled_instances() -> list[dict[str, Any]]:
    with INSTANCES_FILE.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
