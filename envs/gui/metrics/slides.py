"""Presentation metrics (LibreOffice Impress's pptx files and its settings), read with python-pptx.

`compare_pptx_files` walks both decks slide by slide and shape by shape as OSWorld's does: slide count, background
colour, notes, shape count and geometry (relative tolerance `approximately_tolerance`), tables cell by cell, text,
paragraph alignment and level, and each run's font (name, size, bold, italic, colour, underline, strike) and the
slide's bullets. Each `examine_*` option switches one check (OSWorld's defaults); a few options are OSWorld's
task-specific position checks (`examine_title_bottom_position`, `examine_table_bottom_position`,
`examine_right_position`, `examine_top_position`), kept with their thresholds so those tasks score as they do there.
"""

from __future__ import annotations

import logging
import math
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

A_NS = "http://schemas.openxmlformats.org/drawingml/2006/main"
P_NS = "http://schemas.openxmlformats.org/presentationml/2006/main"
OOR = "{http://openoffice.org/2001/registry}"
PICTURE, TABLE, GROUP, AUTO_SHAPE = 13, 19, 6, 1  # MSO_SHAPE_TYPE values OSWorld's checks name

DEFAULTS = {
    "examine_number_of_slides": True, "examine_shape": True, "examine_text": True, "examine_indent": True,
    "examine_font_name": True, "examine_font_size": True, "examine_font_bold": True, "examine_font_italic": True,
    "examine_color_rgb": True, "examine_font_underline": True, "examine_strike_through": True,
    "examine_alignment": True, "examine_title_bottom_position": False, "examine_table_bottom_position": False,
    "examine_run_count": True, "examine_right_position": False, "examine_top_position": False,
    "examine_shape_for_shift_size": False, "examine_image_size": False, "examine_modify_height": False,
    "examine_bullets": True, "examine_background_color": True, "examine_note": True,
}


def _deck(path: str | None) -> Any:
    if not path or not Path(path).exists():
        return None
    from pptx import Presentation

    try:
        return Presentation(path)
    except Exception as exc:
        log.info("not a readable pptx: %s (%s)", path, exc)
        return None


def _close(a: float, b: float, tol: float) -> bool:
    if a == b:
        return True
    if a == 0 or b == 0:
        return False
    return abs(a - b) / max(abs(a), abs(b)) <= tol


def _background(slide: Any) -> Any:
    """A slide's solid background colour (its master's when it follows the master), else None."""
    fill = slide.background.fill
    if fill.type == 1:
        return fill.fore_color.rgb
    if fill.type == 5:
        master = slide.slide_layout.slide_master.background.fill
        return master.fore_color.rgb if master.type == 1 else None
    return None


def _notes(slide: Any) -> str:
    return slide.notes_slide.notes_text_frame.text.strip() if slide.has_notes_slide else ""


def _text_shapes(shapes: Any) -> list[Any]:
    out = []
    for s in shapes:
        if hasattr(s, "text") and hasattr(s, "text_frame"):
            out.append(s)
        if hasattr(s, "shapes"):
            out += _text_shapes(s.shapes)
    return out


def _falsy_same(a: Any, b: Any) -> bool:
    """Bold / italic: unset and False count as the same."""
    return a == b or (not a and not b)


def _underline_same(a: Any, b: Any) -> bool:
    return a == b or (a is None and b is False) or (a is False and b is None)


def _runs(p: Any) -> list[Any]:
    # a paragraph without text may keep formatting-only runs; those do not count
    if (p.text or "").strip() == "":
        return [r for r in p.runs if (r.text or "").strip()]
    return list(p.runs)


def _run_same(r1: Any, r2: Any, o: dict[str, Any]) -> bool:
    f1, f2 = r1.font, r2.font
    if o["examine_font_name"] and f1.name != f2.name:
        return False
    if o["examine_font_size"] and f1.size != f2.size:
        return False
    if o["examine_font_bold"] and not _falsy_same(f1.bold, f2.bold):
        return False
    if o["examine_font_italic"] and not _falsy_same(f1.italic, f2.italic):
        return False
    if o["examine_color_rgb"] and _rgb(f1.color) != _rgb(f2.color):
        return False
    if o["examine_font_underline"] and not _underline_same(f1.underline, f2.underline):
        return False
    strike = (f1._element.attrib.get("strike", "noStrike"), f2._element.attrib.get("strike", "noStrike"))
    return not (o["examine_strike_through"] and strike[0] != strike[1])


def _rgb(color: Any) -> Any:
    try:
        return color.rgb
    except AttributeError:  # a theme colour or none: python-pptx has no rgb for it
        return None


