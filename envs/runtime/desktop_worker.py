"""The action worker: one long-lived process per X display that runs pyautogui code and lists windows.

pyautogui binds to `DISPLAY` when it is imported, so a display needs its own interpreter; keeping that interpreter alive
saves the ~170 ms that OSWorld's `python -c "import pyautogui; ..."` pays on every action. This file runs as a script
(`python desktop_worker.py`, with only the standard library, pyautogui and python-xlib), so the same file serves the
local runtime and the guest server inside a container.

Protocol: one JSON object per line on stdin, one answer per line on the original stdout (fd 1 is pointed at /dev/null
so prints from native code cannot corrupt the stream; `print` in action code is captured and returned).
  {"op": "code", "code": "...", "timeout": 10}  -> {"ok": true, "stdout": "..."} | {"ok": false, "error": "..."}
  {"op": "windows"}                            -> {"ok": true, "windows": [{id, title, wm_class, x, y, w, h, focused}]}
  {"op": "ping"}                               -> {"ok": true, "pid": ...}
  {"op": "session", "env": {...}, "terminal_logs": DIR} -> {"ok": true}: from now on ctrl+alt+t opens a terminal, as
      on OSWorld's Ubuntu: an xterm titled "Terminal" with `env`, its output logged under DIR (for the
      `vm_terminal_output` getter), focused once it maps.
The caller validates code before sending it (envs.runtime.actions); the restricted namespace here is a second guard.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import signal
import sys
import traceback

ALLOWED_MODULES = ("pyautogui", "time")
SAFE_BUILTINS = (
    "abs",
    "all",
    "any",
    "bool",
    "dict",
    "enumerate",
    "float",
    "int",
    "len",
    "list",
    "max",
    "min",
    "print",
    "range",
    "reversed",
    "round",
    "sorted",
    "str",
    "sum",
    "tuple",
    "zip",
    "True",
    "False",
    "None",
    "ValueError",
    "Exception",
)


class ActionTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise ActionTimeout("the action ran past its time limit")


def make_namespace(modules: dict) -> dict:
    safe = {name: getattr(builtins, name) for name in SAFE_BUILTINS}

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        root = name.split(".")[0]
        if root not in ALLOWED_MODULES:
            raise ImportError(f"only {', '.join(ALLOWED_MODULES)} can be imported in an action (got {name!r})")
        return modules[root]

    safe["__import__"] = guarded_import
    return {"__builtins__": safe, **modules}


def run_code(code: str, timeout: float, modules: dict) -> dict:
    out = io.StringIO()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<action>", "exec"), make_namespace(modules))
        return {"ok": True, "stdout": out.getvalue()}
    except ActionTimeout as exc:
        return {"ok": False, "timed_out": True, "error": str(exc), "stdout": out.getvalue()}
    except BaseException as exc:  # the action's own error is an observation, never a crash of the worker
        tb = traceback.format_exception_only(type(exc), exc)
        return {"ok": False, "error": "".join(tb).strip(), "stdout": out.getvalue()}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class WindowLister:
    """Top-level windows of the display: the WM's client list when a WM runs, else the viewable children of root."""

    def __init__(self):
        from Xlib import X, display

        self.X = X
        self.d = display.Display()
        self.root = self.d.screen().root
        self.client_list = self.d.intern_atom("_NET_CLIENT_LIST")
        self.net_wm_name = self.d.intern_atom("_NET_WM_NAME")
        self.utf8 = self.d.intern_atom("UTF8_STRING")
        self.wm_state = self.d.intern_atom("WM_STATE")

    def list(self) -> list[dict]:
        from Xlib import error as xerror

        X = self.X
        wins = []
        prop = self.root.get_full_property(self.client_list, X.AnyPropertyType)
        if prop is not None and len(prop.value):
            candidates = [self.d.create_resource_object("window", int(i)) for i in prop.value]
        else:
            candidates = list(self.root.query_tree().children)
        try:
            focus = self.d.get_input_focus().focus
            focus_id = focus.id if hasattr(focus, "id") else 0
        except xerror.XError:
            focus_id = 0
        for w in candidates:
            try:
                attrs = w.get_attributes()
                if attrs.map_state != X.IsViewable:
                    continue
                geom = w.get_geometry()
                if geom.width <= 1 or geom.height <= 1:
                    continue
                pos = self.root.translate_coords(w, 0, 0)
                title = self._name(w)
                if not title and attrs.override_redirect:
                    continue  # unnamed popups and tooltips
                wm_class = w.get_wm_class() or ()
                wins.append(
                    {
                        "id": w.id,
                        "title": title,
                        "wm_class": list(wm_class),
                        "x": int(pos.x),
                        "y": int(pos.y),
                        "w": int(geom.width),
                        "h": int(geom.height),
                        "focused": self._contains(w, focus_id),
                    }
                )
            except xerror.XError:
                continue  # the window went away while we looked at it
        self.d.flush()
        return wins

    def _name(self, w) -> str:
        prop = w.get_full_property(self.net_wm_name, self.utf8)
        if prop is not None and prop.value:
            value = prop.value
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        name = w.get_wm_name()
        if isinstance(name, bytes):
            return name.decode("latin-1")
        return name or ""

    def _contains(self, w, focus_id: int) -> bool:
        if not focus_id:
            return False
        if w.id == focus_id:
            return True
        try:
            tree = self.d.create_resource_object("window", focus_id).query_tree()
            while tree.parent and tree.parent.id != self.root.id:
                if tree.parent.id == w.id:
                    return True
                tree = tree.parent.query_tree()
        except Exception:
            return False
        return False


