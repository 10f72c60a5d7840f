"""OSWorldClient: the desktop Runtime over OSWorld's guest HTTP API (a real OSWorld VM, a docker-QEMU image, or our
guest server in a container).

It does what OSWorld's own controllers do: pyautogui actions go to `/execute` as
`python -c "import pyautogui; import time; pyautogui.FAILSAFE = False; <code>"` (one interpreter per action, as in
OSWorld), screenshots come from `/screenshot` (PNG), the accessibility tree from `/accessibility`, files through `/file`
and `/setup/upload`, and setup operations through `/setup/...`. Addresses: `http://host:port` or `unix:///path.sock`.

Two things OSWorld's API lacks are taken from NextState's additions when the server has them (our guest server does):
a window list (`/nextstate/windows`; otherwise `wmctrl -lG` through `/execute`) and a per-episode reset
(`/nextstate/new_session`). A real OSWorld VM is reset by reverting its snapshot, which is the provider's job.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from envs.runtime import ExecResult
from envs.runtime.actions import ParsedAction, parse_action
from envs.runtime.desktop import WindowInfo
from envs.runtime.xsession import DesktopError

log = logging.getLogger(__name__)

PKGS_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; {command}"  # OSWorld's PythonController


class OSWorldClient:
    def __init__(
        self,
        url: str,
        *,
        action_timeout_s: float = 10.0,
        exec_timeout_s: float = 130.0,
        connect_retries: int = 3,
        python: str = "python",
    ):
        import httpx

        self.url = url
        self.action_timeout_s = action_timeout_s
        self.exec_timeout_s = exec_timeout_s
        self.python = python
        if url.startswith("unix://"):
            transport = httpx.HTTPTransport(uds=url[len("unix://") :], retries=connect_retries)
            base = "http://guest"
        else:
            transport = httpx.HTTPTransport(retries=connect_retries)
            base = url.rstrip("/")
        self.http = httpx.Client(base_url=base, transport=transport, timeout=exec_timeout_s)
        self._extensions: bool | None = None
        self._home: str | None = None
        self._size: tuple[int, int] | None = None
        self._warned_reset = False

    # ----- plumbing -----
    def _post(self, path: str, *, timeout: float | None = None, **kw: Any):
        import httpx

        try:
            return self.http.post(path, timeout=timeout or self.exec_timeout_s, **kw)
        except httpx.HTTPError as exc:
            raise DesktopError(f"OSWorld guest {self.url}{path}: {type(exc).__name__}: {exc}") from exc

    def _get(self, path: str, *, timeout: float | None = None):
        import httpx

        try:
            return self.http.get(path, timeout=timeout or self.exec_timeout_s)
        except httpx.HTTPError as exc:
            raise DesktopError(f"OSWorld guest {self.url}{path}: {type(exc).__name__}: {exc}") from exc

    def has_extensions(self) -> bool:
        """Whether the server is NextState's guest server (it answers /nextstate/health)."""
        if self._extensions is None:
            try:
                self._extensions = self._get("/nextstate/health", timeout=10).status_code == 200
            except DesktopError:
                self._extensions = False
        return self._extensions

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll until the guest answers (OSWorld's controller polls /terminal and /screenshot the same way)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if self._get("/terminal", timeout=5).status_code == 200:
                    return
            except DesktopError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise DesktopError(f"the OSWorld guest at {self.url} did not answer within {timeout:.0f} s: {last}")

    # ----- Runtime protocol -----
    def exec(self, cmd: str, timeout: float | None = None, *, idempotent: bool = False) -> ExecResult:
        return self.execute(cmd, shell=True, timeout=timeout)

    def execute(self, command: str | Sequence[str], shell: bool = False, timeout: float | None = None) -> ExecResult:
        payload = {"command": command if isinstance(command, str) else list(command), "shell": shell}
        resp = self._post("/execute", json=payload, timeout=(timeout or self.exec_timeout_s) + 10)
        try:
            body = resp.json()
        except ValueError:
            return ExecResult(1, "", f"HTTP {resp.status_code}: {resp.text[:500]}")
        if resp.status_code != 200 or body.get("status") != "success":
            message = body.get("message") or body.get("error") or resp.text[:500]
            return ExecResult(1, body.get("output") or "", str(message), timed_out="timed out" in str(message).lower())
        return ExecResult(int(body.get("returncode", 0)), body.get("output") or "", body.get("error") or "")

    def read_file(self, path: str) -> bytes:
        resp = self._post("/file", data={"file_path": path})
        if resp.status_code == 404:
            raise FileNotFoundError(f"{path} not found on the guest")
        if resp.status_code != 200:
            raise DesktopError(f"reading {path} from the guest failed: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.content

    def write_file(self, path: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        name = path.rstrip("/").rsplit("/", 1)[-1] or "file"
        resp = self._post("/setup/upload", data={"file_path": path}, files={"file_data": (name, raw)})
        if resp.status_code != 200:
            raise DesktopError(f"uploading {path} to the guest failed: HTTP {resp.status_code}: {resp.text[:300]}")

    def close(self) -> None:
        self.http.close()

    # ----- DesktopRuntime -----
    def screenshot(self) -> np.ndarray:
        from PIL import Image

        resp = self._get("/screenshot", timeout=30)
        if resp.status_code != 200:
            raise DesktopError(f"screenshot failed: HTTP {resp.status_code}")
        return np.asarray(Image.open(io.BytesIO(resp.content)).convert("RGB"))

    def a11y_tree(self) -> str:
        resp = self._get("/accessibility", timeout=30)
        if resp.status_code != 200:
            raise DesktopError(f"accessibility tree failed: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()["AT"]

    def act(self, action: str | dict[str, Any] | ParsedAction, timeout: float | None = None) -> ExecResult:
        parsed = action if isinstance(action, ParsedAction) else parse_action(action)
        if parsed.kind == "special":
            return ExecResult(0, "", "")
        argv = [self.python, "-c", PKGS_PREFIX.format(command=parsed.code)]
        return self.execute(argv, timeout=timeout or self.action_timeout_s)

    # ----- OSWorld guest operations -----
    def launch(self, command: str | Sequence[str], shell: bool = False) -> None:
        payload = {"command": command if isinstance(command, str) else list(command), "shell": shell}
        resp = self._post("/setup/launch", json=payload)
        if resp.status_code != 200:
            raise DesktopError(f"launch {command!r} failed: HTTP {resp.status_code}: {resp.text[:300]}")

    def open_path(self, path: str, timeout: float = 10.0) -> None:
        resp = self._post("/setup/open_file", json={"path": path, "timeout_seconds": timeout}, timeout=timeout + 30)
        if resp.status_code == 404:
            raise FileNotFoundError(resp.text)
        if resp.status_code != 200:
            raise DesktopError(f"open {path} failed: {resp.text[:300]}")

    def activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool:
        payload = {"window_name": window_name, "strict": strict, "by_class": by_class}
        return self._post("/setup/activate_window", json=payload).status_code == 200

    def close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool:
        payload = {"window_name": window_name, "strict": strict, "by_class": by_class}
        return self._post("/setup/close_window", json=payload).status_code == 200

    def windows(self) -> list[WindowInfo]:
        if self.has_extensions():
            resp = self._get("/nextstate/windows", timeout=30)
            if resp.status_code == 200:
                return [WindowInfo(**w) for w in resp.json()["windows"]]
        # a plain OSWorld VM: ask its window manager
        res = self.execute(["wmctrl", "-l", "-G"], timeout=10)
        active = self.execute(["xdotool", "getactivewindow"], timeout=10).stdout.strip()
        out = []
        for line in res.stdout.splitlines():
            parts = line.split(None, 7)
            if len(parts) < 7:
                continue
            wid = int(parts[0], 16)
            out.append(
                WindowInfo(
                    wid,
                    parts[7] if len(parts) > 7 else "",
                    [],
                    int(parts[2]),
                    int(parts[3]),
                    int(parts[4]),
                    int(parts[5]),
                    focused=active.isdigit() and int(active) == wid,
                )
            )
        return out

    def screen_size(self) -> tuple[int, int]:
        if self._size is None:
            body = self._post("/screen_size").json()
            self._size = (int(body["width"]), int(body["height"]))
        return self._size

    def terminal_output(self) -> str | None:
        """The text of the desktop's terminal (OSWorld's GET /terminal), None when there is none."""
        resp = self._get("/terminal", timeout=30)
        if resp.status_code != 200:
            return None
        return resp.json().get("output")

    def list_directory(self, path: str) -> dict[str, Any]:
        resp = self._post("/list_directory", json={"path": path})
        if resp.status_code != 200:
            raise FileNotFoundError(resp.json().get("error", resp.text))
        return resp.json()["directory_tree"]

    def new_session(self) -> None:
        if self.has_extensions():
            resp = self._post("/nextstate/new_session", timeout=60)
            if resp.status_code != 200:
                raise DesktopError(f"new_session failed: HTTP {resp.status_code}: {resp.text[:300]}")
            self._home = resp.json().get("home", self._home)
        elif not self._warned_reset:
            log.warning(
                "the OSWorld guest at %s cannot reset itself: episodes share its state unless you revert the VM "
                "snapshot between them (OSWorld's providers do)",
                self.url,
            )
            self._warned_reset = True

    @property
    def home(self) -> str:
        if self._home is None:
            self._home = self.execute('printf %s "$HOME"', shell=True).stdout or "/home/user"
        return self._home

    def __enter__(self) -> OSWorldClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