def _bullets(xml: bytes) -> list[tuple[str, str, str]]:
    """(level, bullet character, text) of each non-empty paragraph of a slide's XML."""
    out = []
    for p in ET.fromstring(xml).iter(f"{{{A_NS}}}p"):
        ppr = p.find(f"{{{A_NS}}}pPr")
        lvl, char = "0", "No Bullet"
        if ppr is not None:
            lvl = ppr.get("lvl") or "0"
            bu = ppr.find(f"{{{A_NS}}}buChar")
            char = bu.get("char") if bu is not None else char
        else:
            lvl = "No Level"
        text = "".join(t.text or "" for t in p.iter(f"{{{A_NS}}}t"))
        if text.strip():
            out.append((lvl, char, text))
    return out


def _geometry_same(s1: Any, s2: Any, tol: float) -> bool:
    return all(_close(getattr(s1, k) or 0, getattr(s2, k) or 0, tol) for k in ("left", "top", "width", "height"))


def _shape_position_ok(s1: Any, s2: Any, slide_no: int, o: dict[str, Any], tol: float) -> bool:
    """OSWorld's position options; each replaces the plain geometry check for the shapes it is about."""
    texts = hasattr(s1, "text") and hasattr(s2, "text")
    if o["examine_title_bottom_position"]:
        if texts and s1.text == s2.text:
            if s1.text == "Product Comparison" and (s1.top <= s2.top or s1.top < 3600000):
                return False
        elif not _geometry_same(s1, s2, tol):
            return False
    if o["examine_table_bottom_position"]:
        if slide_no == 3 and s1.shape_type == TABLE and s2.shape_type == TABLE:
            if s1.top <= s2.top or s1.top < 3600000:
                return False
        elif not _geometry_same(s1, s2, tol):
            return False
    if o["examine_right_position"] and slide_no == 2 and not hasattr(s1, "text") and not hasattr(s2, "text"):
        if s1.left <= s2.left or s1.left < 4320000:
            return False
    if o["examine_top_position"] and slide_no == 2 and s1.shape_type == PICTURE and s2.shape_type == PICTURE:
        if s1.top >= s2.top or s1.top > 1980000:
            return False
    if o["examine_shape_for_shift_size"] and not _geometry_same(s1, s2, tol):
        if not (texts and s1.text == s2.text == "Elaborate on what you want to discuss."):
            return False
    if o["examine_shape"] and not _geometry_same(s1, s2, tol):
        return False
    if o["examine_image_size"]:
        if s1.shape_type == PICTURE and s2.shape_type == PICTURE:
            if not (_close(s1.width, s2.width, tol) and _close(s1.height, s2.height, tol)):
                return False
        elif not _geometry_same(s1, s2, tol):
            return False
    if o["examine_modify_height"]:
        if (not hasattr(s1, "text") and not hasattr(s2, "text")) or (s1.shape_type == 5 and s2.shape_type == 5):
            if not _close(s1.height, s2.height, tol):
                return False
        elif not _geometry_same(s1, s2, tol):
            return False
    return True


def _table_same(t1: Any, t2: Any, o: dict[str, Any]) -> bool:
    if len(t1.rows) != len(t2.rows) or len(t1.columns) != len(t2.columns):
        return False
    for i in range(len(t1.rows)):
        for j in range(len(t1.columns)):
            p1, p2 = t1.cell(i, j).text_frame.paragraphs, t2.cell(i, j).text_frame.paragraphs
            if len(p1) != len(p2):
                return False
            for a, b in zip(p1, p2):
                r1, r2 = _runs(a), _runs(b)
                if o["examine_run_count"] and len(r1) != len(r2):
                    return False
                for x, y in zip(r1, r2):
                    if o["examine_color_rgb"] and _rgb(x.font.color) != _rgb(y.font.color):
                        return False
                    if not (_falsy_same(x.font.bold, y.font.bold) and _falsy_same(x.font.italic, y.font.italic)
                            and _underline_same(x.font.underline, y.font.underline)):
                        return False
    return True


def _alignment(p: Any) -> Any:
    from pptx.enum.text import PP_ALIGN

    return PP_ALIGN.LEFT if p.alignment is None else p.alignment  # unset is drawn left-aligned


