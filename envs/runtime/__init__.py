"""Where commands run. One protocol for every backend (local bubblewrap/subprocess, docker, desktop, remote VM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # output exceeded the runtime's cap and was cut

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Runtime(Protocol):
    """A place to run commands. `idempotent` tells a transport whether retrying a failed call is safe."""

    def exec(self, cmd: str, timeout: float | None = None, *, idempotent: bool = False) -> ExecResult: ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes | str) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class DesktopRuntime(Runtime, Protocol):
    """A runtime with a screen: screenshots, an accessibility tree, and GUI actions."""

    def screenshot(self) -> Any: ...  # H×W×3 uint8 numpy array

    def a11y_tree(self) -> str: ...

    def act(self, action: str | dict[str, Any]) -> ExecResult: ...
