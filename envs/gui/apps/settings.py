"""A settings dialog (GTK): three switches, a font size, a language; Apply writes the settings as JSON.

settings.py [--config ~/.config/nsapp/settings.json]
"""

from __future__ import annotations

import argparse
import json
import os

from _nsapp import Gtk, named, run, window, write_json

DEFAULTS = {"dark_mode": False, "notifications": True, "auto_update": False, "font_size": 11, "language": "English"}
LANGUAGES = ("English", "German", "French")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="~/.config/nsapp/settings.json")
    args = p.parse_args()
    path = os.path.expanduser(args.config)
    current = dict(DEFAULTS)
    if os.path.exists(path):
        current.update(json.load(open(path, encoding="utf-8")))
    else:
        write_json(path, current)

    w = window("Settings", 400, 340)
    grid = Gtk.Grid(column_spacing=10, row_spacing=8)
    w.add(grid)
    checks = {
        "dark_mode": Gtk.CheckButton(label="Dark mode"),
        "notifications": Gtk.CheckButton(label="Notifications"),
        "auto_update": Gtk.CheckButton(label="Automatic updates"),
    }
    for row, cb in enumerate(checks.values()):
        grid.attach(cb, 0, row, 3, 1)
    grid.attach(Gtk.Label(label="Font size", xalign=0), 0, 3, 1, 1)
    font = named(Gtk.SpinButton.new_with_range(8, 32, 1), "Font size")
    grid.attach(font, 1, 3, 2, 1)
    grid.attach(Gtk.Label(label="Language", xalign=0), 0, 4, 1, 1)
    first = Gtk.RadioButton.new_with_label(None, LANGUAGES[0])
    langs = [first] + [Gtk.RadioButton.new_with_label_from_widget(first, lang) for lang in LANGUAGES[1:]]
    for i, rb in enumerate(langs):
        grid.attach(rb, i, 5, 1, 1)
    apply_btn = Gtk.Button(label="Apply")
    cancel = Gtk.Button(label="Cancel")
    grid.attach(apply_btn, 0, 6, 1, 1)
    grid.attach(cancel, 1, 6, 1, 1)
    status = named(Gtk.Label(label="", xalign=0), "Status")
    grid.attach(status, 0, 7, 3, 1)

    def show(values: dict) -> None:
        for key, cb in checks.items():
            cb.set_active(bool(values[key]))
        font.set_value(int(values["font_size"]))
        for rb in langs:
            rb.set_active(rb.get_label() == values["language"])

    def on_apply(_btn):
        font.update()  # take a typed value that was not committed with Enter yet
        values = {key: cb.get_active() for key, cb in checks.items()}
        values["font_size"] = font.get_value_as_int()
        values["language"] = next(rb.get_label() for rb in langs if rb.get_active())
        write_json(path, values)
        current.update(values)
        status.set_text("Settings saved")

    def on_cancel(_btn):
        show(current)
        status.set_text("Changes discarded")

    show(current)
    apply_btn.connect("clicked", on_apply)
    cancel.connect("clicked", on_cancel)
    run(w)


if __name__ == "__main__":
    main()