def _text_same(s1: Any, s2: Any, o: dict[str, Any]) -> tuple[bool, bool]:
    """(same, compared some runs) for two text shapes."""
    if o["examine_text"] and s1.text.strip() != s2.text.strip():
        return False, False
    ps1, ps2 = s1.text_frame.paragraphs, s2.text_frame.paragraphs
    if len(ps1) != len(ps2):
        return False, False
    ran = False
    for a, b in zip(ps1, ps2):
        if o["examine_alignment"] and _alignment(a) != _alignment(b):
            return False, ran
        if o["examine_text"] and a.text != b.text:
            return False, ran
        if o["examine_indent"] and a.level != b.level:
            return False, ran
        r1, r2 = _runs(a), _runs(b)
        if len(r1) != len(r2):
            return False, ran
        for x, y in zip(r1, r2):
            ran = True
            if not _run_same(x, y, o):
                return False, ran
    return True, ran


def compare_pptx_files(result: str | None, expected: str | None, **options: Any) -> float:
    d1, d2 = _deck(result), _deck(expected)
    if d1 is None or d2 is None:
        return 0.0
    o = {**DEFAULTS, **{k: v for k, v in options.items() if k in DEFAULTS}}
    tol = float(options.get("approximately_tolerance", 0.005))
    if o["examine_number_of_slides"] and len(d1.slides) != len(d2.slides):
        return 0.0
    for no, (sl1, sl2) in enumerate(zip(d1.slides, d2.slides), start=1):
        if o["examine_background_color"] and _background(sl1) != _background(sl2):
            return 0.0
        if o["examine_note"] and _notes(sl1) != _notes(sl2):
            return 0.0
        if len(sl1.shapes) != len(sl2.shapes):
            return 0.0
        compared_runs = False
        for s1, s2 in zip(sl1.shapes, sl2.shapes):
            if not _shape_position_ok(s1, s2, no, o, tol):
                return 0.0
            if s1.shape_type == TABLE:
                if s2.shape_type != TABLE or not _table_same(s1.table, s2.table, o):
                    return 0.0
            if hasattr(s1, "text") and hasattr(s2, "text"):
                same, ran = _text_same(s1, s2, o)
                compared_runs = compared_runs or ran
                if not same:
                    return 0.0
        if o["examine_bullets"] and compared_runs and _bullets(sl1.part.blob) != _bullets(sl2.part.blob):
            return 0.0
        t1, t2 = _text_shapes(sl1.shapes), _text_shapes(sl2.shapes)
        if len(t1) != len(t2):
            return 0.0
        if o["examine_alignment"]:
            for a, b in zip(t1, t2):
                if o["examine_text"] and a.text.strip() != b.text.strip():
                    return 0.0
                pa, pb = a.text_frame.paragraphs, b.text_frame.paragraphs
                if len(pa) != len(pb) or any(_alignment(x) != _alignment(y) for x, y in zip(pa, pb)):
                    return 0.0
    return 1.0


def _registry_value(path: str | None, item_path: str, name: str) -> str | None:
    """A value of LibreOffice's registrymodifications.xcu (the user's changed settings)."""
    if not path or not Path(path).exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    for item in root.iter("item"):
        if item.get(f"{OOR}path") != item_path:
            continue
        for prop in item.iter("prop"):
            if prop.get(f"{OOR}name") == name:
                value = prop.find("value")
                if value is not None:
                    return value.text
    return None


def check_presenter_console_disable(result: str | None) -> float:
    v = _registry_value(result, "/org.openoffice.Office.Impress/Misc/Start", "EnablePresenterScreen")
    return float(v is not None and v.lower() == "false")


def check_auto_saving_time(result: str | None, rules: dict[str, Any]) -> float:
    v = _registry_value(result, "/org.openoffice.Office.Common/Save/Document", "AutoSaveTimeIntervall")
    try:
        return float(v is not None and int(v) == rules["minutes"])
    except ValueError:
        return 0.0


def check_image_stretch_and_center(result: str | None, original: str | None) -> float:
    """The first slide's (first) picture of the original fills the result's slide and is centred (within 0.5 in)."""
    from pptx.util import Inches

    mod, orig = _deck(result), _deck(original)
    if mod is None or orig is None:
        return 0.0
    pics = [s for s in orig.slides[0].shapes if s.shape_type == PICTURE]
    if not pics:
        return 0.0
    match = [s for s in mod.slides[0].shapes if s.shape_type == PICTURE and s.image.blob == pics[0].image.blob]
    if not match:
        return 0.0
    img, w, h, tol = match[-1], orig.slide_width, orig.slide_height, Inches(0.5)
    return float(abs(img.width - w) <= tol and abs(img.height - h) <= tol
                 and abs(img.left - (w - img.width) / 2) <= tol and abs(img.top - (h - img.height) / 2) <= tol)


def check_slide_orientation_Portrait(result: str | None) -> float:  # noqa: N802 - OSWorld's name
    deck = _deck(result)
    return float(deck is not None and deck.slide_width < deck.slide_height)


