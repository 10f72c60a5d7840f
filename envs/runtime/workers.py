"""A client for a long-lived JSON-lines worker process (the action worker and the accessibility worker).

Requests are serialized by a lock; each waits at most `timeout` seconds for its answer. A worker that misses a deadline or
dies is stopped (its process group, by pid) and started again on the next request, so one hung action costs one timeout,
never the desktop.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.runtime.owned import OwnedProcess, spawn

log = logging.getLogger(__name__)

RUNTIME_DIR = Path(__file__).resolve().parent


class WorkerError(RuntimeError):
    """The worker could not start, died, or did not answer in time."""


class WorkerTimeout(WorkerError):
    pass


class JsonWorker:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        start_timeout_s: float = 20.0,
        log_path: Path | None = None,
    ):
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.start_timeout_s = start_timeout_s
        self.log_path = log_path
        self._proc: OwnedProcess | None = None
        self._buf = b""
        self._lock = threading.Lock()
        self.restarts = 0

    @classmethod
    def script(cls, name: str, script: str, env: Mapping[str, str], python: str | None = None, **kw: Any) -> JsonWorker:
        """A worker running `envs/runtime/<script>` under `python` (default: this interpreter). `-P`: the script's own
        directory is not put on sys.path, so sibling modules cannot shadow installed packages."""
        return cls(name, [python or sys.executable, "-P", str(RUNTIME_DIR / script)], env, **kw)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.alive() else None

    def request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            if self._proc is None or not self._proc.alive():
                self._start()
            assert self._proc is not None and self._proc.popen.stdin is not None
            try:
                self._proc.popen.stdin.write((json.dumps(payload) + "\n").encode())
                self._proc.popen.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                self._stop()
                raise WorkerError(f"{self.name} worker is gone ({exc}); it restarts on the next request") from None
            try:
                return self._read(timeout)
            except WorkerError:
                self._stop()
                raise

    def _start(self) -> None:
        stderr = self.log_path.open("ab") if self.log_path is not None else subprocess.DEVNULL
        try:
            self._proc = spawn(
                self.name, self.argv, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
            )
        finally:
            if stderr is not subprocess.DEVNULL:
                stderr.close()
        self._buf = b""
        try:
            hello = self._read(self.start_timeout_s)
        except WorkerError as exc:
            self._stop()
            raise WorkerError(f"{self.name} worker did not start: {exc}{self._log_tail()}") from None
        if not hello.get("ok"):
            self._stop()
            raise WorkerError(f"{self.name} worker failed to start: {hello.get('error')}{self._log_tail()}")
        if self.restarts or hello.get("restart"):
            log.info("%s worker restarted (pid %s)", self.name, hello.get("pid"))

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.popen.stdout is not None
        fd = self._proc.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerTimeout(f"{self.name} worker gave no answer within {timeout:.1f} s")
                if sel.select(min(left, 1.0)):
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        raise WorkerError(f"{self.name} worker exited (code {self._proc.popen.poll()})")
                    self._buf += chunk
                elif not self._proc.alive():
                    raise WorkerError(f"{self.name} worker exited (code {self._proc.popen.poll()})")
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.stop(grace_s=0.5)
            self._proc = None
            self.restarts += 1

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.stop(grace_s=0.5)
                self._proc = None

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n" + self.log_path.read_text(errors="replace")[-1500:]
