"""Input and expected files of the bundled per-domain app tasks (envs/gui/tasks/apps/<domain>.json), generated.

One module per OSWorld domain, `envs/gui/app_files/<domain>.py`, exposing `build(out: Path) -> None`: it writes every
file that domain's tasks use under `out` (in practice `out/<domain>/...`), deterministically (same bytes every time:
fixed document dates, zip members stamped 1980-01-01, see `_zip.normalize_zip`), with the format's own library and no
network. Tasks name these files by paths relative to the generated directory (`"url": "libreoffice_calc/sales.xlsx"`
in a `download` step, `"path": "libreoffice_calc/sales_fixed.xlsx"` in a `cloud_file` getter) and say so with
`"nextstate": {"files": "generated"}`.

`generated_dir()` builds the whole set once per process under the cache root (envs.cache: `gui-app-files/<digest>`),
keyed by a digest of this package's sources, so a changed generator gives a new directory and an unchanged one is
reused across processes and runs. Modules whose name starts with `_` are helpers, not domains.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import shutil
from functools import lru_cache
from pathlib import Path

from envs.cache import cache_dir

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent


def domains() -> list[str]:
    """The domains with a generator module, sorted."""
    return sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if not p.stem.startswith("_"))


def build_domain(domain: str, out: Path) -> None:
    """Write `domain`'s files under `out` (its generator's `build`)."""
    if domain not in domains():
        raise ValueError(f"no file generator for domain {domain!r}; generators: {', '.join(domains())}")
    module = importlib.import_module(f"{__name__}.{domain}")
    module.build(out)


def build_all(out: Path) -> None:
    for domain in domains():
        build_domain(domain, out)


def digest() -> str:
    """A digest of every source file of this package: what the generated directory is keyed by (read once per
    process: the env asks for the directory at every setup and evaluation)."""
    return _digest(PACKAGE_DIR)


@lru_cache(maxsize=4)
def _digest(package_dir: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(package_dir.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def generated_dir() -> Path:
    """The directory holding every domain's generated files, built if missing (once per process and cache root)."""
    return _generated(cache_dir("gui-app-files"), digest())


@lru_cache(maxsize=4)
def _generated(root: Path, key: str) -> Path:
    done = root / key
    if (done / ".complete").exists():
        return done
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{key}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    log.info("generating the app tasks' files in %s (once per generator version)", done)
    try:
        build_all(partial)
        (partial / ".complete").touch()
        try:
            partial.rename(done)  # atomic; another process may have won the race with the same content
        except OSError:
            if not (done / ".complete").exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return done


__all__ = ["build_all", "build_domain", "digest", "domains", "generated_dir"]
