"""Every file a page links exists, and the figures quoted next to a link to a kept data file are in that file.

Pages: README.md, every docs/**/*.md and examples/*/README.md.

**Links.** Every relative link target of a page (`[text](target)`, images included, `#anchor` dropped; http(s) and
mailto links and fenced code skipped) must exist, resolved from the page's folder. mkdocs --strict checks the links
between pages of docs/; this also covers the README, the examples and links from docs/ to files outside it.

**Figures next to a kept file.** A kept file is a link target ending in .json, .jsonl, .txt, .csv or .log, or a
generated report (`*_report.md`). A page is cut into units: a paragraph, a bullet (with its continuation lines), a
table row, a heading; fenced code blocks are skipped. A table row also counts the links of the paragraph directly
above its table (the caption that names the table's file). Each number quoted in a unit that links a kept file must
be found in one of the files that unit links, where:

- *quoted number*: digits outside inline code, link targets, dates (2026-12-03), times (08:43), versions (3.11.5),
  words (H100, Qwen3, seed4, c50f5c9, 5e-4) and years (1990-2030 without a decimal point: "AIME 2024"), that have a
  decimal point or at least 3 digits (`1,024` counts as 1024); a `k` or `M` right after it multiplies it by 10^3 or
  10^6 (`792k`). One- and two-digit integers ("2 cores", "17%", "issue 33") are NOT checked: too many of them are
  counts, settings and names, not measurements.
- *the file's numbers*: every number in a JSON file's keys and values (numbers, and numbers written inside strings
  such as `uptime` lines), or every number in a text/report file.
- *found*: some file number v, as is or in one of the unit changes pages make (x100: a fraction shown as a
  percentage; /1000 and x1000: ms <-> s; /60: s -> min; /1024, /1024^2, /1024^3: KiB/MiB/bytes -> MiB/GiB), rounds
  to the quoted number at the quoted precision (0.69 matches 0.6878; 2037.7 matches 2037.66). Signs are ignored (a
  page says "fell by 0.3" for -0.3).
- *derived ratios*: a number written as a ratio (`2.68x`, `x0.23`, `1.28×`) or a percentage with a decimal point is
  also found when it is a/b of two numbers quoted in the same section of the page (between two headings) that are
  themselves found in their units' files (for a percentage: 100·a/b, or a change 100·(a/b − 1)), within the rounding
  of all three.

What it does NOT check: figures in units without a link to a kept file (e.g. the "What it shows" paragraph after a
table whose caption links the file), one- and two-digit integers, sums, differences and means, whether a found number
is the *right* one (a figure that happens to equal another value of the file, in any of the unit changes, passes; a
file with thousands of numbers lets many short figures pass), figures in fenced code blocks, and figures backed by a
test rather than a file (those are asserted where the test runs).
"""
from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").glob("*/README.md"))]

DATA_SUFFIXES = (".json", ".jsonl", ".txt", ".csv", ".log")
UNIT_FACTORS = (1.0, 100.0, 1e-3, 1e3, 1 / 60, 1 / 1024, 1 / 1024**2, 1 / 1024**3)

LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
# removed before numbers are read: inline code, dates, times, versions, URLs
NOT_FIGURES = re.compile(r"`[^`]*`|\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}(?::\d{2})?\b|\b\d+(?:\.\d+){2,}\b"
                         r"|https?://\S+")
NUMBER = re.compile(r"(?<![\w.])(?P<pre>x|×)?(?P<num>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?"
                    r"(?P<suf>[A-Za-z%×]*)")
SUFFIX_SCALE = {"": 1.0, "x": 1.0, "×": 1.0, "%": 1.0, "k": 1e3, "M": 1e6, "s": 1.0, "ms": 1.0}


@dataclass
class Unit:
    page: Path
    line: int
    text: str
    section: int
    caption_links: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Figure:
    text: str  # as quoted
    value: float  # absolute value, scaled by its k/M suffix
    half_step: float  # half the quoted precision (the rounding a match allows), scaled
    ratio: bool  # quoted as a ratio (x) or a percentage with a decimal point
    percent: bool


