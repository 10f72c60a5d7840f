"""The Python of a `FROM python:3.X` task image: 3.X itself where this machine has it.

A `python:*` image (`python:3.12-slim`, `*/python:3.12`, Terminal-Bench's `ghcr.io/laude-institute/t-bench/python-3-13`)
has its interpreter in /usr/local, first on PATH as `python`, `python3` and `pip`. No registry is reachable here, so
the interpreter comes from this machine: a pyenv build (`versions/X.Y.Z` of a root `envs.runtime.pyenv` finds; built on
Debian bookworm like the task bases, so its shared libraries are there) is copied into the base's /usr/local as the
official image lays it out (no test suite, no static library, site-packages with pip and setuptools only), or Debian's
own python3 (3.11 in bookworm) is used when pyenv has no 3.11. A version the machine lacks is one line at load naming
the task, the version asked and those available (`TaskRefused`), unless `python_fallback="nearest"` (then one logged
line, and the nearest minor version of the same major is built instead).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from envs.runtime.pyenv import pyenv_roots

DEBIAN_PYTHON = "3.11"  # the task bases' own /usr/bin/python3 (Debian bookworm)
PYTHON_FALLBACKS = ("exact", "nearest")
# what an official python image's site-packages holds (ensurepip's), the rest of a pyenv build's is this machine's
SITE_KEEP = re.compile(r"^(pip|setuptools|wheel|pkg_resources|_distutils_hack|distutils-precedence\.pth|easy_install)"
                       r"([-.]|$)", re.IGNORECASE)
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test"})  # removed from /usr/local by the official images
_TAG = re.compile(r"^(?P<major>\d)(?:\.(?P<minor>\d+))?(?:[.\-_]|$)")
_TB_NAME = re.compile(r"^python-(?P<major>\d)-(?P<minor>\d+)$")


@dataclass(frozen=True)
class Interpreter:
    version: str  # "3.12"
    prefix: Path | None  # a pyenv build's prefix; None: Debian's python3 in the base

    @property
    def full_version(self) -> str:
        return self.prefix.name if self.prefix is not None else f"{DEBIAN_PYTHON} (Debian)"


def asked_python(image: str) -> str | None:
    """The version a Python image asks for: "3.12" (python:3.12-slim, python:3.12.4, .../python-3-12:tag), "3"
    (python:3, python:latest, python:slim: the newest 3.x), None when `image` is not a Python image."""
    ref = image.split("@", 1)[0]
    name, _, tag = ref.rpartition("/")[2].partition(":")
    if m := _TB_NAME.match(name):
        return f"{m['major']}.{m['minor']}"
    if name != "python":
        return None
    m = _TAG.match(tag)
    if not m:
        return "3"  # latest, slim, bookworm, or no tag
    return f"{m['major']}.{m['minor']}" if m["minor"] else m["major"]


def available_pythons() -> dict[str, Interpreter]:
    """Major.minor -> the interpreter this machine can put in an image (the newest patch release of each)."""
    found: dict[str, Interpreter] = {DEBIAN_PYTHON: Interpreter(DEBIAN_PYTHON, None)}
    builds = sorted((p for root in reversed(pyenv_roots()) for p in (root / "versions").glob("*")
                     if re.fullmatch(r"\d+\.\d+\.\d+", p.name) and (p / "bin" / "python").exists()),
                    key=lambda p: tuple(int(x) for x in p.name.split(".")))
    for prefix in builds:
        major_minor = prefix.name.rsplit(".", 1)[0]
        found[major_minor] = Interpreter(major_minor, prefix)
    return found


def _key(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor or 0)


def choose_python(asked: str, fallback: str = "exact", available: dict[str, Interpreter] | None = None
                  ) -> tuple[Interpreter, str | None]:
    """(the interpreter to build with, a one-line note when it is not the one asked). ValueError (one line) when this
    machine has no such version and `fallback` is "exact", or none of its major at all."""
    if fallback not in PYTHON_FALLBACKS:
        raise ValueError(f"python_fallback={fallback!r}: use one of {', '.join(PYTHON_FALLBACKS)}")
    have = available if available is not None else available_pythons()
    if "." not in asked:  # any of this major: the newest
        same = sorted((v for v in have if v.split(".")[0] == asked), key=_key)
        if same:
            return have[same[-1]], None
    elif asked in have:
        return have[asked], None
    listed = ", ".join(sorted(have, key=_key))
    same = [v for v in have if v.split(".")[0] == asked.split(".")[0]]
    if not same:
        raise ValueError(f"asks for Python {asked}; this machine has {listed} and none of Python {asked[0]}")
    nearest = min(same, key=lambda v: (abs(_key(v)[1] - _key(asked)[1]), -_key(v)[1]))
    if fallback == "exact":
        raise ValueError(f"asks for Python {asked}, which this machine does not have (it has {listed}); "
                         f"env.python_fallback=nearest builds it with {nearest}")
    return have[nearest], f"asks for Python {asked}; this machine has {listed}: built with {nearest} " \
                          "(env.python_fallback=nearest)"


def install_python(root: Path, interpreter: Interpreter) -> None:
    """Make `interpreter` what `python`, `python3` and `pip` run in the unpacked base at `root` (host-side, trusted:
    the base is the project's own rootfs)."""
    local = root / "usr" / "local"
    if interpreter.prefix is None:  # Debian's python3, under the names a python image has
        for name, target in (("python", "/usr/bin/python3"), ("pip", "/usr/bin/pip3"), ("pip3", "/usr/bin/pip3")):
            (local / "bin" / name).symlink_to(target)
        return
    src = interpreter.prefix
    lib = f"python{interpreter.version}"

    def skip(directory: str, names: list[str]) -> set[str]:
        here = Path(directory)
        out = {n for n in names if n in SKIPPED_DIRS or n.endswith(".a")}
        if here.name == "site-packages":
            out |= {n for n in names if not SITE_KEEP.match(n)}
        if here == src:  # bin, include, lib: not share/ (man pages)
            out |= {n for n in names if n not in ("bin", "include", "lib")}
        return out

    shutil.copytree(src, local, symlinks=True, ignore=skip, dirs_exist_ok=True)
    old, new = str(src).encode(), b"/usr/local"
    rewrite = [p for p in (local / "bin").iterdir() if p.is_file() and not p.is_symlink()]  # scripts' #! lines
    rewrite += [*(local / "lib" / lib).glob("_sysconfigdata*.py"), *(local / "lib" / lib).glob("config-*/Makefile")]
    for path in rewrite:
        data = path.read_bytes()
        if old in data and b"\0" not in data[:4096]:  # text only: the interpreter binary itself is left as built
            path.write_bytes(data.replace(old, new))
    major = interpreter.version.split(".")[0]
    for name, target in ((f"python{major}", f"python{interpreter.version}"), ("python", f"python{interpreter.version}"),
                         (f"pip{major}", f"pip{interpreter.version}"), ("pip", f"pip{interpreter.version}")):
        link = local / "bin" / name
        if (local / "bin" / target).exists() and not link.exists():
            link.symlink_to(target)
    # its libpython in /usr/local/lib: the binary's RUNPATH names the pyenv prefix, absent in the image
    subprocess.run(["ldconfig", "-r", str(root)], check=True, capture_output=True)


__all__ = ["DEBIAN_PYTHON", "PYTHON_FALLBACKS", "Interpreter", "asked_python", "available_pythons", "choose_python",
           "install_python"]
