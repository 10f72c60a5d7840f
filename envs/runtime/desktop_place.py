"""Where a local desktop's processes run: in a throwaway-root sandbox (the default) or on this machine as they are.

The desktop (`envs.runtime.desktop`) and its X session (`envs.runtime.xsession`) start every process through a place:
`argv()` turns a command into what to spawn, `env()` gives the environment it sees, file access and lookups go
through it, so the same desktop code drives both:

- `SandboxPlace` (isolation "sandbox"): one `envs.runtime.nsroot.NamespaceRoot` over the guest rootfs
  (`envs.runtime.sandbox_root`): Xvfb, the buses, the workers, the task's apps and setup commands all run inside, as
  OSWorld's user `user` (uid 1000 inside, a non-root host uid outside) with HOME /home/user, `sudo` working against the
  sandbox's own root, no network. NextState's source is bound read-only at /opt/nextstate (the workers and bundled apps
  run from it); a private exchange directory at /run/nextstate is the only writable host path (Xvfb keeps its
  framebuffer there, which is how screenshots are taken without any X connection from the host). File reads and writes
  run as `user` inside, so a planted symlink reaches nothing outside.
- `HostPlace` (isolation "none"): plain child processes of this user with a private HOME: no isolation. For a machine
  without root, or inside a container that is itself the sandbox (the docker guest's server uses it).
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from envs.runtime.nsroot import Bind, NamespaceRoot

log = logging.getLogger(__name__)

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout that holds envs/
GUEST_SRC = "/opt/nextstate"
EXCHANGE = "/run/nextstate"
USER_UID = 1000
USER_HOME = "/home/user"
USER_RUNTIME_DIR = f"/run/user/{USER_UID}"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FRAMEBUFFER = "Xvfb_screen0"


class HostPlace:
    sandboxed = False

    def __init__(self, runtime_dir: Path, gi_python: str | None, worker_python: str | None):
        self.runtime_dir = runtime_dir
        self.gi_python = gi_python
        self.worker_python = worker_python or sys.executable
        self.xdg_runtime_dir = str(runtime_dir)

    def argv(self, argv: list[str] | str, *, cwd: str | None = None, root: bool = False) -> tuple[list[str] | str, str | None]:
        return argv, cwd

    def base_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "WAYLAND_DISPLAY")}
        env.setdefault("LANG", "C.UTF-8")
        env["NEXTSTATE_TK_PYTHON"] = env.get("NEXTSTATE_TK_PYTHON", sys.executable)
        if self.gi_python:
            env.setdefault("NEXTSTATE_GI_PYTHON", self.gi_python)
        env.update(extra)
        return env

    def path(self, host_path: str) -> str:
        return host_path

    def login_shell(self) -> str:
        return os.environ.get("SHELL", "/bin/sh")

    def worker(self, script: str, gi: bool) -> list[str] | None:
        python = self.gi_python if gi else self.worker_python
        if python is None:
            return None
        return [python, "-P", str(SOURCE_ROOT / "envs" / "runtime" / script)]

    def tool(self, name: str) -> str | None:
        """An infrastructure binary (Xvfb, dbus-daemon, ...) by name or absolute path, None when missing."""
        return name if os.path.isabs(name) and os.path.exists(name) else shutil.which(name)

    def which(self, name: str, path_env: str) -> bool:
        return shutil.which(name, path=path_env) is not None

    def exists(self, path: str) -> str | None:
        """'dir', 'file' or None."""
        return "dir" if os.path.isdir(path) else "file" if os.path.exists(path) else None

    def read_bytes(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def write_bytes(self, path: str, data: bytes) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def reset_home(self, home: str, wipe: bool) -> None:
        p = Path(home)
        if wipe and p.is_dir():
            for child in p.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink()

    def xvfb_args(self) -> list[str]:
        return []

    def screenshot(self, width: int, height: int) -> np.ndarray | None:
        return None  # the desktop grabs the display itself

    def pids(self) -> list[int]:
        return []

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        pass


class SandboxPlace:
    sandboxed = True
    gi_python = worker_python = "/usr/bin/python3"  # the rootfs's: PyGObject, python-xlib, pyautogui
    xdg_runtime_dir = USER_RUNTIME_DIR

    def __init__(self, runtime_dir: Path, *, root_bytes: int, tmp_bytes: int, source_root: Path | None = None,
                 recipe: Any = None):
        from envs.runtime.guest_image import GUEST_HOSTNAME
        from envs.runtime.sandbox_root import DESKTOP_UID_BASE, ensure_sandbox_root

        self.runtime_dir = runtime_dir
        self.lower = ensure_sandbox_root(recipe)  # None: the guest's own recipe
        self.source_root = Path(source_root or SOURCE_ROOT)
        self.exchange = runtime_dir / "exchange"
        self.exchange.mkdir(mode=0o700)
        os.chown(self.exchange, DESKTOP_UID_BASE + USER_UID, DESKTOP_UID_BASE + USER_UID)
        self.ns = NamespaceRoot(
            self.lower,
            uid_base=DESKTOP_UID_BASE,
            binds=[Bind(str(self.source_root), GUEST_SRC), Bind(str(self.exchange), EXCHANGE, readonly=False)],
            hostname=GUEST_HOSTNAME,
            upper_bytes=root_bytes,
            tmp_bytes=tmp_bytes,
            log_path=runtime_dir / "sandbox.log",
            scratch_parent=runtime_dir,
        )
        try:
            setup = self.ns.run(
                ["/bin/sh", "-c", f"install -d -m 700 -o {USER_UID} -g {USER_UID} {USER_RUNTIME_DIR} && "
                                  "install -d -m 1777 /tmp/.X11-unix /tmp/.ICE-unix"],
                uid=0,
            )
            if setup.returncode != 0:
                raise RuntimeError(f"sandbox setup failed: {setup.stderr.decode(errors='replace')}")
        except BaseException:
            self.ns.close()
            raise

    def argv(self, argv: list[str] | str, *, cwd: str | None = None, root: bool = False) -> tuple[list[str], None]:
        """A command as the sandbox's user (or its root), `shell` commands given as a string run by /bin/sh."""
        inner = ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)
        return self.ns.enter(inner, uid=0 if root else USER_UID, cwd=cwd or USER_HOME), None

    def base_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": USER_HOME,
            "USER": "user",
            "LOGNAME": "user",
            "LANG": "C.UTF-8",
            "TERM": "xterm",
            "NEXTSTATE_TK_PYTHON": "python3",
            "NEXTSTATE_GI_PYTHON": "python3",
        }
        env.update(extra)
        if "PATH" in extra:  # prepended host paths (the bundled apps' launchers) as the sandbox sees them
            env["PATH"] = os.pathsep.join(self.path(p) for p in extra["PATH"].split(os.pathsep))
        return env

    def login_shell(self) -> str:
        """`user`'s login shell as the sandbox's /etc/passwd says now (what a new login would get)."""
        r = self._sh('getent passwd user | cut -d: -f7')
        return r.stdout.decode().strip() or "/bin/sh"

    def path(self, host_path: str) -> str:
        """A host path under NextState's source tree as the sandbox sees it; other paths are returned unchanged."""
        try:
            rel = Path(host_path).resolve().relative_to(self.source_root)
        except ValueError:
            return host_path
        return f"{GUEST_SRC}/{rel}" if str(rel) != "." else GUEST_SRC

    def worker(self, script: str, gi: bool) -> list[str]:
        return [self.worker_python, "-P", f"{GUEST_SRC}/envs/runtime/{script}"]

    def tool(self, name: str) -> str | None:
        # infrastructure binaries come from the pristine root tree (what the sandbox starts with): no process needed
        candidates = [name] if os.path.isabs(name) else [f"{d}/{name}" for d in SANDBOX_PATH.split(":")]
        for c in candidates:
            if os.path.exists(str(self.lower) + c):
                return c
        return None

    def _sh(self, script: str, *args: str, stdin: bytes | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess:
        argv = ["/bin/sh", "-c", script, "sh", *args]
        return self.ns.run(argv, uid=USER_UID, cwd="/", env=self.base_env({}), stdin=stdin, timeout=timeout)

    def which(self, name: str, path_env: str) -> bool:
        return self._sh('PATH="$1" command -v "$2" >/dev/null', path_env, name).returncode == 0

    def exists(self, path: str) -> str | None:
        r = self._sh('if [ -d "$1" ]; then echo dir; elif [ -e "$1" ]; then echo file; fi', path)
        return r.stdout.decode().strip() or None

    def read_bytes(self, path: str) -> bytes:
        r = self._sh('cat -- "$1"', path, timeout=60)
        if r.returncode != 0:
            msg = r.stderr.decode(errors="replace").strip()
            if "No such file" in msg:
                raise FileNotFoundError(f"{path}: no such file on the desktop")
            if "Is a directory" in msg:
                raise IsADirectoryError(f"{path} is a directory")
            if "Permission denied" in msg:
                raise PermissionError(f"{path}: permission denied on the desktop")
            raise OSError(f"reading {path} on the desktop failed: {msg}")
        return r.stdout

    def write_bytes(self, path: str, data: bytes) -> None:
        r = self._sh('mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', path, stdin=data, timeout=60)
        if r.returncode != 0:
            raise OSError(f"writing {path} on the desktop failed: {r.stderr.decode(errors='replace').strip()}")

    def reset_home(self, home: str, wipe: bool) -> None:
        if wipe:
            self.ns.run(["/bin/sh", "-c", f"find {shlex.quote(home)} -mindepth 1 -delete"], uid=0)

    def xvfb_args(self) -> list[str]:
        return ["-fbdir", EXCHANGE]

    def screenshot(self, width: int, height: int) -> np.ndarray:
        """The screen from Xvfb's memory-mapped framebuffer (an XWD file in the exchange directory): no X client on
        the host. The file is the sandbox's to write, so it is read without following links and checked."""
        fd = os.open(self.exchange / FRAMEBUFFER, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            head = f.read(100)
            if len(head) < 100:
                raise OSError("the framebuffer file is truncated")
            h = struct.unpack(">25I", head)
            header_size, depth, w, hgt, bpp, bpl, ncolors = h[0], h[3], h[4], h[5], h[11], h[12], h[19]
            if (w, hgt) != (width, height) or bpp != 32 or bpl < 4 * w or header_size > 4096 or ncolors > 65536:
                raise OSError(f"unexpected framebuffer layout ({w}x{hgt}, {bpp} bpp, depth {depth})")
            f.seek(header_size + 12 * ncolors)
            raw = f.read(bpl * hgt)
        if len(raw) < bpl * hgt:
            raise OSError("the framebuffer file is truncated")
        pixels = np.frombuffer(raw, np.uint8).reshape(hgt, bpl // 4, 4)
        rgb = np.empty((hgt, w, 3), np.uint8)
        for i, channel in enumerate((2, 1, 0)):  # BGRX in memory (LSBFirst, red mask 0xff0000); per channel: 3x faster
            rgb[..., i] = pixels[:, :w, channel]
        return rgb

    def pids(self) -> list[int]:
        return self.ns.pids()

    def alive(self) -> bool:
        return self.ns.alive()

    def close(self) -> None:
        self.ns.close()


@functools.lru_cache(maxsize=8)
def find_gi_python(preferred: str | None = None) -> str | None:
    """An interpreter that can import gi's Atspi: `preferred`, this one, or the system's /usr/bin/python3."""
    for candidate in (preferred, sys.executable, "/usr/bin/python3"):
        if not candidate or not os.path.exists(candidate):
            continue
        probe = subprocess.run([candidate, "-c", "import gi; gi.require_version('Atspi', '2.0')"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    return None


def host_runtime_dir(session_id: str) -> Path:
    """The session's host directory. 0711: a sandbox's overlay dirs live below it, reached by the sandbox's own uid."""
    d = Path(tempfile.mkdtemp(prefix=f"nextstate-x-{session_id}-"))
    d.chmod(0o711)
    return d
