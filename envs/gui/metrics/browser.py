"""Browser metrics (the chrome domain) and PDF metrics, over what the browser getters return: the active tab's URL
or {url, title, content}, the open tabs, bookmarks, cookies and history rows, desktop shortcuts, font settings.

URLs compare as OSWorld's `compare_urls` does: scheme kept, `www.` dropped, the public suffix ignored (airbnb.com and
airbnb.com.sg are the same site), a lone trailing slash ignored. The public suffix list is tldextract's bundled copy
(no download).
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path
from typing import Any
from urllib.parse import ParseResult, urlparse, urlunparse


@functools.lru_cache(maxsize=1)
def _extractor() -> Any:
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)  # the bundled snapshot: never the web


def normalize_url(url: str, full: bool = True) -> str:
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://", url):
        url = f"http://{url}"
    p = urlparse(url)
    ext = _extractor()(p.netloc.lower())
    sub = "" if ext.subdomain == "www" else ext.subdomain
    netloc = f"{sub}.{ext.domain}" if sub else ext.domain
    return urlunparse(ParseResult(p.scheme.lower(), netloc, "" if p.path == "/" else p.path,
                                  p.params if full else "", p.query if full else "", p.fragment if full else ""))


def same_url(a: str | None, b: str | None, full: bool = True) -> bool:
    if a is None or b is None:
        return a == b
    return normalize_url(a, full) == normalize_url(b, full)


def _url_of(tab: Any) -> str | None:
    if isinstance(tab, dict):
        return tab.get("url")
    return tab if isinstance(tab, str) else None


def is_expected_url_pattern_match(result: Any, rules: dict[str, Any]) -> float:
    """Every regex of `rules["expected"]` matches the active tab's URL."""
    url = _url_of(result)
    return float(bool(url) and all(re.search(p, url) for p in rules["expected"]))


def is_expected_active_tab(result: Any, rules: dict[str, Any]) -> float:
    if not result or rules.get("type") != "url":
        return 0.0
    return float(same_url(rules["url"], _url_of(result)))


def is_expected_active_tab_approximate(result: Any, rules: dict[str, Any]) -> float:
    """The active tab's URL equals the expected one once both drop their query strings."""
    url = _url_of(result)
    if not url or rules.get("type") != "url":
        return 0.0

    def bare(u: str) -> str:
        return urlunparse(urlparse(u)._replace(query=""))

    return float(bare(rules["url"]) == bare(url))


def is_expected_tabs(result: list[dict[str, str]] | None, rules: dict[str, Any]) -> float:
    """The open tabs are the expected URLs (as many, each matching one of the others)."""
    if not result or rules.get("type") != "url":
        return 0.0
    got, want = [t["url"] for t in result], list(rules["urls"])
    return float(len(got) == len(want) and all(any(same_url(w, g) for g in got) for w in want))


def _bar(bookmarks: dict[str, Any]) -> list[dict[str, Any]]:
    return bookmarks.get("bookmark_bar", {}).get("children", [])


def is_expected_bookmarks(result: dict[str, Any] | None, rules: dict[str, Any]) -> float:
    """Chrome's Bookmarks roots: the bookmark bar's folder names, its site URLs, or the URLs in its "Liked Authors"
    folder (each expected entry a URL or a list of acceptable URLs) are exactly the expected ones."""
    if not result:
        return 0.0
    kind = rules["type"]
    if kind == "bookmark_bar_folders_names":
        return float({b["name"] for b in _bar(result) if b["type"] == "folder"} == set(rules["names"]))
    if kind == "bookmark_bar_websites_urls":
        return float({b["url"] for b in _bar(result) if b["type"] == "url"} == set(rules["urls"]))
    if kind == "liked_authors_websites_urls":
        folder = next((b for b in _bar(result) if b["type"] == "folder" and b["name"] == "Liked Authors"), None)
        if folder is None:
            return 0.0
        got = {b["url"] for b in folder.get("children", []) if b["type"] == "url"}
        options = [[u] if isinstance(u, str) else list(u) for u in rules["urls"]]
        return float(any(set(c) == got for c in itertools.product(*options)))
    raise ValueError(f"is_expected_bookmarks: unknown rule type {kind!r}")


