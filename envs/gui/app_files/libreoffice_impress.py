"""The libreoffice_impress tasks' decks (pptx, python-pptx): each task's input and the expected result (the same deck
with the asked-for edit).

Every run carries its font, size and colour and every title its alignment explicitly, as LibreOffice writes them
when it saves a pptx: a deck saved unchanged by LibreOffice then compares equal to its input under
`compare_pptx_files` (with `examine_bullets` and `examine_background_color` off: LibreOffice spells the layout's
bullets and background out on every slide), so only the task's edit makes the difference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.gui.app_files._zip import save_reproducible

DOMAIN = "libreoffice_impress"
TITLE_SLIDE, TITLE_AND_CONTENT = 0, 1  # python-pptx's default template layouts
FONT = "Calibri"
# (size in pt, colour, centred) of the title slide's title and subtitle, and of a content slide's title and bullets
STYLE = {"title": (44, "000000", True), "subtitle": (32, "8B8B8B", True), "heading": (44, "000000", True),
         "bullet": (32, "000000", False)}

Slide = tuple[str, list[str]]  # (title, subtitle or bullet lines); the first slide of a deck uses the title layout

# ns-libreoffice_impress-fix-title
PITCH: list[Slide] = [("Greenway Bikes", ["City bikes for everyone"]),
                      ("The Problem", ["Short trips clog the roads", "Parking is scarce"]),
                      ("Our Prodcut", ["Light frames", "Two-minute rental"]),
                      ("Next Steps", ["Pilot in three districts", "Raise the seed round"])]
TYPO, FIXED = "Our Prodcut", "Our Product"
# ns-libreoffice_impress-delete-slide: slide 3 is the one to go
REVIEW: list[Slide] = [("Year in Review", ["Harbor Street Library"]),
                       ("Visitors", ["41,000 visits", "Up 12 percent"]),
                       ("Draft numbers", ["Do not present"]),
                       ("Events", ["120 reading groups", "30 workshops"])]
DRAFT = 2
# ns-libreoffice_impress-bold-title: the title slide's title in bold; -center-bullets: slide 2's bullets centred
LAUNCH: list[Slide] = [("Autumn Launch", ["Three new teas"]),
                       ("The Teas", ["Smoky pine", "Pear and ginger", "Night mint"])]


def _style(paragraph: Any, role: str, bold: bool = False, centre: bool = False) -> None:
    from pptx.dml.color import RGBColor
    from pptx.enum.text import PP_ALIGN
    from pptx.util import Pt

    size, colour, centred = STYLE[role]
    if centred or centre:
        paragraph.alignment = PP_ALIGN.CENTER
    for run in paragraph.runs:
        run.font.name, run.font.size, run.font.bold = FONT, Pt(size), bold
        run.font.color.rgb = RGBColor.from_string(colour)


def _deck(slides: list[Slide], bold_titles: frozenset[int] = frozenset(),
          centred_bodies: frozenset[int] = frozenset()) -> Any:
    from pptx import Presentation

    prs = Presentation()
    prs.core_properties.author = "NextState"
    for i, (title, lines) in enumerate(slides):
        slide = prs.slides.add_slide(prs.slide_layouts[TITLE_SLIDE if i == 0 else TITLE_AND_CONTENT])
        slide.shapes.title.text = title
        _style(slide.shapes.title.text_frame.paragraphs[0], "title" if i == 0 else "heading", i in bold_titles)
        body = slide.placeholders[1].text_frame
        body.text = lines[0]
        for line in lines[1:]:
            body.add_paragraph().text = line
        for p in body.paragraphs:
            _style(p, "subtitle" if i == 0 else "bullet", centre=i in centred_bodies)
    return prs



def build(out: Path) -> None:
    d = out / DOMAIN
    save_reproducible(_deck(PITCH), d / "pitch.pptx")
    save_reproducible(_deck([(FIXED if t == TYPO else t, lines) for t, lines in PITCH]), d / "pitch_expected.pptx")
    save_reproducible(_deck(REVIEW), d / "review.pptx")
    save_reproducible(_deck([s for i, s in enumerate(REVIEW) if i != DRAFT]), d / "review_expected.pptx")
    save_reproducible(_deck(LAUNCH), d / "launch.pptx")
    save_reproducible(_deck(LAUNCH, bold_titles=frozenset({0})), d / "launch_bold_expected.pptx")
    save_reproducible(_deck(LAUNCH, centred_bodies=frozenset({1})), d / "launch_centered_expected.pptx")
