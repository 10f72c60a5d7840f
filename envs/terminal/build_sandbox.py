"""Where a task image build (`envs.terminal.task_image`) runs its steps: isolated as Docker's builder isolates them.

`BuildSandbox(lower, storage_bytes=..., work_dir=...)` holds one build:
- the base, unpacked once with its owners shifted into `BUILD_UID_BASE..` (uid 0 inside is an unprivileged host uid),
  is the read-only lower layer of an overlay whose upper layer (everything the steps write) lives on a filesystem of
  its own, `storage_bytes` big (the task's `storage_mb`): an ext4 image in a sparse file on the host's disk, mounted
  through a loop device (`CappedDisk`). A disk rather than a tmpfs: this kind of machine has no swap, and a build that
  installs a GPU framework writes gigabytes that would otherwise sit in RAM until the build ends. A step that writes
  past the cap fails with ENOSPC ("No space left on device"), and the host's disk holds at most the cap;
- every step runs in a fresh `NamespaceRoot` (`envs.runtime.nsroot`) over that overlay: user, mount, pid, network,
  IPC, UTS and cgroup namespaces, a minimal /dev (no host device), pivot_root (no path of the host inside, so `chroot`
  tricks lead nowhere), rlimits; when the step ends its pid namespace ends, so nothing it started outlives it (as a
  `RUN` in its own container);
- a `RUN` step's only way out is an `EgressProxy` (`envs.runtime.egress_proxy`) listening on the loopback of its
  network namespace, named by `http_proxy` / `https_proxy`: it reaches the package registries and refuses the host's
  loopback, link-local addresses and every address of the host itself; there is no route for anything else. The
  host's CA bundle (a machine whose egress re-signs TLS) is bound read-only at `BUILD_CA` for that step only;
- the build context never enters the sandbox: COPY's files are read host-side and streamed into a `tar -x` inside;
- `export()` tars the result from inside (owners as the image has them, 0..65535) and the host copies that stream
  member by member into the cache (`copy_image_tar`): a path outside the root, a member below a symlink, a hard link
  to nothing before it, a device node, an owner outside the image's range or more bytes than the base plus the cap
  can hold is a `BuildError`, so a step that replaced the image's `tar` gains nothing.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import selectors
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from envs.runtime.egress_proxy import EgressProxy
from envs.runtime.nsroot import UID_COUNT, Bind, NamespaceRoot

BUILD_UID_BASE = 1_710_000_000  # the builds' uid range (apart from the task sandboxes' TASK_UID_BASE..)
PROXY_UID = BUILD_UID_BASE + UID_COUNT  # the proxies' host uid: no process of a build sandbox has it
BUILD_CA = "/run/nextstate-build/ca-certificates.crt"  # in the root while a RUN step runs, never in the image
CA_VARS = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS")
HOSTNAME = "sandbox"  # the name the bases' /etc/hosts gives 127.0.1.1 (Docker's builder uses buildkitsandbox)
OUTPUT_TAIL = 64 << 10
READ_LIMIT = 1 << 20  # a file read out of the image (/etc/passwd)
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
MOUNT_POINTS = ("./proc", "./dev")  # exported as empty root-owned directories, as an image has them


class BuildError(RuntimeError):
    """A task environment that could not be built; the message names the task, the step and its output."""


# ----- the size-capped disk of a build's writes -----
class CappedDisk:
    """A directory (`path`) on an ext4 filesystem of its own, `size_bytes` big, kept in a sparse file under `work_dir`
    and mounted through a loop device (nosuid, nodev); `close()` unmounts it and removes the file. Needs root."""

    def __init__(self, work_dir: Path, size_bytes: int, owner: int):
        for tool in ("mkfs.ext4", "mount", "umount"):
            if shutil.which(tool, path=SYSTEM_PATH) is None:
                raise BuildError(f"a task image build needs {tool} (e2fsprogs, util-linux)")
        self.dir = work_dir
        clear_work_dir(work_dir)
        work_dir.mkdir(parents=True)
        os.chmod(work_dir, 0o711)  # the sandbox's uids pass through it to their layer
        image, self.path = work_dir / "disk.ext4", work_dir / "fs"
        self.path.mkdir()
        with open(image, "wb") as f:
            f.truncate(int(size_bytes))
        _system(["mkfs.ext4", "-q", "-F", "-m", "0", "-i", "8192", "-O", "^has_journal",
                 "-E", f"lazy_itable_init=1,root_owner={owner}:{owner}", str(image)], "making the build's disk")
        _system(["mount", "-o", "loop,nosuid,nodev", str(image), str(self.path)],
                "mounting the build's disk (a loop device)")
        os.chmod(self.path, 0o700)

    def close(self) -> None:
        clear_work_dir(self.dir)


def clear_work_dir(work_dir: Path) -> None:
    """Remove a build's work directory, unmounting its disk first (also one a crashed build left mounted)."""
    fs = work_dir / "fs"
    if os.path.ismount(fs):
        # lazily: the last sandbox's mount namespace may still be tearing down; the loop device frees itself after
        _system(["umount", "-l", str(fs)], "unmounting the build's disk")
    shutil.rmtree(work_dir, ignore_errors=True)