def is_cookie_deleted(result: list[Any] | None, rules: dict[str, Any]) -> float:
    """No cookie row (its second field is the host) belongs to one of `rules["domains"]`."""
    if rules.get("type") != "domains":
        raise ValueError(f"is_cookie_deleted: unknown rule type {rules.get('type')!r}")
    hosts = [row[1] for row in result or []]
    return float(not any(same_url(d, h) for d in rules["domains"] for h in hosts))


def check_history_deleted(result: list[Any] | None, rules: dict[str, Any]) -> float:
    """No history row's URL (its first field) contains one of `rules["keywords"]`."""
    if rules.get("type") != "keywords":
        raise ValueError(f"check_history_deleted: unknown rule type {rules.get('type')!r}")
    urls = [row[0] for row in result or []]
    return float(not any(k in u for k in rules["keywords"] for u in urls))


def is_shortcut_on_desktop(result: dict[str, str] | None, rules: dict[str, Any]) -> float:
    """Some .desktop file's Name= (or Exec=) line matches the expected one (equal, or either contains the other;
    names case-insensitively)."""
    kind = rules.get("type")
    if kind not in ("name", "exec"):
        raise ValueError(f"is_shortcut_on_desktop: rule type {kind!r} is not supported (name, exec)")
    key, want = ("Name=", rules["name"]) if kind == "name" else ("Exec=", rules["exec"])
    for content in (result or {}).values():
        for line in content.split("\n"):
            if not line.startswith(key):
                continue
            got = line[len(key):]
            a, b = (got.lower(), want.lower()) if kind == "name" else (got, want)
            if a == b or b in a or a in b:
                return 1.0
    return 0.0


def check_font_size(result: dict[str, Any] | None, rules: dict[str, Any]) -> float:
    if not result:
        return 0.0
    size = result["default_font_size"]
    if rules["type"] == "value":
        return float(size == rules["value"])
    if rules["type"] == "range":
        return float(rules["min"] < size < rules["max"])
    raise ValueError(f"check_font_size: unknown rule type {rules['type']!r}")


def is_added_to_steam_cart(result: dict[str, Any] | None, rules: dict[str, Any]) -> float:
    """Every expected item name occurs in the active tab's page text."""
    content = (result or {}).get("content") or ""
    return float(all(item in content for item in rules["items"]))


# ----- PDF -----
def pdf_text(path: str) -> str:
    from pypdf import PdfReader

    return "".join(page.extract_text() or "" for page in PdfReader(path).pages).strip()


def compare_pdfs(result: str | list[str] | None, expected: str | list[str] | None) -> float:
    """Mean over the pairs of the fuzzy ratio (rapidfuzz) of the two PDFs' texts; an unreadable pair scores 0."""
    from rapidfuzz import fuzz

    results = result if isinstance(expected, list) else [result]
    wanted = expected if isinstance(expected, list) else [expected]
    total = 0.0
    for r, e in zip(results or [], wanted):
        if not r or not e or not Path(r).exists() or not Path(e).exists():
            continue
        try:
            total += fuzz.ratio(pdf_text(r), pdf_text(e)) / 100.0
        except Exception:  # not a PDF pypdf can read: that pair scores 0
            continue
    return total / len(wanted) if wanted else 0.0


def check_pdf_pages(result: str | None, rules: dict[str, Any]) -> float:
    """The PDF's page count stands in `relation` (eq, lt, ge, ...) to `ref_value`."""
    import operator

    from pypdf import PdfReader

    if not result or not Path(result).exists():
        return 0.0
    return float(getattr(operator, rules["relation"])(len(PdfReader(result).pages), rules["ref_value"]))


METRICS = {
    f.__name__: f
    for f in (
        is_expected_url_pattern_match, is_expected_active_tab, is_expected_active_tab_approximate, is_expected_tabs,
        is_expected_bookmarks, is_cookie_deleted, check_history_deleted, is_shortcut_on_desktop, check_font_size,
        is_added_to_steam_cart, compare_pdfs, check_pdf_pages,
    )
}
