"""A calculator (GTK): digit and operator buttons, a display; the display is written to a state file on every change.

calc.py [--state ~/.local/state/nsapp/calc.txt]
"""

from __future__ import annotations

import argparse
import os

from _nsapp import Gtk, named, run, window, write_atomic

OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else None,
}


def fmt(v: float | None) -> str:
    if v is None:
        return "Error"
    return str(int(v)) if float(v).is_integer() else f"{v:.6g}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--state", default="~/.local/state/nsapp/calc.txt")
    args = p.parse_args()
    state_path = os.path.expanduser(args.state)

    w = window("Calculator", 260, 320)
    box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL, spacing=6)
    w.add(box)
    display = named(Gtk.Label(label="0", xalign=1), "Display")
    box.pack_start(display, False, False, 0)
    grid = Gtk.Grid(column_spacing=4, row_spacing=4, column_homogeneous=True, row_homogeneous=True)
    box.pack_start(grid, True, True, 0)
    state = {"acc": None, "op": None, "fresh": True}

    def show(text: str) -> None:
        display.set_text(text)
        write_atomic(state_path, text + "\n")

    def press(label: str) -> None:
        cur = display.get_text()
        if label.isdigit():
            show(label if state["fresh"] or cur == "0" else cur + label)
            state["fresh"] = False
        elif label == "C":
            state.update(acc=None, op=None, fresh=True)
            show("0")
        elif label in OPS or label == "=":
            value = float(cur) if cur != "Error" else 0.0
            if state["op"] is not None and not state["fresh"]:
                value = OPS[state["op"]](state["acc"], value)
                show(fmt(value))
            state.update(acc=value, op=None if label == "=" else label, fresh=True)

    layout = ["789/", "456*", "123-", "C0=+"]
    for r, row in enumerate(layout):
        for c, label in enumerate(row):
            b = Gtk.Button(label=label)
            b.connect("clicked", lambda _b, lab=label: press(lab))
            grid.attach(b, c, r, 1, 1)
    show("0")
    run(w)


if __name__ == "__main__":
    main()
