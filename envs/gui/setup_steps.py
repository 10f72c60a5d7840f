"""OSWorld's task setup steps (`config`, and the evaluator's `postconfig`), against any GuestDesktop.

Each step is `{"type": T, "parameters": {...}}`. Supported types, with OSWorld's parameters:
  launch {command, shell}               start in the background
  execute / command {command, shell, stdout, stderr, until}   run to completion; `until` repeats it until
                                        {returncode | stdout | stderr} matches (at most `max_tries`, default 50)
  execute_with_verification {command, shell, verification: {window_exists, command_success}, max_wait_time,
                                        check_interval}
  sleep {seconds}
  open {path}                           open a file/folder with its default app and wait for its window
  download {files: [{url, path}]}       copy a file onto the desktop (file://, local or task-relative path, http(s))
  upload_file {files: [{local_path, path}]}
  activate_window / close_window {window_name, strict, by_class}
  chrome_open_tabs {urls_to_open} / chrome_close_tabs {urls_to_close}   through the browser's DevTools HTTP endpoint
  update_browse_history {history: [{url, title, visit_time_from_now_in_seconds}]}   rows added to OSWorld's empty
                                        History database (a task file: from $NEXTSTATE_OSWORLD_FILES or the web),
                                        written as the Chrome and the Chromium profile's History
A `launch` or `execute` of an app (APP_PROGRAMS) the desktop's guest root lacks fails with a one-line reason naming it
(VS Code's `code` is not a Debian package: `env.guest_packages` adds it to the guest to run the vs_code tasks);
`google-chrome` runs as Debian's `chromium` where only that is installed.
Commands may use OSWorld's placeholders {CLIENT_PASSWORD}, {SCREEN_WIDTH}, {SCREEN_HEIGHT}, {SCREEN_WIDTH_HALF},
{SCREEN_HEIGHT_HALF}. Cloud-drive, login, proxy and wallpaper steps are not supported and fail with a clear error.
"""

from __future__ import annotations

import itertools
import logging
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from envs.gui.browser_getters import CHROME_PROFILES, devtools, open_tab
from envs.gui.getters import fetch_source
from envs.runtime.app_profiles import CHROME_DIR
from envs.runtime.desktop import GuestDesktop

log = logging.getLogger(__name__)

UNSUPPORTED = (
    "googledrive",
    "login",
    "proxy",
    "change_wallpaper",
    "tidy_desktop",
    "act",
    "replay",
)


class SetupError(RuntimeError):
    """A setup step failed; the message names the step."""


@dataclass
class SetupContext:
    desktop: GuestDesktop
    cache_dir: Path
    files_dir: Path | None = None
    client_password: str = "password"
    open_timeout_s: float = 15.0


