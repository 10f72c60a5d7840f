"""The harness's own pytest for a task directory's tests, and the interpreter that runs it, both out of the agent's reach.

The runner is built once on the host (`ensure_runner`: pytest and its dependencies installed with pip into a folder of
their own, plus `runner.py`, an empty `pytest.ini` and a `pytest` launcher), owned by the host's root, and bound
read-only at `RUNNER_MOUNT` into the verifier's sandbox only (`envs.terminal.verifier`); no agent's sandbox ever has it.
It runs on the task image's own Python, taken from the *built* root (bound read-only at `IMAGE_MOUNT`), never from the
agent's copy of it: the image's dynamic loader is started directly with the image's library folders first and the
loader cache off, so a replaced `python3`, libc or `ld.so.cache` in the agent's filesystem never runs in the runner's
process (the verifier also binds an empty `/etc/ld.so.preload`). The interpreter starts isolated (`-I -S -B`: no
PYTHON* variables, no site: no `.pth` lines, no sitecustomize or usercustomize, no bytecode written), and `runner.py`
then puts the runner's own site first and the image's site-packages folders *as the agent left them* last (what the
tests import: the task's packages, and what the agent installed), without running any `.pth` file in them. pytest then
runs with `--rootdir` and `--confcutdir` at the tests' folder (no conftest.py or ini file above it is read: the
tests' own ini file or the runner's empty one), its cache off, plugin autoloading off (only the pytest plugins the
*built* image installed are loaded, by name).

What this cannot guard: code the tests themselves run from the agent's files (an import of the agent's module, a
program of its that they call) runs in the test process or beside it, as it would in the task's own container.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from envs.runtime.host_paths import file_lock

RUNNER_MOUNT = "/opt/nextstate-verifier"  # the runner, in the verifier's sandbox only
IMAGE_MOUNT = "/opt/nextstate-image"  # the task's built root, read-only, in the verifier's sandbox only
TEST_PATH_HEAD = f"{RUNNER_MOUNT}/bin"  # first on PATH while a test script runs: its `pytest` is the runner
#: the runner's wheels: pure Python, the pytest Terminal-Bench's own test scripts ask for, and what it needs down to 3.9
TEST_RUNNER_WHEELS = ("pytest==8.4.1", "pluggy==1.6.0", "iniconfig==2.1.0", "packaging==25.0", "pygments==2.19.2",
                      "exceptiongroup==1.3.0", "tomli==2.2.1", "typing_extensions==4.14.1")
#: the oldest Python each wheel set runs on -> the set: the runner runs on the image's own Python (a python:3.7 image
#: gets 3.7), and pytest 8.4 needs 3.9, so older images get the newest pytest that still supports theirs
RUNNER_WHEEL_SETS: dict[tuple[int, int], tuple[str, ...]] = {
    (3, 9): TEST_RUNNER_WHEELS,
    (3, 8): ("pytest==8.3.5", "pluggy==1.5.0", "iniconfig==2.0.0", "packaging==24.2", "exceptiongroup==1.2.2",
             "tomli==2.2.1"),
    (3, 7): ("pytest==7.4.4", "pluggy==1.2.0", "iniconfig==2.0.0", "packaging==24.0", "exceptiongroup==1.2.2",
             "tomli==2.0.1", "importlib-metadata==6.7.0", "zipp==3.15.0", "typing_extensions==4.7.1"),
    (3, 6): ("pytest==7.0.1", "pluggy==1.0.0", "iniconfig==1.1.1", "packaging==21.3", "pyparsing==3.0.7", "py==1.11.0",
             "attrs==22.2.0", "tomli==1.2.3", "importlib-metadata==4.8.3", "zipp==3.6.0", "typing_extensions==4.1.1"),
}
RUNNER_REVISION = "2"  # bump when runner.py or the layout changes

RUNNER_PY = '''"""The harness's pytest runner (envs/terminal/test_runner.py): isolated from the files of the agent it judges."""
import os
import sys

RUNNER = "{runner}"
IMAGE = "{image}"
INI_NAMES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def image_sites():
    import site
    return [p for p in site.getsitepackages() if p.startswith(IMAGE + "/")]


def image_plugins(sites):
    """Module names of the pytest plugins the built image installed (its own site-packages, never the agent's)."""
    try:
        from importlib.metadata import distributions
    except ImportError:  # Python < 3.8: the backport the runner's own wheels bring
        from importlib_metadata import distributions
    names = []
    for dist in distributions(path=sites):
        for ep in dist.entry_points:
            module = ep.value.partition(":")[0].strip()  # EntryPoint.module is 3.9+
            if ep.group == "pytest11" and module not in names:
                names.append(module)
    return names


def idle():
    """pid 1 of a verifier's container: reaps orphans, runs nothing of the agent's."""
    import time
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(1.0)


