"""Text-document metrics (LibreOffice Writer's docx / odt files), read with python-docx and odfpy.

The comparisons follow OSWorld's: `compare_docx_files` compares paragraph texts (whitespace collapsed by default,
optionally case-folded, order-free, fuzzy); the formatting checks first require the texts to match, then look at one
property (line spacing, tab stops, strike-through, italics' size, colours in tables, highlights, subscripts).
A missing or unreadable file scores 0.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def _docx(path: str | None) -> Any:
    """The python-docx Document, or None where the file is missing or not a docx."""
    if not path or not Path(path).exists():
        return None
    from docx import Document

    try:
        return Document(path)
    except Exception as exc:  # the agent saved something else
        log.info("not a readable docx: %s (%s)", path, exc)
        return None


def _odt_paragraphs(path: str) -> list[str] | None:
    from odf.opendocument import load
    from odf.text import P

    try:
        doc = load(path)
    except Exception as exc:
        log.info("not a readable odt: %s (%s)", path, exc)
        return None
    texts = []
    for p in doc.getElementsByType(P):
        # a paragraph's own text and its spans' direct text, as OSWorld reads it
        parts = []
        for node in p.childNodes:
            if node.nodeType == node.TEXT_NODE:
                parts.append(node.data)
            elif node.nodeType == node.ELEMENT_NODE and node.tagName == "text:span":
                parts += [c.data for c in node.childNodes if c.nodeType == c.TEXT_NODE]
        texts.append("".join(parts))
    return texts


def paragraphs(path: str | None) -> list[str] | None:
    """The paragraph texts of a docx or odt file (None where it cannot be read)."""
    if not path:
        return None
    if path.endswith(".odt"):
        return _odt_paragraphs(path)
    doc = _docx(path)
    return None if doc is None else [p.text for p in doc.paragraphs]


def _collapse(paras: list[str], fold: bool) -> str:
    s = re.sub(r"\s+", " ", "\n".join(paras)).strip()
    return s.lower() if fold else s


def compare_docx_files(result: str | None, expected: str | None, **options: Any) -> float:
    from rapidfuzz import fuzz

    if not result or not expected or Path(result).suffix != Path(expected).suffix:
        return 0.0
    a, b = paragraphs(result), paragraphs(expected)
    if a is None or b is None:
        return 0.0
    fold, fuzzy = options.get("ignore_case", False), options.get("fuzzy_match", False)
    if options.get("ignore_order", False):
        a, b = sorted(a), sorted(b)
    if options.get("delete_empty_lines", False):
        a, b = [p for p in a if p.strip()], [p for p in b if p.strip()]
    if options.get("content_only", False):
        return fuzz.ratio(_collapse(a, fold), _collapse(b, fold)) / 100.0
    if options.get("ignore_blanks", True):
        ta, tb = _collapse(a, fold), _collapse(b, fold)
        return fuzz.ratio(ta, tb) / 100.0 if fuzzy else float(ta == tb)
    if len(a) != len(b):
        return 0.0
    if fold:
        a, b = [p.lower() for p in a], [p.lower() for p in b]
    if fuzzy:
        return sum(fuzz.ratio(x, y) / 100.0 for x, y in zip(a, b)) / len(a) if a else 1.0
    return float(a == b)


def compare_docx_files_and_ignore_new_lines(result: str | None, expected: str | None, **options: Any) -> float:
    """Two docx files' texts match once empty paragraphs are dropped (whitespace collapsed with `ignore_blanks`)."""
    if not result or not expected or not (result.endswith(".docx") and expected.endswith(".docx")):
        return 0.0
    a, b = paragraphs(result), paragraphs(expected)
    if a is None or b is None:
        return 0.0
    a, b = [p for p in a if p != ""], [p for p in b if p != ""]
    if options.get("ignore_blanks", True):
        return float(_collapse(a, False) == _collapse(b, False))
    return float(a == b)


def compare_docx_tables(result: str | None, expected: str | None) -> float:
    d1, d2 = _docx(result), _docx(expected)
    if d1 is None or d2 is None or len(d1.tables) != len(d2.tables):
        return 0.0
    for t1, t2 in zip(d1.tables, d2.tables):
        if len(t1.rows) != len(t2.rows) or len(t1.columns) != len(t2.columns):
            return 0.0
        for i in range(len(t1.rows)):
            for j in range(len(t1.columns)):
                if t1.cell(i, j).text.strip() != t2.cell(i, j).text.strip():
                    return 0.0
    return 1.0


def _images(doc: Any) -> list[bytes]:
    return [rel.target_part.blob for rel in doc.part.rels.values() if "image" in rel.reltype]


