"""A guest server that speaks OSWorld's VM HTTP API, backed by a LocalDesktop (an Xvfb desktop it owns).

Real OSWorld VMs run such a server (Flask, port 5000) inside the guest OS; this one serves the same routes, request
shapes and response shapes from an Xvfb desktop, so the OSWorld client (`envs.runtime.osworld.OSWorldClient`), and
OSWorld's own controllers, can be exercised for real where VMs cannot run. It is meant to run inside a container
(`envs.runtime.osworld_docker`), reached over a unix socket bind-mounted from the host (the container has no network);
`--host/--port` serves TCP instead.

Routes (OSWorld's): POST /execute and /setup/execute, /setup/execute_with_verification, /setup/launch, GET /screenshot,
GET /accessibility, GET /terminal, POST /file, POST /setup/upload, GET /platform, GET /cursor_position,
POST /screen_size, POST /window_size, POST /desktop_path, POST /list_directory, POST /setup/open_file,
POST /setup/activate_window, POST /setup/close_window, POST /setup/download_file, POST /run_python,
POST /run_bash_script. NextState's additions live under /nextstate/: GET health, GET windows, POST new_session.

    python -m envs.runtime.osworld_server (--uds PATH | --host 127.0.0.1 --port 5000) [--home DIR] [--width W] ...
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PLATFORM = "Linux"


def create_app(desktop: Any):
    """The Flask app serving OSWorld's guest API from `desktop` (a LocalDesktop): its routes by concern, then
    NextState's own under /nextstate/."""
    from flask import Flask

    app = Flask("nextstate-osworld-guest")
    add_command_routes(app, desktop)
    add_script_routes(app, desktop)
    add_observation_routes(app, desktop)
    add_file_routes(app, desktop)
    add_window_routes(app, desktop)
    add_nextstate_routes(app, desktop)
    return app


def add_command_routes(app: Any, desktop: Any) -> None:
    """Commands run in the desktop: /execute, /execute_with_verification (both also under /setup/), /setup/launch."""
    from flask import jsonify, request

    def execute_result(res) -> Any:
        if res.exit_code == 127 and not res.stdout and res.stderr.startswith(("FileNotFoundError", "PermissionError")):
            return jsonify({"status": "error", "message": res.stderr}), 500
        if res.timed_out:
            return jsonify({"status": "error", "message": f"Command timed out: {res.stderr}"}), 500
        return jsonify({"status": "success", "output": res.stdout, "error": res.stderr, "returncode": res.exit_code})

    @app.post("/execute")
    @app.post("/setup/execute")
    def execute():
        data = request.get_json(force=True) or {}
        shell = bool(data.get("shell", False))
        command = data.get("command", "" if shell else [])
        return execute_result(desktop.execute(command, shell=shell, timeout=120))

    @app.post("/execute_with_verification")
    @app.post("/setup/execute_with_verification")
    def execute_with_verification():
        data = request.get_json(force=True) or {}
        shell = bool(data.get("shell", False))
        res = desktop.execute(data.get("command", "" if shell else []), shell=shell, timeout=120)
        verification = data.get("verification") or {}
        body = {"output": res.stdout, "error": res.stderr, "returncode": res.exit_code}
        if not verification:
            return jsonify({"status": "success", **body})
        t0, max_wait = time.monotonic(), float(data.get("max_wait_time", 10))
        while time.monotonic() - t0 < max_wait:
            ok = True
            if "window_exists" in verification:
                ok = any(str(verification["window_exists"]).lower() in w.title.lower() for w in desktop.windows())
            if ok and "command_success" in verification:
                ok = desktop.execute(verification["command_success"], shell=True, timeout=5).exit_code == 0
            if ok:
                return jsonify(
                    {"status": "success", **body, "verification": "passed", "wait_time": time.monotonic() - t0}
                )
            time.sleep(min(float(data.get("check_interval", 1)), 0.2))
        return jsonify({"status": "verification_failed", **body, "verification": "failed", "wait_time": max_wait}), 500

    @app.post("/setup/launch")
    def launch():
        data = request.get_json(force=True) or {}
        shell = bool(data.get("shell", False))
        command = data.get("command", "" if shell else [])
        try:
            desktop.launch(command, shell=shell)
        except Exception as exc:
            return jsonify({"status": "error", "message": str(exc)}), 500
        return (
            f"{command if shell else ' '.join(command) if isinstance(command, list) else command} launched successfully"
        )


