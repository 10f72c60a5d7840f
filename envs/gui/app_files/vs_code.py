"""The vs_code tasks' files (`out/vs_code/`): a text file to edit and the file as it should be afterwards."""

from __future__ import annotations

from pathlib import Path

NOTES = """\
Style notes for the harbour guide

- The colour of the lighthouse bands is red and white.
- Use one colour per map layer; the sea keeps its blue colour.
- Photos keep their original colour profile.
"""


def build(out: Path) -> None:
    d = out / "vs_code"
    d.mkdir(parents=True, exist_ok=True)
    (d / "notes.txt").write_text(NOTES)
    (d / "notes_expected.txt").write_text(NOTES.replace("colour", "color"))
