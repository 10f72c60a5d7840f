"""OSWorld's general metric functions (text, lists, JSON, CSV records, the accessibility tree, the os domain).

A metric is called `metric(result_state, expected_state, **options)`, or `metric(result_state, **options)` when the task
has no `expected`, and returns a score in [0, 1]. `result_state` / `expected_state` come from getters
(envs.gui.getters): command output, a local path of a fetched file, the accessibility XML, a rule dict.
Implemented here:

exact_match, check_include_exclude, match_in_list, is_in_list, literal_match, fuzzy_match, diff_text_file,
compare_text_file, check_list, check_csv, check_json, check_direct_json_object, check_accessibility_tree, run_sqlite3,
plus `infeasible`, which the evaluator handles itself (the score depends on the agent's last action).
The app-specific metrics live beside this module, one per file format or app (see envs.gui.metrics).
"""

from __future__ import annotations

import ast
import csv
import difflib
import functools
import json
import logging
import operator
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.runtime.a11y_worker import NS as A11Y_NAMESPACES  # the XML's prefixes, which OSWorld's xpath rules use

log = logging.getLogger(__name__)


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    return float(result == rules["expected"])


def check_include_exclude(result: str | None, rules: dict[str, list[str]]) -> float:
    if result is None:
        return 0.0
    include, exclude = rules.get("include", []), rules.get("exclude", [])
    return float(all(s in result for s in include) and all(s not in result for s in exclude))


def match_in_list(result: Any, rules: dict[str, Any]) -> float:
    """The result is one of the expected values."""
    return float(result in rules["expected"])


def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    """The expected value is contained in the result (a list or a string)."""
    return float(result is not None and rules["expected"] in result)


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    kind = options.get("type", "str")
    fold = (lambda s: str(s).lower()) if options.get("ignore_case", False) else str
    if kind == "str":
        return float(fold(result) == fold(expected))
    if kind == "list":
        if (
            not isinstance(result, (list, tuple))
            or not isinstance(expected, (list, tuple))
            or len(result) != len(expected)
        ):
            return 0.0
        return float([fold(s) for s in result] == [fold(s) for s in expected])
    raise ValueError(f"literal_match: unknown type {kind!r} (str or list)")


def fuzzy_match(result: str | None, rules: dict[str, Any]) -> float:
    from rapidfuzz import fuzz

    if result is None:
        return 0.0
    return fuzz.ratio(result, rules["expected"]) / 100.0


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")


def diff_text_file(result: str | None, expected: str) -> float:
    """Line-level similarity of two text files (1.0 when identical)."""
    if result is None:
        return 0.0
    return difflib.SequenceMatcher(a=_read(result).splitlines(), b=_read(expected).splitlines()).ratio()


def compare_text_file(result: str | None, expected: str | None, **options: Any) -> float:
    """1 when the two text files are equal (optionally ignoring case and collapsing whitespace)."""
    if not result or not expected:
        return 0.0
    a, b = _read(result), _read(expected)
    if options.get("ignore_blanks", False):
        a, b = re.sub(r"\s+", " ", a).strip(), re.sub(r"\s+", " ", b).strip()
    if options.get("ignore_case", False):
        a, b = a.lower(), b.lower()
    return float(a == b)


def check_list(result: str | None, rules: dict[str, list[str]]) -> float:
    """Every `expect` regex matches some line of the file and no `unexpect` regex matches any line."""
    if result is None:
        return 0.0
    expect = [re.compile(p) for p in rules.get("expect", [])]
    unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    seen = [False] * len(expect)
    lines = _read(result).splitlines()
    for line in lines:
        for i, pat in enumerate(expect):
            seen[i] = seen[i] or pat.search(line) is not None
        if any(p.search(line) for p in unexpect):
            return 0.0
    return float(all(seen))


def _match_record(pattern: dict[str, Any], record: dict[str, Any]) -> bool:
    return all(k in record and record[k] == v for k, v in pattern.items())


