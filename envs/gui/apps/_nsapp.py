"""Shared bits of the bundled GTK apps: a fixed-position window, accessible names, atomic state files.

The apps run under an interpreter with PyGObject (the launchers in bin/ pick it), draw deterministically (no caret
blink, no animations) and write their state to a file after every change, so a task's evaluator reads real app state
through the ordinary getters (`vm_file`, `vm_command_line`).
"""

from __future__ import annotations

import json
import os
import tempfile

import gi

gi.require_version("Gtk", "3.0")
from gi.repository import Gtk

settings = Gtk.Settings.get_default()
if settings is not None:
    settings.set_property("gtk-cursor-blink", False)
    settings.set_property("gtk-enable-animations", False)


def window(title: str, width: int, height: int, x: int = 0, y: int = 0) -> Gtk.Window:
    """A top-level window at a fixed place (without a window manager it stays exactly there)."""
    w = Gtk.Window(title=title)
    w.set_default_size(width, height)
    w.move(x, y)
    w.set_border_width(10)
    w.connect("destroy", Gtk.main_quit)
    return w


def named(widget: Gtk.Widget, name: str) -> Gtk.Widget:
    """Give a widget its accessible name (what the a11y tree, and so the agent, calls it)."""
    widget.get_accessible().set_name(name)
    return widget


def write_atomic(path: str, text: str) -> None:
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def run(w: Gtk.Window) -> None:
    w.show_all()
    Gtk.main()