def main(argv):
    if argv[:1] == ["--idle"]:
        idle()
    sys.dont_write_bytecode = True
    reward = chdir = None
    while argv[:1] and argv[0] in ("--reward", "--chdir"):
        if argv[0] == "--reward":
            reward = argv[1]
        else:
            chdir = argv[1]
        argv = argv[2:]
    tests = os.environ.get("TEST_DIR", "/tests")
    sites = image_sites()
    sys.path[:0] = [RUNNER + "/site"]
    sys.path += [p[len(IMAGE):] for p in sites]  # the same folders in the agent's filesystem; no .pth file runs
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    plugins = image_plugins(sites)
    ini = next((f"{{tests}}/{{n}}" for n in INI_NAMES if os.path.isfile(f"{{tests}}/{{n}}")), RUNNER + "/pytest.ini")
    if chdir:
        os.chdir(chdir)
    import pytest
    args = ["-p", "no:cacheprovider", "--rootdir", tests, "--confcutdir", tests, "-c", ini]
    for name in plugins:
        args += ["-p", name]
    code = int(pytest.main(args + argv))
    if reward:  # what Harbor's boilerplate test.sh does with pytest's exit code
        with open(reward, "w") as f:
            f.write("1\\n" if code == 0 else "0\\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''

# a test script's `pytest` (first on PATH): the runner, through the interpreter the verifier names in the environment
PYTEST_LAUNCHER = """#!/bin/bash
exec "$NEXTSTATE_LOADER" --inhibit-cache --library-path "$NEXTSTATE_LIBRARY_PATH" "$NEXTSTATE_PYTHON" -I -S -B \\
  {runner}/runner.py "$@"
"""


class RunnerUnavailable(RuntimeError):
    """The image has no interpreter the runner can use (the message names what is missing)."""


def runner_wheels(python_version: str) -> tuple[tuple[int, int], tuple[str, ...]]:
    """(the wheel set's Python, its wheels) for an image whose python3 is `python_version` ("3.7")."""
    major, _, minor = python_version.partition(".")
    want = (int(major), int(minor or 0))
    for oldest in sorted(RUNNER_WHEEL_SETS, reverse=True):
        if want >= oldest:
            return oldest, RUNNER_WHEEL_SETS[oldest]
    raise RunnerUnavailable(f"the task's image runs its tests on Python {python_version}; the verifier's pytest runs on "
                            f"{'.'.join(map(str, min(RUNNER_WHEEL_SETS)))} or newer")


def ensure_runner(cache: Path, python_version: str = "3.11") -> Path:
    """The runner's folder on the host for an image whose python3 is `python_version` (built once per wheel set):
    owned by root, others may only read and run it."""
    oldest, wheels = runner_wheels(python_version)
    key = hashlib.sha256(f"{wheels}\0{RUNNER_REVISION}\0{RUNNER_PY}\0{PYTEST_LAUNCHER}".encode())
    out = cache / f"verifier-runner-{key.hexdigest()[:12]}"
    cache.mkdir(parents=True, exist_ok=True)
    with file_lock(cache / f".{out.name}.lock"):
        if (out / ".complete").exists():
            return out
        partial = out.with_name(out.name + ".partial")
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        (partial / "site").mkdir(parents=True)
        # wheels for the image's Python, not the host's (pip checks each one's Requires-Python against it)
        target = ["--python-version", "%d.%d" % oldest, "--only-binary=:all:"]
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", *target,
                               "--target", str(partial / "site"), *wheels], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"installing the verifier's pytest failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        (partial / "runner.py").write_text(RUNNER_PY.format(runner=RUNNER_MOUNT, image=IMAGE_MOUNT))
        (partial / "pytest.ini").write_text("[pytest]\n")
        (partial / "bin").mkdir()
        (partial / "bin" / "pytest").write_text(PYTEST_LAUNCHER.format(runner=RUNNER_MOUNT))
        (partial / "empty").write_bytes(b"")  # bound over /etc/ld.so.preload
        _readable_by_all(partial)
        subprocess.run(["rm", "-rf", str(out)], check=True)
        partial.rename(out)
        (out / ".complete").touch()
    return out


def _readable_by_all(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, 0, 0)
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = os.path.join(dirpath, name)
            os.lchown(p, 0, 0)
            if not os.path.islink(p):
                os.chmod(p, 0o755 if name == "pytest" and dirpath.endswith("/bin") else 0o644)


@dataclass(frozen=True)
class Interpreter:
    """The built image's Python as the verifier's sandbox sees it (paths under IMAGE_MOUNT)."""

    loader: str
    library_path: str
    python: str
    version: str = "3.11"  # major.minor, read from the interpreter's file name (python3.12) in the built root

    def argv(self, *args: str) -> list[str]:
        """The runner with `args`, started by the image's own loader (no program of the agent's runs first)."""
        return [self.loader, "--inhibit-cache", "--library-path", self.library_path, self.python, "-I", "-S", "-B",
                f"{RUNNER_MOUNT}/runner.py", *args]

    def env(self) -> dict[str, str]:
        """What the `pytest` launcher on a test script's PATH reads."""
        return {"NEXTSTATE_LOADER": self.loader, "NEXTSTATE_LIBRARY_PATH": self.library_path,
                "NEXTSTATE_PYTHON": self.python}