def compare_docx_images(result: str | None, expected: str | None) -> float:
    """The same embedded images, pixel for pixel, in the same order."""
    import io

    from PIL import Image

    d1, d2 = _docx(result), _docx(expected)
    if d1 is None or d2 is None:
        return 0.0
    i1, i2 = _images(d1), _images(d2)
    if len(i1) != len(i2):
        return 0.0
    pixels = [(Image.open(io.BytesIO(a)).tobytes(), Image.open(io.BytesIO(b)).tobytes()) for a, b in zip(i1, i2)]
    return float(all(x == y for x, y in pixels))


def compare_line_spacing(result: str | None, expected: str | None) -> float:
    if not compare_docx_files(result, expected):
        return 0.0
    d1, d2 = _docx(result), _docx(expected)
    if d1 is None or d2 is None or len(d1.paragraphs) != len(d2.paragraphs):
        return 0.0
    return float(all(p.paragraph_format.line_spacing == q.paragraph_format.line_spacing
                      for p, q in zip(d1.paragraphs, d2.paragraphs)))


def compare_font_names(result: str | None, rules: dict[str, Any]) -> float:
    """Every run of the document uses the font `rules["font_name"]`."""
    doc = _docx(result)
    if doc is None:
        return 0.0
    return float(all(run.font.name == rules["font_name"] for p in doc.paragraphs for run in p.runs))


def compare_subscript_contains(result: str | None, expected: str | None) -> float:
    """Some run is a subscript in both documents, at the same paragraph and run position."""
    d1, d2 = _docx(result), _docx(expected)
    if d1 is None or d2 is None:
        return 0.0
    for p1, p2 in zip(d1.paragraphs, d2.paragraphs):
        if any(r1.font.subscript and r2.font.subscript for r1, r2 in zip(p1.runs, p2.runs)):
            return 1.0
    return 0.0


def has_page_numbers_in_footers(result: str | None) -> float:
    """Every section's footer's first paragraph holds a digit (a page number field's cached text)."""
    doc = _docx(result)
    if doc is None:
        return 0.0
    for section in doc.sections:
        paras = section.footer.paragraphs
        if not any(ch.isdigit() for ch in (paras[0].text if paras else "")):
            return 0.0
    return 1.0


def is_first_line_centered(result: str | None) -> float:
    from docx.enum.text import WD_PARAGRAPH_ALIGNMENT

    doc = _docx(result)
    if doc is None or not doc.paragraphs:
        return 0.0
    return float(doc.paragraphs[0].paragraph_format.alignment == WD_PARAGRAPH_ALIGNMENT.CENTER)


def contains_page_break(result: str | None, rules: dict[str, Any] | None = None) -> float:
    """The document has a page break in some run (exactly `rules["page_break_count"]` of them, when given)."""
    doc = _docx(result)
    if doc is None:
        return 0.0
    count = sum(1 for p in doc.paragraphs for run in p.runs
                for br in run.element.iter(f"{{{W_NS}}}br") if br.get(f"{{{W_NS}}}type") == "page")
    want = (rules or {}).get("page_break_count")
    if want is not None and count != want:
        return 0.0
    return float(count > 0)


def check_tabstops(result: str | None, expected: str | None, **options: Any) -> float:
    """The non-empty paragraphs have the expected tab stops (same alignments); the score is 1 minus the mean offset
    of their positions relative to the text width. `word_number_split_by_tabstop` N: the `index`-th tab-separated
    part of each paragraph has N words."""
    from docx.enum.text import WD_TAB_ALIGNMENT

    d1, d2 = _docx(result), _docx(expected)
    if d1 is None or d2 is None:
        return 0.0
    p1 = [p for p in d1.paragraphs if p.text.strip()]
    p2 = [p for p in d2.paragraphs if p.text.strip()]
    if len(p1) != len(p2) or not p1:
        return 0.0
    if options.get("word_number_split_by_tabstop") is not None:
        n, index = options["word_number_split_by_tabstop"], options.get("index", 0)
        for p in p1:
            parts = p.text.split("\t")
            if index >= len(parts) or len(parts[index].split()) != n:
                return 0.0
    sec = d2.sections[0]
    width = sec.page_width - sec.left_margin - sec.right_margin

    def kept(p: Any) -> list[Any]:  # cleared stops and a left stop at 0 are no stops
        return [t for t in p.paragraph_format.tab_stops if t.alignment != WD_TAB_ALIGNMENT.CLEAR
                and not (t.alignment == WD_TAB_ALIGNMENT.LEFT and t.position == 0)]

    off = 0.0
    for a, b in zip(p1, p2):
        ta, tb = kept(a), kept(b)
        if len(ta) != len(tb) or any(x.alignment != y.alignment for x, y in zip(ta, tb)):
            return 0.0
        off += sum(abs(x.position - y.position) for x, y in zip(ta, tb)) / width
    return 1.0 - off / len(p1)


def _delta_e(rgb: Any, ref: tuple[int, int, int]) -> float:
    """CIEDE2000 distance between two sRGB colours (scikit-image)."""
    import numpy as np
    from skimage.color import deltaE_ciede2000, rgb2lab

    if rgb is None:
        rgb = (0, 0, 0)  # a run without a colour is drawn in the default black
    a = rgb2lab(np.array([[list(rgb)]], dtype=float) / 255.0)
    b = rgb2lab(np.array([[list(ref)]], dtype=float) / 255.0)
    return float(deltaE_ciede2000(a, b)[0, 0])


