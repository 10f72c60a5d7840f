"""The accessibility worker: a long-lived process that dumps the AT-SPI tree of one display as OSWorld's XML.

Runs as a script under an interpreter that has PyGObject with Atspi (Debian's python3-gi + gir1.2-atspi-2.0), which may
differ from the interpreter running NextState. It needs the session's DISPLAY and DBUS_SESSION_BUS_ADDRESS.

The XML follows OSWorld's Linux format so its tooling (and `check_accessibility_tree` rules) work unchanged: the root is
`desktop-frame`, each node is tagged with its role ("push button" -> `push-button`), has a `name` attribute, `st:<state>`
flags, `attr:<key>` object attributes, `cp:screencoord` / `cp:size` for visible and showing nodes, `val:` values, and its
text as element text. Namespace URIs are OSWorld's.

Protocol: one JSON object per line; {"op": "tree"} -> {"ok": true, "xml": "..."}; {"op": "ping"} -> {"ok": true}.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
MAX_DEPTH = 50
MAX_WIDTH = 1024
MAX_TEXT = 4000


def _q(ns: str, local: str) -> str:
    return f"{{{NS[ns]}}}{local}"


class TreeDumper:
    def __init__(self):
        import gi

        gi.require_version("Atspi", "2.0")
        from gi.repository import Atspi

        self.Atspi = Atspi
        # a hung app must not hang the dump for D-Bus's default 25 s
        Atspi.set_timeout(1500, 3000)

    def tree(self) -> str:
        for prefix, uri in NS.items():
            ET.register_namespace(prefix, uri)
        root = ET.Element("desktop-frame")
        desktop = self.Atspi.get_desktop(0)
        for i in range(min(desktop.get_child_count(), MAX_WIDTH)):
            app = desktop.get_child_at_index(i)
            if app is not None:
                root.append(self.node(app, 1))
        return ET.tostring(root, encoding="unicode")  # ElementTree declares the used namespaces on the root

    def node(self, n, depth: int) -> ET.Element:
        Atspi = self.Atspi
        attrs: dict[str, str] = {}
        try:
            attrs["name"] = n.get_name() or ""
        except Exception:
            attrs["name"] = ""
        states = set()
        try:
            for st in n.get_state_set().get_states():
                nick = st.value_nick.replace("-", "_")
                states.add(nick)
                attrs[_q("st", nick)] = "true"
        except Exception:
            pass
        try:
            for k, v in (n.get_attributes() or {}).items():
                if k:
                    attrs[_q("attr", k)] = str(v)
        except Exception:
            pass
        if "visible" in states and "showing" in states:
            try:
                ext = n.get_extents(Atspi.CoordType.SCREEN)
                attrs[_q("cp", "screencoord")] = f"({ext.x}, {ext.y})"
                attrs[_q("cp", "size")] = f"({ext.width}, {ext.height})"
            except Exception:
                pass
        text = ""
        try:
            ti = n.get_text_iface()
            if ti is not None:
                count = Atspi.Text.get_character_count(n)
                text = Atspi.Text.get_text(n, 0, min(count, MAX_TEXT)) or ""
                text = text.replace("\ufffc", "").replace("\ufffd", "")
        except Exception:
            pass
        try:
            vi = n.get_value_iface()
            if vi is not None:
                attrs[_q("val", "value")] = str(Atspi.Value.get_current_value(n))
                attrs[_q("val", "min")] = str(Atspi.Value.get_minimum_value(n))
                attrs[_q("val", "max")] = str(Atspi.Value.get_maximum_value(n))
        except Exception:
            pass
        try:
            ai = n.get_action_iface()
            if ai is not None:
                for i in range(Atspi.Action.get_n_actions(n)):
                    name = (Atspi.Action.get_action_name(n, i) or "").replace(" ", "-")
                    if name:
                        attrs[_q("act", f"{name}_kb")] = Atspi.Action.get_key_binding(n, i) or ""
        except Exception:
            pass
        try:
            if n.get_selection_iface() is not None:
                attrs["selection"] = "true"
        except Exception:
            pass
        try:
            role = (n.get_role_name() or "unknown").strip() or "unknown"
        except Exception:
            role = "unknown"
        el = ET.Element(role.replace(" ", "-"), attrs)
        if text:
            el.text = text
        if depth < MAX_DEPTH:
            try:
                count = n.get_child_count()
            except Exception:
                count = 0
            for i in range(min(count, MAX_WIDTH)):
                try:
                    child = n.get_child_at_index(i)
                except Exception:
                    continue
                if child is not None:
                    el.append(self.node(child, depth + 1))
        return el


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    try:
        dumper = TreeDumper()
    except Exception as exc:
        proto.write(json.dumps({"ok": False, "fatal": True, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 2
    proto.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req.get("op") == "tree":
                resp = {"ok": True, "xml": dumper.tree()}
            elif req.get("op") == "ping":
                resp = {"ok": True}
            else:
                resp = {"ok": False, "error": f"unknown op {req.get('op')!r}"}
        except Exception as exc:
            resp = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(resp) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