def evaluate_presentation_fill_to_rgb_distance(result: str | None, rules: dict[str, Any]) -> float:
    """1 minus the mean (over slides) RGB distance of each slide's background to `rules["rgb"]`; a slide left at
    `original_rgb`, or without a solid colour, counts as the farthest."""
    deck = _deck(result)
    if deck is None or not len(deck.slides):
        return 0.0
    want, orig = tuple(rules["rgb"]), rules.get("original_rgb")

    def distance(slide: Any) -> float:
        rgb = _background(slide)
        if rgb is None or (orig is not None and tuple(rgb) == tuple(orig)):
            return 1.0
        return math.dist(tuple(rgb), want) / math.dist((0, 0, 0), (255, 255, 255))

    return 1.0 - sum(distance(s) for s in deck.slides) / len(deck.slides)


def check_left_panel(result: str | None) -> float:
    """The accessibility tree shows Impress's slide pane (a document frame named "Slides View")."""
    if not result:
        return 0.0
    root = ET.fromstring(result)
    return float(any(e.get("name") == "Slides View" for e in root.iter("document-frame")))


def check_transition(result: str | None, rules: dict[str, Any]) -> float:
    """Slide `slide_idx` has a transition of type `transition_type` (an element name such as "dissolve")."""
    if not result or not Path(result).exists():
        return 0.0
    name = f"ppt/slides/slide{rules['slide_idx'] + 1}.xml"
    with zipfile.ZipFile(result) as z:
        if name not in z.namelist():
            return 0.0
        root = ET.fromstring(z.read(name))
    tr = root.find(f".//{{{P_NS}}}transition")
    return float(tr is not None and tr.find(f".//{{{P_NS}}}{rules['transition_type']}") is not None)


def _dominant(rgb: tuple[int, int, int], color: str, margin: int = 50) -> bool:
    r, g, b = rgb
    return {
        "red": r > g + margin and r > b + margin,
        "green": g > r + margin and g > b + margin,
        "blue": b > r + margin and b > g + margin,
        "black": max(rgb) < margin,
    }.get(color, True)


def check_page_number_colors(result: str | None, rules: dict[str, Any]) -> float:
    """The slide master's slide-number colour is `rules["color"]` (red, green, blue or black, by channel margin):
    the number placeholder's fill, else a footer/date placeholder's, else the last non-black text colour."""
    if not result or not Path(result).exists():
        return 0.0
    with zipfile.ZipFile(result) as z:
        try:
            root = ET.fromstring(z.read("ppt/slideMasters/slideMaster1.xml"))
        except KeyError:
            return 0.0
    srgb = f".//{{{A_NS}}}solidFill//{{{A_NS}}}srgbClr"
    val = None
    phs = [ph for ph in root.iter(f"{{{P_NS}}}ph")]
    for types in (("sldNum",), ("sldNum", "ftr", "dt")):
        for ph in phs:
            if ph.get("type") in types and (c := ph.find(srgb)) is not None:
                val = c.get("val")
                break
        if val:
            break
    if val is None:
        runs = [c.get("val") for c in root.findall(f".//{{{A_NS}}}rPr//{{{A_NS}}}solidFill//{{{A_NS}}}srgbClr")]
        fills = [c.get("val") for c in root.findall(srgb)]
        val = next((v for v in reversed(runs) if v and v != "000000"), None)
        val = val or next((v for v in reversed(fills) if v and v != "000000"), None) or (fills[-1] if fills else None)
    if not val or len(val.lstrip("#")) != 6:
        return 0.0
    h = val.lstrip("#")
    try:
        rgb = (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16))
    except ValueError:
        return 0.0
    return float(_dominant(rgb, rules["color"]))


def check_strikethrough(result: str | None, rules: dict[str, Any]) -> float:
    """The first run of each listed paragraph of each listed shape of each listed slide is struck through."""
    deck = _deck(result)
    if deck is None:
        return 0.0
    try:
        for si in rules["slide_index_s"]:
            for hi in rules["shape_index_s"]:
                paras = deck.slides[si].shapes[hi].text_frame.paragraphs
                for pi in rules["paragraph_index_s"]:
                    if "strike" not in paras[pi].runs[0].font._element.attrib:
                        return 0.0
    except (IndexError, AttributeError):
        return 0.0
    return 1.0


METRICS = {
    f.__name__: f
    for f in (
        compare_pptx_files, check_presenter_console_disable, check_auto_saving_time, check_image_stretch_and_center,
        check_slide_orientation_Portrait, evaluate_presentation_fill_to_rgb_distance, check_left_panel,
        check_transition, check_page_number_colors, check_strikethrough,
    )
}