def add_script_routes(app: Any, desktop: Any) -> None:
    """Code run in the desktop: /run_python, /run_bash_script."""
    from flask import jsonify, request

    @app.post("/run_python")
    def run_python():
        code = (request.get_json(force=True) or {}).get("code")
        if not code:
            return jsonify({"status": "error", "message": "Code not supplied!"}), 400
        path = Path(tempfile.gettempdir()) / f"python_exec_{uuid.uuid4().hex}.py"
        path.write_text(code)
        try:
            res = desktop.execute(["python3", str(path)], timeout=30)
        finally:
            path.unlink(missing_ok=True)
        if res.timed_out:
            return jsonify(
                {
                    "status": "error",
                    "message": "Execution timeout: Code took too long to execute",
                    "error": "TimeoutExpired",
                    "need_more": False,
                    "output": None,
                }
            ), 500
        message = res.stdout + (("\n" if res.stdout else "") + res.stderr if res.stderr else "")
        return jsonify(
            {
                "status": "success" if res.exit_code == 0 else "error",
                "message": message,
                "need_more": False,
                "output": res.stdout,
                "error": res.stderr,
                "return_code": res.exit_code,
            }
        )

    @app.post("/run_bash_script")
    def run_bash_script():
        data = request.get_json(force=True) or {}
        script = data.get("script")
        if not script:
            return jsonify({"status": "error", "output": "Script not supplied!", "error": "", "returncode": -1}), 400
        workdir = data.get("working_dir")
        if workdir and not os.path.isdir(desktop.resolve(workdir)):
            return jsonify(
                {
                    "status": "error",
                    "output": f"Working directory does not exist: {workdir}",
                    "error": "",
                    "returncode": -1,
                }
            ), 400
        prefix = f"cd {json.dumps(desktop.resolve(workdir))} || exit 1\n" if workdir else ""
        res = desktop.execute(["/bin/bash", "-c", prefix + script], timeout=float(data.get("timeout", 100)))
        if res.timed_out:
            return jsonify(
                {
                    "status": "error",
                    "output": f"Script execution timed out after {data.get('timeout', 100)} seconds",
                    "error": "",
                    "returncode": -1,
                }
            ), 500
        # OSWorld merges stderr into stdout here; we capture them apart, so stderr follows stdout
        return jsonify(
            {
                "status": "success" if res.exit_code == 0 else "error",
                "output": res.stdout + res.stderr,
                "error": "",
                "returncode": res.exit_code,
            }
        )


def add_observation_routes(app: Any, desktop: Any) -> None:
    """What the desktop shows: /screenshot, /accessibility, /terminal, /platform, /cursor_position,
    /screen_size, /window_size."""
    from flask import jsonify, request, send_file

    @app.get("/screenshot")
    def screenshot():
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(desktop.screenshot()).save(buf, format="PNG", compress_level=1)
        buf.seek(0)
        return send_file(buf, mimetype="image/png")

    @app.get("/accessibility")
    def accessibility():
        try:
            return jsonify({"AT": desktop.a11y_tree()})
        except Exception as exc:
            return jsonify({"status": "error", "message": str(exc)}), 500

    @app.get("/terminal")
    def terminal():
        # OSWorld reads gnome-terminal's text through AT-SPI; here: the log of the terminal ctrl+alt+t opened (None when
        # there is none). OSWorld's setup controller polls this route (with /screenshot) to know the server is up.
        return jsonify({"output": desktop.terminal_output(), "status": "success"})

    @app.get("/platform")
    def platform():
        return PLATFORM

    @app.get("/cursor_position")
    def cursor_position():
        res = desktop.act("p = pyautogui.position(); print(p.x, p.y)")
        x, y = (int(v) for v in res.stdout.split()) if res.ok else (0, 0)
        return jsonify(x, y)

    @app.post("/screen_size")
    def screen_size():
        w, h = desktop.screen_size()
        return jsonify({"width": w, "height": h})

    @app.post("/window_size")
    def window_size():
        cls = request.form.get("app_class_name")
        if not cls:
            return jsonify({"error": "app_class_name is required"}), 400
        for w in desktop.windows():
            if cls.lower() in [c.lower() for c in w.wm_class]:
                return jsonify({"width": w.w, "height": w.h})
        return jsonify(None)


def add_file_routes(app: Any, desktop: Any) -> None:
    """Files of the desktop's user: /file, /setup/upload, /desktop_path, /list_directory,
    /setup/open_file, /setup/download_file."""
    from flask import jsonify, request, send_file

    @app.post("/file")
    def get_file():
        path = request.form.get("file_path")
        if not path:
            return jsonify({"error": "file_path is required"}), 400
        target = desktop.resolve(path)
        if not os.path.isfile(target):
            return jsonify({"error": "File not found"}), 404
        return send_file(target, as_attachment=True)

    @app.post("/setup/upload")
    def upload():
        if "file_path" not in request.form or "file_data" not in request.files:
            return jsonify({"error": "file_path and file_data are required"}), 400
        data = request.files["file_data"].read()
        desktop.write_file(request.form["file_path"], data)
        return f"File Uploaded: {len(data)} bytes"

    @app.post("/desktop_path")
    def desktop_path():
        path = os.path.join(desktop.home, "Desktop")
        if os.path.isdir(path):
            return jsonify(desktop_path=path)
        return jsonify(error="desktop path not found"), 404

    @app.post("/list_directory")
    def list_directory():
        data = request.get_json(force=True) or {}
        if "path" not in data:
            return jsonify(error="Missing 'path' parameter"), 400
        start = desktop.resolve(data["path"])
        if not os.path.isdir(start):
            return jsonify(error="The provided path is not a directory"), 400

        def tree(d: str) -> dict[str, Any]:
            try:
                return {
                    "type": "directory",
                    "name": os.path.basename(d),
                    "children": [
                        tree(os.path.join(d, e)) if os.path.isdir(os.path.join(d, e)) else {"type": "file", "name": e}
                        for e in os.listdir(d)
                    ],
                }
            except OSError as exc:
                return {"error": str(exc)}

        return jsonify(directory_tree=tree(start))

    @app.post("/setup/open_file")
    def open_file():
        data = request.get_json(force=True) or {}
        path = data.get("path")
        if not path:
            return "Path not supplied!", 400
        try:
            desktop.open_path(path, timeout=float(data.get("timeout_seconds", 30)))
        except FileNotFoundError as exc:
            return str(exc), 404
        except Exception as exc:
            return f"Failed to open {path}. Error: {exc}", 500
        return "File opened and window activated successfully"

    @app.post("/setup/download_file")
    def download_file():
        data = request.get_json(force=True) or {}
        url, path = data.get("url"), data.get("path")
        if not url or not path:
            return "Path or URL not supplied!", 400
        try:
            import httpx

            resp = httpx.get(url, follow_redirects=True, timeout=300)
            resp.raise_for_status()
        except Exception as exc:
            return f"Failed to download {url}. Error: {exc}", 500
        desktop.write_file(path, resp.content)
        return f"File downloaded successfully: {len(resp.content)} bytes"


