"""The text an agent reads: the desktop's windows and their actionable elements, with screen coordinates.

Built from OSWorld's accessibility XML (any backend) plus the X window list (which also covers apps without an
accessibility tree, such as Tk apps and xterm). Each element is one short line, `role "name" = "value" [states] @x,y`,
where x,y is the element's centre: exactly what `pyautogui.click(x, y)` needs, so a text-only policy can act.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field

from envs.runtime.a11y_worker import NS
from envs.runtime.desktop import WindowInfo

NS_STATE, NS_COMPONENT, NS_VALUE = NS["st"], NS["cp"], NS["val"]  # of the XML the a11y worker writes (OSWorld's)

#: Roles worth showing: what can be clicked, typed into or read. Containers (filler, panel, scroll pane...) are skipped.
ACTIONABLE_ROLES = frozenset(
    {
        "push button",
        "toggle button",
        "check box",
        "radio button",
        "text",
        "password text",
        "entry",
        "spin button",
        "combo box",
        "menu item",
        "check menu item",
        "radio menu item",
        "menu",
        "list item",
        "table cell",
        "tree item",
        "page tab",
        "slider",
        "link",
        "icon",
        "terminal",
        "document text",
        "paragraph",
        "label",
        "heading",
        "static",
    }
)
SHOWN_STATES = ("checked", "selected", "focused", "expanded", "pressed")
_PAIR = re.compile(r"\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)")


@dataclass
class Element:
    role: str
    name: str
    x: int  # top-left, screen coordinates
    y: int
    w: int
    h: int
    text: str = ""
    value: str | None = None
    states: frozenset[str] = field(default_factory=frozenset)
    app: str = ""

    @property
    def center(self) -> tuple[int, int]:
        return self.x + self.w // 2, self.y + self.h // 2

    def line(self, max_text: int = 60, compact: bool = False) -> str:
        """role "name" = value [state] @x,y; `compact` leaves out "[unchecked]" (what is not said checked is not)."""
        parts = [self.role, _quote(self.name)]
        shown = self.text if self.role not in ("label", "heading", "static") or self.text != self.name else ""
        if self.value is not None and self.role in ("spin button", "slider"):
            parts.append(f"= {self.value}")
        elif shown or self.role in ("text", "password text", "entry", "spin button"):
            parts.append(f"= {_quote(_clip(shown, max_text))}")
        if self.role in ("check box", "radio button", "toggle button", "check menu item", "radio menu item"):
            if not compact or "checked" in self.states:
                parts.append("[checked]" if "checked" in self.states else "[unchecked]")
        extra = [s for s in SHOWN_STATES if s in self.states and s != "checked"]
        if extra:
            parts.append("[" + " ".join(extra) + "]")
        cx, cy = self.center
        parts.append(f"@{cx},{cy}")
        return " ".join(parts)


def parse_a11y(xml_text: str) -> list[Element]:
    """The visible, showing, on-screen elements of an OSWorld accessibility XML, in reading order."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError:
        return []
    out: list[Element] = []
    for app in root:
        app_name = app.get("name", "")
        for node in app.iter():
            role = _local(node.tag).replace("-", " ")
            if role not in ACTIONABLE_ROLES:
                continue
            coord, size = node.get(f"{{{NS_COMPONENT}}}screencoord"), node.get(f"{{{NS_COMPONENT}}}size")
            if not coord or not size:
                continue
            (x, y), (w, h) = _pair(coord), _pair(size)
            if w <= 0 or h <= 0 or x < 0 or y < 0:
                continue
            states = frozenset(
                k.split("}", 1)[1] for k, v in node.attrib.items() if k.startswith(f"{{{NS_STATE}}}") and v == "true"
            )
            if "showing" not in states or "visible" not in states:
                continue
            name = node.get("name", "") or ""
            text = (node.text or "").strip("\n")
            if role in ("label", "static", "heading") and not (name or text):
                continue
            value = node.get(f"{{{NS_VALUE}}}value")
            out.append(Element(role, name, x, y, w, h, text, _tidy_number(value), states, app_name))
    out.sort(key=lambda e: (e.y, e.x))
    return out


def render(
    instruction: str | None,
    windows: Sequence[WindowInfo],
    elements: Sequence[Element],
    *,
    result: str = "",
    width: int = 0,
    height: int = 0,
    max_elements: int = 60,
    compact: bool = False,
) -> str:
    """The observation text. `result` reports the last action ("" on the first observation); `instruction` None leaves
    the task line out (a conversation that showed it once). `compact`: the element lines only (no window list, no
    headers, no "[unchecked]", no label that shows only its name) and the task line last, for a tiny policy whose
    training time is its observations' length."""
    lines = []
    if result:
        lines.append(f"Result: {result}")
    if instruction is not None and not compact:
        lines.append(f"Task: {instruction}")
    if windows and not compact:
        lines.append("Windows:")
        for w in windows:
            flag = " [focused]" if w.focused else ""
            lines.append(f"- {_quote(w.title or '(untitled)')} at {w.x},{w.y} size {w.w}x{w.h}{flag}")
    elif not windows:
        lines.append(f"Windows: none (an empty {width}x{height} screen)" if width else "Windows: none")
    # a label that only names an input ("Name" beside the text field "Name") says nothing the input does not
    named = {e.name for e in elements if e.role not in ("label", "static", "heading") and e.name}
    shown = [e for e in elements if not (e.role in ("label", "static") and e.name in named and e.text in ("", e.name))]
    if compact:  # nor does one that only shows its own name ("Language"), or nothing yet (an empty status line)
        shown = [e for e in shown if not (e.role in ("label", "static") and e.text in ("", e.name))]
    if shown:
        if not compact:
            lines.append("Elements:")  # role "name" = value [state] @x,y (the centre); the system prompt explains it
        for e in shown[:max_elements]:
            lines.append(e.line(compact=True) if compact else f"- {e.line()}")
        if len(shown) > max_elements:
            lines.append(f"- ... {len(shown) - max_elements} more")
    if instruction is not None and compact:  # last: the values to copy stay close to the action that types them
        lines.append(f"Task: {instruction}")
    return "\n".join(lines)


def find_element(elements: Sequence[Element], name: str, role: str | None = None, index: int = 0) -> Element | None:
    """The `index`-th element whose name (or, failing that, text) is `name`, optionally of `role`."""
    for attr in ("name", "text"):
        hits = [e for e in elements if getattr(e, attr) == name and (role is None or e.role == role)]
        if len(hits) > index:
            return hits[index]
    return None


def _local(tag: str) -> str:
    return tag.split("}", 1)[1] if tag.startswith("{") else tag


def _pair(text: str) -> tuple[int, int]:
    m = _PAIR.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _tidy_number(v: str | None) -> str | None:
    if v is None:
        return None
    try:
        f = float(v)
    except ValueError:
        return v
    return str(int(f)) if f.is_integer() else v
