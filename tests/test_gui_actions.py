"""GUI action parsing: pyautogui code checks, computer_13 translation, special actions (no desktop needed)."""

import json

import pytest

from envs.runtime.actions import ActionParseError, check_pyautogui_code, parse_action, strip_fences


@pytest.mark.parametrize(
    "text",
    [
        "pyautogui.click(120, 40)",
        "import pyautogui\npyautogui.write('abc'); pyautogui.press('enter')",
        "import pyautogui as pg\npg.hotkey('ctrl', 's')",
        "from pyautogui import click\nclick(3, 4)",
        "for i in range(3):\n    pyautogui.press('tab')",
        "x = 10\ny = x * 2\npyautogui.moveTo(x, y, duration=0.1)",
        "pyautogui.scroll(-3); time.sleep(0.1)",
        "pyautogui.press(['tab', 'enter'])",
        "pyautogui.dragTo(5, 6, 0.2, pyautogui.easeInQuad)",
    ],
)
def test_valid_pyautogui_code_is_accepted_unchanged(text):
    p = parse_action(text)
    assert p.kind == "code" and p.space == "pyautogui" and p.code == text


@pytest.mark.parametrize(
    "text, why",
    [
        ("import os", "only pyautogui and time"),
        ("import subprocess; subprocess.run('ls')", "only pyautogui and time"),
        ("pyautogui.os.system('rm -rf /')", "attributes may only be read"),
        ("open('/etc/passwd')", "'open' is not defined"),
        ("__import__('os')", "'__import__' is not defined"),
        ("(1).__class__", "attributes may only be read"),
        ("pyautogui.alert('hi')", "pyautogui.alert is not available"),
        ("pyautogui.screenshot('/tmp/x.png')", "pyautogui.screenshot is not available"),
        ("while True:\n    pass", "'While' statements"),
        ("lambda: 0", "'Lambda' is not allowed"),
        ("pyautogui = 3", "may not rebind"),
        ("pyautogui.PAUSE = 5", "plain variable names"),
        ("pyautogui.click(", "could not parse"),
        ("pyautogui.press('nokey')", "unknown key 'nokey'"),
        ("pyautogui.hotkey('ctrl', 'bogus')", "unknown key 'bogus'"),
        ("def f():\n    pass", "'FunctionDef' statements"),
    ],
)
def test_disallowed_code_is_a_parse_error_with_a_reason(text, why):
    with pytest.raises(ActionParseError, match=why):
        parse_action(text)


def test_code_fences_are_stripped():
    assert strip_fences("I will click.\n```python\npyautogui.click(1, 2)\n```") == "pyautogui.click(1, 2)"
    assert parse_action("```\npyautogui.click(1, 2)\n```").code == "pyautogui.click(1, 2)"
    assert parse_action("```\nDONE\n```").special == "DONE"


@pytest.mark.parametrize("word", ["WAIT", "DONE", "FAIL"])
def test_special_actions(word):
    p = parse_action(f"  {word}\n")
    assert p.kind == "special" and p.special == word
    assert parse_action({"action_type": word}).special == word


def test_lowercase_done_is_code_not_special():
    with pytest.raises(ActionParseError):
        parse_action("done")


def test_code_then_done_must_be_separate_actions():
    with pytest.raises(ActionParseError, match="as its own action"):
        parse_action("pyautogui.click(1, 2)\nDONE")


@pytest.mark.parametrize(
    "action, code",
    [
        ({"action_type": "CLICK", "parameters": {"x": 10, "y": 20}}, "pyautogui.click(button='left', x=10, y=20)"),
        (
            {"action_type": "CLICK", "x": 10, "y": 20, "button": "right", "num_clicks": 2},
            "pyautogui.click(button='right', x=10, y=20, clicks=2)",
        ),
        ({"action_type": "MOVE_TO", "parameters": {"x": 1.5, "y": 2}}, "pyautogui.moveTo(x=1.5, y=2)"),
        ({"action_type": "TYPING", "parameters": {"text": "it's"}}, 'pyautogui.typewrite("it\'s")'),
        ({"action_type": "PRESS", "parameters": {"key": "enter"}}, "pyautogui.press('enter')"),
        ({"action_type": "HOTKEY", "parameters": {"keys": ["ctrl", "s"]}}, "pyautogui.hotkey('ctrl', 's')"),
        ({"action_type": "SCROLL", "parameters": {"dy": -3}}, "pyautogui.vscroll(-3)"),
        ({"action_type": "SCROLL", "parameters": {"dx": 2, "dy": 1}}, "pyautogui.hscroll(2); pyautogui.vscroll(1)"),
        (
            {"action_type": "DRAG_TO", "parameters": {"x": 3, "y": 4}},
            "pyautogui.dragTo(x=3, y=4, duration=0.3, button='left', mouseDownUp=True)",
        ),
        ({"action_type": "MOUSE_DOWN"}, "pyautogui.mouseDown(button='left')"),
        ({"action_type": "RIGHT_CLICK", "parameters": {}}, "pyautogui.rightClick()"),
        ({"action_type": "KEY_DOWN", "parameters": {"key": "shift"}}, "pyautogui.keyDown('shift')"),
    ],
)
def test_computer_13_translates_to_checked_pyautogui_code(action, code):
    p = parse_action(action)
    assert p.space == "computer_13" and p.code == code
    check_pyautogui_code(p.code)  # the translation passes the same checks as agent code
    assert parse_action(json.dumps(action)).code == code  # and its JSON text parses the same


@pytest.mark.parametrize(
    "action, why",
    [
        ({"action_type": "JUMP"}, "unknown action_type"),
        ({"parameters": {}}, "needs an 'action_type'"),
        ({"action_type": "CLICK", "parameters": {"x": "ten", "y": 2}}, "must be a number"),
        ({"action_type": "PRESS", "parameters": {"key": "nokey"}}, "unknown key"),
        ({"action_type": "TYPING", "parameters": {}}, "needs a 'text'"),
        ({"action_type": "MOVE_TO", "parameters": {}}, "needs 'x' and 'y'"),
        ({"action_type": "CLICK", "parameters": {"button": "side"}}, "button must be"),
    ],
)
def test_bad_computer_13_actions_are_parse_errors(action, why):
    with pytest.raises(ActionParseError, match=why):
        parse_action(action)


def test_action_space_restricts_what_is_accepted():
    with pytest.raises(ActionParseError, match="computer_13"):
        parse_action("pyautogui.click(1, 2)", "computer_13")
    with pytest.raises(ActionParseError, match="pyautogui code"):
        parse_action({"action_type": "CLICK", "x": 1, "y": 2}, "pyautogui")
    assert parse_action("DONE", "computer_13").special == "DONE"
    with pytest.raises(ValueError):
        parse_action("DONE", "vnc")


def test_malformed_json_and_empty_actions():
    with pytest.raises(ActionParseError, match="not valid JSON"):
        parse_action('{"action_type": "CLICK",')
    with pytest.raises(ActionParseError, match="empty"):
        parse_action("   ")
    with pytest.raises(ActionParseError, match="text or a dict"):
        parse_action(42)  # type: ignore[arg-type]
