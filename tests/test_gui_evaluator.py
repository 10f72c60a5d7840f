"""OSWorld evaluation semantics (metrics, getters, conj, infeasible, postconfig) and setup steps, on a fake desktop.

The fake stands in for the desktop only here, where the code under test is the evaluator's own logic; the same code
runs against real desktops in test_gui_tasks.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from envs.gui import metrics
from envs.gui.evaluator import check_supported, evaluate, partial_checks
from envs.gui.getters import EvalContext
from envs.gui.setup_steps import SetupContext, SetupError, check_steps, run_steps
from envs.gui.tasks import bundled_tasks, validate_task
from envs.runtime import ExecResult
from envs.runtime.desktop import WindowInfo


class FakeDesktop:
    """A desktop whose files live in a temp dir and whose commands run in a real shell there."""

    def __init__(self, home: Path):
        self.home = str(home)
        self.launched: list = []
        self.windows_list: list[WindowInfo] = []
        self.a11y = "<desktop-frame/>"
        self.executed: list = []

    def resolve(self, path: str) -> str:
        p = path.replace("~", self.home, 1) if path.startswith("~") else path
        return p if p.startswith("/") else f"{self.home}/{p}"

    def execute(self, command, shell=False, timeout=None):
        self.executed.append(command)
        proc = subprocess.run(
            command if shell else list(command),
            shell=shell,
            capture_output=True,
            text=True,
            cwd=self.home,
            env={"HOME": self.home, "PATH": "/usr/bin:/bin"},
        )
        return ExecResult(proc.returncode, proc.stdout, proc.stderr)

    def read_file(self, path):
        return Path(self.resolve(path)).read_bytes()

    def write_file(self, path, data):
        p = Path(self.resolve(path))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())

    def launch(self, command, shell=False):
        self.launched.append((command, shell))

    def windows(self):
        return self.windows_list

    def a11y_tree(self):
        return self.a11y

    def screen_size(self):
        return 1920, 1080

    def activate_window(self, name, strict=False, by_class=False):
        return any(name in w.title for w in self.windows_list)

    close_window = activate_window

    def open_path(self, path, timeout=10.0):
        self.launched.append((["open", path], False))


@pytest.fixture
def desk(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return FakeDesktop(home)


@pytest.fixture
def ctx(desk, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "gold.txt").write_text("hello")
    return EvalContext(desk, tmp_path / "cache", files)


def cmd(command, expected):
    return {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": command, "shell": True},
        "expected": {"type": "rule", "rules": {"expected": expected}},
    }


def test_single_metric_and_getters(ctx, desk):
    assert evaluate(cmd("echo hi", "hi\n"), ctx, "DONE").score == 1.0
    assert evaluate(cmd("echo hi", "ho\n"), ctx, "DONE").score == 0.0
    desk.write_file("~/out.txt", "hello")
    ev = {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": "~/out.txt", "dest": "out.txt"},
        "expected": {"type": "cloud_file", "path": "gold.txt", "dest": "gold.txt"},
    }
    assert evaluate(ev, ctx, "DONE").score == 1.0
    desk.write_file("~/out.txt", "hell")
    assert evaluate(ev, ctx, "DONE").score == 0.0


def test_missing_file_scores_zero(ctx):
    ev = {
        "func": "check_json",
        "result": {"type": "vm_file", "path": "~/nope.json", "dest": "n.json"},
        "expected": {"type": "rule", "rules": {"expect": [{"key": ["a"], "method": "eq", "ref": 1}]}},
    }
    assert evaluate(ev, ctx, "DONE").score == 0.0


def test_conj_and_or(ctx):
    both = {
        "func": ["exact_match", "exact_match"],
        "result": [cmd("echo a", "")["result"], cmd("echo b", "")["result"]],
        "expected": [{"type": "rule", "rules": {"expected": "a\n"}}, {"type": "rule", "rules": {"expected": "x\n"}}],
    }
    ev = evaluate(both, ctx, "DONE")
    assert ev.score == 0.0 and ev.scores == [1.0, 0.0]  # "and" stops at the first zero
    ev = evaluate({**both, "conj": "or"}, ctx, "DONE")
    assert ev.score == 1.0 and ev.scores == [1.0]  # "or" stops at the first one
    fuzzy = {
        "func": ["fuzzy_match", "exact_match"],
        "conj": "and",
        "result": [cmd("printf abcd", "")["result"], cmd("echo a", "")["result"]],
        "expected": [{"type": "rule", "rules": {"expected": "abce"}}, {"type": "rule", "rules": {"expected": "a\n"}}],
        "options": [{}, None],
    }
    assert evaluate(fuzzy, ctx, "DONE").score == pytest.approx((0.75 + 1.0) / 2)  # "and" averages partial scores


def test_infeasible_and_fail_rules(ctx):
    assert evaluate({"func": "infeasible"}, ctx, "FAIL").score == 1.0
    assert evaluate({"func": "infeasible"}, ctx, "DONE").score == 0.0
    assert evaluate({"func": "infeasible"}, ctx, None).score == 0.0
    assert evaluate(cmd("echo hi", "hi\n"), ctx, "FAIL").score == 0.0  # giving up on a feasible task scores 0


def test_postconfig_runs_before_the_metric(ctx, desk):
    ev = {
        **cmd("cat ~/flag", "set\n"),
        "postconfig": [{"type": "execute", "parameters": {"command": "echo set > ~/flag", "shell": True}}],
    }
    assert evaluate(ev, ctx, "DONE").score == 1.0


def test_evaluator_errors_score_zero_with_a_reason(ctx, desk):
    desk.write_file("~/s.json", '{"a": 1}')
    ev = {
        "func": "check_json",
        "result": {"type": "vm_file", "path": "~/s.json", "dest": "s.json"},
        "expected": {"type": "rule", "rules": {"expect": [{"key": ["a"], "method": "nope", "ref": 1}]}},
    }
    out = evaluate(ev, ctx, "DONE")
    assert out.score == 0.0 and "unknown rule method 'nope'" in out.error


def test_check_json_rules(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"a": {"b": 3}, "name": "Alice Smith", "x": 1.0004}))
    rules = lambda *r: {"expect": list(r)}
    assert metrics.check_json(str(f), rules({"key": ["a", "b"], "method": "eq", "ref": 3})) == 1.0
    assert metrics.check_json(str(f), rules({"key": ["a", "b"], "method": "gt", "ref": 3})) == 0.0
    assert metrics.check_json(str(f), rules({"key": ["name"], "method": "re.I", "ref": "^alice"})) == 1.0
    assert metrics.check_json(str(f), rules({"key": ["x"], "method": "approx:0.001", "ref": 1})) == 1.0
    assert metrics.check_json(str(f), rules({"key": ["missing"], "method": "eq", "ref": 1})) == 0.0
    assert metrics.check_json(str(f), {"unexpect": [{"key": ["name"], "method": "eq", "ref": "Alice Smith"}]}) == 0.0
    (tmp_path / "bad.json").write_text("{")
    assert metrics.check_json(str(tmp_path / "bad.json"), rules({"key": ["a"], "method": "eq", "ref": 1})) == 0.0


def test_text_metrics(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("Line one\nline  two\n")
    b.write_text("line one\nline two")
    assert metrics.compare_text_file(str(a), str(b)) == 0.0
    assert metrics.compare_text_file(str(a), str(b), ignore_case=True, ignore_blanks=True) == 1.0
    c = tmp_path / "c"
    c.write_text("Line one\nline 2\n")
    assert metrics.diff_text_file(str(a), str(c)) == 0.5  # one of two lines in common
    assert metrics.diff_text_file(str(a), str(a)) == 1.0
    assert metrics.check_list(str(a), {"expect": ["^Line one$"], "unexpect": ["three"]}) == 1.0
    assert metrics.check_list(str(a), {"expect": ["^Line one$"], "unexpect": ["two"]}) == 0.0
    assert metrics.check_include_exclude("abc", {"include": ["a"], "exclude": ["z"]}) == 1.0
    assert metrics.check_include_exclude(None, {"include": []}) == 0.0
    assert metrics.is_in_list(["x", "y"], {"expected": "y"}) == 1.0
    assert metrics.match_in_list("y", {"expected": ["x", "y"]}) == 1.0
    assert metrics.literal_match("ABC", "abc", ignore_case=True) == 1.0
    assert metrics.check_direct_json_object('{"k": "v"}', {"expected": {"k": "v"}}) == 1.0
    csv_file = tmp_path / "c.csv"
    csv_file.write_text("name,age\nann,3\nbob,4\n")
    assert (
        metrics.check_csv(str(csv_file), {"expect": [{"name": "bob", "age": "4"}], "unexpect": [{"name": "cy"}]}) == 1.0
    )


XML = """<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state"
 xmlns:cp="https://accessibility.ubuntu.example.org/ns/component"><application name="form.py">
