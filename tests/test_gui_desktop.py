"""The local desktop runtime on real Xvfb displays: actions, screenshots, the a11y tree, timeouts, process ownership."""

from __future__ import annotations

import os
import signal
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from envs.gui.tasks import APPS_BIN
from envs.runtime.actions import ActionParseError
from envs.runtime.app_profiles import FIRST_RUN_FILES, LIBREOFFICE_PROFILE, VLC_PROFILE
from envs.runtime.desktop import DesktopConfig, LocalDesktop
from envs.runtime.owned import pids_with_marker
from envs.runtime.xsession import MARKER
from tests.gui_support import require_desktop_tools

pytestmark = pytest.mark.integration
# the desktop's user has Debian's .bashrc, which (as on Ubuntu) sets an xterm's title to user@host: dir
FIXED_TITLE = ("-xrm", "XTerm*allowTitleOps: false")


def wait_for(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture(scope="module")
def desk():
    require_desktop_tools()
    d = LocalDesktop(DesktopConfig(width=800, height=600, path_prepend=(str(APPS_BIN),)))
    yield d
    d.close()


def test_screenshot_actions_and_a11y_on_a_gtk_app(desk):
    desk.new_session()
    img = desk.screenshot()
    assert img.shape == (600, 800, 3) and img.dtype == np.uint8
    desk.launch(["ns-form", "--out", "~/out.json"])
    wait_for(lambda: any(w.title == "Sign-up form" for w in desk.windows()))
    wait_for(lambda: "Sign-up form" in desk.a11y_tree())
    assert desk.act("pyautogui.click(153, 27)").ok
    assert desk.act("pyautogui.write('Zoe')").ok
    wait_for(lambda: ">Zoe</text>" in desk.a11y_tree())
    after = desk.screenshot()
    assert not np.array_equal(img, after)
    res = desk.act({"action_type": "CLICK", "parameters": {"x": 62, "y": 171}})  # computer_13: Submit
    assert res.ok
    wait_for(lambda: desk.execute("test -e ~/out.json", shell=True).ok)
    assert '"name": "Zoe"' in desk.read_file("~/out.json").decode()
    assert desk.act("print(pyautogui.position())").stdout.startswith("Point(x=62, y=171)")


def test_accessibility_is_on_for_every_toolkit(desk):
    """The AT-SPI bus says IsEnabled, as GNOME's toolkit-accessibility setting makes it: Chromium, Thunderbird (Gecko)
    and Electron apps expose their accessibility trees only then."""
    res = desk.execute(["dbus-send", "--session", "--print-reply", "--dest=org.a11y.Bus", "/org/a11y/bus",
                        "org.freedesktop.DBus.Properties.Get", "string:org.a11y.Status", "string:IsEnabled"])
    assert res.ok, res.stderr
    assert "boolean true" in res.stdout, res.stdout


def test_action_errors_are_results_not_exceptions(desk):
    res = desk.act("pyautogui.write(5)")  # passes the syntax checks, raises inside pyautogui
    assert not res.ok and "TypeError" in res.stderr
    with pytest.raises(ActionParseError):
        desk.act("import os")
    assert desk.act("DONE").ok  # special actions do nothing at the runtime level


def test_action_timeout_and_a_hung_worker_recover(desk):
    pid = desk.actions.pid
    t0 = time.monotonic()
    res = desk.act("time.sleep(3)", timeout=0.3)
    assert res.timed_out and time.monotonic() - t0 < 2.5
    assert desk.actions.pid == pid  # the worker interrupted the action itself and lives on
    os.killpg(pid, signal.SIGSTOP)  # a worker that does not answer at all is replaced (its group: nsenter and it)
    res = desk.act("pyautogui.moveTo(5, 5)", timeout=0.2)
    assert res.timed_out and "restarted" in res.stderr
    assert desk.act("pyautogui.moveTo(6, 6)").ok and desk.actions.pid != pid


def test_execute_captures_output_and_times_out(desk):
    res = desk.execute(["bash", "-c", "echo out; echo err >&2; exit 3"])
    assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert desk.execute("echo $HOME", shell=True).stdout.strip() == desk.home
    assert desk.execute("echo $DISPLAY", shell=True).stdout.strip() == desk.display
    t0 = time.monotonic()
    res = desk.execute("sleep 10", shell=True, timeout=0.3)
    assert res.timed_out and time.monotonic() - t0 < 3
    assert desk.execute(["no-such-binary-xyz"]).exit_code == 127


@pytest.mark.parametrize("mode", ["sandbox-fresh-root", "sandbox-same-root", "none"])
def test_new_session_stops_everything_the_episode_started(mode):
    require_desktop_tools()
    isolation = "none" if mode == "none" else "sandbox"
    cfg = DesktopConfig(width=320, height=240, isolation=isolation, fresh_root_per_episode=mode == "sandbox-fresh-root")
    with LocalDesktop(cfg) as desk:
        home = desk.home
        desk.write_file("~/left-over.txt", "x")
        desk.launch(["sleep", "1000"])
        desk.execute("nohup sleep 1001 > /dev/null 2>&1 &", shell=True)  # daemonized: left our process group
        desk.execute("setsid sleep 1002 > /dev/null 2>&1 < /dev/null &", shell=True)
        sleeps = lambda: [p for p in desk.pids() if _cmd(p).startswith("sleep 10")]  # noqa: E731
        wait_for(lambda: len(sleeps()) == 3)
        started, infra = sleeps(), desk.actions.pid
        desk.new_session()
        assert all(not os.path.exists(f"/proc/{p}") or _cmd(p) == "" for p in started)
        assert not desk.execute("test -e ~/left-over.txt", shell=True).ok  # a fresh (or emptied) HOME
        if mode == "none":
            assert desk.home != home and not os.path.exists(home)
        # the infrastructure stays, except where the whole sandbox is new
        assert (desk.actions.pid == infra) == (mode != "sandbox-fresh-root")
        assert desk.act("pyautogui.moveTo(5, 5)").ok


def test_windows_activate_and_close_without_a_window_manager(desk):
    desk.new_session()
    desk.launch(["xterm", "-T", "Term A", *FIXED_TITLE, "-geometry", "40x10+0+0"])
    desk.launch(["xterm", "-T", "Term B", *FIXED_TITLE, "-geometry", "40x10+300+0"])
    wait_for(lambda: len(desk.windows()) == 2)
    assert desk.activate_window("term b")  # wmctrl's matching: case-insensitive substring
    assert wait_for(lambda: desk.find_window("Term B").focused)
    assert desk.find_window("Term", strict=True) is None
    assert desk.close_window("Term A", strict=True)
    wait_for(lambda: [w.title for w in desk.windows()] == ["Term B"])


def test_every_session_starts_the_apps_past_their_first_run(desk):
    """LibreOffice's fresh profile in each episode's HOME shows no Tip of the Day and no first-start info bar, VLC's
    asks no privacy question (the slow app-task tests check the real apps open without them)."""
    desk.new_session()
    xcu = desk.read_file(LIBREOFFICE_PROFILE).decode()
    assert xcu == FIRST_RUN_FILES[LIBREOFFICE_PROFILE]
    ns = "{http://openoffice.org/2001/registry}"
    props = {(item.get(f"{ns}path"), prop.get(f"{ns}name")): prop.findtext("value")
             for item in ET.fromstring(xcu) for prop in item}
    assert props[("/org.openoffice.Office.Common/Misc", "ShowTipOfTheDay")] == "false"
    assert float(props[("/org.openoffice.Setup/Product", "ooSetupLastVersion")]) > 50  # above any real version
    vlcrc = desk.read_file(VLC_PROFILE).decode()  # VLC: the privacy question answered, the web interface on
    set_lines = [line for line in vlcrc.splitlines() if line and not line.startswith(("#", "["))]
    assert set_lines == ["qt-privacy-ask=0", "extraintf=http", "http-password=password"]


def test_many_desktops_start_at_once_on_distinct_displays():
    require_desktop_tools()
    with ThreadPoolExecutor(4) as pool:
        desks = list(
            pool.map(lambda _: LocalDesktop(DesktopConfig(width=640, height=480, accessibility=False)), range(4))
        )
    try:
        # one sandbox each: each has its own display (all called :0, in their own namespaces) and pointer
        assert len({d.x.session_id for d in desks}) == 4
        for i, d in enumerate(desks):
            assert d.act(f"pyautogui.moveTo({10 + i}, 10)").ok
        assert [d.act("print(pyautogui.position())").stdout for d in desks] == [
            f"Point(x={10 + i}, y=10)\n" for i in range(4)
        ]
    finally:
        ids = [d.x.session_id for d in desks]
        for d in desks:
            d.close()
    for sid in ids:
        assert pids_with_marker(MARKER, sid) == []  # close() leaves nothing behind


def test_window_manager_mode():
    require_desktop_tools()
    import shutil

    if shutil.which("openbox") is None:
        pytest.skip("openbox is not installed (scripts/install.sh installs it)")
    with LocalDesktop(DesktopConfig(width=800, height=600, window_manager="openbox", accessibility=False)) as d:
        d.launch(["xterm", "-T", "Managed", *FIXED_TITLE, "-geometry", "40x10+0+0"])
        w = wait_for(lambda: d.find_window("Managed"))
        assert d.activate_window("Managed")
        assert wait_for(lambda: d.find_window("Managed").focused)
        assert d.execute(["wmctrl", "-l"]).stdout.count("Managed") == 1  # the WM manages it
        assert w.w > 0


def _cmd(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_a_killed_owner_does_not_leave_its_desktop_behind(tmp_path):
    """SIGKILL the process owning a desktop (as when a Ray worker dies): its watchdog stops the X server and the rest."""
    require_desktop_tools()
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from envs.runtime.desktop import DesktopConfig, LocalDesktop\n"
        "d = LocalDesktop(DesktopConfig(width=320, height=240))\n"
        "d.launch(['sleep', '1000'])\n"
        "print(d.x.session_id, d.x.runtime_dir, flush=True)\n"
        "time.sleep(1000)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=str(APPS_BIN.parents[3]))
    try:
        session, runtime_dir = owner.stdout.readline().split()
        assert len(pids_with_marker(MARKER, session)) >= 4  # Xvfb, buses, workers, sleep
    finally:
        owner.kill()
        owner.wait()
    wait_for(lambda: pids_with_marker(MARKER, session) == [], timeout=10)
    wait_for(lambda: not os.path.exists(runtime_dir), timeout=10)  # its files too
