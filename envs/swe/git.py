"""Host-side git, for the repositories NextState builds and owns (bundled repos, clones, checkouts it prepares)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None, check: bool = True) -> str:
    """Host-side git on repositories we own (never on an agent's checkout: that runs inside the sandbox)."""
    proc = subprocess.run(
        ["git", "-c", "core.autocrlf=false", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout
