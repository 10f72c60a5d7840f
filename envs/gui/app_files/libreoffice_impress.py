"""The libreoffice_impress tasks' decks (pptx, python-pptx): each task's input and, where its check compares decks,
the expected result (the same deck with the asked-for edit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.gui.app_files._zip import normalize_zip

DOMAIN = "libreoffice_impress"

TITLE_ONLY, TITLE_AND_CONTENT, TITLE_SLIDE = 5, 1, 0  # the default template's layouts

# (title, subtitle or bullet lines) per slide; slide 0 uses the title layout
PITCH = [("Greenway Bikes", ["City bikes for everyone"]),
         ("The Problem", ["Short trips clog the roads", "Parking is scarce"]),
         ("Our Prodcut", ["Light frames", "Two-minute rental"]),
         ("Next Steps", ["Pilot in three districts", "Raise the seed round"])]
TYPO, FIXED = "Our Prodcut", "Our Product"


def _deck(slides: list[tuple[str, list[str]]]) -> Any:
    from pptx import Presentation

    prs = Presentation()
    prs.core_properties.author = "NextState"
    for i, (title, lines) in enumerate(slides):
        slide = prs.slides.add_slide(prs.slide_layouts[TITLE_SLIDE if i == 0 else TITLE_AND_CONTENT])
        slide.shapes.title.text = title
        body = slide.placeholders[1].text_frame
        body.text = lines[0]
        for line in lines[1:]:
            body.add_paragraph().text = line
    return prs


def _save(prs: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    prs.save(path)
    normalize_zip(path)


def build(out: Path) -> None:
    d = out / DOMAIN
    _save(_deck(PITCH), d / "pitch.pptx")
    _save(_deck([(FIXED if t == TYPO else t, lines) for t, lines in PITCH]), d / "pitch_expected.pptx")