def add_window_routes(app: Any, desktop: Any) -> None:
    """The desktop's windows: /setup/activate_window, /setup/close_window, /setup/change_wallpaper."""
    from flask import request

    @app.post("/setup/activate_window")
    def activate_window():
        data = request.get_json(force=True) or {}
        name = data.get("window_name")
        if not name:
            return "window_name required", 400
        desktop.activate_window(
            name, strict=bool(data.get("strict", False)), by_class=bool(data.get("by_class", False))
        )
        return "Window activated successfully", 200

    @app.post("/setup/close_window")
    def close_window():
        data = request.get_json(force=True) or {}
        if "window_name" not in data:
            return "window_name required", 400
        desktop.close_window(
            data["window_name"], strict=bool(data.get("strict", False)), by_class=bool(data.get("by_class", False))
        )
        return "Window closed successfully.", 200

    @app.post("/setup/change_wallpaper")
    def change_wallpaper():
        return "Failed to change wallpaper. Error: this desktop has no wallpaper service", 500


def add_nextstate_routes(app: Any, desktop: Any) -> None:
    """NextState's additions: /nextstate/health, /nextstate/windows, /nextstate/new_session."""
    from flask import jsonify

    @app.get("/nextstate/health")
    def health():
        return jsonify({"status": "ok", "display": desktop.display, "home": desktop.home})

    @app.get("/nextstate/windows")
    def windows():
        return jsonify({"windows": [asdict(w) for w in desktop.windows()]})

    @app.post("/nextstate/new_session")
    def new_session():
        desktop.new_session()
        return jsonify({"status": "ok", "home": desktop.home})


def serve(
    desktop: Any,
    *,
    uds: str | None = None,
    host: str = "127.0.0.1",
    port: int = 5000,
    ready: threading.Event | None = None,
):
    """Serve until SIGTERM/SIGINT (or `server.shutdown()` from another thread); returns the werkzeug server."""
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    if uds:
        Path(uds).unlink(missing_ok=True)
        server = make_server(f"unix://{uds}", 0, create_app(desktop), threaded=True)
        os.chmod(uds, 0o660)
    else:
        server = make_server(host, port, create_app(desktop), threaded=True)
    if ready is not None:
        ready.set()
    return server


def main(argv: list[str] | None = None) -> int:
    from envs.runtime.desktop import DesktopConfig, LocalDesktop

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uds", help="serve on this unix socket path (else TCP on --host/--port)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=800)
    p.add_argument("--home", default=None, help="fixed HOME for tasks (e.g. /home/user); default: fresh per session")
    p.add_argument("--wipe-home", action="store_true", help="empty the fixed --home at every new session")
    p.add_argument("--window-manager", default=None)
    p.add_argument("--path-prepend", action="append", default=[], help="directory put first on PATH (repeatable)")
    p.add_argument("--open-with", action="append", default=[], help="KIND=COMMAND for open_file without xdg-open")
    p.add_argument("--action-timeout", type=float, default=10.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    open_with = {k: v.split() for k, _, v in (o.partition("=") for o in args.open_with)}
    desktop = LocalDesktop(
        DesktopConfig(
            isolation="none",  # the container is the sandbox (no network, removed per episode)
            width=args.width,
            height=args.height,
            home=args.home,
            wipe_home=args.wipe_home,
            window_manager=args.window_manager,
            path_prepend=tuple(args.path_prepend),
            open_with=open_with,
            action_timeout_s=args.action_timeout,
        )
    )
    server = serve(desktop, uds=args.uds, host=args.host, port=args.port)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("OSWorld guest API for %s on %s", desktop.display, args.uds or f"http://{args.host}:{args.port}")
    try:
        server.serve_forever()
    finally:
        desktop.close()
        if args.uds:
            Path(args.uds).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
