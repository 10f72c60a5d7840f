"""LocalDesktop: the desktop Runtime on a local Xvfb display, in a throwaway-root sandbox by default.

One desktop = one X session (Xvfb started with `-extension GLX`, a private session bus, the AT-SPI bus, an optional window
manager), a long-lived action worker bound to the display (pyautogui, no new interpreter per action), an accessibility
worker (AT-SPI, OSWorld's XML), screenshots, and the operations OSWorld's guest API offers (`execute`, `launch`,
`open_path`, `activate_window`, ...), so the task setup and the evaluator run the same code against this desktop or a
remote OSWorld VM (`envs.runtime.osworld.OSWorldClient`).

Isolation (`DesktopConfig.isolation`, see `envs.runtime.desktop_place`):
- "sandbox" (default): all of it, the task's apps and setup commands included, runs in a sandbox over an overlay of the
  guest rootfs, as OSWorld's `user` with HOME /home/user, a non-root host uid, no network, `sudo` against the sandbox's
  own root (`echo password | sudo -S apt-get install zsh` installs zsh from the rootfs's offline repository into the
  sandbox, never onto the host). Screenshots come from Xvfb's framebuffer file; the host never connects to the display.
- "none": processes of this user on this machine with a private HOME (as before there was a sandbox): no isolation,
  for machines without root and for the docker guest, whose container is the sandbox.

Episodes: `new_session()` gives the episode a fresh start. In the sandbox (`fresh_root_per_episode`, default) that is a
new sandbox: a fresh root, no process of the last episode, the session restarted, like reverting an OSWorld VM snapshot.
Otherwise (and with isolation "none") it stops every process the previous episode started (apps, setup commands and what
they daemonized: found by an env marker, stopped by pid), gives the episode a fresh or emptied HOME, and parks the
pointer, while the X server, buses and workers stay up: a reset then costs an app start rather than a desktop start.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from envs.runtime import DesktopRuntime, ExecResult
from envs.runtime.app_profiles import FIRST_RUN_FILES
from envs.runtime.actions import ActionParseError, ParsedAction, parse_action
from envs.runtime.desktop_place import (
    SANDBOX_PATH,
    USER_HOME,
    HostPlace,
    SandboxPlace,
    find_gi_python,
)
from envs.runtime.owned import OwnedProcess, kill_marked, process_tree_pss_kib, spawn
from envs.runtime.workers import JsonWorker, WorkerError, WorkerTimeout
from envs.runtime.xsession import DesktopError, XSession, XSessionConfig

log = logging.getLogger(__name__)

EPISODE_MARKER = "NEXTSTATE_EPISODE"
TERMINAL_LOGS = "/tmp/nextstate-terminals"  # in the sandbox (its private /tmp): where ctrl+alt+t terminals log
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()*+][0-9A-Za-z]|\x1b[=>78cDEHMNOZ]")
HOME_DIRS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos")
GTK_SETTINGS = "[Settings]\ngtk-cursor-blink=false\ngtk-enable-animations=false\n"  # deterministic screenshots


@dataclass
class WindowInfo:
    id: int
    title: str
    wm_class: list[str]
    x: int
    y: int
    w: int
    h: int
    focused: bool = False


@runtime_checkable
class GuestDesktop(DesktopRuntime, Protocol):
    """What the gui family needs from a desktop: the Runtime and DesktopRuntime methods plus OSWorld's guest operations.
    Implemented by LocalDesktop (this module) and OSWorldClient (an OSWorld VM's HTTP API)."""

    def execute(
        self, command: str | Sequence[str], shell: bool = False, timeout: float | None = None
    ) -> ExecResult: ...

    def launch(self, command: str | Sequence[str], shell: bool = False) -> None: ...

    def open_path(self, path: str, timeout: float = 10.0) -> None: ...

    def activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool: ...

    def close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool: ...

    def windows(self) -> list[WindowInfo]: ...

    def screen_size(self) -> tuple[int, int]: ...

    def terminal_output(self) -> str | None: ...

    def new_session(self) -> None: ...

    @property
    def home(self) -> str: ...


ISOLATIONS = ("sandbox", "none")


@dataclass
class DesktopConfig:
    isolation: str = "sandbox"  # "sandbox" (throwaway root, see the module docstring) | "none" (this user, this machine)
    fresh_root_per_episode: bool = True  # sandbox: a new sandbox at every new session (False: reset inside, faster)
    root_bytes: int = 1 << 30  # sandbox: what an episode may write to its root (a tmpfs: memory)
    tmp_bytes: int = 512 << 20  # sandbox: its /tmp (a tmpfs)
    source_root: str | None = None  # sandbox: the NextState tree bound at /opt/nextstate (default: this checkout)
    width: int = 1280
    height: int = 800
    depth: int = 24
    window_manager: str | None = None  # None or "openbox" (a WM moves windows: fix it per task family)
    accessibility: bool = True  # AT-SPI tree (GTK apps); without it the observation falls back to the window list
    home: str | None = None  # none: a fixed HOME (e.g. /home/user in a guest container); None: fresh per episode
    wipe_home: bool = False  # none: with a fixed HOME, empty it at every new session (only for a disposable guest)
    path_prepend: tuple[str, ...] = ()  # directories put first on PATH (e.g. launchers of bundled apps)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for apps and commands
    open_with: dict[str, list[str]] = field(
        default_factory=dict
    )  # "dir"/"text" -> command for `open_path` (else xdg-open, when the desktop has it)
    action_timeout_s: float = 10.0  # one pyautogui action
    exec_timeout_s: float = 120.0  # one setup / evaluator command (OSWorld's /execute uses 120 s)
    a11y_timeout_s: float = 10.0
    pyautogui_pause_s: float = 0.0  # pyautogui.PAUSE after each call (0: the settle wait after an action does the job)
    max_output_bytes: int = 1 << 20
    gi_python: str | None = None  # none: interpreter with PyGObject + Atspi (default: this one if it has gi, else
    # /usr/bin/python3); the sandbox uses its rootfs's python3
    worker_python: str | None = None  # none: interpreter with pyautogui (default: this one)

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation={self.isolation!r}: use one of {', '.join(ISOLATIONS)}")
        if self.width < 64 or self.height < 64:
            raise ValueError(f"screen size {self.width}x{self.height} is too small")
        if self.isolation == "sandbox" and self.home not in (None, USER_HOME):
            raise ValueError(f"the sandbox's HOME is {USER_HOME}; home= applies to isolation='none'")
        self.path_prepend = tuple(self.path_prepend)


class LocalDesktop:
    """A desktop on a local Xvfb display. Start it with `LocalDesktop(cfg)`; stop it with `close()`."""

    def __init__(self, cfg: DesktopConfig | None = None):
        self.cfg = cfg or DesktopConfig()
        self._closed = False
        self._lock = threading.Lock()
        self._episode = 0
        self._home: Path | None = None
        self._launched: list[OwnedProcess] = []
        self._shell = "/bin/sh"
        self._armed = -1  # the action worker's restart count when this episode was last told to it
        if self.cfg.isolation == "none":
            log.warning(
                "UNSANDBOXED desktop (isolation='none'): the task's setup commands and apps and the agent's actions "
                "run as this user on this machine, with its network and files; only HOME is private"
            )
        try:
            self._start()
            self.new_session(restart=False)
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        """Start the X session (in a new sandbox) and the workers."""
        cfg = self.cfg
        if cfg.isolation == "sandbox":
            make_place = lambda d: SandboxPlace(  # noqa: E731
                d, root_bytes=cfg.root_bytes, tmp_bytes=cfg.tmp_bytes,
                source_root=Path(cfg.source_root) if cfg.source_root else None,
            )
        else:
            make_place = lambda d: HostPlace(d, find_gi_python(cfg.gi_python), cfg.worker_python)  # noqa: E731
        self.x = XSession.start(
            XSessionConfig(cfg.width, cfg.height, cfg.depth, cfg.accessibility, cfg.window_manager),
            base_env=self._base_env(),
            make_place=make_place,
        )
        self.place = self.x.place
        logs = self.x.runtime_dir
        assert logs is not None and self.place is not None
        self.actions = JsonWorker("action", self._wrap(self.place.worker("desktop_worker.py", gi=False)),
                                  self._infra_env(), log_path=logs / "action-worker.log")
        self._a11y: JsonWorker | None = None
        if cfg.accessibility:
            a11y = self.place.worker("a11y_worker.py", gi=True)
            if a11y is None:
                log.warning(
                    "no Python with PyGObject/Atspi found (apt-get install python3-gi gir1.2-atspi-2.0): "
                    "the accessibility tree is unavailable, observations use the window list"
                )
            else:
                self._a11y = JsonWorker("a11y", self._wrap(a11y), self._infra_env(), log_path=logs / "a11y-worker.log")
        # a desktop dropped without close() (or alive at interpreter exit) still stops its processes
        self._finalizer = weakref.finalize(self, _shutdown, self.x, [self.actions, self._a11y], self._launched)
        self.actions.request({"op": "ping"}, timeout=30)  # fail now, not at the first action

    def _stop(self) -> None:
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        elif getattr(self, "x", None) is not None:
            _shutdown(self.x, [getattr(self, "actions", None), getattr(self, "_a11y", None)], self._launched)

    def _wrap(self, argv: list[str]) -> list[str]:
        wrapped, _ = self.place.argv(argv)
        return list(wrapped)

    # ----- environment -----
    def _base_env(self) -> dict[str, str]:
        env = {"GDK_BACKEND": "x11", "NO_AT_BRIDGE": "0", "NEXTSTATE_PYAUTOGUI_PAUSE": str(self.cfg.pyautogui_pause_s)}
        if self.cfg.path_prepend:
            rest = SANDBOX_PATH if self.cfg.isolation == "sandbox" else os.environ.get("PATH", "/usr/bin:/bin")
            env["PATH"] = os.pathsep.join([*self.cfg.path_prepend, rest])
        env.update(self.cfg.env)
        return env

    def _infra_env(self) -> dict[str, str]:
        return dict(self.x.env)

    def _task_env(self) -> dict[str, str]:
        env = dict(self.x.env)
        env["HOME"] = self.home
        env["SHELL"] = self._shell
        env[EPISODE_MARKER] = self._episode_tag
        return env

    @property
    def _episode_tag(self) -> str:
        return f"{self.x.session_id}-{self._episode}"

    @property
    def home(self) -> str:
        assert self._home is not None
        return str(self._home)

    @property
    def display(self) -> str:
        return self.x.display

    @property
    def sandboxed(self) -> bool:
        return self.cfg.isolation == "sandbox"

    # ----- episodes -----
    def new_session(self, restart: bool = True) -> None:
        """Start the next episode fresh (see the module docstring), the pointer parked next to a corner."""
        self._check_open()
        if restart and self.sandboxed and self.cfg.fresh_root_per_episode:
            self._stop()
            self._launched = []
            self._start()
        for p in self._launched:
            p.stop(grace_s=0.5)
        self._launched.clear()
        kill_marked(EPISODE_MARKER, self._episode_tag)
        old_home = self._home
        self._episode += 1
        if self.sandboxed:
            self._home = Path(USER_HOME)
            if self._episode > 1 and not self.cfg.fresh_root_per_episode:
                self.place.reset_home(USER_HOME, wipe=True)
        elif self.cfg.home:
            self._home = Path(self.cfg.home)
            self.place.reset_home(self.cfg.home, wipe=self.cfg.wipe_home)
        else:
            assert self.x.runtime_dir is not None
            self._home = self.x.runtime_dir / f"home-{self._episode}"
            if old_home is not None and old_home.parent == self.x.runtime_dir:
                shutil.rmtree(old_home, ignore_errors=True)
        self._shell = self.place.login_shell()
        dirs = " ".join(shlex.quote(f"{self.home}/{d}") for d in (*HOME_DIRS, ".config/gtk-3.0"))
        if self.sandboxed:
            self.execute(f"mkdir -p {dirs}", shell=True, timeout=30)
        else:
            for d in (*HOME_DIRS, ".config/gtk-3.0"):
                (self._home / d).mkdir(parents=True, exist_ok=True)
        self.write_file("~/.config/gtk-3.0/settings.ini", GTK_SETTINGS)
        for path, content in FIRST_RUN_FILES.items():  # the guest's apps open without first-start dialogs
            self.write_file(path, content)
        self._armed = -1
        # near a corner, not in it: pyautogui's fail-safe (which OSWorld's setup commands keep on) fires in a corner
        self._run_code(f"pyautogui.moveTo({self.cfg.width - 2}, {self.cfg.height - 2})", self.cfg.action_timeout_s)

    @property
    def _terminal_logs(self) -> str:
        if self.sandboxed:
            return TERMINAL_LOGS
        assert self.x.runtime_dir is not None
        return str(self.x.runtime_dir / f"terminals-{self._episode}")

    def _arm_session(self) -> None:
        """Tell the action worker about this episode (ctrl+alt+t opens a terminal with the episode's environment);
        again after the worker was restarted."""
        if self._armed == self.actions.restarts:
            return
        resp = self.actions.request(
            {"op": "session", "env": self._task_env(), "terminal_logs": self._terminal_logs},
            timeout=self.cfg.action_timeout_s,
        )
        if not resp.get("ok"):
            log.warning("the terminal hotkey is not available: %s", resp.get("error"))
        self._armed = self.actions.restarts

    def terminal_output(self) -> str | None:
        """What the last terminal opened by ctrl+alt+t shows (its log, control sequences removed); None if none was
        opened this episode. OSWorld's `vm_terminal_output` reads the same from gnome-terminal through AT-SPI."""
        logs = shlex.quote(self._terminal_logs)
        res = self.execute(
            f'f=$(ls -t {logs}/terminal-*.log 2>/dev/null | head -n 1); [ -n "$f" ] && tail -c 262144 "$f"',
            shell=True,
            timeout=10,
        )
        return terminal_text(res.stdout) if res.ok else None

    # ----- Runtime protocol -----
    def exec(self, cmd: str, timeout: float | None = None, *, idempotent: bool = False) -> ExecResult:
        return self.execute(cmd, shell=True, timeout=timeout)

    def read_file(self, path: str) -> bytes:
        """A file of the desktop (in the sandbox: read as its user, inside: a link cannot lead out)."""
        self._check_open()
        return self.place.read_bytes(self.resolve(path))

    def write_file(self, path: str, data: bytes | str) -> None:
        self._check_open()
        self.place.write_bytes(self.resolve(path), data.encode() if isinstance(data, str) else bytes(data))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop()

    # ----- DesktopRuntime -----
    def screenshot(self) -> np.ndarray:
        from PIL import ImageGrab

        self._check_open()
        try:
            if self.sandboxed:
                return self.place.screenshot(self.cfg.width, self.cfg.height)
            img = ImageGrab.grab(xdisplay=self.x.display)
        except OSError as exc:
            raise DesktopError(f"screenshot of {self.x.display} failed: {exc}") from exc
        return np.asarray(img.convert("RGB") if img.mode != "RGB" else img)

    def a11y_tree(self) -> str:
        """OSWorld's accessibility XML of the whole desktop. Raises DesktopError when no tree is available."""
        self._check_open()
        if self._a11y is None:
            raise DesktopError(
                "the accessibility tree is not available on this desktop (accessibility is off or "
                "no Python with PyGObject/Atspi was found)"
            )
        try:
            resp = self._a11y.request({"op": "tree"}, timeout=self.cfg.a11y_timeout_s)
        except WorkerError as exc:
            raise DesktopError(f"accessibility tree: {exc}") from exc
        if not resp.get("ok"):
            raise DesktopError(f"accessibility tree: {resp.get('error')}")
        return resp["xml"]

    def act(self, action: str | dict[str, Any] | ParsedAction, timeout: float | None = None) -> ExecResult:
        """Run one GUI action (pyautogui code or a computer_13 dict). WAIT/DONE/FAIL do nothing here (the env gives
        them meaning). Raises ActionParseError for an action that cannot run; everything else is an ExecResult."""
        parsed = action if isinstance(action, ParsedAction) else parse_action(action)
        if parsed.kind == "special":
            return ExecResult(0, "", "")
        return self._run_code(parsed.code, timeout or self.cfg.action_timeout_s)

    def _run_code(self, code: str, timeout: float) -> ExecResult:
        self._check_open()
        try:
            self._arm_session()
            resp = self.actions.request({"op": "code", "code": code, "timeout": timeout}, timeout=timeout + 5.0)
        except WorkerTimeout as exc:
            return ExecResult(1, "", f"{exc}; the action worker was restarted", timed_out=True)
        except WorkerError as exc:
            return ExecResult(1, "", str(exc))
        if resp.get("ok"):
            return ExecResult(0, resp.get("stdout", ""), "")
        return ExecResult(
            1, resp.get("stdout", ""), resp.get("error", "the action failed"), timed_out=bool(resp.get("timed_out"))
        )

    # ----- OSWorld guest operations -----
    def resolve(self, path: str) -> str:
        """A guest path as OSWorld's server reads it: `~` is the episode HOME, relative paths are under HOME."""
        p = os.path.expandvars(path)
        if p == "~" or p.startswith("~/"):
            p = self.home + p[1:]
        return p if os.path.isabs(p) else os.path.join(self.home, p)

    def _argv(self, command: str | Sequence[str], shell: bool) -> str | list[str]:
        if shell:
            return command if isinstance(command, str) else " ".join(command)
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        return [self.home + a[1:] if a.startswith("~/") else a for a in argv]  # as OSWorld's server expands them

    def execute(self, command: str | Sequence[str], shell: bool = False, timeout: float | None = None) -> ExecResult:
        """Run a command to completion in the episode's environment (OSWorld's `/execute`)."""
        self._check_open()
        argv = self._argv(command, shell)
        if not argv:
            return ExecResult(1, "", "empty command")
        timeout = timeout or self.cfg.exec_timeout_s
        wrapped, cwd = self.place.argv(argv, cwd=self.home)
        try:
            proc = subprocess.Popen(
                wrapped,
                shell=shell and not self.sandboxed,  # the sandbox runs a string command with its own /bin/sh
                env=self._task_env(),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            return ExecResult(127, "", f"{type(exc).__name__}: {exc}")
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _killpg(proc.pid)
            out, err = proc.communicate()
        cap = self.cfg.max_output_bytes
        truncated = len(out) > cap or len(err) > cap
        return ExecResult(
            proc.returncode if proc.returncode >= 0 else 128 - proc.returncode,
            out[:cap].decode(errors="replace"),
            err[:cap].decode(errors="replace"),
            timed_out,
            truncated,
        )

    def launch(self, command: str | Sequence[str], shell: bool = False) -> None:
        """Start a process in the background (OSWorld's `/setup/launch`); it lives until the episode ends."""
        self._check_open()
        argv = self._argv(command, shell)
        wrapped, cwd = self.place.argv(argv, cwd=self.home)
        assert self.x.runtime_dir is not None
        with (self.x.runtime_dir / "launched.log").open("ab") as out:
            self._launched.append(
                spawn(
                    f"launch {argv!r}",
                    wrapped,
                    shell=shell and not self.sandboxed,
                    env=self._task_env(),
                    cwd=cwd,
                    stdout=out,
                    stderr=out,
                )
            )

    def open_path(self, path: str, timeout: float = 10.0) -> None:
        """Open a file or directory with its default app and wait for a window named after it (`/setup/open_file`)."""
        target = self.resolve(path)
        path_env = self._task_env().get("PATH", "")
        found = self.place.exists(target)
        if found is None:
            if self.place.which(path, path_env):
                self.launch([path])
                return
            raise FileNotFoundError(f"open: {path} does not exist on the desktop")
        # a configured opener first: what the machine's xdg-open would pick depends on what happens to be installed
        kind = "dir" if found == "dir" else "text"
        if kind in self.cfg.open_with:
            self.launch([*self.cfg.open_with[kind], target])
        elif self.place.which("xdg-open", path_env):
            self.launch(["xdg-open", target])
        else:
            raise DesktopError(f"open: no opener configured for a {kind} (DesktopConfig.open_with) and no xdg-open")
        name = os.path.basename(target.rstrip("/"))
        candidates = [name, os.path.splitext(name)[0]]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(c and c in w.title for w in self.windows() for c in candidates):
                return
            time.sleep(0.05)
        raise DesktopError(f"open: no window for {name!r} appeared within {timeout:.0f} s")

    def windows(self) -> list[WindowInfo]:
        self._check_open()
        try:
            resp = self.actions.request({"op": "windows"}, timeout=self.cfg.action_timeout_s)
        except WorkerError as exc:
            raise DesktopError(f"window list: {exc}") from exc
        if not resp.get("ok"):
            raise DesktopError(f"window list: {resp.get('error')}")
        return [WindowInfo(**w) for w in resp["windows"]]

    def find_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> WindowInfo | None:
        """wmctrl's matching: a case-insensitive substring of the title (or WM_CLASS), or the exact string if strict."""
        for w in self.windows():
            names = w.wm_class if by_class else [w.title]
            for n in names:
                if (n == window_name) if strict else (window_name.lower() in n.lower()):
                    return w
        return None

    def activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool:
        w = self.find_window(window_name, strict, by_class)
        if w is None:
            return False
        # with a WM, ask it (it restacks and focuses); without one, raise and focus the window ourselves
        steps = (
            ["windowactivate", "--sync", str(w.id)]
            if self.cfg.window_manager
            else ["windowraise", str(w.id), "windowfocus", "--sync", str(w.id)]
        )
        return self.execute(["xdotool", *steps], timeout=10).ok

    def close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool:
        w = self.find_window(window_name, strict, by_class)
        if w is None:
            return False
        if self.cfg.window_manager and shutil.which("wmctrl"):
            return self.execute(["wmctrl", "-i", "-c", hex(w.id)], timeout=10).ok
        return self.execute(["xdotool", "windowclose", str(w.id)], timeout=10).ok

    def screen_size(self) -> tuple[int, int]:
        return self.cfg.width, self.cfg.height

    # ----- bookkeeping -----
    def pids(self) -> list[int]:
        return self.x.pids()

    def memory_kib(self) -> int:
        """Proportional memory of every process of this desktop (X server, buses, workers, apps)."""
        return process_tree_pss_kib(self.pids())

    def _check_open(self) -> None:
        if self._closed:
            raise DesktopError("the desktop is closed")
        if not self.x.alive():
            if self.place is not None and not self.place.alive():
                raise DesktopError(f"the sandbox of {self.x.display} is gone; see {self.x.runtime_dir}/sandbox.log")
            raise DesktopError(f"the X server of {self.x.display} died; see {self.x.runtime_dir}/xvfb.log")

    def __enter__(self) -> LocalDesktop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def terminal_text(raw: str) -> str:
    """A terminal log as text: escape sequences dropped, CR LF as LF, backspaces applied."""
    text = _CONTROL.sub("", raw).replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    for ch in text:
        if ch == "\b":
            if out and out[-1] != "\n":
                out.pop()
        elif ch == "\x07":
            continue
        else:
            out.append(ch)
    return "".join(out)


def _shutdown(x: XSession, workers: list[JsonWorker | None], launched: list[OwnedProcess]) -> None:
    if x.place is not None and x.place.sandboxed:
        x.place.close()  # everything inside ends at once; what follows only reaps the host-side helpers
    for p in launched:
        p.stop(grace_s=0.3)
    for w in workers:
        if w is not None:
            w.close()
    x.stop()


def _killpg(pgid: int) -> None:
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


__all__ = [
    "ActionParseError",
    "DesktopConfig",
    "DesktopError",
    "GuestDesktop",
    "LocalDesktop",
    "WindowInfo",
    "find_gi_python",
]
