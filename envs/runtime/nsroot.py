"""A throwaway-root sandbox: Linux namespaces over an overlay of a root tree, entered by `nsenter` for each process.

`NamespaceRoot(lower, ...)` starts `nsroot_init.py` (see there for what it mounts), which becomes pid 1 of new user,
mount, pid, network, IPC, UTS and cgroup namespaces:
- uids and gids 0..65535 inside are host uids `uid_base`.. (non-root; no host uid below that exists inside), so the
  sandbox has a real root (`sudo` works: no no_new_privs, setuid binaries of the tree are owned by its uid 0) whose
  powers end at the namespace: it may change its own root, never the host's;
- the root is an overlay: `lower` read-only below, a size-capped tmpfs of the namespace above; whatever the sandbox
  writes (packages installed, passwords changed, files) is gone when it stops. With `upper_dir` the upper layer is
  that host directory instead (owned by `uid_base`, its size capped by its owner: a task image build keeps its layer
  on a size-capped disk across one sandbox per step, `envs.terminal.build_sandbox`);
- no network but its own loopback, its own /proc, /dev, /tmp (`tmp_bytes=0`: the tree's own /tmp), hostname;
  `binds` are the only host paths inside (a read-only bind stays read-only for its root too: it is made before the
  user namespace, so its flags are locked);
- `layers` stack read-only snapshots over `lower` (topmost first): `copy_writes` takes one of another sandbox's writes;
  `empty_dirs` start empty whatever the layers hold, and `read_written` reads back what the sandbox wrote there.

Processes start inside through `enter(argv)`: `prlimit` (rlimits) then `nsenter` into every namespace, as uid `uid`
(1000 by default), so callers keep spawning, piping and killing them as ordinary children; a process that leaves its
process group is still found through its pid namespace (`pids()`). `close()` (or the owner's death: pid 1 exits when
its stdin pipe closes) ends every process of the sandbox, by the kernel, at once; `end_processes()` does the same but
keeps the sandbox's writes readable (`copy_writes`) until `close()`. Ending pid 1 ends every process whose pid
namespace is this one or nested in it, whatever it did (left its group, forked, changed uid, made namespaces): the
kernel kills them all, and pid 1's exit completes only once they are gone.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envs.runtime.host_paths import reachable_by_others, read_beneath
from envs.runtime.local import SandboxUnavailable

log = logging.getLogger(__name__)

INIT_SCRIPT = Path(__file__).resolve().parent / "nsroot_init.py"
UID_COUNT = 65536


@dataclass
class Bind:
    source: str  # host path (a directory or a file)
    target: str  # where it appears inside
    readonly: bool = True


@dataclass
class NamespaceLimits:
    """rlimits of every process started inside (per process; `processes` counts per uid inside this sandbox only)."""

    processes: int = 2048  # RLIMIT_NPROC, threads included: GUI apps run many
    open_files: int = 4096
    file_bytes: int = 4 << 30


class NamespaceRoot:
    def __init__(
        self,
        lower: Path,
        *,
        uid_base: int,
        binds: list[Bind] | None = None,
        hostname: str = "sandbox",
        upper_bytes: int = 1 << 30,
        tmp_bytes: int = 512 << 20,
        limits: NamespaceLimits | None = None,
        start_timeout_s: float = 30.0,
        log_path: Path | None = None,
        scratch_parent: Path | None = None,
        upper_dir: Path | None = None,
        layers: Sequence[Path] = (),
        empty_dirs: Sequence[str] = (),
    ):
        # by absolute path: the caller's environment (an image's ENV PATH) must not choose what we run as root
        self._tools = {t: shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") for t in ("nsenter", "prlimit")}
        for tool, found in self._tools.items():
            if found is None:
                raise SandboxUnavailable(f"{tool} not found: apt-get install util-linux")
        if os.geteuid() != 0:
            raise SandboxUnavailable(
                "the desktop sandbox maps a range of host uids into its user namespace, which needs root; run as root, "
                "or use the docker backend, or isolation='none' (unsandboxed, with a loud warning)"
            )
        self.lower = Path(lower)
        for layer in layers:  # mounted by root inside, a non-root host uid: it must reach them
            if not reachable_by_others(layer):
                raise PermissionError(f"{layer}: a layer must be reachable by the sandbox's uids (every parent "
                                      "directory searchable by others)")
        self.uid_base = uid_base
        self.limits = limits or NamespaceLimits()
        self.scratch = Path(tempfile.mkdtemp(prefix="nextstate-nsroot-", dir=scratch_parent))
        os.chmod(self.scratch, 0o711)
        for name in ("upper", "merged"):
            d = self.scratch / name
            d.mkdir(mode=0o700)
            os.chown(d, uid_base, uid_base)
        staged = self.scratch / "binds"  # placeholders the binds are staged on (nsroot_init, step 1)
        staged.mkdir(mode=0o711)
        bind_config = []
        for i, b in enumerate(binds or []):
            place = staged / str(i)
            if os.path.isdir(b.source):
                place.mkdir(mode=0o755)
            elif os.path.exists(b.source):
                place.touch(mode=0o644)
            else:
                raise FileNotFoundError(f"{b.source}: no such file or directory to bind at {b.target}")
            bind_config.append({"source": b.source, "staged": str(place), "target": b.target,
                                "readonly": b.readonly})
        self._held: dict[str, int] = {}  # our descriptors of the upper layer's tmpfs and of pid 1, once started
        config = {
            "lower": str(self.lower),
            "layers": [str(p) for p in layers],
            "empty_dirs": [d for d in empty_dirs],
            "scratch": str(upper_dir if upper_dir is not None else self.scratch / "upper"),
            "scratch_tmpfs": upper_dir is None,
            "merged": str(self.scratch / "merged"),
            "uid_base": uid_base,
            "uid_count": UID_COUNT,
            "upper_bytes": int(upper_bytes),
            "tmp_bytes": int(tmp_bytes),
            "userxattr": True,
            "hostname": hostname,
            "binds": bind_config,
        }
        err = log_path.open("ab") if log_path is not None else subprocess.DEVNULL
        try:
            self.launcher = subprocess.Popen(
                [sys.executable, "-I", "-S", str(INIT_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            )
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        self._finalizer = weakref.finalize(self, _stop, self.launcher, self.scratch, self._held)
        try:
            assert self.launcher.stdin is not None
            self.launcher.stdin.write((json.dumps(config) + "\n").encode())
            self.launcher.stdin.flush()
            self.init_pid, upper_fd = self._read_ready(start_timeout_s, log_path)
            self._pidns = os.readlink(f"/proc/{self.init_pid}/ns/pid")
            self._held["init"] = os.pidfd_open(self.init_pid)
            self._held["upper"] = os.open(f"/proc/{self.init_pid}/fd/{upper_fd}", os.O_PATH | os.O_DIRECTORY |
                                          os.O_CLOEXEC)
            self.launcher.stdin.write(b"c")  # pid 1 closes its own: nothing inside reaches the layer but the overlay
            self.launcher.stdin.flush()
        except BaseException:
            self.close()
            raise

    def _read_ready(self, timeout: float, log_path: Path | None) -> tuple[int, int]:
        assert self.launcher.stdout is not None
        fd = self.launcher.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SandboxUnavailable(f"the sandbox did not start within {timeout:.0f} s{_tail(log_path)}")
            chunk = os.read(fd, 256)
            if not chunk:
                raise SandboxUnavailable(f"the sandbox failed to start{_tail(log_path)}")
            buf += chunk
        words = buf.decode().split()
        if len(words) != 3 or words[0] != "READY" or not (words[1].isdigit() and words[2].isdigit()):
            raise SandboxUnavailable(f"the sandbox's launcher said {buf!r}{_tail(log_path)}")
        return int(words[1]), int(words[2])

    def enter(self, argv: list[str], *, uid: int = 1000, gid: int | None = None, cwd: str | None = "/") -> list[str]:
        """An argv that runs `argv` inside the sandbox as `uid` in `cwd` (pass the environment to Popen as usual).
        `cwd=None`: `argv` itself is the first program that runs inside, in `/` (no program of the tree's chdirs
        first: a trusted step over a tree an agent wrote)."""
        lim = self.limits
        chdir = ["/usr/bin/env", f"--chdir={cwd}"] if cwd is not None else []  # resolved inside
        return [
            self._tools["prlimit"],
            f"--nproc={lim.processes}",
            f"--nofile={lim.open_files}",
            f"--fsize={lim.file_bytes}",
            "--core=0",
            "--",
            self._tools["nsenter"],
            f"--target={self.init_pid}",
            "--user",
            "--mount",
            "--pid",
            "--net",
            "--ipc",
            "--uts",
            "--cgroup",
            "--root",
            "--wd",  # the target's own (/): `--wd=DIR` would resolve DIR on the host, before entering
            f"--setuid={uid}",
            f"--setgid={uid if gid is None else gid}",
            "--",
            *chdir,
            *argv,
        ]

    def run(self, argv: list[str], *, uid: int = 1000, cwd: str = "/", env: dict[str, str] | None = None,
            stdin: bytes | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a short command inside to completion (trusted setup steps; the caller checks the result)."""
        return subprocess.run(self.enter(argv, uid=uid, cwd=cwd), input=stdin, capture_output=True, timeout=timeout,
                              env=env or {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})

    def alive(self) -> bool:
        return self.launcher.poll() is None

    def pids(self) -> list[int]:
        """Host pids of every process inside (its pid namespace), and of the launcher."""
        found = [self.launcher.pid] if self.alive() else []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/pid") == self._pidns:
                        found.append(int(entry))
                except OSError:
                    continue
        return found

    def end_processes(self, timeout: float = 30.0) -> None:
        """End every process of the sandbox (as `close` does) but keep its writes for `copy_writes` until `close`.
        Returns once pid 1 has exited, which the kernel completes only after every other process inside is gone."""
        if "init" not in self._held:
            raise RuntimeError("this sandbox is closed")
        _end(self.launcher)
        if not select.select([self._held["init"]], [], [], timeout)[0]:  # a pidfd reads ready once it exited
            raise RuntimeError(f"the sandbox's pid 1 ({self.init_pid}) did not exit within {timeout:.0f} s")

    def copy_writes(self, dest: Path, timeout: float = 300.0) -> None:
        """Copy what the sandbox wrote (its overlay's upper layer: files, whiteouts of what it deleted, opaque
        directories, owners, modes, times, user xattrs) into the empty host directory `dest`, to be a layer of another
        sandbox (`layers`). Reads without touching: access times stay as they were. While processes run inside, a file
        they are writing may be copied half-written; after `end_processes` the copy is exact."""
        if "upper" not in self._held:
            raise RuntimeError("this sandbox is closed")
        fd = self._held["upper"]
        src = f"/proc/self/fd/{fd}/upper"
        xattrs = ["--xattrs", "--xattrs-include=user.*"]
        pack = subprocess.Popen(["tar", "-C", src, "--numeric-owner", "--atime-preserve=system", "--sparse", *xattrs,
                                 "-cf", "-", "."], stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(fd,))
        try:
            unpack = subprocess.run(["tar", "-C", str(dest), "--numeric-owner", "--same-owner", "-p", *xattrs,
                                     "-xf", "-"], stdin=pack.stdout, capture_output=True, timeout=timeout)
        finally:
            assert pack.stdout is not None
            pack.stdout.close()
            err = pack.stderr.read() if pack.stderr is not None else b""
            if pack.stderr is not None:
                pack.stderr.close()
            code = pack.wait()
        # tar exits 1 when a file changed while it was read (a live sandbox): the copy is still whole
        if code not in (0, 1) or unpack.returncode != 0:
            raise OSError(f"copying the sandbox's writes failed ({code}, {unpack.returncode}): "
                          f"{(err + unpack.stderr).decode(errors='replace')[-800:]}")

    def read_written(self, path: str, limit: int = 1 << 20) -> bytes | None:
        """The first `limit` bytes of the regular file the sandbox wrote at `path` (from its upper layer: only what it
        wrote itself, never a layer below), None if it wrote none there. No symlink is followed on the way, so nothing
        inside can make the host read anything else. Call it after `end_processes`."""
        if "upper" not in self._held:
            raise RuntimeError("this sandbox is closed")
        return read_beneath(self._held["upper"], f"upper/{path.lstrip('/')}", limit)

    def close(self) -> None:
        self._finalizer()


def _end(launcher: subprocess.Popen) -> None:
    # pid 1 exits when its stdin closes; the launcher's group kill covers a pid 1 that is stuck
    for f in (launcher.stdin, launcher.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
    try:
        launcher.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        launcher.wait()


def _stop(launcher: subprocess.Popen, scratch: Path, held: dict[str, int]) -> None:
    _end(launcher)
    for name in list(held):  # the upper layer's: the last reference to its tmpfs, whose memory is freed here
        os.close(held.pop(name))
    shutil.rmtree(scratch, ignore_errors=True)  # empty mount points: the mounts died with the namespace


def _tail(log_path: Path | None) -> str:
    if log_path is None or not log_path.exists():
        return ""
    return ": " + log_path.read_text(errors="replace")[-800:].strip()


__all__ = ["Bind", "NamespaceLimits", "NamespaceRoot", "UID_COUNT"]