def check_csv(result: str | None, rules: dict[str, list[dict[str, str]]]) -> float:
    """Every `expect` record occurs in the CSV file and no `unexpect` record does."""
    if result is None:
        return 0.0
    expect = rules.get("expect", [])
    seen = [False] * len(expect)
    with open(result, newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            for i, r in enumerate(expect):
                seen[i] = seen[i] or _match_record(r, rec)
            if any(_match_record(r, rec) for r in rules.get("unexpect", [])):
                return 0.0
    return float(all(seen))


def match_value_to_rule(value: Any, rule: dict[str, Any]) -> bool:
    """OSWorld's rule matching: `method` is eq/ne/le/lt/ge/gt, `re[.FLAG...]` (regex search) or `approx:TOL`."""
    method = rule["method"]
    if method.startswith("re"):
        flags = functools.reduce(operator.or_, (getattr(re, f) for f in method.split(".")[1:]), re.RegexFlag(0))
        return value is not None and re.search(rule["ref"], str(value), flags) is not None
    if method in ("eq", "ne", "le", "lt", "ge", "gt"):
        try:
            return bool(getattr(operator, method)(value, rule["ref"]))
        except TypeError:
            return False
    if method.startswith("approx"):
        tol = float(method.split(":", 1)[1]) if ":" in method else 1e-6
        try:
            return abs(float(value) - float(rule["ref"])) <= tol
        except (TypeError, ValueError):
            return False
    if method == "spreadsheet_range":  # the value (a MultiCellRange) lies within ref[1] and covers ref[0]
        from openpyxl.worksheet.cell_range import MultiCellRange

        inner, outer = MultiCellRange(rule["ref"][0]), MultiCellRange(rule["ref"][1])
        return all(r in value for r in inner) and all(r in outer for r in value)
    if method.startswith("range.") and len(method) == 8:  # range.te [a, b]: a < v <= b (t: <, e: <=)
        lo, hi = (operator.lt if c == "t" else operator.le for c in method[6:8])
        try:
            return bool(lo(rule["ref"][0], value) and hi(value, rule["ref"][1]))
        except TypeError:
            return False
    if method in ("str_list_eq", "str_set_eq"):  # a comma-separated string against a list of strings
        kind = list if method == "str_list_eq" else set
        return value is not None and kind(str(value).strip("\"'").split(",")) == kind(rule["ref"])
    raise ValueError(
        f"unknown rule method {method!r} (eq, ne, le, lt, ge, gt, re[.FLAGS], approx:TOL, spreadsheet_range, "
        "range.XY, str_list_eq, str_set_eq)"
    )


def check_json(result: str | None, rules: dict[str, list[dict[str, Any]]], is_yaml: bool = False) -> float:
    """Each `expect` rule ({key: [path...], method, ref}) holds in the JSON (or YAML) file; no `unexpect` rule does."""
    if result is None or not Path(result).exists():
        return 0.0
    try:
        text = _read(result)
        if is_yaml:
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        log.info("check_json: %s is not valid %s: %s", result, "YAML" if is_yaml else "JSON", exc)
        return 0.0
    for r in rules.get("expect", []):
        value = data
        for k in r["key"]:
            try:
                value = value[k]
            except (KeyError, IndexError, TypeError):
                return 0.0
        if not match_value_to_rule(value, r):
            return 0.0
    for r in rules.get("unexpect", []):
        value = data
        for k in r["key"]:
            try:
                value = value[k]
            except (KeyError, IndexError, TypeError):
                value = None
                break
        if match_value_to_rule(value, r):
            return 0.0
    return 1.0


def check_direct_json_object(result: Any, rules: dict[str, Any]) -> float:
    """The result (a dict, or its JSON text) has the `expected` values (or contains them with `expect_in_result`)."""
    if isinstance(result, str):
        try:
            result = json.loads(result.strip().replace("'", '"'))
        except json.JSONDecodeError:
            return 0.0
    if not isinstance(result, dict):
        return 0.0
    expected = rules["expected"]
    if rules.get("expect_in_result", False):
        return float(all(str(v) in str(result.get(k, "")) for k, v in expected.items()))
    return float(all(result.get(k) == v for k, v in expected.items()))


def check_accessibility_tree(result: str | None, rules: list[dict[str, Any]], osname: str = "ubuntu") -> float:
    """Each rule selects elements of the accessibility XML by `xpath` or CSS `selectors`; with `text`, the best
    element's text must equal it (`exact`, the default) or fuzzily match it. Scores multiply."""
    import lxml.etree

    if result is None:
        return 0.0
    if osname != "ubuntu":
        raise ValueError("check_accessibility_tree: only the ubuntu (AT-SPI) namespaces are available here")
    root = lxml.etree.fromstring(result.encode() if isinstance(result, str) else result)
    total = 1.0
    for r in rules:
        if "xpath" in r:
            elements = root.xpath(r["xpath"], namespaces=A11Y_NAMESPACES)
        elif "selectors" in r:
            from lxml.cssselect import CSSSelector

            elements = CSSSelector(", ".join(r["selectors"]), namespaces=A11Y_NAMESPACES)(root)
        else:
            raise ValueError("check_accessibility_tree: a rule needs 'xpath' or 'selectors'")
        if not elements:
            return 0.0
        if "text" in r:
            if r.get("exact", True):
                score = max(float((e.text or "") == r["text"]) for e in elements)
            else:
                from rapidfuzz import fuzz

                score = max(fuzz.ratio(e.text or "", r["text"]) / 100.0 for e in elements)
        else:
            score = 1.0
        total *= score
    return float(total)


def run_sqlite3(result: str | None, rules: dict[str, Any]) -> float:
    if result is None:
        return 0.0
    with sqlite3.connect(result) as conn:
        row = conn.execute(rules["sql"]).fetchone()
    return float((row[0] if row else 0) or 0)


# ----- OSWorld's os-domain checks (the same rules, our code) -----
def check_gnome_favorite_apps(result: str | None, rules: dict[str, Any]) -> float:
    """`gsettings get org.gnome.shell favorite-apps` (a Python-style list literal) holds exactly the expected apps."""
    try:
        apps = ast.literal_eval((result or "").strip())
    except (ValueError, SyntaxError):
        return 0.0
    if not isinstance(apps, (list, tuple)):
        return 0.0
    expected = list(rules["expected"])
    return float(len(apps) == len(expected) and set(apps) == set(expected))


def is_utc_0(result: str | None) -> float:
    """`timedatectl status` says the time zone is at UTC+0 (its "Time zone:" line ends with "+0000)")."""
    for line in (result or "").splitlines():
        if line.strip().startswith("Time zone:"):
            return float(line.rstrip().endswith("+0000)"))
    return 0.0


def check_text_enlarged(result: str | None) -> float:
    """`gsettings get org.gnome.desktop.interface text-scaling-factor` is above 1."""
    try:
        return float(float((result or "").strip()) > 1.0)
    except ValueError:
        return 0.0


def check_moved_jpgs(result: dict[str, Any] | None, rules: dict[str, Any]) -> float:
    """The directory (a `list_directory` tree) holds exactly the expected file names."""
    if not isinstance(result, dict) or "children" not in result:
        return 0.0
    names = [node.get("name") for node in result["children"]]
    expected = list(rules["expected"])
    return float(len(names) == len(expected) and set(names) == set(expected))


METRICS: dict[str, Callable[..., float]] = {
    f.__name__: f
    for f in (
        exact_match,
        check_include_exclude,
        match_in_list,
        is_in_list,
        literal_match,
        fuzzy_match,
        diff_text_file,
        compare_text_file,
        check_list,
        check_csv,
        check_json,
        check_direct_json_object,
        check_accessibility_tree,
        run_sqlite3,
        check_gnome_favorite_apps,
        is_utc_0,
        check_text_enlarged,
        check_moved_jpgs,
    )
}
INFEASIBLE = "infeasible"