TERMINAL_ARGV = ["xterm", "-T", "Terminal", "-xrm", "XTerm*allowTitleOps: false"]


class TerminalHotkey:
    """ctrl+alt+t -> a new terminal (a thread with its own X connection and a passive grab on the root window)."""

    def __init__(self):
        import threading

        from Xlib import XK, X, display

        self.X = X
        self.d = display.Display()
        self.root = self.d.screen().root
        self.pid_atom = self.d.intern_atom("_NET_WM_PID")
        code = self.d.keysym_to_keycode(XK.string_to_keysym("t"))
        for extra in (0, X.LockMask, X.Mod2Mask, X.LockMask | X.Mod2Mask):  # whatever Caps and Num Lock are
            self.root.grab_key(code, X.ControlMask | X.Mod1Mask | extra, True, X.GrabModeAsync, X.GrabModeAsync)
        self.d.sync()
        self.env: dict = dict(os.environ)
        self.logs = "/tmp"
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        import subprocess

        while True:
            ev = self.d.next_event()
            if ev.type != self.X.KeyPress:
                continue
            log = os.path.join(self.logs, f"terminal-{time_ns()}.log")
            try:
                proc = subprocess.Popen([*TERMINAL_ARGV, "-l", "-lf", log], env=self.env, cwd=self.env.get("HOME"),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError:
                continue
            self._focus(proc.pid)

    def _focus(self, pid: int, timeout: float = 5.0) -> None:
        # without a window manager nobody gives the new window the keyboard: the pointer's window would get it
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for w in self.root.query_tree().children:
                try:
                    prop = w.get_full_property(self.pid_atom, self.X.AnyPropertyType)
                    if prop is not None and prop.value and int(prop.value[0]) == pid:
                        if w.get_attributes().map_state == self.X.IsViewable:
                            w.set_input_focus(self.X.RevertToParent, self.X.CurrentTime)
                            self.d.sync()
                            return
                except Exception:
                    continue
            time.sleep(0.05)


def time_ns() -> int:
    import time

    return time.time_ns()


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        import time as time_module

        import pyautogui
    except Exception as exc:  # e.g. no DISPLAY, or pyautogui missing in this interpreter
        proto.write(json.dumps({"ok": False, "fatal": True, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 2
    pyautogui.FAILSAFE = False  # the pointer in a corner is a normal state on a virtual screen
    pyautogui.PAUSE = float(os.environ.get("NEXTSTATE_PYAUTOGUI_PAUSE", "0"))
    modules = {"pyautogui": pyautogui, "time": time_module}
    lister = None
    hotkey = None
    proto.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "code":
                resp = run_code(str(req["code"]), float(req.get("timeout", 10.0)), modules)
            elif op == "windows":
                if lister is None:
                    lister = WindowLister()
                resp = {"ok": True, "windows": lister.list()}
            elif op == "ping":
                resp = {"ok": True, "pid": os.getpid()}
            elif op == "session":
                if hotkey is None:
                    hotkey = TerminalHotkey()
                hotkey.env = {str(k): str(v) for k, v in dict(req.get("env") or {}).items()}
                hotkey.logs = str(req.get("terminal_logs") or "/tmp")
                os.makedirs(hotkey.logs, exist_ok=True)
                resp = {"ok": True}
            else:
                resp = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as exc:
            resp = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(resp) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