def image_interpreter(root: Path, path: str) -> Interpreter:
    """The image's `python3` (first on its PATH), its ELF loader and library folders, found in the built root `root`
    with every symlink resolved inside it (never on the host)."""
    found = [p for d in path.split(":") if d.startswith("/")
             for p in [in_root(root, f"{d}/python3")] if p is not None and (root / p).is_file()]
    # the first that is a dynamically linked program (a wrapper script, a pyenv shim, cannot be started this way)
    python, loader = next(((p, i) for p in found for i in [elf_interpreter(root / p)] if i), (None, None))
    if python is None or loader is None:
        raise RunnerUnavailable(f"the task's image has no dynamically linked python3 on its PATH ({path}) to run "
                                f"pytest with (found: {', '.join('/' + p for p in found) or 'none'})")
    loader_path = in_root(root, loader)
    if loader_path is None:
        raise RunnerUnavailable(f"the image's /{python} names a loader ({loader}) the image does not have")
    dirs = [os.path.dirname(loader_path), "usr/local/lib", os.path.join(os.path.dirname(os.path.dirname(python)), "lib")]
    dirs += _ld_so_conf(root) + ["lib", "usr/lib"]
    found: list[str] = []
    for d in dirs:
        rel = in_root(root, d)
        if rel is not None and (root / rel).is_dir() and rel not in found:
            found.append(rel)
    return Interpreter(loader=f"{IMAGE_MOUNT}/{loader_path}", python=f"{IMAGE_MOUNT}/{python}",
                       library_path=":".join(f"{IMAGE_MOUNT}/{d}" for d in found),
                       version=python_version(root, python))


def python_version(root: Path, python: str) -> str:
    """Major.minor of the image's interpreter at `root/python` (a resolved path): from its name (python3.12), else
    from the one lib/python3.X folder beside it (a bare `python3` binary)."""
    m = re.search(r"python(\d)\.(\d+)$", python)
    if m:
        return f"{m[1]}.{m[2]}"
    lib = (root / python).parent.parent / "lib"
    found = sorted({m[0] for p in lib.glob("python3.*") for m in [re.fullmatch(r"python(3\.\d+)", p.name)] if m and
                    (p / "os.py").is_file()} if lib.is_dir() else set())
    if len(found) != 1:
        raise RunnerUnavailable(f"cannot tell the Python version of the image's /{python} (no version in its name; "
                                f"standard libraries beside it: {', '.join(found) or 'none'})")
    return found[0][len("python"):]


def in_root(root: Path, path: str, max_links: int = 40) -> str | None:
    """`path` resolved as a process chrooted into `root` would resolve it, relative to `root`; None if missing."""
    todo = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, name)
        try:
            st = here.lstat()
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > max_links:
                return None
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p] + todo
            continue
        done.append(name)
    return "/".join(done)


def elf_interpreter(path: Path) -> str | None:
    """The PT_INTERP of an ELF executable (its dynamic loader), None for a static one or a script."""
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF":
            return None
        is64, little = head[4] == 2, head[5] == 1
        end = "<" if little else ">"
        if is64:
            phoff, = struct.unpack_from(end + "Q", head, 32)
            phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
        else:
            phoff, = struct.unpack_from(end + "I", head, 28)
            phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            ph = f.read(phentsize)
            if struct.unpack_from(end + "I", ph, 0)[0] != 3:  # PT_INTERP
                continue
            offset, size = (struct.unpack_from(end + "Q", ph, 8)[0], struct.unpack_from(end + "Q", ph, 32)[0]) \
                if is64 else (struct.unpack_from(end + "I", ph, 4)[0], struct.unpack_from(end + "I", ph, 16)[0])
            f.seek(offset)
            return f.read(min(size, 4096)).split(b"\0", 1)[0].decode()
    return None


def _ld_so_conf(root: Path) -> list[str]:
    """Library folders the image's /etc/ld.so.conf.d names (absolute paths only)."""
    conf = in_root(root, "/etc/ld.so.conf.d")
    if conf is None or not (root / conf).is_dir():
        return []
    dirs = []
    for f in sorted((root / conf).glob("*.conf")):
        if f.is_symlink() or not f.is_file():
            continue
        dirs += [line.strip() for line in f.read_text(errors="replace").splitlines() if line.strip().startswith("/")]
    return dirs


__all__ = ["IMAGE_MOUNT", "RUNNER_MOUNT", "RUNNER_WHEEL_SETS", "TEST_PATH_HEAD", "TEST_RUNNER_WHEELS", "Interpreter", "RunnerUnavailable",
           "elf_interpreter", "ensure_runner", "image_interpreter", "in_root", "python_version",
           "runner_wheels"]
