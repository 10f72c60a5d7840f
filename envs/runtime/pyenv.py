"""Where this machine's pyenv builds are, found without trusting HOME: `$PYENV_ROOT` when set (that root only, as
pyenv itself reads it); else `~/.pyenv`, the pyenv this process's own Python came from (a virtual environment made
from a pyenv Python, run with an empty HOME, still finds that pyenv's other versions), then the system-wide places."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _running_pyenv_root() -> Path | None:
    base = Path(sys.base_prefix)  # <root>/versions/<X.Y.Z> for a pyenv build
    return base.parent.parent if base.parent.name == "versions" else None


def pyenv_roots() -> list[Path]:
    """The pyenv roots that exist, most specific first, each once."""
    if os.environ.get("PYENV_ROOT"):
        roots = [os.environ["PYENV_ROOT"]]
    else:
        roots = [os.path.expanduser("~/.pyenv"), _running_pyenv_root(), "/opt/pyenv", "/usr/local/pyenv"]
    return [Path(r) for r in dict.fromkeys(str(r) for r in roots if r) if Path(r, "versions").is_dir()]


__all__ = ["pyenv_roots"]