def units(page: Path) -> list[Unit]:
    """The page cut into paragraphs, bullets, table rows and headings (fenced code blocks skipped); a table row
    carries the links of the paragraph directly above its table."""
    out: list[Unit] = []
    cur: Unit | None = None
    in_fence, section = False, 0
    last_paragraph: Unit | None = None  # the unit just before a table starts (its caption)
    table_caption: list[str] | None = None
    for no, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_fence, cur, table_caption = not in_fence, None, None
            continue
        if in_fence:
            continue
        stripped = line.strip()
        if not stripped:
            cur = table_caption = None
            continue
        if stripped.startswith("|"):
            if table_caption is None:  # the table's first row
                table_caption = link_targets(last_paragraph.text) if last_paragraph else []
            out.append(Unit(page, no, stripped, section, caption_links=table_caption))
            cur = last_paragraph = None
            continue
        table_caption = None
        if HEADING.match(line):
            section += 1
            out.append(Unit(page, no, stripped, section))
            cur = last_paragraph = None
            continue
        if cur is None or ITEM.match(line):
            cur = Unit(page, no, stripped, section)
            out.append(cur)
        else:
            cur.text += " " + stripped
        last_paragraph = cur
    return out


def link_targets(text: str) -> list[str]:
    return [t for _, t in LINK.findall(text)]


def resolve(page: Path, target: str) -> Path | None:
    """The repository file a relative link points to, or None for external links and same-page anchors."""
    target = target.split("#", 1)[0]
    if not target or re.match(r"^[a-z]+:", target):
        return None
    return (page.parent / target).resolve()


def is_kept_file(path: Path) -> bool:
    return path.suffix in DATA_SUFFIXES or path.name.endswith("_report.md")


def figures(text: str) -> list[Figure]:
    """The quoted numbers of a unit's text that the check looks at (see the module's docstring)."""
    text = LINK.sub(lambda m: m.group(1), text)  # link text stays, the target goes
    text = NOT_FIGURES.sub(" ", text).replace("−", "-")
    out = []
    for m in NUMBER.finditer(text):
        suf = m.group("suf")
        if suf not in SUFFIX_SCALE:
            continue  # a word or a name (4B, 80GB, 16k-token is fine: k is a scale)
        digits = m.group("num").replace(",", "")
        frac = m.group("frac") or ""
        year = len(m.group("num")) == 4 and 1990 <= int(digits) <= 2030
        if not frac and (len(digits) < 3 or year):
            continue  # a count, a setting or a name; or a year
        scale = SUFFIX_SCALE[suf]
        decimals = len(frac) - 1 if frac else 0
        out.append(Figure(m.group(0), float(digits + frac) * scale, 0.5 * 10**-decimals * scale,
                          ratio=bool(m.group("pre")) or suf in ("x", "×") or (suf == "%" and bool(frac)),
                          percent=suf == "%"))
    return out


