"""Processes owned by the code that started them: stopped by pid / process group, and found again by an env marker.

A desktop starts long-lived processes (Xvfb, D-Bus, AT-SPI, workers) and task processes (apps, setup commands, whatever
those daemonize). Each child gets its own session so `killpg` reaches what stayed in its group; every child also inherits
a marker variable, so processes that left the group (`nohup ... &`, `setsid`, D-Bus activation) are still found by pid
through /proc and stopped. Nothing is ever killed by name.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class OwnedProcess:
    """A child started in its own session; `stop()` signals its whole process group."""

    name: str
    popen: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = 2.0) -> None:
        if self.popen.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.debug("%s (pid %d) ignored SIGTERM; killing its group", self.name, self.pid)
        _signal_group(self.pid, signal.SIGKILL)  # leftovers in the group, even when the leader is gone
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) did not exit after SIGKILL", self.name, self.pid)
        for f in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


def spawn(
    name: str,
    argv: Sequence[str] | str,
    *,
    env: Mapping[str, str],
    shell: bool = False,
    cwd: str | None = None,
    stdin: int | None = subprocess.DEVNULL,
    stdout: int | None = subprocess.DEVNULL,
    stderr: int | None = subprocess.DEVNULL,
    pass_fds: Sequence[int] = (),
) -> OwnedProcess:
    popen = subprocess.Popen(
        argv if shell else list(argv),
        shell=shell,
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
    )
    return OwnedProcess(name, popen)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pids_with_marker(key: str, value: str) -> list[int]:
    """Pids whose environment holds `key=value` (read from /proc; processes we cannot read are skipped)."""
    needle = f"{key}={value}".encode()  # zombies have an empty environ and are skipped
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(key: str, value: str, *, rounds: int = 3) -> int:
    """SIGKILL every process carrying the marker (repeated: a dying parent may fork). Returns how many were signalled."""
    total = 0
    for _ in range(rounds):
        pids = pids_with_marker(key, value)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                total += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    return total


_WATCHDOG = r"""
import os, shutil, signal, sys, time
key, value, leftovers = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.stdin.buffer.read()  # returns when the owner closes the pipe or dies
needle = f"{key}={value}".encode()
for _ in range(3):
    found = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
                    found = True
        except OSError:
            pass
    if not found:
        break
    time.sleep(0.05)
for path in leftovers:
    shutil.rmtree(path, ignore_errors=True)
"""


def start_watchdog(key: str, value: str, leftovers: Sequence[str] = ()) -> OwnedProcess:
    """A tiny process that kills everything carrying the marker once its stdin closes, then deletes `leftovers`
    (directories): when the owner exits, even by SIGKILL (a Ray worker killed with its envs), the desktop's processes
    and files do not outlive it. The owner keeps the pipe's write end and never writes to it."""
    import sys

    env = {k: v for k, v in os.environ.items() if k != key}  # the watchdog itself does not carry the marker
    return spawn(f"watchdog {key}={value}", [sys.executable, "-I", "-c", _WATCHDOG, key, value, *leftovers], env=env,
                 stdin=subprocess.PIPE)


def process_tree_pss_kib(pids: Sequence[int]) -> int:
    """Proportional set size (KiB) summed over `pids` (shared pages split fairly): the honest per-desktop memory."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except (OSError, ValueError):
            continue
    return total