<frame name="Sign-up form" st:showing="true" st:visible="true" cp:screencoord="(0, 0)" cp:size="(420, 330)">
<text name="Name" st:showing="true" st:visible="true" st:focused="true" cp:screencoord="(59, 10)" cp:size="(188, 34)">Alice</text>
<radio-button name="Pro" st:showing="true" st:visible="true" st:checked="true" cp:screencoord="(130, 95)" cp:size="(40, 20)"/>
</frame></application></desktop-frame>"""


def test_check_accessibility_tree(ctx):
    import lxml  # noqa: F401 (the gui extra, always installed: a broken one fails)
    ok = [{"xpath": "//text[@name='Name']", "text": "Alice", "exact": True}]
    assert metrics.check_accessibility_tree(XML, ok) == 1.0
    assert metrics.check_accessibility_tree(XML, [{"xpath": "//radio-button[@name='Pro'][@st:checked='true']"}]) == 1.0
    assert (
        metrics.check_accessibility_tree(XML, [{"xpath": "//text[@name='Name']", "text": "Bob", "exact": True}]) == 0.0
    )
    assert metrics.check_accessibility_tree(XML, [{"selectors": ["text[name='Name']"]}]) == 1.0
    ctx.a11y_xml = XML
    checks = [
        {
            "func": "check_accessibility_tree",
            "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": ok},
        },
        {
            "func": "check_accessibility_tree",
            "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": [{"xpath": "//push-button"}]},
        },
    ]
    assert partial_checks(checks, ctx) == [True, False]


def test_setup_steps(desk, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "doc.txt").write_text("payload")
    ctx = SetupContext(desk, tmp_path / "cache", files, client_password="pw")
    run_steps(
        [
            {
                "type": "execute",
                "parameters": {"command": "echo {CLIENT_PASSWORD} {SCREEN_WIDTH_HALF} > ~/p", "shell": True},
            },
            {
                "type": "download",
                "parameters": {
                    "files": [
                        {"url": "doc.txt", "path": "~/Documents/doc.txt"},
                        {"url": f"file://{files / 'doc.txt'}", "path": "abs.txt"},
                    ]
                },
            },
            {"type": "launch", "parameters": {"command": "ns-editor ~/Documents/doc.txt"}},
            {"type": "command", "parameters": {"command": ["bash", "-c", "echo out"], "stdout": "o.txt"}},
            {
                "type": "execute",
                "parameters": {
                    "command": "test -e ~/ready || touch ~/ready; cat ~/ready; echo x",
                    "shell": True,
                    "until": {"stdout": "x"},
                },
            },
            {"type": "sleep", "parameters": {"seconds": 0}},
            {"type": "activate_window", "parameters": {"window_name": "Nothing"}},
            {"type": "open", "parameters": {"path": "~/Documents/doc.txt"}},
        ],
        ctx,
    )
    assert Path(desk.resolve("~/p")).read_text() == "pw 960\n"
    assert Path(desk.resolve("~/Documents/doc.txt")).read_text() == "payload"
    assert Path(desk.resolve("abs.txt")).read_text() == "payload"
    assert desk.launched[0] == (["ns-editor", "~/Documents/doc.txt"], False)  # a string command is split (OSWorld)
    assert (tmp_path / "cache" / "o.txt").read_text() == "out\n"


def test_setup_failures_name_the_step(desk, tmp_path):
    ctx = SetupContext(desk, tmp_path / "cache", None)
    with pytest.raises(SetupError, match=r"setup step 1 \(download\) failed"):
        run_steps([{"type": "download", "parameters": {"files": [{"url": "missing.txt", "path": "x"}]}}], ctx)
    with pytest.raises(SetupError, match="until"):
        run_steps(
            [
                {
                    "type": "execute",
                    "parameters": {"command": "true", "shell": True, "until": {"returncode": 3}, "max_tries": 2},
                }
            ],
            ctx,
        )
    with pytest.raises(SetupError, match="did not hold"):
        run_steps(
            [
                {
                    "type": "execute_with_verification",
                    "parameters": {
                        "command": "true",
                        "shell": True,
                        "verification": {"window_exists": "Nope"},
                        "max_wait_time": 0.2,
                    },
                }
            ],
            ctx,
        )


def test_task_validation_names_what_is_unsupported():
    for t in bundled_tasks("all") + bundled_tasks("osworld"):
        validate_task(t)
    base = {
        "id": "t",
        "instruction": "do",
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "rule", "rules": 1},
            "expected": {"type": "rule", "rules": {"expected": 1}},
        },
    }
    validate_task(base)
    with pytest.raises(ValueError, match="metric 'compare_epub' is not supported"):
        validate_task({**base, "evaluator": {**base["evaluator"], "func": "compare_epub"}})
    with pytest.raises(ValueError, match="getter 'chrome_cookies' is not supported"):
        validate_task({**base, "evaluator": {**base["evaluator"], "result": {"type": "chrome_cookies"}}})
    with pytest.raises(ValueError, match="'googledrive' is not supported"):
        validate_task({**base, "config": [{"type": "googledrive", "parameters": {}}]})
    with pytest.raises(ValueError, match="must be a list of 2"):
        check_supported({"func": ["exact_match", "exact_match"], "result": [{"type": "rule"}]})
    with pytest.raises(ValueError, match="no 'instruction'"):
        validate_task({"id": "x", "evaluator": {}})
    with pytest.raises(ValueError, match="unknown setup step"):
        check_steps([{"type": "teleport"}])


def test_os_domain_metrics():
    from envs.gui.metrics import check_gnome_favorite_apps, check_moved_jpgs, check_text_enlarged, is_utc_0

    rule = {"expected": ["google-chrome.desktop", "thunderbird.desktop"]}
    assert check_gnome_favorite_apps("['thunderbird.desktop', 'google-chrome.desktop']\n", rule) == 1.0
    assert check_gnome_favorite_apps("['thunderbird.desktop', 'vim.desktop', 'google-chrome.desktop']", rule) == 0.0
    assert check_gnome_favorite_apps("__import__('os').system('true')", rule) == 0.0  # a literal, never code
    assert check_gnome_favorite_apps(None, rule) == 0.0
    zone = "      Local time: Thu 2024-01-25 12:56:06 WET\n Universal time: ...\n   RTC time: ...\n"
    assert is_utc_0(zone + "       Time zone: Atlantic/Faroe (WET, +0000)\n") == 1.0
    assert is_utc_0(zone + "       Time zone: Europe/Paris (CET, +0100)\n") == 0.0
    assert is_utc_0("") == 0.0 and is_utc_0(None) == 0.0
    assert check_text_enlarged("1.25\n") == 1.0 and check_text_enlarged("1.0\n") == 0.0
    assert check_text_enlarged("") == 0.0
    tree = {"type": "directory", "name": "cpjpg", "children": [{"type": "file", "name": "a.jpg"},
                                                               {"type": "file", "name": "b.jpg"}]}
    assert check_moved_jpgs(tree, {"expected": ["b.jpg", "a.jpg"]}) == 1.0
    assert check_moved_jpgs(tree, {"expected": ["a.jpg"]}) == 0.0
    assert check_moved_jpgs({"error": "no such dir"}, {"expected": []}) == 0.0


def test_terminal_logs_become_text():
    from envs.runtime.desktop import terminal_text

    raw = "\x1b]0;user@host: ~\x07\x1b[01;32muser@host\x1b[00m:~$ stty size\r\n43 132\r\nab\bc\x1b[?2004h"
    assert terminal_text(raw) == "user@host:~$ stty size\n43 132\nac"
