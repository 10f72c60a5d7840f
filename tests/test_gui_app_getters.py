"""The app getters and the browser setup steps against a desktop whose HOME is a temp dir (tests/test_gui_evaluator's
FakeDesktop: its commands run in a real shell), and the DevTools ones against a real headless Chromium on loopback."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import zipfile
from datetime import date
from pathlib import Path

import pytest

from envs.gui import app_getters, browser_getters
from envs.gui.evaluator import GETTERS, evaluate
from envs.gui.getters import EvalContext
from envs.gui.metrics.browser import pdf_text
from envs.gui.setup_steps import SetupContext, SetupError, run_steps
from envs.runtime.desktop import WindowInfo
from tests.test_gui_evaluator import FakeDesktop


@pytest.fixture
def desk(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return FakeDesktop(home)


@pytest.fixture
def ctx(desk, tmp_path):
    return EvalContext(desk, tmp_path / "cache")


def test_config_file_getters_feed_their_metrics(ctx, desk):
    desk.write_file("~/.config/vlc/vlcrc", "#qt-bgcone=1\nqt-max-volume=200\n")
    desk.write_file("~/.config/GIMP/2.10/gimprc", "(undo-levels 100)\n")
    vlc = {"func": "check_qt_max_volume", "result": {"type": "vlc_config", "dest": "vlcrc"},
           "expected": {"type": "rule", "rules": {"expected_qt_max_volume": 200}}}
    assert evaluate(vlc, ctx, "DONE").score == 1.0
    vlc["expected"]["rules"]["expected_qt_max_volume"] = 125
    assert evaluate(vlc, ctx, "DONE").score == 0.0
    gimp = {"func": "check_config_status", "result": {"type": "gimp_config_file", "file_name": "gimprc",
                                                      "dest": "gimprc"},
            "expected": {"type": "rule", "rules": {"key": "undo-levels", "value": "100"}}}
    assert evaluate(gimp, ctx, "DONE").score == 1.0
    gimp["result"]["file_name"] = "sessionrc"  # not on the desktop: scored 0, not an evaluator error
    ev = evaluate(gimp, ctx, "DONE")
    assert ev.score == 0.0 and not ev.error


def test_vlc_status_without_vlc_scores_zero_with_a_reason(ctx):
    with pytest.raises(FileNotFoundError, match="does not answer on the desktop"):
        GETTERS["vlc_playing_info"](ctx, {"dest": "status.xml", "port": 1})


def test_window_size_wallpaper_and_shortcuts(ctx, desk):
    desk.windows_list = [WindowInfo(1, "movie - VLC", ["vlc", "Vlc"], 0, 0, 1920, 1080)]
    assert GETTERS["vm_window_size"](ctx, {"app_class_name": "vlc"}) == {"width": 1920, "height": 1080}
    assert GETTERS["vm_window_size"](ctx, {"app_class_name": "gimp"}) is None
    assert Path(GETTERS["vm_wallpaper"](ctx, {"dest": "w.png"})).read_bytes() == b""  # no GNOME here: none set
    desk.write_file("~/Desktop/app.desktop", "[Desktop Entry]\nName=My App\nExec=myapp\n")
    shortcuts = GETTERS["shortcuts_on_desktop"](ctx, {})
    assert list(shortcuts.values()) == ["[Desktop Entry]\nName=My App\nExec=myapp\n"]


def test_audio_in_slide(ctx, desk, tmp_path):
    deck = tmp_path / "talk.pptx"
    with zipfile.ZipFile(deck, "w") as z:
        z.writestr("ppt/slides/_rels/slide1.xml.rels", (
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="r1" Type="http://schemas.microsoft.com/office/2007/relationships/media" '
            'Target="../media/media1.mp3"/>'
            '<Relationship Id="r2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/audio" '
            'Target="../media/media1.mp3"/></Relationships>'))
        z.writestr("ppt/media/media1.mp3", b"ID3-fake-audio")
    desk.write_file("~/Desktop/talk.pptx", deck.read_bytes())
    got = GETTERS["audio_in_slide"](ctx, {"ppt_file_path": "~/Desktop/talk.pptx", "slide_index": 0, "dest": "a.mp3"})
    assert Path(got).read_bytes() == b"ID3-fake-audio"
    assert GETTERS["audio_in_slide"](ctx, {"ppt_file_path": "~/Desktop/talk.pptx", "slide_index": 3,
                                           "dest": "a.mp3"}) is None


def test_chrome_profile_getters(ctx, desk):
    prefs = {"profile": {"name": "Work"}, "enable_do_not_track": True, "safebrowsing": {"enhanced": True},
             "webkit": {"webprefs": {"default_font_size": 20}}, "session": {"restore_on_startup": 5},
             "default_search_provider_data": {"template_url_data": {"short_name": "Bing"}},
             "extensions": {"settings": {"abc": {"path": "/home/user/ext"}}}}
    desk.write_file("~/.config/chromium/Default/Preferences", json.dumps(prefs))
    desk.write_file("~/.config/chromium/Default/Bookmarks", json.dumps({"roots": {"bookmark_bar": {"children": []}}}))
    assert GETTERS["profile_name"](ctx, {}) == "Work"
    assert GETTERS["enable_do_not_track"](ctx, {}) == "true"
    assert GETTERS["enable_safe_browsing"](ctx, {}) == "true"
    assert GETTERS["chrome_font_size"](ctx, {}) == {"default_font_size": 20}
    assert GETTERS["new_startup_page"](ctx, {}) == "true"
    assert GETTERS["default_search_engine"](ctx, {}) == "Bing"
    assert GETTERS["find_unpacked_extension_path"](ctx, {}) == ["/home/user/ext"]
    assert GETTERS["bookmarks"](ctx, {}) == {"bookmark_bar": {"children": []}}
    with pytest.raises(FileNotFoundError, match="no Chrome/Chromium profile"):
        GETTERS["history"](ctx, {"dest": "History"})


def test_deleting_data_on_close_is_the_session_only_cookie_setting(ctx, desk):
    def prefs(values):
        desk.write_file("~/.config/google-chrome/Default/Preferences",
                        json.dumps({"profile": {"default_content_setting_values": values}}))
        return GETTERS["data_delete_automacally"](ctx, {})

    # what Chromium 150 writes by itself on its first exit: not the setting (OSWorld's getter says "true" here)
    assert prefs({"has_migrated_local_network_access": True}) == "false"
    assert prefs({"popups": 2}) == "false"
    assert prefs({"cookies": 4}) == "true"  # "Delete cookies and site data when you close all windows"


def test_rule_relative_time_fills_the_expected_dates(ctx, monkeypatch):
    monkeypatch.setattr(app_getters, "_today", lambda rules: date(2026, 12, 2))
    rule = {"rules": {"relativeTime": {"from": "next Monday split", "to": "next Friday split"},
                      "expected": {"puDay": "{DayD}", "puMonth": "{MonthD}", "puYear": "{Year}", "doDay": "{DayD}",
                                   "doMonth": "{MonthD}", "doYear": "{Year}"}}}
    got = GETTERS["rule_relativeTime"](ctx, rule)["expected"]
    assert got == {"puDay": "7", "puMonth": "12", "puYear": "2026", "doDay": "11", "doMonth": "12", "doYear": "2026"}
    assert rule["rules"]["expected"]["puDay"] == "{DayD}"  # the task's own dict is left as it was
    one = GETTERS["rule_relativeTime"](ctx, {"rules": {"relativeTime": {"from": "this month"},
                                                       "expected": {"time": "{month}-weather"}}})
    assert one["expected"]["time"] == "december-weather"


def test_url_getters_read_the_address_bar(ctx, desk):
    desk.a11y = ('<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state">'
                 '<application name="Chromium"><entry name="Address and search bar">'
                 "www.example.com/c/mens-clothing/shirts/Size,Product_department/M,shirts?q=1&amp;s=a,b</entry>"
                 "</application></desktop-frame>")
    ctx.a11y_xml = None
    assert GETTERS["active_url_from_accessTree"](ctx, {}).startswith("https://www.example.com/c/")
    assert GETTERS["active_tab_url_parse"](ctx, {"parse_keys": ["q", "s", "z"], "replace": {"q": "query"}}) == {
        "s": "a,b", "z": "", "query": "1"}
    assert GETTERS["url_dashPart"](ctx, {"partIndex": 4, "returnType": "json", "key": "k"}) == {"k": "mens-clothing"}
    parsed = GETTERS["url_path_parse"](ctx, {"parse_keys": ["Size"]})
    assert parsed == {"mens_clothing": True, "shirts": True, "short_sleeve": None, "Size": "M"}


def test_launching_a_missing_app_is_refused_in_one_line(desk, tmp_path, monkeypatch):
    monkeypatch.setattr(desk, "execute", lambda *a, **k: FakeDesktop.execute(desk, ["false"]))
    sctx = SetupContext(desk, tmp_path / "cache", open_timeout_s=0)  # no app window to wait for
    with pytest.raises(SetupError, match="'code' is not installed in the desktop's guest root .VS Code") as err:
        run_steps([{"type": "launch", "parameters": {"command": ["code", "/home/user/project"]}}], sctx)
    assert "\n" not in str(err.value) and "env.guest_packages" in str(err.value)  # the option that adds it
    run_steps([{"type": "launch", "parameters": {"command": ["xterm"]}}], sctx)  # not an app we check
    assert desk.launched[-1][0] == ["xterm"]


# ----- a real Chromium over DevTools -----
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def chromium(tmp_path, monkeypatch):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium on this machine (Debian's `chromium` package)")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "--headless=new", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={port}",
         "--remote-debugging-address=127.0.0.1", f"--user-data-dir={tmp_path / 'profile'}", "--no-first-run",
         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "HOME": str(tmp_path)})  # its crash database, dconf: not the runner's HOME
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("chromium's DevTools endpoint did not come up in 30 s")
                time.sleep(0.2)
        monkeypatch.setattr(browser_getters, "DEVTOOLS_PORTS", (port,))
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_tabs_and_page_content_over_devtools(chromium, desk, ctx, tmp_path):
    page = "data:text/html,<title>Cart</title><p>Portal 2 added to your cart</p>"
    run_steps([{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [page]}}], SetupContext(desk, tmp_path))
    deadline = time.monotonic() + 15
    while not any(t["url"] == page for t in GETTERS["open_tabs_info"](ctx, {})):
        assert time.monotonic() < deadline, "the opened tab never showed in DevTools"
        time.sleep(0.2)
    info = GETTERS["active_tab_info"](ctx, {})
    assert info["url"] == page and "Portal 2 added" in info["content"]
    steam = {"func": "is_added_to_steam_cart", "result": {"type": "active_tab_info"},
             "expected": {"type": "rule", "rules": {"items": ["Portal 2"]}}}
    assert evaluate(steam, ctx, "DONE").score == 1.0
    steam["expected"]["rules"]["items"] = ["Half-Life 3"]
    assert evaluate(steam, ctx, "DONE").score == 0.0
    html = GETTERS["active_tab_html_parse"](ctx, {"category": "xpath", "xpathObject": {"/html/body/p": "line"}})
    assert html == {"line": "Portal 2 added to your cart"}
    run_steps([{"type": "chrome_close_tabs", "parameters": {"urls_to_close": [page]}}], SetupContext(desk, tmp_path))
    deadline = time.monotonic() + 15
    while any(t["url"] == page for t in GETTERS["open_tabs_info"](ctx, {})):
        assert time.monotonic() < deadline, "the tab was not closed"
        time.sleep(0.2)


def test_google_chrome_runs_as_chromium_where_only_that_is_installed(desk, tmp_path, monkeypatch):
    def which(command, shell=False, timeout=None):  # the guest has chromium, not google-chrome
        return FakeDesktop.execute(desk, ["true"] if command[-1] == "chromium" else ["false"])

    monkeypatch.setattr(desk, "execute", which)
    sctx = SetupContext(desk, tmp_path / "cache", open_timeout_s=0)  # no app window to wait for
    run_steps([{"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}}], sctx)
    # on Chrome's profile, which the tasks' setups edit and the getters read
    profile = f"--user-data-dir={desk.home}/.config/google-chrome"
    assert desk.launched[-1][0] == ["chromium", profile, "--remote-debugging-port=1337"]
    # OSWorld's postconfigs stop Chrome by its process name, to have it write its profile out
    run_steps([{"type": "launch", "parameters": {"command": ["pkill", "chrome"]}}], sctx)
    assert desk.launched[-1][0] == ["pkill", "chromium"]
    run_steps([{"type": "launch", "parameters": {"command": "killall -q chrome; sleep 1", "shell": True}}], sctx)
    assert desk.launched[-1][0] == "killall -q chromium; sleep 1"
    run_steps([{"type": "launch", "parameters": {"command": ["pkill", "vlc"]}}], sctx)
    assert desk.launched[-1][0] == ["pkill", "vlc"]
    monkeypatch.setattr(desk, "execute", lambda *a, **k: FakeDesktop.execute(desk, ["false"]))
    with pytest.raises(SetupError, match="'google-chrome' is not installed .* \\(nor is 'chromium'\\)"):
        run_steps([{"type": "launch", "parameters": {"command": ["google-chrome"]}}], sctx)


def test_a_shell_launch_names_its_app_after_the_variables(desk, tmp_path, monkeypatch):
    monkeypatch.setattr(desk, "execute", lambda *a, **k: FakeDesktop.execute(desk, ["false"]))
    sctx = SetupContext(desk, tmp_path / "cache", open_timeout_s=0)  # no app window to wait for
    with pytest.raises(SetupError, match="'vlc' is not installed"):
        run_steps([{"type": "launch", "parameters": {"command": "VLC_VERBOSE=-1 vlc --no-audio", "shell": True}}],
                  sctx)

    def only_chromium(command, shell=False, timeout=None):
        return FakeDesktop.execute(desk, ["true"] if command[-1] == "chromium" else ["false"])

    monkeypatch.setattr(desk, "execute", only_chromium)
    run_steps([{"type": "launch", "parameters": {"command": "google-chrome --remote-debugging-port=1337 &",
                                                  "shell": True}}], sctx)
    assert desk.launched[-1] == (f"chromium --user-data-dir={desk.home}/.config/google-chrome "
                                 "--remote-debugging-port=1337 &", True)


def test_update_browse_history_fills_the_template_from_the_files_mirror(desk, ctx, tmp_path, monkeypatch):
    import sqlite3
    import uuid

    from envs.gui.getters import FILES_ENV
    from envs.gui.setup_steps import HISTORY_TEMPLATE_URL

    mirror = tmp_path / "mirror" / "44ee5668"
    mirror.mkdir(parents=True)
    template = mirror / f"{uuid.uuid5(uuid.NAMESPACE_URL, HISTORY_TEMPLATE_URL)}_history_empty.sqlite"
    with sqlite3.connect(template) as conn:
        conn.execute("CREATE TABLE urls (id INTEGER PRIMARY KEY, url TEXT, title TEXT, visit_count INTEGER, "
                     "typed_count INTEGER, last_visit_time INTEGER, hidden INTEGER)")
        conn.execute("CREATE TABLE visits (id INTEGER PRIMARY KEY, url INTEGER, visit_time INTEGER, from_visit "
                     "INTEGER, transition INTEGER, segment_id INTEGER, visit_duration INTEGER)")
    step = {"type": "update_browse_history", "parameters": {"history": [
        {"url": "https://news.example/a", "title": "A", "visit_time_from_now_in_seconds": 60}]}}
    monkeypatch.delenv(FILES_ENV, raising=False)
    with pytest.raises(SetupError, match="cannot be fetched offline"):
        run_steps([step], SetupContext(desk, tmp_path / "c1"))
    monkeypatch.setenv(FILES_ENV, str(tmp_path / "mirror"))
    run_steps([step], SetupContext(desk, tmp_path / "c2"))
    rows = GETTERS["history"](ctx, {"dest": "History"})
    assert [r[:2] for r in rows] == [("https://news.example/a", "A")]
    deleted = {"func": "check_history_deleted", "result": {"type": "history", "dest": "History"},
               "expected": {"type": "rule", "rules": {"type": "keywords", "keywords": ["news.example"]}}}
    assert evaluate(deleted, ctx, "DONE").score == 0.0  # untouched: the history is still there


@pytest.mark.integration
def test_html_parse_categories_on_a_real_page(chromium, desk, ctx, tmp_path):
    page = ("data:text/html,<div class='fare'>120</div><div class='fare'>95</div><div class='route'>SEA<span>-"
            "</span>NYC</div><ul class='cats'><li class='catAllProducts'><span>Shoes</span></li></ul>"
            "<label>Total: 3 items</label><input id='q' value=' socks '><h4 class='tag'>red</h4>")
    run_steps([{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [page]}}], SetupContext(desk, tmp_path))
    deadline = time.monotonic() + 15
    while GETTERS["open_tabs_info"](ctx, {})[0]["url"] != page:
        assert time.monotonic() < deadline, "the opened tab never came first in DevTools"
        time.sleep(0.2)
    parse = GETTERS["active_tab_html_parse"]
    got = parse(ctx, {"category": "class", "class_multiObject": {"fare": {"0": "first", "1": "second", "5": "none"}},
                      "class_multiObject_child": {"route": {"0": "from", "1": "to"}},
                      "class_singleObject": {"tag": "tag"},
                      "class_multiObject_search_exist": {"fare": ["120", "is_other_exist"]}})
    assert got == {"first": "120", "second": "95", "none": "", "from": "SEA", "to": "NYC", "tag": "red",
                   "120": True, "is_other_exist": True}
    assert parse(ctx, {"category": "class&url", "class_multiObject_li": {"cats": ["shoes"]},
                       "url_include_expected": ["NYC", "LAX"]}) == {"shoes": True, "is_other_exist": False,
                                                                     "nyc": True, "lax": False}
    assert parse(ctx, {"category": "label", "labelObject": {"Total:": "total"}}) == {"total": "Total: 3 items"}
    assert parse(ctx, {"category": "input", "inputObject": {"//input[@id='q']": "query"}}) == {"query": "socks"}


@pytest.mark.integration
def test_page_info_and_pdf_from_url_in_a_new_tab(chromium, desk, ctx):
    page = "data:text/html,<title>Receipt</title><h1>Order 4417</h1>"
    info = GETTERS["page_info"](ctx, {"url": page})
    assert info["title"] == "Receipt" and "Order 4417" in info["content"]
    pdf = GETTERS["pdf_from_url"](ctx, {"path": page, "dest": "receipt.pdf"})
    assert Path(pdf).read_bytes().startswith(b"%PDF")
    assert "Order 4417" in pdf_text(pdf)
    deadline = time.monotonic() + 15  # the getters close their tabs again (closing is asynchronous)
    while any(t["url"] == page for t in GETTERS["open_tabs_info"](ctx, {})):
        assert time.monotonic() < deadline, "a getter's tab stayed open"
        time.sleep(0.2)
