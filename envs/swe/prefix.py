"""The environment of a SWE instance is an interpreter prefix of its own, as SWE-bench's conda environment is.

No conda can be downloaded here. A venv would be the usual stand-in, but a venv's python finds its environment only when
run by its own path: a tool that links sys.executable elsewhere (tox-current-env, which sphinx's test command uses,
links it into .tox/py39/bin) gets the bare base interpreter, without the environment's packages. A conda environment
has no such trap: its python is a complete installation at the environment's prefix. So the environment here is a copy
of a pyenv interpreter's prefix at /opt/nextstate/venv (hard links: seconds and no disk for the files), with only the
packages a fresh environment has (pip, setuptools, wheel) and an `activate` script that puts its bin first on PATH (what
`conda activate testbed` does in SWE-bench's eval script). Its `python` finds its standard library and site-packages
from its own location, by any path. The interpreter's shared library is found at the pyenv prefix (the binary's
RUNPATH), so that tree is visible at its own path too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from envs.swe.grading import VENV_DIR

#: top-level entries of site-packages that a fresh environment has; anything else the interpreter's own site-packages
#: holds (packages installed on this machine, its .pth hooks) is not part of an environment
FRESH_SITE = ("pip", "setuptools", "wheel", "_distutils_hack", "pkg_resources", "distutils-precedence.pth",
              "README.txt")

ACTIVATE = f"""# the environment's activation (what `conda activate testbed` does in SWE-bench's scripts)
export PATH="{VENV_DIR}/bin:$PATH"
hash -r 2>/dev/null || true
"""


def fresh_site_step() -> str:
    """The shell step (run in the environment's build) that leaves site-packages as a fresh environment's."""
    keep = " ".join(f"-not -name '{name}*'" for name in FRESH_SITE)
    return f"find {VENV_DIR}/lib/python*/site-packages -mindepth 1 -maxdepth 1 {keep} -exec rm -rf {{}} +"


def activate_step() -> str:
    """The shell step that writes the environment's `bin/activate`."""
    return f"cat > {VENV_DIR}/bin/activate <<'EOF_NEXTSTATE_ACTIVATE'\n{ACTIVATE}EOF_NEXTSTATE_ACTIVATE"


def link_copy(src: Path, dest: Path, uid: int | None) -> None:
    """`dest` (an empty directory) as a copy of the tree `src` that a build running as `uid` may change without changing
    `src`: its files are hard links to root-owned files the build cannot write (pip replaces files, it does not write
    into them; a tool that does fails loudly instead of changing every copy), its directories are the build's own, and
    the few small files tools do rewrite in place (`bin/` scripts, the top-level files of site-packages) are real
    copies."""
    subprocess.run(["cp", "-al", f"{src}/.", str(dest)], check=True)
    rewritten = [*dest.glob("bin/*"), *dest.glob("lib/python*/site-packages/*.*")]
    rewritten = [f for f in rewritten if f.is_file() and not f.is_symlink() and f.stat().st_size < 1 << 20]
    for f in rewritten:
        tmp = f.with_name(f.name + ".nextstate-copy")
        shutil.copy2(f, tmp)
        os.replace(tmp, f)
    if uid is not None:
        for d, _dirs, _files in os.walk(dest):
            os.chown(d, uid, uid)
        for f in rewritten:
            os.chown(f, uid, uid)