def _numbers_in(value, out: list[float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            out.append(abs(float(value)))
    elif isinstance(value, str):
        out.extend(abs(float(n)) for n in re.findall(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _numbers_in(k, out)
            _numbers_in(v, out)
    elif isinstance(value, list):
        for v in value:
            _numbers_in(v, out)


@lru_cache(maxsize=None)
def file_numbers(path: Path) -> tuple[float, ...]:
    """Every number the file holds, absolute, sorted."""
    text = path.read_text(errors="replace")
    out: list[float] = []
    if path.suffix == ".json":
        _numbers_in(json.loads(text), out)
    elif path.suffix == ".jsonl":
        for line in text.splitlines():
            if line.strip():
                _numbers_in(json.loads(line), out)
    else:
        _numbers_in(text.replace(",", ""), out)
    return tuple(sorted(set(out)))


def _holds(numbers: tuple[float, ...], lo: float, hi: float) -> bool:
    i = bisect.bisect_left(numbers, lo)
    return i < len(numbers) and numbers[i] <= hi


def found(fig: Figure, numbers: tuple[float, ...]) -> bool:
    """Some number of the file, in one of the unit changes, rounds to the quoted figure."""
    lo, hi = fig.value - fig.half_step * (1 + 1e-9), fig.value + fig.half_step * (1 + 1e-9)
    return any(_holds(numbers, lo / f, hi / f) for f in UNIT_FACTORS)


def derived(fig: Figure, backed: list[Figure]) -> bool:
    """a/b (or 100·a/b, 100·(a/b − 1) for a percentage) of two backed figures of the same section, within the
    rounding of the three."""
    targets = [(fig.value - fig.half_step, fig.value + fig.half_step)]
    if fig.percent:
        lo, hi = targets[0][0] / 100, targets[0][1] / 100
        targets = [(lo, hi), (1 + lo, 1 + hi), (1 - hi, 1 - lo)]
    for a in backed:
        for b in backed:
            if a is b or b.value - b.half_step <= 0:
                continue
            r_lo = (a.value - a.half_step) / (b.value + b.half_step)
            r_hi = (a.value + a.half_step) / (b.value - b.half_step)
            if any(r_lo <= hi and lo <= r_hi for lo, hi in targets):
                return True
    return False


def unbacked_figures(pages: list[Path], root: Path = REPO) -> list[str]:
    """Every quoted figure next to a link to a kept file that none of the unit's files holds: 'page:line: figure
    (not in files)', paths relative to `root`."""
    flagged = []
    for page in pages:
        page_units = units(page)
        backed_by_section: dict[int, list[Figure]] = {}
        pending: list[tuple[Unit, Figure, list[Path]]] = []
        for unit in page_units:
            paths = [resolve(page, t) for t in link_targets(unit.text) + unit.caption_links]
            kept = [p for p in paths if p is not None and is_kept_file(p) and p.is_file()]
            if not kept:
                continue
            for fig in figures(unit.text):
                if any(found(fig, file_numbers(p)) for p in kept):
                    backed_by_section.setdefault(unit.section, []).append(fig)
                else:
                    pending.append((unit, fig, kept))
        for unit, fig, kept in pending:
            if fig.ratio and derived(fig, backed_by_section.get(unit.section, [])):
                continue
            names = ", ".join(str(p.relative_to(root)) for p in kept)
            flagged.append(f"{page.relative_to(root)}:{unit.line}: {fig.text} (not in {names})")
    return flagged


# ----- the heuristic itself: each rule can fail -----

def _page(tmp_path: Path, text: str, data: dict) -> Path:
    (tmp_path / "run.json").write_text(json.dumps(data))
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def _flags(page: Path) -> list[str]:
    return unbacked_figures([page], root=page.parent)


def test_a_figure_next_to_a_link_must_be_in_the_file(tmp_path):
    data = {"steps_per_s": 117.4, "x_ideal": 0.2293, "reset_ms": 1356.76, "mem_bytes": 3 * 1024**3,
            "uptime": "load average: 7.10, 6.2"}
    ok = _page(tmp_path, "One run ([JSON](run.json)): 117 steps/s, x0.23, a reset 1.36 s, 3.0 GiB, load 7.1.\n", data)
    assert _flags(ok) == []
    bad = _page(tmp_path, "One run ([JSON](run.json)): 118 steps/s and 0.24 of ideal.\n", data)
    assert _flags(bad) == ["page.md:1: 118 (not in run.json)", "page.md:1: 0.24 (not in run.json)"]


def test_units_tables_captions_and_what_is_not_checked(tmp_path):
    data = {"a": 190.0, "b": 71.0, "c": 0.69}
    text = ("Medians ([output](run.json)):\n\n| app | PSS | ratio |\n|---|---|---|\n| none | 71.0 | |\n"
            "| calc | 190 (2.68x) | 0.69 |\n| gimp | 156 | 0.70 |\n\n"
            "What it shows: 999.9 with no link is not checked; `123.4` in code neither.\n\n"
            "```bash\npython x.py --n 4242 --json run.json\n```\n"
            "- a bullet ([JSON](run.json)) quoting 2 cores, 17%, on 2026-12-03 08:43 with Qwen3 on an H100, 3.11.5,\n"
            "  lr 5e-4 in AIME 2024: none of them figures\n")
    page = _page(tmp_path, text, data)
    # 2.68x is 190/71 (both backed, same section); 156 and 0.70 are not in the file
    assert _flags(page) == ["page.md:7: 156 (not in run.json)", "page.md:7: 0.70 (not in run.json)"]


def test_a_link_to_a_missing_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See [the\nrun](gone.json), [the web](https://example.org/x.json) and [here](#top).\n")
    assert missing_links([page], root=tmp_path) == ["page.md:1: gone.json"]


# ----- the repository's pages -----

def missing_links(pages: list[Path], root: Path = REPO) -> list[str]:
    """'page:line: target' for every relative link target (outside code) that does not exist."""
    out = []
    for page in pages:
        for unit in units(page):
            for target in link_targets(re.sub(r"`[^`]*`", "", unit.text)):
                path = resolve(page, target)
                if path is not None and not path.exists():
                    out.append(f"{page.relative_to(root)}:{unit.line}: {target}")
    return out


def test_every_linked_file_exists():
    assert missing_links(PAGES) == []


def test_every_figure_next_to_a_kept_file_is_in_it():
    flagged = unbacked_figures(PAGES)
    assert not flagged, "figures quoted next to a kept file that the file does not hold:\n" + "\n".join(flagged)


if __name__ == "__main__":  # the whole list, for fixing pages: python tests/test_docs_figures.py
    print("\n".join(missing_links(PAGES) + unbacked_figures(PAGES)))
