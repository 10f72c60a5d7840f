"""A file manager-like list (GTK): the entries of one folder; select one, then Delete or Rename; New folder.

files.py DIR
"""

from __future__ import annotations

import argparse
import os
import shutil

from _nsapp import Gtk, named, run, window


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    args = p.parse_args()
    root = os.path.expanduser(args.dir)
    os.makedirs(root, exist_ok=True)

    w = window(f"Files - {os.path.basename(root.rstrip('/')) or root}", 460, 420)
    box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL, spacing=6)
    w.add(box)
    listbox = named(Gtk.ListBox(), "Files")
    listbox.set_selection_mode(Gtk.SelectionMode.SINGLE)
    scroll = Gtk.ScrolledWindow()
    scroll.set_min_content_height(220)
    scroll.add(listbox)
    box.pack_start(scroll, True, True, 0)
    row = Gtk.Box(spacing=6)
    entry = named(Gtk.Entry(), "New name")
    row.pack_start(Gtk.Label(label="New name"), False, False, 0)
    row.pack_start(entry, True, True, 0)
    box.pack_start(row, False, False, 0)
    buttons = Gtk.Box(spacing=6)
    delete = Gtk.Button(label="Delete")
    rename = Gtk.Button(label="Rename")
    mkdir = Gtk.Button(label="New folder")
    for b in (delete, rename, mkdir):
        buttons.pack_start(b, True, True, 0)
    box.pack_start(buttons, False, False, 0)
    status = named(Gtk.Label(label="", xalign=0), "Status")
    box.pack_start(status, False, False, 0)

    def refresh() -> None:
        for child in listbox.get_children():
            listbox.remove(child)
        for name in sorted(os.listdir(root)):
            label = name + ("/" if os.path.isdir(os.path.join(root, name)) else "")
            lrow = Gtk.ListBoxRow()
            lrow.add(Gtk.Label(label=label, xalign=0))
            lrow.entry_name = name
            listbox.add(lrow)
        listbox.show_all()
        listbox.unselect_all()  # nothing is selected until the user clicks a row

    def selected() -> str | None:
        r = listbox.get_selected_row()
        return getattr(r, "entry_name", None) if r is not None else None

    def on_delete(_btn):
        name = selected()
        if name is None:
            status.set_text("Select a file first")
            return
        target = os.path.join(root, name)
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
        status.set_text(f"Deleted {name}")
        refresh()

    def on_rename(_btn):
        name, new = selected(), entry.get_text().strip()
        if name is None or not new or "/" in new:
            status.set_text("Select a file and type a new name")
            return
        os.rename(os.path.join(root, name), os.path.join(root, new))
        status.set_text(f"Renamed {name} to {new}")
        entry.set_text("")
        refresh()

    def on_mkdir(_btn):
        new = entry.get_text().strip()
        if not new or "/" in new:
            status.set_text("Type a folder name first")
            return
        os.makedirs(os.path.join(root, new), exist_ok=True)
        status.set_text(f"Created {new}")
        entry.set_text("")
        refresh()

    delete.connect("clicked", on_delete)
    rename.connect("clicked", on_rename)
    mkdir.connect("clicked", on_mkdir)
    refresh()
    run(w)


if __name__ == "__main__":
    main()