def evaluate_colored_words_in_tables(result: str | None, expected: str | None, **options: Any) -> float:
    """Texts match, and in the tables every word starting with a vowel is red and every other word blue (within
    CIEDE2000 `threshold`, 3.5 by default)."""
    if not compare_docx_files(result, expected):
        return 0.0
    doc = _docx(result)
    if doc is None:
        return 0.0
    threshold = options.get("threshold", 3.5)
    for table in doc.tables:
        for row in table.rows:
            for cell in row.cells:
                for p in cell.paragraphs:
                    for run in p.runs:
                        if not run.text:
                            continue
                        ref = (255, 0, 0) if run.text[0].lower() in "aeiou" else (0, 0, 255)
                        if _delta_e(run.font.color.rgb, ref) > threshold:
                            return 0.0
    return 1.0


def check_highlighted_words(result: str | None, expected: str | None) -> float:
    """Texts match and no span of the (odt) result keeps a yellow (#ffff00) background."""
    if not compare_docx_files(result, expected):
        return 0.0
    from odf.opendocument import load
    from odf.text import Span

    doc = load(result)
    styles = {s.getAttribute("name"): s for s in doc.automaticstyles.childNodes if s.nodeType == s.ELEMENT_NODE}
    for span in doc.getElementsByType(Span):
        style = styles.get(span.getAttribute("stylename"))
        if style is None:
            continue
        for prop in style.childNodes:
            if prop.nodeType == prop.ELEMENT_NODE and prop.getAttribute("backgroundcolor") == "#ffff00":
                return 0.0
    return 1.0


def evaluate_strike_through_last_paragraph(result: str | None, expected: str | None) -> float:
    if not compare_docx_files(result, expected):
        return 0.0
    doc = _docx(result)
    if doc is None or not doc.paragraphs:
        return 0.0
    return float(all(run.font.strike for run in doc.paragraphs[-1].runs))


def check_italic_font_size_14(result: str | None, expected: str | None) -> float:
    """Texts match and every italic run is 14 pt."""
    if not compare_docx_files(result, expected):
        return 0.0
    doc = _docx(result)
    if doc is None:
        return 0.0
    for p in doc.paragraphs:
        for run in p.runs:
            if run.italic and (run.font.size is None or run.font.size.pt != 14):
                return 0.0
    return 1.0


def compare_unique_train_records(result: str | None, expected: list[str] | None, **options: Any) -> float:
    """`expected` is [gold, initial]: the result keeps only lines of the initial document, no record id (the second
    of four comma-separated fields) twice, the gold's set of ids and the gold's number of lines."""
    if not result or not isinstance(expected, list) or len(expected) < 2:
        return 0.0

    def lines_ids(path: str | None) -> tuple[list[str], list[str]] | None:
        paras = paragraphs(path)
        if paras is None:
            return None
        lines = [p.strip() for p in paras if p.strip()]
        return lines, [ln.split(",")[1].strip() for ln in lines if len(ln.split(",")) == 4]

    got, gold, initial = lines_ids(result), lines_ids(expected[0]), lines_ids(expected[1])
    if got is None or gold is None or initial is None:
        return 0.0
    lines, ids = got
    return float(set(lines) <= set(initial[0]) and len(ids) == len(set(ids)) and set(ids) == set(gold[1])
                 and len(lines) == len(gold[0]))


def find_default_font(result: str | None, rules: dict[str, Any]) -> float:
    """LibreOffice's registrymodifications.xcu sets Writer's default (Standard) font to `rules["font_name"]`."""
    import xml.etree.ElementTree as ET

    if not result or not Path(result).exists():
        return 0.0
    oor = "{http://openoffice.org/2001/registry}"
    found = None
    try:
        root = ET.parse(result).getroot()
    except ET.ParseError:
        return 0.0
    for item in root.iter("item"):
        if item.get(f"{oor}path") != "/org.openoffice.Office.Writer/DefaultFont":
            continue
        for prop in item.iter("prop"):
            if prop.get(f"{oor}name") == "Standard":
                for value in prop.findall("value"):
                    found = value.text
    return float(found == rules["font_name"])


METRICS = {
    f.__name__: f
    for f in (
        compare_docx_files, compare_docx_files_and_ignore_new_lines, compare_docx_tables, compare_docx_images,
        compare_line_spacing, compare_font_names, compare_subscript_contains, has_page_numbers_in_footers,
        is_first_line_centered, contains_page_break, check_tabstops, evaluate_colored_words_in_tables,
        check_highlighted_words, evaluate_strike_through_last_paragraph, check_italic_font_size_14,
        compare_unique_train_records, find_default_font,
    )
}
