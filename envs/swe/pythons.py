"""Find a Python interpreter for a SWE-bench spec's version ("3.9"): the exact minor version when one is installed
(pyenv's versions, then the system's), else the closest one. The choice is recorded with the result."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from envs.runtime.pyenv import pyenv_roots


@dataclass(frozen=True)
class Interpreter:
    executable: str  # a real binary, never a pyenv shim
    version: tuple[int, int, int]
    prefix: str  # sys.base_prefix: the tree a venv made from it links into

    @property
    def minor(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def full(self) -> str:
        return ".".join(map(str, self.version))


@dataclass(frozen=True)
class PythonChoice:
    requested: str
    interpreter: Interpreter
    exact: bool  # same major.minor as requested

    def describe(self) -> str:
        how = "exact" if self.exact else "closest available"
        return f"Python {self.interpreter.full} for requested {self.requested} ({how}: {self.interpreter.executable})"


def _candidates() -> list[str]:
    found: list[str] = []
    for root in pyenv_roots():
        found += sorted(glob.glob(os.path.join(root, "versions", "*", "bin", "python3")))
    for d in ("/usr/local/bin", "/usr/bin"):
        found += sorted(p for p in glob.glob(os.path.join(d, "python3.[0-9]*")) if not p.endswith("-config"))
    return [p for p in found if os.access(p, os.X_OK) and "/shims/" not in p]


@lru_cache(maxsize=1)
def installed_interpreters() -> tuple[Interpreter, ...]:
    """Every CPython 3 on this machine (one per version; pyenv's first), probed once."""
    probe = (
        "import json, sys; print(json.dumps([list(sys.version_info[:3]), sys.base_prefix, sys.implementation.name]))"
    )
    seen: dict[tuple[int, int, int], Interpreter] = {}
    for exe in _candidates():
        try:
            out = subprocess.run([exe, "-I", "-c", probe], capture_output=True, text=True, timeout=20)
            version, prefix, impl = json.loads(out.stdout)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            continue
        if impl != "cpython" or version[0] != 3:
            continue
        key = tuple(version)
        seen.setdefault(key, Interpreter(str(Path(exe).resolve()), key, prefix))  # type: ignore[arg-type]
    return tuple(sorted(seen.values(), key=lambda i: i.version))


def choose_python(requested: str, available: tuple[Interpreter, ...] | None = None) -> PythonChoice:
    """The newest patch release of the requested minor version, else the nearest minor version (ties: the newer)."""
    pool = installed_interpreters() if available is None else available
    if not pool:
        raise RuntimeError("no CPython 3 interpreter found (looked in pyenv's versions, /usr/local/bin, /usr/bin)")
    try:
        major, minor = (int(x) for x in str(requested).split(".")[:2])
    except ValueError:
        raise ValueError(f"python version {requested!r} is not of the form 3.N") from None
    exact = [i for i in pool if i.version[:2] == (major, minor)]
    if exact:
        return PythonChoice(str(requested), max(exact, key=lambda i: i.version), True)
    best = min(pool, key=lambda i: (abs((i.version[0] - major) * 100 + i.version[1] - minor), -i.version[1]))
    return PythonChoice(str(requested), best, False)
