"""The OSWorld guest HTTP API: our server (over a real Xvfb desktop) answers OSWorld's requests in OSWorld's shapes,
and the client drives it as it would drive an OSWorld VM. (The docker-hosted server runs the bundled tasks in
test_gui_tasks.py.)"""

from __future__ import annotations

import io
import threading
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from envs.gui.tasks import APPS_BIN
from envs.runtime.desktop import DesktopConfig, LocalDesktop
from envs.runtime.osworld import PKGS_PREFIX, OSWorldClient
from envs.runtime.osworld_server import serve
from tests.gui_support import require_desktop_tools

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    require_desktop_tools()
    sock = str(tmp_path_factory.mktemp("guest") / "guest.sock")
    # the guest server runs inside a container, which is its sandbox (envs.runtime.osworld_docker), so its desktop
    # is unsandboxed, as there
    desktop = LocalDesktop(
        DesktopConfig(
            isolation="none",
            width=800,
            height=600,
            path_prepend=(str(APPS_BIN),),
            open_with={"text": ["ns-editor"], "dir": ["ns-files"]},
        )
    )
    server = serve(desktop, uds=sock)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    raw = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://guest", timeout=60)
    client = OSWorldClient(f"unix://{sock}")
    yield desktop, raw, client
    client.close()
    raw.close()
    server.shutdown()
    desktop.close()


def test_osworld_request_shapes(guest):
    desktop, raw, _ = guest
    desktop.new_session()
    # PythonController.execute_python_command: a command list, shell false
    r = raw.post(
        "/execute",
        json={"command": ["python", "-c", PKGS_PREFIX.format(command="print(pyautogui.size())")], "shell": False},
    )
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success" and body["returncode"] == 0
    assert body["output"].strip() == "Size(width=800, height=600)"
    r = raw.post("/setup/execute", json={"command": "echo $HOME; exit 4", "shell": True})
    assert r.json()["output"].strip() == desktop.home and r.json()["returncode"] == 4
    r = raw.post("/execute", json={"command": ["definitely-not-a-command"], "shell": False})
    assert r.status_code == 500 and r.json()["status"] == "error"
    # files: multipart upload, form-encoded download (SetupController / PythonController.get_file)
    r = raw.post("/setup/upload", data={"file_path": "~/Desktop/a.txt"}, files={"file_data": ("a.txt", b"payload")})
    assert r.status_code == 200 and r.text == "File Uploaded: 7 bytes"
    r = raw.post("/file", data={"file_path": "~/Desktop/a.txt"})
    assert r.status_code == 200 and r.content == b"payload"
    assert raw.post("/file", data={"file_path": "~/nope"}).status_code == 404
    # observations
    r = raw.get("/screenshot")
    assert r.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(r.content)).size == (800, 600)
    assert raw.get("/accessibility").json()["AT"].startswith("<desktop-frame")
    assert raw.get("/terminal").json()["status"] == "success"
    assert raw.get("/platform").text == "Linux"
    assert raw.post("/screen_size").json() == {"width": 800, "height": 600}
    assert raw.post("/desktop_path").json()["desktop_path"] == f"{desktop.home}/Desktop"
    tree = raw.post("/list_directory", json={"path": "~/Desktop"}).json()["directory_tree"]
    assert tree["type"] == "directory" and {"type": "file", "name": "a.txt"} in tree["children"]
    r = raw.post("/run_python", json={"code": "print(6 * 7)"})
    assert r.json()["status"] == "success" and r.json()["output"] == "42\n"
    r = raw.post("/run_bash_script", json={"script": "echo hi; echo err >&2; exit 2", "timeout": 10})
    assert r.json()["returncode"] == 2 and "hi" in r.json()["output"] and "err" in r.json()["output"]
    assert raw.post("/setup/change_wallpaper", json={"path": "/x.png"}).status_code == 500


def test_launch_open_activate_and_window_routes(guest):
    desktop, raw, client = guest
    client.new_session()
    assert raw.post("/setup/launch", json={"command": ["ns-calc"], "shell": False}).status_code == 200
    deadline = time.monotonic() + 20
    while not any(w.title == "Calculator" for w in client.windows()) and time.monotonic() < deadline:
        time.sleep(0.05)
    r = raw.post("/window_size", data={"app_class_name": "calc.py"})
    assert r.json() == {"width": 260, "height": 320}
    client.write_file("~/notes.txt", "x")
    assert raw.post("/setup/open_file", json={"path": "~/notes.txt", "timeout_seconds": 20}).status_code == 200
    assert any(w.title == "Editor - notes.txt" for w in client.windows())
    assert raw.post("/setup/activate_window", json={"window_name": "calculator"}).status_code == 200
    assert [w.title for w in client.windows() if w.focused] == ["Calculator"]
    assert raw.post("/setup/open_file", json={"path": "~/missing.txt"}).status_code == 404


def test_client_runtime_methods(guest):
    desktop, _, client = guest
    client.new_session()
    assert client.has_extensions()
    assert client.home == desktop.home
    img = client.screenshot()
    assert img.shape == (600, 800, 3) and img.dtype == np.uint8
    assert np.array_equal(img, desktop.screenshot())
    res = client.exec("echo hi")
    assert res.ok and res.stdout == "hi\n"
    client.write_file("~/f.bin", b"\x00\x01")
    assert client.read_file("~/f.bin") == b"\x00\x01"
    with pytest.raises(FileNotFoundError):
        client.read_file("~/nope")
    assert client.act("pyautogui.moveTo(10, 20)").ok  # one interpreter per action, as OSWorld does it
    assert desktop.act("print(pyautogui.position())").stdout.startswith("Point(x=10, y=20)")
    res = client.act("pyautogui.write(5)")
    assert not res.ok and "TypeError" in res.stderr
    assert client.screen_size() == (800, 600)
    assert client.list_directory("~")["type"] == "directory"


def test_client_reports_an_unreachable_guest_clearly(tmp_path):
    from envs.runtime.xsession import DesktopError

    c = OSWorldClient(f"unix://{tmp_path}/none.sock", connect_retries=0)
    with pytest.raises(DesktopError, match="OSWorld guest"):
        c.screenshot()
    with pytest.raises(DesktopError, match="did not answer"):
        c.wait_ready(timeout=0.3)
    c.close()
