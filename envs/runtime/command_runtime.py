"""The Runtime protocol on top of one primitive: what the local (bubblewrap) and docker runtimes share.

A subclass provides `run(cmd, *, timeout, stdin, output_limit) -> RawResult` (a bash command in its sandbox, raw bytes
back; it refuses what `check_command` refuses and takes commands of any length, so it never puts one on an argv) and
sets `_lock`, `_closed` and `_finalizer` (called once, by the first close()); exec, file access and close are then the
same for both. File access goes through the sandbox too, never through host paths.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from envs.action_text import unencodable
from envs.runtime import ExecResult
from envs.runtime.process import RawResult


def check_command(cmd: str) -> None:
    """Raise ValueError, saying where, for a command bash cannot receive: a NUL byte (it would end the string) or text
    that is not encodable as UTF-8 (a lone surrogate). Envs reject such actions before they get here."""
    if not isinstance(cmd, str):
        raise TypeError(f"a command is a str, got {type(cmd).__name__}")
    problem = unencodable(cmd)
    if problem:
        raise ValueError(f"the command {problem}: bash cannot run it")


class CommandRuntime:
    place: ClassVar[str] = "the sandbox"  # where commands run, for error messages
    _lock: threading.Lock
    _closed: bool
    _finalizer: Callable[[], Any]

    def run(
        self, cmd: str, *, timeout: float | None = None, stdin: bytes | None = None, output_limit: int | None = None
    ) -> RawResult:
        raise NotImplementedError

    # ----- the Runtime protocol -----
    def exec(self, cmd: str, timeout: float | None = None, *, idempotent: bool = False) -> ExecResult:
        raw = self.run(cmd, timeout=timeout)
        return ExecResult(
            exit_code=raw.exit_code,
            stdout=raw.stdout.decode("utf-8", errors="replace"),
            stderr=raw.stderr.decode("utf-8", errors="replace"),
            timed_out=raw.timed_out,
            truncated=raw.truncated,
        )

    def read_file(self, path: str) -> bytes:
        raw = self.run(f"cat -- {shlex.quote(path)}", timeout=30, output_limit=1 << 30)
        if raw.exit_code != 0:
            msg = raw.stderr.decode(errors="replace").strip()
            if "No such file" in msg:
                raise FileNotFoundError(f"{path}: no such file in {self.place}")
            raise OSError(f"reading {path} in {self.place} failed ({raw.exit_code}): {msg}")
        return raw.stdout

    def write_file(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else bytes(data)
        q = shlex.quote(path)
        raw = self.run(f'mkdir -p -- "$(dirname -- {q})" && cat > {q}', timeout=30, stdin=payload)
        if raw.exit_code != 0:
            raise OSError(
                f"writing {path} in {self.place} failed ({raw.exit_code}): {raw.stderr.decode(errors='replace')}"
            )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer()

    # ----- more than the protocol -----
    @property
    def closed(self) -> bool:
        return self._closed