def _system(argv: list[str], what: str) -> None:
    argv = [shutil.which(argv[0], path=SYSTEM_PATH) or argv[0], *argv[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True, env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"})
    if proc.returncode != 0:
        raise BuildError(f"{what} failed ({' '.join(argv)}: exit {proc.returncode}): {proc.stderr.strip()[-500:]}")


# ----- one step -----
@dataclass
class StepResult:
    exit_code: int | None  # None: stopped at the build's deadline
    output: str  # the tail of stdout and stderr together
    refused: list[str] = field(default_factory=list)  # destinations the proxy refused, one line each


class StepSandbox:
    """One step's sandbox (a fresh namespace root over the build's layers), and its proxy when it has the network."""

    def __init__(self, ns: NamespaceRoot, proxy: EgressProxy | None, ca: bool):
        self.ns = ns
        self.proxy = proxy
        self._refused: list[str] | None = None
        self.network_env: dict[str, str] = {**(proxy.env if proxy else {}),
                                            **({k: BUILD_CA for k in CA_VARS} if ca else {})}

    def run(self, argv: list[str], *, env: Mapping[str, str], deadline: float, uid: int = 0, gid: int = 0,
            cwd: str = "/", stdin: Callable[[IO[bytes]], None] | None = None) -> StepResult:
        """`argv` inside as `uid`:`gid` in `cwd`, with `env` (plus the network's variables) and `stdin` writing the
        process's standard input (from a thread), until it ends or `deadline` (time.monotonic) passes."""
        proc = subprocess.Popen(self.ns.enter(argv, uid=uid, gid=gid, cwd=cwd),
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env={**env, **self.network_env}, start_new_session=True)
        failed: list[BaseException] = []
        writer = _feed(proc, stdin, failed) if stdin else None
        try:
            tail, timed_out = _drain_tail(proc, deadline)
        finally:
            _stop(proc)
            if writer is not None:
                writer.join()
        if failed:  # what the step read was not all there: its result cannot stand
            raise failed[0]
        return StepResult(None if timed_out else proc.returncode, tail.decode(errors="replace"), self.refused())

    def read(self, path: str, deadline: float) -> bytes | None:
        """A file of the image (as root; None when it has none), at most READ_LIMIT bytes."""
        proc = subprocess.Popen(self.ns.enter(["cat", "--", path], uid=0, gid=0), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={"PATH": SYSTEM_PATH},
                                start_new_session=True)
        try:
            data, timed_out = _drain_tail(proc, deadline, READ_LIMIT, stop_past_limit=True)
        finally:
            _stop(proc)
        if timed_out or len(data) > READ_LIMIT:
            raise BuildError(f"the image's {path} could not be read (more than {READ_LIMIT} bytes, or it never ended)")
        return data if proc.returncode == 0 else None

    def export(self, out: Path, deadline: float, limit_bytes: int) -> None:
        """The image's root as a tarball at `out`: tarred inside (/proc, /dev and the build's CA left out), copied
        member by member by `copy_image_tar` on the host."""
        argv = ["tar", "-C", "/", "--numeric-owner", "--one-file-system", f"--exclude=.{posixpath.dirname(BUILD_CA)}",
                "-cf", "-", "."]
        proc = subprocess.Popen(self.ns.enter(argv, uid=0, gid=0), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
                                start_new_session=True)
        errors: list[bytes] = []
        reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore
        reader.start()
        watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0), _kill_group, (proc.pid,))
        watchdog.start()
        try:
            assert proc.stdout is not None
            copy_image_tar(proc.stdout, out, limit_bytes)
            proc.wait()
        except (tarfile.TarError, ValueError) as exc:
            raise BuildError(f"the built image's tar stream was refused: {exc}") from None
        finally:
            watchdog.cancel()
            _stop(proc)
            reader.join(timeout=5.0)
        if proc.returncode != 0:
            stderr = b"".join(errors).decode(errors="replace")[-2000:]
            late = " (the build's deadline passed)" if time.monotonic() >= deadline else ""
            raise BuildError(f"tarring the built image failed (exit {proc.returncode}){late}: {stderr}")

    def refused(self) -> list[str]:
        """Stop the proxy (once): the destinations it refused."""
        if self._refused is None:
            self._refused = self.proxy.close() if self.proxy is not None else []
        return list(self._refused)


