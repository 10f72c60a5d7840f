"""The libreoffice_writer tasks' documents (docx, python-docx): each task's input and, where its check compares
documents, the expected result (same texts, the asked-for formatting)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.gui.app_files._zip import save_reproducible

DOMAIN = "libreoffice_writer"

# ns-libreoffice_writer-center-title
REPORT = ["Quarterly Report",
          "Sales grew in every region this quarter, led by the north.",
          "Costs stayed flat, so the margin rose by two points.",
          "Next quarter we open two new stores."]
# ns-libreoffice_writer-sign-letter: the closing line to add
LETTER = ["Dear Ms Patel,",
          "Thank you for your order of twelve oak chairs.",
          "They will be delivered on Monday morning."]
SIGNATURE = "Best wishes from Robin Lee"
# ns-libreoffice_writer-double-spacing
NOTES = ["Meeting notes",
         "The team agreed to move the launch to May.",
         "Design will share the new layout by Friday.",
         "Everyone reviews the budget before the next meeting."]
# ns-libreoffice_writer-page-break: the appendix starts a new page
ESSAY = ["Rivers of the North",
         "Rivers shaped the towns of the north for centuries.",
         "Mills, bridges and markets grew along their banks.",
         "Appendix",
         "Sources are listed by chapter."]


def _doc(paragraphs: list[str], style: Callable[[Any, int], None] | None = None) -> Any:
    from docx import Document

    doc = Document()
    doc.core_properties.author = "NextState"
    for i, text in enumerate(paragraphs):
        p = doc.add_paragraph(text)
        if style is not None:
            style(p, i)
    return doc



def _double(p: Any, i: int) -> None:
    p.paragraph_format.line_spacing = 2.0


def build(out: Path) -> None:
    d = out / DOMAIN
    save_reproducible(_doc(REPORT), d / "report.docx")
    save_reproducible(_doc(LETTER), d / "letter.docx")
    save_reproducible(_doc([*LETTER, SIGNATURE]), d / "letter_expected.docx")
    save_reproducible(_doc(NOTES), d / "notes.docx")
    save_reproducible(_doc(NOTES, _double), d / "notes_expected.docx")
    save_reproducible(_doc(ESSAY), d / "essay.docx")
