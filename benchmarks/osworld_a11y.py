"""The a11y baseline of benchmarks/desktop.py: a long-lived process that dumps a display's AT-SPI tree the way
OSWorld's guest server answers GET /accessibility on Linux.

What that route does (read from OSWorld's desktop_env/server/main.py; this is our own code): in the server's
long-lived process, one thread per application walks the tree and, for every node, reads its name, state set and
object attributes, the screen extents of visible and showing nodes, its text, whether it has the image and selection
interfaces, its value (current, minimum, maximum, minimum increment) and, per action, the name, description and key
binding; the tree becomes one XML document (lxml there, ElementTree here: the Debian Python with PyGObject has no
lxml), sent back per request. Left out: the route also runs `libreoffice --version` in a shell on every call (there is
no LibreOffice here), so this baseline is a lower bound of the route's cost.

Runs under an interpreter with PyGObject + Atspi (NEXTSTATE_GI_PYTHON), with the display's DISPLAY and
DBUS_SESSION_BUS_ADDRESS. Protocol: one line in, one JSON line out: {"xml": "..."} (the document travels back, as
the route's answer does).
"""

from __future__ import annotations

import json
import sys
import warnings
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor

import gi

warnings.simplefilter("ignore", DeprecationWarning)  # Atspi's action getters; still what pyatspi calls
gi.require_version("Atspi", "2.0")
from gi.repository import Atspi  # noqa: E402

NS = "https://accessibility.ubuntu.example.org/ns/"
MAX_DEPTH, MAX_WIDTH = 50, 1024


def _try(fn, default=None):
    try:
        return fn()
    except Exception:
        return default


def node_xml(n, depth: int) -> ET.Element:
    attrs = {"name": _try(n.get_name, "") or ""}
    states = {s.value_nick for s in _try(lambda: n.get_state_set().get_states(), [])}
    attrs.update({f"{{{NS}state}}{s.replace('-', '_')}": "true" for s in states})
    attrs.update({f"{{{NS}attributes}}{k}": str(v) for k, v in (_try(n.get_attributes, {}) or {}).items() if k})
    if "visible" in states and "showing" in states and n.get_component_iface() is not None:
        ext = _try(lambda: n.get_extents(Atspi.CoordType.SCREEN))
        if ext is not None:
            attrs[f"{{{NS}component}}screencoord"] = str((ext.x, ext.y))
            attrs[f"{{{NS}component}}size"] = str((ext.width, ext.height))
    text = ""
    if n.get_text_iface() is not None:
        text = _try(lambda: Atspi.Text.get_text(n, 0, Atspi.Text.get_character_count(n)), "") or ""
        text = text.replace("\ufffc", "").replace("\ufffd", "")
    if n.get_image_iface() is not None:
        attrs["image"] = "true"
    if n.get_selection_iface() is not None:
        attrs["selection"] = "true"
    if n.get_value_iface() is not None:
        for key, get in (("value", Atspi.Value.get_current_value), ("min", Atspi.Value.get_minimum_value),
                         ("max", Atspi.Value.get_maximum_value), ("step", Atspi.Value.get_minimum_increment)):
            value = _try(lambda: get(n))
            if value is not None:
                attrs[f"{{{NS}value}}{key}"] = str(value)
    if n.get_action_iface() is not None:
        for i in range(_try(lambda: Atspi.Action.get_n_actions(n), 0)):
            name = (_try(lambda: Atspi.Action.get_action_name(n, i), "") or "").replace(" ", "-")
            attrs[f"{{{NS}action}}{name}_desc"] = _try(lambda: Atspi.Action.get_action_description(n, i), "") or ""
            attrs[f"{{{NS}action}}{name}_kb"] = _try(lambda: Atspi.Action.get_key_binding(n, i), "") or ""
    role = (_try(n.get_role_name, "") or "").strip() or "unknown"
    el = ET.Element(role.replace(" ", "-"), attrs)
    if text:
        el.text = text
    if depth < MAX_DEPTH:
        for i in range(min(_try(n.get_child_count, 0), MAX_WIDTH)):
            child = _try(lambda: n.get_child_at_index(i))
            if child is not None:
                el.append(node_xml(child, depth + 1))
    return el


def dump() -> str:
    desktop = Atspi.get_desktop(0)
    apps = [a for a in (desktop.get_child_at_index(i) for i in range(desktop.get_child_count())) if a is not None]
    root = ET.Element("desktop-frame")
    with ThreadPoolExecutor() as pool:  # one thread per application, as the route does
        root.extend(pool.map(lambda a: node_xml(a, 1), apps))
    return ET.tostring(root, encoding="unicode")


def main() -> int:
    for _ in sys.stdin:
        print(json.dumps({"xml": dump()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