def _placeholders(command: Any, ctx: SetupContext) -> Any:
    w, h = ctx.desktop.screen_size()
    subs = {
        "{CLIENT_PASSWORD}": ctx.client_password,
        "{SCREEN_WIDTH_HALF}": str(w // 2),
        "{SCREEN_HEIGHT_HALF}": str(h // 2),
        "{SCREEN_WIDTH}": str(w),
        "{SCREEN_HEIGHT}": str(h),
    }

    def one(s: str) -> str:
        for k, v in subs.items():
            s = s.replace(k, v)
        return s

    return one(command) if isinstance(command, str) else [one(str(c)) for c in command]


# the applications OSWorld's domains start; a task starting one the guest root lacks is refused in one line
APP_PROGRAMS = ("code", "libreoffice", "soffice", "gimp", "vlc", "thunderbird", "google-chrome", "chromium",
                "chromium-browser")


# Google Chrome is not a Debian package; Debian's Chromium takes the same flags and DevTools port (OSWorld itself runs
# `chromium` where Chrome does not exist, on arm). As a stand-in it runs on Chrome's profile directory (the one the
# tasks' setups edit and the getters read first), and `pkill chrome` / `killall chrome` (Chrome's process name, which
# OSWorld's postconfigs use to make Chrome write its profile out) stop it by its own name.
STAND_INS = {"google-chrome": "chromium"}
STAND_IN_ARGS = {"google-chrome": ("--user-data-dir={home}/" + CHROME_DIR,)}
STAND_IN_PROCESSES = {"google-chrome": ("chrome", "chromium")}  # the app: (its process name, its stand-in's)
KILLERS = ("pkill", "killall")
STAND_IN_WINDOWS = {"Google Chrome": "Chromium"}  # activate_window / close_window: Chrome's title, its stand-in's

# the title of each app's main window once it is ready (LibreOffice's depends on its arguments: see _app_window)
APP_WINDOWS = {
    "gimp": r"GNU Image Manipulation Program$|GIMP$",  # not its splash, "GIMP Startup"
    "vlc": r"VLC media player$",
    "thunderbird": r"Thunderbird$",
    "chromium": r"Chromium$",
    "chromium-browser": r"Chromium$",
    "google-chrome": r"Google Chrome$",
    "code": r"Visual Studio Code$",
}
LIBREOFFICE_MODULES = ("--calc", "--writer", "--impress", "--draw", "--math", "--base", "--web")


def _installed(ctx: SetupContext, prog: str) -> bool:
    return ctx.desktop.execute(["sh", "-c", 'command -v "$1" >/dev/null', "sh", prog], timeout=10).exit_code == 0


def _words(command: Any, shell: bool) -> list[str]:
    """The words of a command (in a shell line: after any VAR=value assignments; [] when it does not parse)."""
    if shell:
        try:  # `;`, `&`, `|` are words of their own
            lexer = shlex.shlex(command if isinstance(command, str) else " ".join(map(str, command)), posix=True,
                                punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:
            return []
        return list(itertools.dropwhile(lambda w: re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w), words))
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def program_of(command: Any, shell: bool) -> str:
    """The program a command starts (in a shell line: its first word after any VAR=value assignments)."""
    words = _words(command, shell)
    return words[0] if words else ""


def not_installed(prog: str) -> str:
    """The one-line reason for an app the desktop's guest root lacks, naming it."""
    stand_in = STAND_INS.get(prog)
    hint = (" (VS Code is not a Debian package: add it with env.guest_packages=[/path/to/code_<version>_amd64.deb], or "
            "env.guest_packages=[code] and env.guest_apt_sources=[<Microsoft's apt line>] on a connected machine)"
            if prog == "code" else f" (nor is {stand_in!r})" if stand_in else "")
    return f"{prog!r} is not installed in the desktop's guest root{hint}"


def _swap_word(command: Any, shell: bool, old: str, new: list[str]) -> Any:
    """The command with its first word `old` (a program, or a killer's target) replaced by the words `new`."""
    if shell:
        line = command if isinstance(command, str) else " ".join(map(str, command))
        return re.sub(rf"(?<![\w/.-]){re.escape(old)}(?![\w.-])", lambda _: " ".join(map(shlex.quote, new)), line,
                      count=1)
    argv = command.split() if isinstance(command, str) else list(command)
    i = argv.index(old)
    return [*argv[:i], *new, *argv[i + 1:]]


def _require_program(ctx: SetupContext, command: Any, shell: bool) -> Any:
    """The command, its app replaced by a stand-in where the guest has only that; refused in one line when the app
    is not in the guest at all (else it would fail silently, later)."""
    prog = program_of(command, shell)
    if prog in KILLERS:
        return _kill_stand_in(ctx, command, shell)
    if prog not in APP_PROGRAMS or _installed(ctx, prog):
        return command
    stand_in = STAND_INS.get(prog)
    if stand_in is not None and _installed(ctx, stand_in):
        extra = [a.format(home=ctx.desktop.home) for a in STAND_IN_ARGS.get(prog, ())]
        return _swap_word(command, shell, prog, [stand_in, *extra])
    raise SetupError(not_installed(prog))


def _kill_stand_in(ctx: SetupContext, command: Any, shell: bool) -> Any:
    """`pkill chrome`: Chromium's process name where Chromium stands in for Chrome."""
    target = next((w for w in _words(command, shell)[1:] if not w.startswith("-")), None)
    for app, (name, stand_in_name) in STAND_IN_PROCESSES.items():
        if target == name and not _installed(ctx, app) and _installed(ctx, STAND_INS[app]):
            return _swap_word(command, shell, name, [stand_in_name])
    return command


def _launch(ctx: SetupContext, command: Any, shell: bool = False) -> None:
    if not command:
        raise ValueError("empty command to launch")
    if not shell and isinstance(command, str) and len(command.split()) > 1:
        command = command.split()  # OSWorld splits a string command on spaces when shell is false
    command = _require_program(ctx, command, shell)
    ctx.desktop.launch(_placeholders(command, ctx), shell=shell)
    _wait_for_app_window(ctx, _words(command, shell))


def _app_window(words: Sequence[str]) -> str | None:
    """A pattern for the main window's title of the app a command starts (None: not one of OSWorld's apps)."""
    words = list(itertools.takewhile(lambda w: not re.fullmatch(r"[;&|<>()]+", w), words))  # the first command
    prog = words[0].rsplit("/", 1)[-1] if words else ""
    if prog in ("libreoffice", "soffice"):
        # a module or a file: its document window, or the import dialog a CSV file opens on (the splash is called
        # "LibreOffice", like the start centre)
        document = any(not w.startswith("-") or w in LIBREOFFICE_MODULES for w in words[1:])
        return r" - LibreOffice \w+$|^Text Import - " if document else r"^LibreOffice$"
    return APP_WINDOWS.get(prog)


def _wait_for_app_window(ctx: SetupContext, words: Sequence[str]) -> None:
    """Wait until a started app shows its main window, as OSWorld's VM has by the time its agent looks (its runner
    waits a minute after setup); a splash screen or an app still loading is not ready. An app that shows none within
    `open_timeout_s` is logged and left to the task, as OSWorld does."""
    pattern = _app_window(words)
    if pattern is None:
        return
    deadline = time.monotonic() + ctx.open_timeout_s
    while not any(re.search(pattern, w.title) for w in ctx.desktop.windows()):
        if time.monotonic() >= deadline:
            log.warning("launch: no window of %r (title matching %r) within %.0f s", words[0], pattern,
                        ctx.open_timeout_s)
            return
        time.sleep(0.1)


def _execute(
    ctx: SetupContext,
    command: Any,
    shell: bool = False,
    stdout: str = "",
    stderr: str = "",
    until: dict[str, Any] | None = None,
    max_tries: int = 50,
) -> None:
    if not command:
        raise ValueError("empty command to execute")
    command = _require_program(ctx, _placeholders(command, ctx), shell)
    until = until or {}
    for _ in range(max_tries if until else 1):
        res = ctx.desktop.execute(command, shell=shell)
        if stdout:
            (ctx.cache_dir / stdout).write_text(res.stdout)
        if stderr:
            (ctx.cache_dir / stderr).write_text(res.stderr)
        if res.exit_code != 0:
            log.info("setup command %r exited %d: %s", command, res.exit_code, res.stderr.strip()[-300:])
        if (
            not until
            or ("returncode" in until and res.exit_code == until["returncode"])
            or ("stdout" in until and until["stdout"] in res.stdout)
            or ("stderr" in until and until["stderr"] in res.stderr)
        ):
            return
        time.sleep(0.3)
    raise SetupError(f"execute: {command!r} never met its 'until' condition {until} in {max_tries} tries")


def _execute_with_verification(
    ctx: SetupContext,
    command: Any,
    verification: dict[str, Any] | None = None,
    max_wait_time: float = 10,
    check_interval: float = 1.0,
    shell: bool = False,
) -> None:
    ctx.desktop.execute(_placeholders(command, ctx), shell=shell)
    verification = verification or {}
    deadline = time.monotonic() + float(max_wait_time)
    while True:
        ok = True
        if "window_exists" in verification:
            name = str(verification["window_exists"]).lower()
            ok = any(name in w.title.lower() for w in ctx.desktop.windows())
        if ok and "command_success" in verification:
            ok = ctx.desktop.execute(verification["command_success"], shell=True, timeout=5).exit_code == 0
        if ok:
            return
        if time.monotonic() >= deadline:
            raise SetupError(f"execute_with_verification: {verification} did not hold within {max_wait_time} s")
        time.sleep(min(float(check_interval), 0.2))


def _sleep(ctx: SetupContext, seconds: float) -> None:
    time.sleep(float(seconds))


def _open(ctx: SetupContext, path: str) -> None:
    if not path:
        raise ValueError("open: no path")
    ctx.desktop.open_path(path, timeout=ctx.open_timeout_s)


def _download(ctx: SetupContext, files: Sequence[dict[str, str]]) -> None:
    for f in files:
        url, path = f.get("url"), f.get("path")
        if not url or not path:
            raise ValueError(f"download: each file needs 'url' and 'path', got {f}")
        ctx.desktop.write_file(path, fetch_source(url, ctx.files_dir, ctx.cache_dir))


def _upload_file(ctx: SetupContext, files: Sequence[dict[str, str]]) -> None:
    for f in files:
        local = Path(f["local_path"])
        if not local.is_absolute() and ctx.files_dir is not None:
            local = ctx.files_dir / local
        ctx.desktop.write_file(f["path"], local.read_bytes())


def _find_name(ctx: SetupContext, window_name: str, strict: bool, by_class: bool) -> str:
    """The window name to use: Chrome's is its stand-in's where no window has Chrome's own."""
    stand_in = STAND_IN_WINDOWS.get(window_name)
    finder = getattr(ctx.desktop, "find_window", None)
    if stand_in is None or by_class or finder is None or finder(window_name, strict, by_class) is not None:
        return window_name
    return stand_in if finder(stand_in, False, False) is not None else window_name


def _activate_window(ctx: SetupContext, window_name: str, strict: bool = False, by_class: bool = False) -> None:
    window_name = _find_name(ctx, window_name, strict, by_class)
    if not ctx.desktop.activate_window(window_name, strict=strict, by_class=by_class):
        log.info("activate_window: no window matches %r", window_name)  # OSWorld logs and goes on


def _close_window(ctx: SetupContext, window_name: str, strict: bool = False, by_class: bool = False) -> None:
    window_name = _find_name(ctx, window_name, strict, by_class)
    if not ctx.desktop.close_window(window_name, strict=strict, by_class=by_class):
        log.info("close_window: no window matches %r", window_name)


def _chrome_open_tabs(ctx: SetupContext, urls_to_open: Sequence[str]) -> None:
    for url in urls_to_open:
        open_tab(_eval_view(ctx), url)


def _chrome_close_tabs(ctx: SetupContext, urls_to_close: Sequence[str]) -> None:
    view = _eval_view(ctx)
    for tab in devtools(view, "/json/list"):
        if tab.get("type") == "page" and tab.get("url") in urls_to_close:
            devtools(view, f"/json/close/{tab['id']}")


# OSWorld's empty Chrome History database, which the step fills (a task file like any other: mirrored or fetched)
HISTORY_TEMPLATE_URL = ("https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/chrome/"
                        "44ee5668-ecd5-4366-a6ce-c1c9b8d4e938/history_empty.sqlite?download=true")
CHROME_EPOCH = datetime(1601, 1, 1)  # Chrome's timestamps: microseconds since 1601


def _update_browse_history(ctx: SetupContext, history: Sequence[dict[str, Any]]) -> None:
    import sqlite3

    db = ctx.cache_dir / "History"
    db.write_bytes(fetch_source(HISTORY_TEMPLATE_URL, ctx.files_dir, ctx.cache_dir))
    with sqlite3.connect(db) as conn:
        for item in history:
            when = datetime.now() - timedelta(seconds=float(item["visit_time_from_now_in_seconds"]))
            stamp = int((when - CHROME_EPOCH).total_seconds() * 1_000_000)
            cur = conn.execute("INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden) "
                               "VALUES (?, ?, 1, 0, ?, 0)", (item["url"], item["title"], stamp))
            # 805306368: a link visit that starts and ends a redirect chain, as OSWorld records it
            conn.execute("INSERT INTO visits (url, visit_time, from_visit, transition, segment_id, visit_duration) "
                         "VALUES (?, ?, 0, 805306368, 0, 0)", (cur.lastrowid, stamp))
    for profile in CHROME_PROFILES:
        ctx.desktop.write_file(f"{profile}/History", db.read_bytes())


def _eval_view(ctx: SetupContext) -> Any:
    from envs.gui.getters import EvalContext

    return EvalContext(ctx.desktop, ctx.cache_dir, ctx.files_dir, ctx.client_password)


STEPS: dict[str, Callable[..., None]] = {
    "chrome_open_tabs": _chrome_open_tabs,
    "chrome_close_tabs": _chrome_close_tabs,
    "update_browse_history": _update_browse_history,
    "launch": _launch,
    "execute": _execute,
    "command": _execute,
    "execute_with_verification": _execute_with_verification,
    "sleep": _sleep,
    "open": _open,
    "download": _download,
    "upload_file": _upload_file,
    "activate_window": _activate_window,
    "close_window": _close_window,
}


def check_steps(steps: Any, where: str = "config") -> None:
    """Raise ValueError for a malformed or unsupported step list (at task load time, before any desktop exists)."""
    if steps is None:
        return
    if not isinstance(steps, list):
        raise ValueError(f"{where} must be a list of steps, got {type(steps).__name__}")
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or "type" not in step:
            raise ValueError(f"{where}[{i}] must be an object with a 'type', got {step!r}")
        t = step["type"]
        if t in UNSUPPORTED:
            raise ValueError(f"{where}[{i}]: setup step {t!r} is not supported by NextState's desktops")
        if t not in STEPS:
            raise ValueError(f"{where}[{i}]: unknown setup step {t!r}; supported: {', '.join(sorted(STEPS))}")
        if not isinstance(step.get("parameters", {}), dict):
            raise ValueError(f"{where}[{i}]: 'parameters' must be an object")


def run_steps(steps: Sequence[dict[str, Any]], ctx: SetupContext) -> None:
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    for i, step in enumerate(steps):
        t = step.get("type")
        fn = STEPS.get(t)
        if fn is None:
            raise SetupError(f"setup step {i + 1} ({t!r}) is not supported")
        try:
            fn(ctx, **(step.get("parameters") or {}))
        except SetupError:
            raise
        except Exception as exc:
            raise SetupError(f"setup step {i + 1} ({t}) failed: {type(exc).__name__}: {exc}") from exc
