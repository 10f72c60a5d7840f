"""The chrome tasks' files (`out/chrome/site/`): a small static web site of a town library, opened from file:// (the
desktop has no network: a task's pages are on its disk).
"""

from __future__ import annotations

from html import escape
from pathlib import Path

PAGES = {
    "index.html": ("Harbour Town Library", [
        "Welcome to the Harbour Town Library, open to everyone since 1911.",
        "Borrow books, music and films, or use our reading rooms and study desks.",
    ]),
    "hours.html": ("Opening hours - Harbour Town Library", [
        "Monday to Friday: 9:00 to 19:00.",
        "Saturday: 10:00 to 16:00. Sunday: closed.",
    ]),
    "events.html": ("Events - Harbour Town Library", [
        "Tuesday 18:00: Poetry evening in the east reading room.",
        "Saturday 11:00: Story time for children aged 4 to 8.",
    ]),
    "contact.html": ("Contact - Harbour Town Library", [
        "Harbour Town Library, 12 Quay Street.",
        "Telephone: 555 0142. Email: desk@library.example.",
    ]),
}


def page(name: str) -> str:
    title, paragraphs = PAGES[name]
    nav = " | ".join(f'<a href="{n}">{escape(PAGES[n][0].split(" - ")[0])}</a>' for n in PAGES)
    body = "\n".join(f"<p>{escape(p)}</p>" for p in paragraphs)
    head = f'<head><meta charset="utf-8"><title>{escape(title)}</title></head>'
    return (f'<!DOCTYPE html>\n<html lang="en">\n{head}\n'
            f"<body>\n<nav>{nav}</nav>\n<h1>{escape(title)}</h1>\n{body}\n</body>\n</html>\n")


def build(out: Path) -> None:
    d = out / "chrome" / "site"
    d.mkdir(parents=True, exist_ok=True)
    for name in PAGES:
        (d / name).write_text(page(name), encoding="utf-8")
