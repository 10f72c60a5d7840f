"""OSWorld's apps starting on the desktop: a launch waiting for the app's main window, Chrome's Chromium stand-in
(profile, process and window names), the loader's refusals of what a desktop cannot run; then, on the real sandboxed
desktop over the guest root, each app as OSWorld's tasks start it, with the profiles of envs/runtime/app_profiles.py
(VLC's web interface, no first-run dialogs) fresh in every episode.

The unit tests drive tests/test_gui_evaluator's FakeDesktop (its commands run in a real shell in a temp HOME); the
integration tests need the guest root with the apps (`python -m envs.runtime.sandbox_root build`) and skip, saying so,
where it has none."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from envs.gui import setup_steps
from envs.gui.env import GUIConfig, GUIEnv, guest_programs
from envs.gui.osworld_tasks import apps_started, load_osworld_examples
from envs.gui.setup_steps import SetupContext, run_steps
from envs.runtime.desktop import WindowInfo
from envs.tasks import load_task_source
from tests.gui_support import require_desktop_tools
from tests.test_gui_evaluator import FakeDesktop


@pytest.fixture
def desk(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return FakeDesktop(home)


def window(title: str) -> WindowInfo:
    return WindowInfo(1, title, [], 0, 0, 800, 600)


# ----- launching an app -----
@pytest.fixture
def apps_installed(monkeypatch):
    """The fake desktop's shell is this machine's: the apps count as installed there."""
    monkeypatch.setattr(setup_steps, "_installed", lambda ctx, prog: True)


@pytest.mark.usefixtures("apps_installed")
def test_a_launch_waits_for_the_apps_main_window_not_its_splash(desk, tmp_path):
    shown = iter([[], [window("GIMP Startup")], [window("GIMP Startup")],
                  [window("GNU Image Manipulation Program")]])
    desk.windows = lambda: next(shown)
    run_steps([{"type": "launch", "parameters": {"command": ["gimp"]}}], SetupContext(desk, tmp_path, open_timeout_s=30))
    assert next(shown, "all read") == "all read"  # it returned at the main window, not before


@pytest.mark.usefixtures("apps_installed")
@pytest.mark.parametrize("command, shell, ready, not_ready", [
    (["libreoffice", "--calc"], False, "Untitled 1 - LibreOffice Calc", "LibreOffice"),  # LibreOffice's splash
    ("libreoffice --writer /home/user/a.docx &", True, "a.docx - LibreOffice Writer", "LibreOffice"),
    (["libreoffice"], False, "LibreOffice", "Untitled 1 - LibreOffice Calc"),  # the start centre
    (["libreoffice", "--calc", "/home/user/b.csv"], False, "Text Import - [b.csv]", "LibreOffice"),
    ("VLC_VERBOSE=-1 vlc --no-audio --no-video-title-show", True, "VLC media player", "vlc"),
    (["thunderbird"], False, "Account Setup - Mozilla Thunderbird", "Thunderbird Daily Profile"),
])
def test_each_apps_window_is_recognised(desk, tmp_path, command, shell, ready, not_ready):
    seen = [[window(not_ready)], [window(not_ready)], [window(ready)]]
    desk.windows = lambda: seen.pop(0) if len(seen) > 1 else seen[0]
    run_steps([{"type": "launch", "parameters": {"command": command, "shell": shell}}],
              SetupContext(desk, tmp_path, open_timeout_s=30))
    assert len(seen) == 1  # polled until the ready title


@pytest.mark.usefixtures("apps_installed")
def test_an_app_that_shows_no_window_is_logged_and_setup_goes_on(desk, tmp_path, caplog):
    run_steps([{"type": "launch", "parameters": {"command": ["vlc"]}},
               {"type": "execute", "parameters": {"command": "touch ~/after", "shell": True}}],
              SetupContext(desk, tmp_path, open_timeout_s=0.2))
    assert "no window of 'vlc'" in caplog.text and (Path(desk.home) / "after").exists()


def test_chromium_stands_in_for_chromes_window_names(desk, tmp_path):
    desk.windows_list = [window("New Tab - Chromium")]
    got = []
    desk.find_window = lambda name, strict=False, by_class=False: next(
        (w for w in desk.windows_list if name.lower() in w.title.lower()), None)
    desk.activate_window = lambda name, strict=False, by_class=False: got.append(name) or True
    run_steps([{"type": "activate_window", "parameters": {"window_name": "Google Chrome"}}], SetupContext(desk, tmp_path))
    assert got == ["Chromium"]
    desk.windows_list = [window("Downloads - Google Chrome")]  # the real one: its own name
    run_steps([{"type": "activate_window", "parameters": {"window_name": "Google Chrome"}}], SetupContext(desk, tmp_path))
    assert got[-1] == "Google Chrome"


# ----- what a desktop cannot run is refused at load -----
def _task(tid: str, config: list, evaluator: dict | None = None) -> dict:
    return {"id": tid, "instruction": f"NextState test task {tid}", "config": config,
            "evaluator": evaluator or {"func": "exact_match", "result": {"type": "vm_command_line", "command": "true"},
                                       "expected": {"type": "rule", "rules": {"expected": "x"}}}}


def write_tree(root: Path, domains: dict[str, list[dict]]) -> Path:
    for domain, tasks in domains.items():
        (root / "examples" / domain).mkdir(parents=True, exist_ok=True)
        for t in tasks:
            (root / "examples" / domain / f"{t['id']}.json").write_text(json.dumps(t))
    (root / "test_all.json").write_text(json.dumps({d: [t["id"] for t in ts] for d, ts in domains.items()}))
    return root


def test_web_pages_and_missing_apps_are_refused_at_load_in_one_line(tmp_path):
    tree = write_tree(tmp_path / "tree", {
        "chrome": [_task("ns-page", [{"type": "chrome_open_tabs",
                                      "parameters": {"urls_to_open": ["https://www.example.com/a"]}}]),
                   _task("ns-local-page", [{"type": "launch", "parameters": {"command": ["google-chrome"]}}])],
        "vs_code": [_task("ns-code", [{"type": "launch", "parameters": {"command": ["code"]}}])],
        "vlc": [_task("ns-vlc", [{"type": "launch", "parameters": {"command": "VLC_VERBOSE=-1 vlc --no-audio",
                                                                    "shell": True}}])],
    })
    has = {"vlc", "chromium"}.__contains__  # Chrome only through its stand-in, no VS Code
    got = load_osworld_examples(tree, exclude_domains=(), has_program=has)
    assert sorted(t["id"] for t in got.tasks) == ["ns-local-page", "ns-vlc"]
    assert "has no network" in got.skipped["ns-page"] and "www.example.com" in got.skipped["ns-page"]
    assert "'code' is not installed" in got.skipped["ns-code"]
    assert all("\n" not in why for why in got.skipped.values())
    online = load_osworld_examples(tree, exclude_domains=(), desktop_online=True)  # a VM: every app, the web
    assert len(online.tasks) == 4
    assert apps_started(got.tasks[1]) == ["vlc"]


def test_the_launcher_gives_the_loader_the_envs_options(tmp_path):
    tree = write_tree(tmp_path / "tree", {"chrome": [_task("ns-page", [{"type": "chrome_open_tabs", "parameters": {
        "urls_to_open": ["https://www.example.com/a"]}}])], "os": [_task("ns-os", [])]})
    local = load_task_source(GUIEnv, str(tree), "osworld_all", {"max_steps": 3})
    assert [t["id"] for t in local] == ["ns-os"]
    vm = load_task_source(GUIEnv, str(tree), "osworld_all", {"backend": "osworld", "osworld_url": "http://vm:5000"})
    assert sorted(t["id"] for t in vm) == ["ns-os", "ns-page"]


# ----- the real apps on the sandboxed desktop -----
def require_apps(*apps: str):
    require_desktop_tools()
    has = guest_programs(GUIConfig())
    if has is None:
        pytest.skip("the desktop's guest root is not built (python -m envs.runtime.sandbox_root build)")
    missing = [a for a in apps if not has(a)]
    if missing:
        pytest.skip(f"the desktop's guest root has no {', '.join(missing)}")


def app_task(tid: str, config: list, evaluator: dict | None = None) -> dict:
    return {**_task(tid, config, evaluator), "domain": "apps"}


@pytest.fixture
def env():
    e = GUIEnv(max_steps=3)
    yield e
    e.close()


@pytest.mark.integration
def test_vlc_starts_with_its_web_interface_and_a_fresh_profile_each_episode(env):
    require_apps("vlc")
    playing = {"func": "is_vlc_playing", "result": {"type": "vlc_playing_info", "dest": "status.xml"},
               "expected": {"type": "rule", "rules": {"type": "file_name", "file_name": "clip.mp4"}}}
    task = app_task("ns-vlc-start", [{"type": "launch", "parameters": {
        "command": "VLC_VERBOSE=-1 vlc --no-audio --no-video-title-show", "shell": True}}], playing)
    env.reset(options={"task": task})
    assert [w.title for w in env.desktop.windows()] == ["VLC media player"]  # no first-run privacy dialog
    status = env.desktop.execute(["python3", "-c", (
        "import base64,urllib.request as u;r=u.Request('http://localhost:8080/requests/status.xml');"
        "r.add_header('Authorization','Basic '+base64.b64encode(b':password').decode());"
        "print(u.urlopen(r,timeout=5).read().decode())")])
    assert status.ok and "<state>stopped</state>" in status.stdout, status.stderr
    _, score, *_ = env.step("DONE")
    assert score == 0.0 and not env.last_evaluation.error  # read from status.xml: nothing plays
    env.desktop.execute("echo qt-max-volume=200 >> ~/.config/vlc/vlcrc; touch ~/.config/vlc/left-over", shell=True)
    env.reset(options={"task": task})  # a new episode: a fresh throwaway root, the snapshot's profile again
    vlcrc = env.desktop.read_file("~/.config/vlc/vlcrc").decode()
    assert "qt-max-volume" not in vlcrc and "http-password=password" in vlcrc
    assert not env.desktop.execute("test -e ~/.config/vlc/left-over", shell=True).ok


@pytest.mark.integration
@pytest.mark.slow
def test_each_of_osworlds_apps_starts_as_its_tasks_start_it(env):
    require_apps("libreoffice", "gimp", "thunderbird", "chromium")
    csv = "item,cost\nrent,700\nfood,250\n"
    cases = [
        ("calc", [{"type": "execute", "parameters": {"command": f"printf '{csv}' > ~/Desktop/budget.csv",
                                                     "shell": True}},
                  {"type": "launch", "parameters": {"command": ["libreoffice", "--calc", "/home/user/Desktop/budget.csv"]}}],
         "Text Import - [budget.csv]"),  # a CSV opens on its import dialog
        ("impress", [{"type": "launch", "parameters": {"command": ["libreoffice", "--impress"]}}],
         "LibreOffice Impress"),
        ("gimp", [{"type": "launch", "parameters": {"command": ["gimp"]}}], "GNU Image Manipulation Program"),
        ("thunderbird", [{"type": "launch", "parameters": {"command": ["thunderbird"]}}], "Thunderbird"),
        ("chrome", [{"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
                    {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork",
                                                                  "tcp:localhost:1337"]}}], "Chromium"),
    ]
    for name, config, title in cases:
        env.reset(options={"task": app_task(f"ns-start-{name}", config)})
        titles = [w.title for w in env.desktop.windows()]
        assert any(title in t for t in titles), (name, titles)
        assert not any("Tip of the Day" in t or "Privacy" in t for t in titles), (name, titles)
        if name in ("thunderbird", "chrome", "gimp"):  # only when the bus says accessibility is on / GTK 2's modules
            deadline = time.monotonic() + 20
            while not re.search(r'<application name="(Thunderbird|Chromium|gimp)"', env.desktop.a11y_tree()):
                assert time.monotonic() < deadline, f"{name} never appeared in the accessibility tree"
                time.sleep(0.5)
        if name == "chrome":  # on Chrome's profile, its DevTools on the port OSWorld gives
            tabs = env.desktop.execute(["python3", "-c", "import urllib.request as u;"
                                        "print(u.urlopen('http://localhost:1337/json/list',timeout=5).read().decode())"])
            assert tabs.ok and '"type": "page"' in tabs.stdout, tabs.stderr
            assert env.desktop.execute("test -e ~/.config/google-chrome/Default/Preferences", shell=True).ok
            run_steps([{"type": "launch", "parameters": {"command": ["pkill", "chrome"]}}], env._setup_ctx())
            deadline = time.monotonic() + 15
            while any("Chromium" in w.title for w in env.desktop.windows()):
                assert time.monotonic() < deadline, "pkill chrome did not stop the stand-in"
                time.sleep(0.3)
        if name == "calc":
            assert "for the first time" not in env.desktop.a11y_tree()  # no "running this version" bar
