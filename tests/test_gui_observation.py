"""The observation text built from OSWorld's a11y XML, and scripted solution steps resolved against it."""

import pytest

from envs.gui.observation import find_element, parse_a11y, render
from envs.gui.solution import MAX_WAITS, SolutionError, awaited, max_waits, resolve_step, wait_is_over
from envs.runtime.desktop import WindowInfo

XML = """<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state"
 xmlns:cp="https://accessibility.ubuntu.example.org/ns/component" xmlns:val="https://accessibility.ubuntu.example.org/ns/value">
<application name="settings.py">
 <frame name="Settings" st:showing="true" st:visible="true" cp:screencoord="(0, 0)" cp:size="(400, 340)">
  <filler name="" st:showing="true" st:visible="true" cp:screencoord="(0, 0)" cp:size="(400, 340)">
   <check-box name="Dark mode" st:showing="true" st:visible="true" st:checked="true" cp:screencoord="(10, 10)" cp:size="(246, 22)"/>
   <spin-button name="Font size" st:showing="true" st:visible="true" val:value="11.0" cp:screencoord="(100, 100)" cp:size="(150, 34)">11</spin-button>
   <label name="Font size" st:showing="true" st:visible="true" cp:screencoord="(10, 100)" cp:size="(60, 17)">Font size</label>
   <push-button name="Apply" st:showing="true" st:visible="true" cp:screencoord="(10, 200)" cp:size="(74, 28)"/>
   <push-button name="Hidden" st:visible="true" cp:screencoord="(10, 300)" cp:size="(74, 28)"/>
   <push-button name="Offscreen" st:showing="true" st:visible="true"/>
   <label name="Status" st:showing="true" st:visible="true" cp:screencoord="(10, 240)" cp:size="(200, 17)">Settings "saved"</label>
   <text name="Name" st:showing="true" st:visible="true" st:focused="true" cp:screencoord="(10, 50)" cp:size="(200, 30)"></text>
  </filler>
 </frame>
</application></desktop-frame>"""


def test_parse_keeps_visible_actionable_elements_in_reading_order():
    els = parse_a11y(XML)
    assert [e.name for e in els] == ["Dark mode", "Name", "Font size", "Font size", "Apply", "Status"]
    dark = els[0]
    assert dark.center == (133, 21) and "checked" in dark.states and dark.app == "settings.py"
    assert els[2].role == "label" and els[3].value == "11"
    assert parse_a11y("not xml <") == []


def test_render_is_short_and_actionable():
    els = parse_a11y(XML)
    text = render(
        "Turn on dark mode.", [WindowInfo(1, "Settings", ["settings.py"], 0, 0, 400, 340, True)], els, result="ok"
    )
    lines = text.splitlines()
    assert lines[0] == "Result: ok" and lines[1] == "Task: Turn on dark mode."
    assert '- "Settings" at 0,0 size 400x340 [focused]' in lines
    assert '- check box "Dark mode" [checked] @133,21' in lines
    assert '- text "Name" = "" [focused] @110,65' in lines
    assert '- spin button "Font size" = 11 @175,117' in lines
    assert '- label "Status" = "Settings \\"saved\\"" @110,248' in lines
    assert 'label "Font size"' not in text  # a label that only names an input is left out
    assert len(text) < 600
    assert "Windows: none (an empty 1280x800 screen)" in render("x", [], [], width=1280, height=800)
    many = render("x", [], els * 30, max_elements=10)
    assert "... 140 more" in many  # 6 elements x 30, less the 30 redundant labels


def test_compact_render_lists_the_elements_then_the_task():
    els = parse_a11y(XML)
    unchecked = [e for e in parse_a11y(XML.replace(' st:checked="true"', ""))]
    text = render("Turn on dark mode.", [WindowInfo(1, "Settings", ["settings.py"], 0, 0, 400, 340, True)], unchecked,
                  result="ok", compact=True)
    assert text.splitlines() == [
        "Result: ok", 'check box "Dark mode" @133,21', 'text "Name" = "" [focused] @110,65',
        'spin button "Font size" = 11 @175,117', 'push button "Apply" @47,214',
        'label "Status" = "Settings \\"saved\\"" @110,248', "Task: Turn on dark mode."]
    assert 'check box "Dark mode" [checked] @133,21' in render(None, [], els, compact=True)
    assert render(None, [], [], compact=True) == "Windows: none"


def test_find_element_and_resolve_steps():
    els = parse_a11y(XML)
    wins = [WindowInfo(7, "Terminal", ["xterm"], 1, 1, 484, 316)]
    assert find_element(els, "Apply").role == "push button"
    assert find_element(els, "Apply", role="check box") is None
    assert find_element(els, 'Settings "saved"').name == "Status"  # falls back to the text
    assert resolve_step({"click": "Apply"}, els, wins) == "pyautogui.click(47, 214)"
    assert (
        resolve_step({"click": "Font size", "role": "spin button", "clicks": 3}, els, wins)
        == "pyautogui.tripleClick(175, 117)"
    )
    assert resolve_step({"write": "it's"}, els, wins) == 'pyautogui.write("it\'s")'
    assert resolve_step({"hotkey": ["ctrl", "s"]}, els, wins) == "pyautogui.hotkey('ctrl', 's')"
    assert resolve_step({"click_window": "Terminal"}, els, wins) == "pyautogui.click(243, 159)"
    assert resolve_step("DONE", els, wins) == "DONE"
    assert resolve_step({"computer_13": {"action_type": "PRESS", "key": "enter"}}, els, wins).startswith("{")
    with pytest.raises(SolutionError, match="no element named 'Cancel'"):
        resolve_step({"click": "Cancel"}, els, wins)
    with pytest.raises(SolutionError, match="no window titled"):
        resolve_step({"click_window": "Editor"}, els, wins)
    with pytest.raises(SolutionError, match="one of click"):
        resolve_step({"click": "Apply", "write": "x"}, els, wins)


def test_wait_steps_are_over_when_their_window_or_element_is_there():
    """`wait_window` waits for a listed (by default focused) window; `wait_element` for an element by name or text
    (and role), focused only when asked: a dialog's field is ready for keys after its window is listed."""
    els = parse_a11y(XML)
    wins = [WindowInfo(7, "Settings - app", ["app"], 1, 1, 400, 340, focused=False)]
    assert not wait_is_over({"wait_window": "Settings"}, els, wins)
    assert wait_is_over({"wait_window": "Settings", "focused": False}, els, wins)
    assert wait_is_over({"wait_element": "Apply", "role": "push button"}, els, wins)
    assert not wait_is_over({"wait_element": "Apply", "role": "check box"}, els, wins)
    assert not wait_is_over({"wait_element": "Apply", "focused": True}, els, wins)
    assert wait_is_over({"wait_element": "Name", "role": "text", "focused": True}, els, wins)
    assert wait_is_over({"wait_element": 'Settings "saved"'}, els, wins)  # by its text
    assert not wait_is_over({"wait_element": "Cancel"}, [], wins)
    assert resolve_step({"wait_element": "Apply"}, els, wins) == "WAIT"
    assert max_waits({"wait_element": "Apply"}) == MAX_WAITS and max_waits({"wait_window": "x", "max_waits": 3}) == 3
    assert max_waits({"click": "Apply"}) == 0 and max_waits("DONE") == 0
    assert awaited({"wait_window": "Export"}) == "focused window 'Export'"
    assert awaited({"wait_element": "File name:", "role": "text"}) == "element 'File name:' (text)"
    assert awaited({"wait_element": "x", "focused": True}) == "focused element 'x'"
