"""One X session: an Xvfb display, a private D-Bus session bus, the AT-SPI bus, and (optionally) a window manager,
started in a place (`envs.runtime.desktop_place`: the desktop's sandbox, or this machine), which the session owns.

Order matters for accessibility: `DISPLAY` must be set before the session bus starts, and `at-spi-bus-launcher` must run
before any app, or GTK apps never register with the accessibility registry. Every process carries the session's marker
(`NEXTSTATE_DESKTOP=<id>`) so `stop()` also finds what D-Bus activated or what escaped its process group.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from envs.runtime.desktop_place import HostPlace, SandboxPlace, host_runtime_dir
from envs.runtime.owned import OwnedProcess, kill_marked, spawn, start_watchdog

log = logging.getLogger(__name__)

MARKER = "NEXTSTATE_DESKTOP"
AT_SPI_LAUNCHERS = ("/usr/libexec/at-spi-bus-launcher", "/usr/lib/at-spi2-core/at-spi-bus-launcher")
WINDOW_MANAGERS = {"openbox": ["openbox", "--sm-disable"]}


class DesktopError(RuntimeError):
    """A desktop component failed to start or answer."""


@dataclass
class XSessionConfig:
    width: int = 1280
    height: int = 800
    depth: int = 24
    accessibility: bool = True  # start a session bus and the AT-SPI bus (needed for the a11y tree of GTK apps)
    window_manager: str | None = None  # None (windows stay where apps put them) or "openbox"
    start_timeout_s: float = 15.0


@dataclass
class XSession:
    """Start with `XSession.start(cfg)`; `env` is what every client process of this display needs."""

    cfg: XSessionConfig
    session_id: str
    display: str = ""
    env: dict[str, str] = field(default_factory=dict)
    runtime_dir: Path | None = None  # on the host: logs, and the place's own files (the sandbox's scratch)
    procs: list[OwnedProcess] = field(default_factory=list)
    watchdog: OwnedProcess | None = None
    place: HostPlace | SandboxPlace | None = None

    @classmethod
    def start(
        cls,
        cfg: XSessionConfig | None = None,
        base_env: dict[str, str] | None = None,
        make_place: Callable[[Path], HostPlace | SandboxPlace] | None = None,
    ) -> XSession:
        """`make_place(runtime_dir)` makes the place the session runs in (default: this machine, unsandboxed);
        `base_env` is completed by the place (`place.base_env`)."""
        cfg = cfg or XSessionConfig()
        s = cls(cfg, uuid.uuid4().hex[:12])
        try:
            s._start(base_env or {}, make_place or (lambda d: HostPlace(d, None, None)))
        except BaseException:
            s.stop()
            raise
        return s

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], **kw) -> OwnedProcess:
        assert self.place is not None
        wrapped, cwd = self.place.argv(argv)
        return spawn(name, wrapped, env=env, cwd=cwd, **kw)

    def _probe(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        assert self.place is not None
        wrapped, cwd = self.place.argv(argv)
        return subprocess.run(wrapped, env=env, cwd=cwd, capture_output=True, text=True, timeout=10)

    def _start(self, base_env: dict[str, str], make_place) -> None:
        self.runtime_dir = host_runtime_dir(self.session_id)
        self.watchdog = start_watchdog(MARKER, self.session_id, [str(self.runtime_dir)])
        self.place = make_place(self.runtime_dir)
        exe = self.place.tool("Xvfb")
        if exe is None:
            raise DesktopError("Xvfb not found: apt-get install xvfb (scripts/install.sh installs it)")
        env = self.place.base_env(base_env)
        env[MARKER] = self.session_id
        env["XDG_RUNTIME_DIR"] = self.place.xdg_runtime_dir
        env["XDG_SESSION_TYPE"] = (
            "x11"  # what a desktop session sets; pyautogui/pyscreeze pick their screenshot tool by it
        )
        # -displayfd: the server picks a free display number and writes it once it accepts connections (no races
        # between many desktops starting at once, no polling)
        r, w = os.pipe()
        log_path = self.runtime_dir / "xvfb.log"
        try:
            with log_path.open(
                "wb"
            ) as xlog:  # a file, not a pipe: nobody reads Xvfb's chatter, and a full pipe blocks it
                xvfb = self._spawn(
                    "Xvfb",
                    [
                        exe,
                        "-displayfd",
                        str(w),
                        "-screen",
                        "0",
                        f"{self.cfg.width}x{self.cfg.height}x{self.cfg.depth}",
                        "-extension",
                        "GLX",
                        "-nolisten",
                        "tcp",
                        "-noreset",
                        *self.place.xvfb_args(),
                    ],
                    env=env,
                    pass_fds=(w,),
                    stderr=xlog,
                )
            self.procs.append(xvfb)
            os.close(w)
            w = -1
            number = _read_display_number(r, xvfb, self.cfg.start_timeout_s, log_path)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        self.display = f":{number}"
        env["DISPLAY"] = self.display
        if self.cfg.accessibility:
            env["DBUS_SESSION_BUS_ADDRESS"] = self._start_session_bus(env)
            env["NO_AT_BRIDGE"] = "0"
            env["GTK_A11Y"] = "atspi"
            self._start_at_spi(env)
        self.env = env
        if self.cfg.window_manager:
            self._start_window_manager(env)

    def _start_session_bus(self, env: dict[str, str]) -> str:
        assert self.place is not None
        exe = self.place.tool("dbus-daemon")
        if exe is None:
            raise DesktopError("dbus-daemon not found: apt-get install dbus (needed for the accessibility tree)")
        # in the sandbox the bus is where a logged-in user's is (OSWorld's tasks name unix:path=/run/user/1000/bus)
        address = [f"--address=unix:path={self.place.xdg_runtime_dir}/bus"] if self.place.sandboxed else []
        r, w = os.pipe()
        try:
            bus = self._spawn(
                "dbus-daemon",
                [exe, "--session", *address, "--nofork", "--nopidfile", f"--print-address={w}"],
                env=env,
                pass_fds=(w,),
            )
            self.procs.append(bus)
            os.close(w)
            w = -1
            address = _read_line(r, bus, self.cfg.start_timeout_s, "dbus-daemon", None)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        return address

    def _start_at_spi(self, env: dict[str, str]) -> None:
        assert self.place is not None
        launcher = next((p for p in AT_SPI_LAUNCHERS if self.place.tool(p)), None)
        if launcher is None:
            raise DesktopError("at-spi-bus-launcher not found: apt-get install at-spi2-core")
        self.procs.append(self._spawn("at-spi-bus-launcher", [launcher, "--launch-immediately"], env=env))
        # the launcher registers org.a11y.Bus on the session bus; apps started before that get no a11y tree
        deadline = time.monotonic() + self.cfg.start_timeout_s
        send = self.place.tool("dbus-send")
        while time.monotonic() < deadline:
            probe = (
                self._probe(
                    [send, "--session", "--print-reply", "--dest=org.a11y.Bus", "/org/a11y/bus",
                     "org.a11y.Bus.GetAddress"],
                    env,
                )
                if send
                else None
            )
            if probe is None:
                time.sleep(0.2)  # no way to ask: give it a moment
                return
            if probe.returncode == 0:
                self._enable_a11y(send, env)
                return
            time.sleep(0.02)
        raise DesktopError(f"the AT-SPI bus did not come up within {self.cfg.start_timeout_s:.0f} s")

    def _enable_a11y(self, send: str, env: dict[str, str]) -> None:
        """Turn accessibility on for every toolkit, as GNOME does when its toolkit-accessibility setting is on
        (OSWorld's VM): GTK registers anyway, but Chromium, Firefox/Thunderbird (Gecko) and Electron expose their
        trees only when the bus's org.a11y.Status IsEnabled is true."""
        res = self._probe([send, "--session", "--print-reply", "--dest=org.a11y.Bus", "/org/a11y/bus",
                           "org.freedesktop.DBus.Properties.Set", "string:org.a11y.Status", "string:IsEnabled",
                           "variant:boolean:true"], env)
        if res.returncode != 0:
            log.warning("could not turn on accessibility for all toolkits (org.a11y.Status IsEnabled): %s",
                        res.stderr.strip()[-200:])

    def _start_window_manager(self, env: dict[str, str]) -> None:
        name = self.cfg.window_manager
        if name not in WINDOW_MANAGERS:
            raise DesktopError(f"unknown window manager {name!r}; known: {', '.join(WINDOW_MANAGERS)} (or none)")
        argv = WINDOW_MANAGERS[name]
        assert self.place is not None
        if self.place.tool(argv[0]) is None:
            raise DesktopError(f"{argv[0]} not found: apt-get install {argv[0]}")
        self.procs.append(self._spawn(name, argv, env=env))
        # the WM is up once it owns the _NET_SUPPORTING_WM_CHECK property on the root window
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while time.monotonic() < deadline:
            out = self._probe(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env)
            if "window id" in out.stdout:
                return
            time.sleep(0.05)
        raise DesktopError(f"window manager {name} did not start within {self.cfg.start_timeout_s:.0f} s")

    def alive(self) -> bool:
        return bool(self.procs) and self.procs[0].alive() and self.place is not None and self.place.alive()

    def pids(self) -> list[int]:
        """Every live process of this session (infrastructure, workers, apps): found by its marker, and, in a sandbox,
        everything in its pid namespace (a process cannot shed that)."""
        from envs.runtime.owned import pids_with_marker

        extra = self.place.pids() if self.place is not None else []
        return sorted(set(pids_with_marker(MARKER, self.session_id)) | set(extra))

    def stop(self) -> None:
        if self.place is not None and self.place.sandboxed:
            self.place.close()  # its processes are gone now: the stops below are quick
        for p in reversed(self.procs):
            p.stop(grace_s=1.0)
        self.procs.clear()
        if self.place is not None:
            self.place.close()  # a sandbox: every process inside ends with it
            self.place = None
        kill_marked(MARKER, self.session_id)
        if self.watchdog is not None:
            self.watchdog.stop(grace_s=1.0)  # everything is already stopped: the watchdog has nothing left to do
            self.watchdog = None
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None


def _read_display_number(fd: int, xvfb: OwnedProcess, timeout: float, log_path: Path) -> int:
    text = _read_line(fd, xvfb, timeout, "Xvfb", log_path)
    try:
        return int(text)
    except ValueError:
        raise DesktopError(f"Xvfb wrote {text!r} instead of a display number") from None


def _read_line(fd: int, proc: OwnedProcess, timeout: float, what: str, log_path: Path | None) -> str:
    buf = b""
    deadline = time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise DesktopError(f"{what} did not start within {timeout:.0f} s")
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(fd, 256)
            if not chunk:
                break
            buf += chunk
        elif not proc.alive():
            break
    if not buf.strip():
        err = ""
        if log_path is not None and log_path.exists():
            err = log_path.read_text(errors="replace")[-800:]
        raise DesktopError(f"{what} exited before it was ready (code {proc.popen.poll()}): {err}")
    return buf.decode().strip()
