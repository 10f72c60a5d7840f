"""PyPI as it was when SWE-bench's environments were built: every pip install of an environment build is held to the
releases uploaded before a cutoff date.

SWE-bench's specs pin a few packages (`pip_packages`) and leave the rest to pip, which took the newest releases of the
day its images were built (mid 2024, when SWE-bench Verified was validated). Resolved today, the same specs pull
releases
that break the instances' tests (sphinx's LaTeX tests expect Pygments 2.18's tokens, say), and a gold patch stops
resolving. pip can filter by upload date only from version 26.1 on, which needs Python 3.10; the environments run 3.6 to
3.11. So uv (a static binary, `--exclude-newer`) resolves each install step at the cutoff into a constraints file, and
the environment's own pip installs as the spec says, under those constraints (PIP_CONSTRAINT). Build dependencies that
pip installs in isolated build environments are not held (their pins would clash with the runtime ones in one
constraints file); the spec's pre_install pins the ones that matter (setuptools for astropy).
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from envs.runtime.host_paths import file_lock
from envs.swe.grading import VENV_DIR

DEFAULT_CUTOFF = "2024-09-01"  # SWE-bench Verified was released in August 2024, validated on images built before
TOOLS_DIR = "/opt/nextstate/tools"  # where uv is visible in build sandboxes and build containers
UV = f"{TOOLS_DIR}/uv"
ENV_CONSTRAINTS = f"{VENV_DIR}/.nextstate-constraints.txt"
FAR_FUTURE = "2100-01-01"  # the environment's own pins, for the instance's install
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T[\d:]+Z?)?$")


def check_cutoff(cutoff: str) -> str:
    if cutoff and not _DATE.match(cutoff):
        raise ValueError(f"pypi_cutoff={cutoff!r}: use a date (YYYY-MM-DD), or '' to resolve at today's PyPI")
    return cutoff


def uv_tools_dir(cache_dir: Path) -> Path:
    """A directory holding the uv binary (the `uv` package's), readable by every uid: mount it at TOOLS_DIR."""
    import uv  # the swe extra

    src = Path(uv.find_uv_bin())
    dest = cache_dir / "tools" / f"uv-{src.stat().st_size}-{int(src.stat().st_mtime)}"
    with file_lock(cache_dir / "tools" / f".{dest.name}.lock"):
        if not (dest / "uv").exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / "uv.partial")
            (dest / "uv.partial").chmod(0o755)
            (dest / "uv.partial").rename(dest / "uv")
    for d in (cache_dir / "tools", dest):
        d.chmod(0o755)
    return dest


def compile_step(inputs: str, out: str, cutoff: str, constraints: str | None = None, *, for_env_var: bool = False
                 ) -> str:
    """The shell step that resolves the requirements file `inputs` at `cutoff` into the constraints file `out` (pins
    only: an editable or local project line is dropped, pip constraints cannot hold one). `for_env_var`: the file
    will be PIP_CONSTRAINT, which reaches pip's isolated build environments too, where a package's own build
    requirements must win: the build tools (setuptools, wheel, pip) are dropped from it; passed as `-c` they stay (it
    binds the install itself only). A version pinned exactly in `inputs` or in `constraints` is taken as given, however
    new (a spec's pip_packages may pin a later release)."""
    pinned = " ".join(shlex.quote(f) for f in (inputs, constraints) if f)
    exempt = (
        f"$(sed -n 's/^\\([A-Za-z0-9_.-]*\\)[[:space:]]*==.*/--exclude-newer-package \\1={FAR_FUTURE}/p' {pinned})"
    )
    extra = f"-c {shlex.quote(constraints)} " if constraints else ""
    return (
        f"UV_CACHE_DIR=/tmp/uv-cache UV_NO_CONFIG=1 {UV} pip compile --quiet --no-header --no-annotate "
        f"--python {VENV_DIR}/bin/python --exclude-newer {cutoff} {exempt} {extra}-o {shlex.quote(out)} "
        f"{shlex.quote(inputs)} && sed -i -e '/^-e /d' -e '/ @ file:/d' -e '/^file:/d' -e '/^[./]/d' "
        + (r"-e '/^\(setuptools\|wheel\|pip\)==/d' " if for_env_var else "") + shlex.quote(out)
    )


def install_target(install: str) -> str | None:
    """What a spec's pip install command installs from the checkout, as the requirement line that resolves its
    dependencies ('.[test]', '.': never editable, which would ask the build backend for PEP 660 hooks an older
    setuptools lacks, where pip itself falls back to `setup.py develop`), or None when it is not a pip install of the
    checkout."""
    try:
        argv = shlex.split(install)
    except ValueError:
        return None
    if "install" not in argv or "pip" not in " ".join(argv[: argv.index("install")]):
        return None
    args = argv[argv.index("install") + 1 :]
    for i, arg in enumerate(args):
        if arg == "-e" and i + 1 < len(args) and args[i + 1].startswith("."):
            return args[i + 1]
        if arg.startswith(".") and (i == 0 or args[i - 1] != "-e"):
            return arg
    return None
