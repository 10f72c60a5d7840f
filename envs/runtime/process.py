"""Run one child process with a wall timeout and an output cap, and kill its whole process group when either is hit.

Both local backends (bubblewrap and the plain subprocess) use this. The child gets its own session, so `os.killpg` reaches
everything it started that did not leave the group; bubblewrap's pid namespace reaches the rest (when its init dies, the
kernel kills every process in the namespace).
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SETPRIV = shutil.which("setpriv")


@dataclass
class RawResult:
    """A finished child: exit status (128 + signal number when killed by a signal) and raw output bytes."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False  # the output passed the cap; the child was stopped there
    wall_s: float = 0.0


class ProcessGroups:
    """The process groups running right now, so an owner can kill them all on close (by pgid, never by name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pgids: set[int] = set()

    def add(self, pgid: int) -> None:
        with self._lock:
            self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def kill_all(self) -> None:
        with self._lock:
            pgids = list(self._pgids)
        for pgid in pgids:
            kill_group(pgid)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def live_group_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are not yet dead (zombies excluded), from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            pids.append(int(entry))
    return pids


def wait_group_dead(pgid: int, timeout: float = 5.0) -> bool:
    """After a SIGKILL, wait until nothing of the group is still running (the kernel tears processes down async)."""
    deadline = time.monotonic() + timeout
    while live_group_members(pgid):
        if time.monotonic() > deadline:
            return False
        kill_group(pgid)
        time.sleep(0.01)
    return True


def returncode_is_kill(returncode: int | None) -> bool:
    return returncode == -signal.SIGKILL


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it: a signal death N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def as_user(argv: Sequence[str], user: int | None, group: int | None = None) -> tuple[list[str], dict]:
    """(argv, Popen kwargs) that run `argv` as host uid `user` (and gid `group`, default the same number), no groups."""
    if user is None:
        return list(argv), {}
    gid = group if group is not None else user
    if SETPRIV:
        # setpriv keeps Python on its fast vfork path (Popen(user=...) forks the whole interpreter): ~2x faster
        return [SETPRIV, f"--reuid={user}", f"--regid={gid}", "--clear-groups", "--", *argv], {}
    return list(argv), {"user": user, "group": gid, "extra_groups": []}


def run_capped(
    argv: Sequence[str],
    *,
    timeout: float,
    output_limit: int,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    user: int | None = None,
    group: int | None = None,
    pass_fds: Sequence[int] = (),
    groups: ProcessGroups | None = None,
) -> RawResult:
    """Run `argv`; stop it (SIGKILL to its process group) after `timeout` seconds or once stdout+stderr pass `output_limit`
    bytes. Output beyond the cap is dropped. `user`/`group` switch the child's uid/gid before exec (needs root)."""
    t0 = time.monotonic()
    argv, kwargs = as_user(argv, user, group)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        **kwargs,
    )
    pgid = proc.pid  # start_new_session: the child leads its own group
    if groups is not None:
        groups.add(pgid)
    timed_out = truncated = False
    try:
        out, err, timed_out, truncated = _pump(proc, stdin, t0 + timeout, output_limit)
        if timed_out or truncated:
            kill_group(pgid)
        try:
            grace = 1.0 if timed_out or truncated else 0.0
            returncode = proc.wait(timeout=max(t0 + timeout - time.monotonic(), 0.0) + grace)
        except subprocess.TimeoutExpired:
            # the child closed its output but kept running past the deadline
            timed_out = True
            kill_group(pgid)
            returncode = proc.wait()
    finally:
        if proc.poll() is None:
            kill_group(pgid)
            proc.wait()
        if timed_out or truncated or returncode_is_kill(proc.returncode):
            wait_group_dead(pgid)  # a killed sandbox leaves nothing running once we return
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        if groups is not None:
            groups.discard(pgid)
    return RawResult(exit_status(returncode), out, err, timed_out, truncated, time.monotonic() - t0)


def _pump(proc: subprocess.Popen, stdin: bytes | None, deadline: float, limit: int) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and collect stdout/stderr until EOF on both, the deadline, or the output cap."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    total = 0
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    pending = memoryview(stdin) if stdin else None
    if proc.stdin is not None:
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
    open_readers = 2
    try:
        while open_readers:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), True, False
            for key, _ in sel.select(min(left, 1.0)):
                f = key.fileobj
                if f is proc.stdin:
                    try:
                        n = os.write(proc.stdin.fileno(), pending[:65536])
                    except BrokenPipeError:
                        n = len(pending)
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(f.fileno(), 65536)
                if not chunk:
                    sel.unregister(f)
                    open_readers -= 1
                    continue
                room = limit - total
                bufs[f] += chunk[:room]
                total += len(chunk)
                if total > limit:
                    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), False, True
        return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), False, False
    finally:
        sel.close()
