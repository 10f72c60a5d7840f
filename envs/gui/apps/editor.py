"""A plain text editor (GTK): one document, Save (or Ctrl+S) writes it back to the file.

editor.py FILE
"""

from __future__ import annotations

import argparse
import os

from _nsapp import Gtk, named, run, window, write_atomic


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("file")
    args = p.parse_args()
    path = os.path.expanduser(args.file)
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""

    w = window(f"Editor - {os.path.basename(path)}", 560, 380)
    box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL, spacing=6)
    w.add(box)
    bar = Gtk.Box(spacing=6)
    save = Gtk.Button(label="Save")
    revert = Gtk.Button(label="Revert")
    status = named(Gtk.Label(label="Saved", xalign=1), "Status")
    bar.pack_start(save, False, False, 0)
    bar.pack_start(revert, False, False, 0)
    bar.pack_end(status, True, True, 0)
    box.pack_start(bar, False, False, 0)

    view = named(Gtk.TextView(), "Document")
    view.set_wrap_mode(Gtk.WrapMode.WORD)
    buf = view.get_buffer()
    buf.set_text(text)
    scroll = Gtk.ScrolledWindow()
    scroll.set_vexpand(True)
    scroll.add(view)
    box.pack_start(scroll, True, True, 0)

    def do_save(*_a):
        start, end = buf.get_bounds()
        write_atomic(path, buf.get_text(start, end, True))
        status.set_text("Saved")
        return True

    def do_revert(*_a):
        buf.set_text(open(path, encoding="utf-8").read() if os.path.exists(path) else "")
        status.set_text("Saved")

    buf.connect("changed", lambda *_a: status.set_text("Modified"))
    save.connect("clicked", do_save)
    revert.connect("clicked", do_revert)
    accel = Gtk.AccelGroup()
    key, mod = Gtk.accelerator_parse("<Control>s")
    accel.connect(key, mod, 0, do_save)
    w.add_accel_group(accel)
    run(w)


if __name__ == "__main__":
    main()