def _feed(proc: subprocess.Popen, write: Callable[[IO[bytes]], None], failed: list[BaseException]
          ) -> threading.Thread:
    def run() -> None:
        assert proc.stdin is not None
        try:
            write(proc.stdin)
        except (BrokenPipeError, ConnectionError):
            pass  # the process stopped reading; its exit status says why
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    t = threading.Thread(target=run, name="build-stdin", daemon=True)
    t.start()
    return t


def _drain_tail(proc: subprocess.Popen, deadline: float, limit: int = OUTPUT_TAIL, *, stop_past_limit: bool = False
                ) -> tuple[bytes, bool]:
    """Read `proc`'s stdout until it ends or `proc` exits (a daemon it left behind may keep the pipe open: its step
    is over all the same, as Docker's is when its process exits), keeping the last `limit` bytes (or stopping past them,
    `stop_past_limit`); (the bytes, whether the deadline passed first)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    kept = bytearray()
    exited_at: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is None and now >= deadline:
                return bytes(kept), True
            ready = sel.select(timeout=0.0 if exited_at is not None else min(deadline - now, 0.2))
            if exited_at is not None and (not ready or now - exited_at > 1.0):
                return bytes(kept), False  # what it left running (and writing) is stopped with its sandbox
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return bytes(kept), False
            kept += chunk
            if len(kept) > limit:
                if stop_past_limit:
                    return bytes(kept), False
                del kept[:-limit]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _stop(proc: subprocess.Popen) -> None:
    """Reap `proc` (the nsenter chain: its group is killed when it has not ended; the sandbox's close ends the rest)."""
    if proc.poll() is None:
        _kill_group(proc.pid)
    proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


# ----- the build -----
class BuildSandbox:
    """One build's layers and the step sandboxes over them (`step()`); `close()` removes its disk."""

    def __init__(self, lower: Path, *, storage_bytes: int, work_dir: Path, ca_bundle: Path | None = None):
        self.lower = lower
        self.ca_bundle = ca_bundle
        self.disk = CappedDisk(work_dir, storage_bytes, owner=BUILD_UID_BASE)

    @contextlib.contextmanager
    def step(self, *, network: bool = False) -> Iterator[StepSandbox]:
        ca = network and self.ca_bundle is not None
        binds = [Bind(str(self.ca_bundle), BUILD_CA)] if ca else []
        ns = NamespaceRoot(self.lower, uid_base=BUILD_UID_BASE, binds=binds, hostname=HOSTNAME, tmp_bytes=0,
                           upper_dir=self.disk.path, scratch_parent=self.disk.dir)
        box = None
        try:
            box = StepSandbox(ns, EgressProxy(ns.init_pid, uid=PROXY_UID) if network else None, ca)
            yield box
        finally:
            if box is not None:
                box.refused()
            ns.close()  # its pid namespace ends: nothing the step started outlives it

    def close(self) -> None:
        self.disk.close()

    def __enter__(self) -> BuildSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_ca_bundle() -> Path | None:
    """The CA bundle this host trusts (its egress may re-sign TLS with a CA no image has)."""
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return Path(os.environ[var])
    default = Path("/etc/ssl/certs/ca-certificates.crt")
    return default if default.is_file() else None


# ----- the result, checked on the host -----
def copy_image_tar(stream: IO[bytes], out: Path, limit_bytes: int) -> None:
    """Copy the tar `stream` (an image's root, from inside the sandbox) to `out` (via `out.partial`), refusing what a
    real root's tar never holds: ValueError naming the member. Owners stay as numbers (the image's own)."""
    partial = out.with_name(out.name + ".partial")
    seen: set[str] = set()
    files: set[str] = set()
    symlinks: set[str] = set()
    total = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as src, open(partial, "wb") as f, \
                tarfile.open(fileobj=f, mode="w|", format=tarfile.PAX_FORMAT) as dst:
            for member in src:
                name = _member_name(member.name)
                if name in seen:
                    raise ValueError(f"{member.name!r} twice")
                if any(parent in symlinks for parent in _parents(name)):
                    raise ValueError(f"{member.name!r} is below a symlink")
                if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.isfifo()):
                    raise ValueError(f"{member.name!r} is a device node or of an unknown type")
                if not (0 <= member.uid < UID_COUNT and 0 <= member.gid < UID_COUNT):
                    raise ValueError(f"{member.name!r} has an owner outside the image ({member.uid}:{member.gid})")
                if member.islnk():
                    member.linkname = _member_name(member.linkname)
                    if member.linkname not in files:
                        raise ValueError(f"{member.name!r} is a hard link to {member.linkname!r}, no file before it")
                total += member.size + 1024
                if total > limit_bytes:
                    raise ValueError(f"more than {limit_bytes >> 20} MiB (the base and the build's storage cap)")
                seen.add(name)
                if member.isreg():
                    files.add(name)
                elif member.issym():
                    symlinks.add(name)
                member.name = name
                if name in MOUNT_POINTS:  # tar saw the sandbox's own /proc and /dev mounted there, not the image's dirs
                    member.type, member.mode, member.uid, member.gid, member.size = tarfile.DIRTYPE, 0o755, 0, 0, 0
                member.uname = member.gname = ""
                member.pax_headers = {}
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
        partial.rename(out)
    finally:
        partial.unlink(missing_ok=True)


def _member_name(name: str) -> str:
    path = posixpath.normpath("/" + name.lstrip("/"))  # "./usr/bin" -> "/usr/bin"; ".." may not climb out of "/"
    if ".." in name.split("/"):
        raise ValueError(f"{name!r} climbs out of the root")
    return "." if path == "/" else "." + path


def _parents(name: str) -> Iterator[str]:
    parts = name.split("/")
    for i in range(2, len(parts)):
        yield "/".join(parts[:i])


__all__ = ["BUILD_CA", "BUILD_UID_BASE", "CA_VARS", "BuildError", "BuildSandbox", "CappedDisk", "StepResult",
           "StepSandbox", "copy_image_tar", "host_ca_bundle"]
