"""A todo list (Tk, so it has no accessibility tree): type an item, press Enter or Add; the list is saved to a file.

todo_tk.py FILE
"""

from __future__ import annotations

import argparse
import os
import tkinter as tk


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("file")
    args = p.parse_args()
    path = os.path.expanduser(args.file)
    items = [ln.rstrip("\n") for ln in open(path, encoding="utf-8")] if os.path.exists(path) else []

    root = tk.Tk()
    root.title("Todo list")
    root.geometry("360x300+0+0")
    entry = tk.Entry(root, width=30)
    entry.pack(padx=8, pady=8, fill="x")
    listbox = tk.Listbox(root)
    listbox.pack(padx=8, fill="both", expand=True)

    def save() -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("".join(i + "\n" for i in items))
        os.replace(path + ".tmp", path)

    def add(*_a) -> None:
        text = entry.get().strip()
        if text:
            items.append(text)
            listbox.insert("end", text)
            entry.delete(0, "end")
            save()

    tk.Button(root, text="Add", command=add).pack(pady=8)
    entry.bind("<Return>", add)
    for i in items:
        listbox.insert("end", i)
    root.after(50, entry.focus_force)  # keyboard input goes to the entry without a click
    root.mainloop()


if __name__ == "__main__":
    main()
