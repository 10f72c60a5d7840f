"""Scripted solution steps -> the concrete action text an agent would send, resolved on the live observation.

`{"click": "Submit"}` becomes `pyautogui.click(62, 171)` using the element's centre in the current accessibility tree,
so a scripted solution survives layout differences between machines (fonts, themes) and the demonstrations a policy is
trained on hold exactly the coordinates it will see.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from envs.gui.observation import Element, find_element
from envs.runtime.desktop import WindowInfo


class SolutionError(ValueError):
    """A scripted step cannot be resolved (its element or window is not on screen)."""


STEP_KEYS = ("click", "write", "press", "hotkey", "click_window", "computer_13", "do", "wait_window", "wait_element")
# {"wait_window": "<title>", "max_waits": n, "focused": true}: GUIEnv.play sends WAIT until a window whose title
# contains it is listed (and focused, unless "focused": false): a dialog an app opens a moment after the keys
# that ask for it. {"wait_element": "<name>", "role": .., "focused": false, "max_waits": n}: WAIT until an element of
# that name (or text) is in the accessibility tree (and focused, if "focused": true): a dialog's widgets are ready
# for input some time after its window is listed. Resolved alone, either is one WAIT
WAIT_STEPS = ("wait_window", "wait_element")
MAX_WAITS = 20


def is_wait_step(step: Any) -> bool:
    return isinstance(step, dict) and any(k in step for k in WAIT_STEPS)


def max_waits(step: Any) -> int:
    """The WAITs a wait step may take before the script fails; 0 for any other step."""
    return int(step.get("max_waits", MAX_WAITS)) if is_wait_step(step) else 0


def _wants_focus(step: dict[str, Any]) -> bool:
    """A window is waited for until it holds the keyboard focus (the keys go there), an element until it is listed,
    unless the step says otherwise."""
    return bool(step.get("focused", "wait_window" in step))


def wait_is_over(step: dict[str, Any], elements: Sequence[Element], windows: Sequence[WindowInfo]) -> bool:
    """Whether the window or element a wait step waits for is on screen now."""
    focused = _wants_focus(step)
    if "wait_window" in step:
        title = str(step["wait_window"])
        return any(title in w.title and (w.focused or not focused) for w in windows)
    name, role = str(step["wait_element"]), step.get("role")
    return any((e.name == name or e.text == name) and (role is None or e.role == role)
               and ("focused" in e.states or not focused) for e in elements)


def awaited(step: dict[str, Any]) -> str:
    """What a wait step waits for, in words (for its error)."""
    focused = "focused " if _wants_focus(step) else ""
    if "wait_window" in step:
        return f"{focused}window {step['wait_window']!r}"
    role = f" ({step['role']})" if step.get("role") else ""
    return f"{focused}element {step['wait_element']!r}{role}"


def resolve_step(step: str | dict[str, Any], elements: Sequence[Element], windows: Sequence[WindowInfo]) -> str:
    """The action text of one scripted step; `{"do": [step, ...]}` is several pyautogui calls in one action."""
    if isinstance(step, str):
        return step
    if not isinstance(step, dict) or len(set(STEP_KEYS) & set(step)) != 1:
        raise SolutionError(f"a solution step is an action string or one of {'/'.join(STEP_KEYS)}, got {step!r}")
    if is_wait_step(step):
        return "WAIT"
    if "do" in step:
        parts = step["do"]
        if not isinstance(parts, list) or not parts or any(not isinstance(p, dict) or "do" in p or "computer_13" in p
                                                            for p in parts):
            raise SolutionError(f"'do' takes a list of pyautogui steps (click/write/press/hotkey), got {parts!r}")
        return "; ".join(resolve_step(p, elements, windows) for p in parts)
    if "click" in step:
        el = find_element(elements, step["click"], step.get("role"), int(step.get("index", 0)))
        if el is None:
            names = sorted({e.name or e.text for e in elements if e.name or e.text})
            raise SolutionError(f"no element named {step['click']!r} on screen; visible: {names}")
        x, y = el.center
        clicks = int(step.get("clicks", 1))
        fn = {1: "click", 2: "doubleClick", 3: "tripleClick"}[clicks]
        if step.get("button", "left") != "left":
            return f"pyautogui.{fn}({x}, {y}, button={step['button']!r})"
        return f"pyautogui.{fn}({x}, {y})"
    if "write" in step:
        return f"pyautogui.write({step['write']!r})"
    if "press" in step:
        return f"pyautogui.press({step['press']!r})"
    if "hotkey" in step:
        return f"pyautogui.hotkey({', '.join(repr(k) for k in step['hotkey'])})"
    if "computer_13" in step:
        return json.dumps(step["computer_13"])
    title = step["click_window"]
    for w in windows:
        if title in w.title:
            return f"pyautogui.click({w.x + int(step.get('dx', w.w // 2))}, {w.y + int(step.get('dy', w.h // 2))})"
    raise SolutionError(f"no window titled {title!r}; windows: {[w.title for w in windows]}")
