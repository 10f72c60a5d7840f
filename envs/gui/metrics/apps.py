"""Application settings metrics: Thunderbird (prefs.js, message filters, folders) and VS Code (settings.json,
keybindings.json, extension lists, other config files)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from envs.gui.metrics.general import match_value_to_rule

# prefs.js lines: user_pref("key", <JSON value>);
PREF_LINE = re.compile(r'^user_pref\("(?P<key>(?:[^"]|\\")+)", (?P<val>.+)\);$')
# a filter's condition string: `AND (field,op,value)` / `OR (...)` terms, or ALL
CONDITION = re.compile(r'\b(?:AND|OR) \((?:[\w ]+),(?:[\w \']+),(?:"(?:(?:[^"]|")+)"|(?:[^)]+))\)|\bALL\b')


def _text(path: str | None) -> str | None:
    if not path or not Path(path).exists():
        return None
    return Path(path).read_text(encoding="utf-8", errors="replace")


def thunderbird_prefs(text: str) -> dict[str, Any]:
    prefs = {}
    for line in text.splitlines():
        m = PREF_LINE.match(line.strip())
        if m:
            try:
                prefs[m["key"]] = json.loads(m["val"])
            except json.JSONDecodeError:
                continue
    return prefs


def check_thunderbird_prefs(result: str | None, rules: dict[str, Any]) -> float:
    """Every `expect` pref is set and matches its rule; no `unexpect` pref that is set matches its rule."""
    text = _text(result)
    if text is None:
        return 0.0
    prefs = thunderbird_prefs(text)
    for key, rule in rules.get("expect", {}).items():
        if key not in prefs or not match_value_to_rule(prefs[key], rule):
            return 0.0
    return float(not any(k in prefs and match_value_to_rule(prefs[k], r) for k, r in rules.get("unexpect", {}).items()))


def _unquote(v: str) -> str:
    return v.replace('\\"', '"').replace("\\\\", "\\")


def thunderbird_filters(text: str) -> list[dict[str, Any]]:
    """msgFilterRules.dat as records; a filter ends at its `condition` line."""
    filters, cur = [], {}
    for line in text.splitlines():
        key, sep, val = line.partition("=")
        if not sep or key not in ("name", "enabled", "type", "action", "actionValue", "condition"):
            continue
        val = _unquote(val.strip()[1:-1]) if val.strip().startswith('"') else val.strip()
        if key == "name":
            cur = {"name": val}
        elif key == "condition":
            cur["condition"] = CONDITION.findall(val)
            filters.append(cur)
        else:
            cur[key] = val
    return filters


def _matches(pattern: dict[str, Any], record: dict[str, Any]) -> bool:
    return all(k in record and record[k] == v for k, v in pattern.items())


def check_thunderbird_filter(result: str | None, rules: dict[str, list[dict[str, Any]]]) -> float:
    """Some filter matches each `expect` record and none matches an `unexpect` one."""
    text = _text(result)
    if text is None:
        return 0.0
    filters = thunderbird_filters(text)
    expect_ok = all(any(_matches(r, f) for f in filters) for r in rules.get("expect", []))
    return float(expect_ok and not any(_matches(r, f) for f in filters for r in rules.get("unexpect", [])))


def _mbox_messages(path: str, options: dict[str, Any]) -> str:
    data = Path(path).read_text(encoding="utf-8", errors="replace").strip()
    msgs = []
    for mail in data.split("FROM - "):
        if not mail.strip():
            continue
        if options.get("remove_deleted", True) and re.search(r"X-Mozilla-Status: 000[89]", mail):
            continue
        if options.get("ignore_status", False):
            mail = re.sub(r"X-Mozilla-Status\d?:[\s\d]+", "", mail)
        if options.get("ignore_keys", False):
            mail = re.sub(r"(X-Mozilla-Keys:[^\n]*?)\n(MIME-Version)", r"\2", mail)
        msgs.append("FROM - " + mail.strip())
    return "\n".join(sorted(set(msgs) if options.get("remove_duplicate", True) else msgs))


def check_thunderbird_folder(result: str | list[str] | None, expected: str | list[str], **options: Any) -> float:
    """Each folder file (mbox) holds the same messages as its expected one (deleted and duplicate ones dropped)."""
    results = result if isinstance(result, list) else [result]
    wanted = expected if isinstance(expected, list) else [expected]
    for r, e in zip(results, wanted):
        if not r or not Path(r).exists() or _mbox_messages(r, options) != _mbox_messages(e, options):
            return 0.0
    return 1.0


# ----- VS Code -----
def _json(path: str | None, skip_first_line: bool = False) -> Any:
    text = _text(path)
    if text is None:
        return None
    if skip_first_line:
        text = text.split("\n", 1)[1] if "\n" in text else ""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def check_json_settings(result: str | None, rules: dict[str, Any], **options: Any) -> float:
    """Every key of `rules["expected"]` is set to that value in the JSON file (settings.json, a workspace)."""
    data = _json(result)
    if not isinstance(data, dict):
        return 0.0
    return float(all(k in data and data[k] == v for k, v in rules["expected"].items()))


def check_json_keybindings(result: str | None, rules: dict[str, Any], **options: Any) -> float:
    """keybindings.json (a list, possibly under a first comment line) contains the expected binding."""
    data = _json(result)
    if not isinstance(data, list):
        data = _json(result, skip_first_line=True)
    return float(isinstance(data, list) and rules["expected"] in data)


def _subset(want: Any, got: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _subset(v, got[k]) for k, v in want.items())
    return bool(want == got)


def compare_config(result: str | None, rules: dict[str, Any], **options: Any) -> float:
    """The file equals `rules["expected"]` (as text or as JSON); with `containment_ok` (the default) the expected
    JSON need only be contained in the file's (or the expected text in the file's text)."""
    text, want = _text(result), rules.get("expected")
    if text is None or not want:
        return 0.0
    if options.get("containment_ok", True):
        try:
            return float(_subset(json.loads(want), json.loads(text)))
        except json.JSONDecodeError:
            return float(want.strip() in text)
    if text == want:
        return 1.0
    try:
        return float(json.loads(text) == json.loads(want))
    except json.JSONDecodeError:
        return 0.0


def compare_answer(result: str | None, rules: dict[str, Any], **options: Any) -> float:
    return float(bool(result) and result == rules["expected"])


def is_extension_installed(result: str | None, rules: dict[str, Any], **options: Any) -> float:
    """The output of `code --list-extensions` contains (`contain`) or lacks (`not_contain`) the extension id."""
    kind = rules.get("type")
    if kind not in ("contain", "not_contain"):
        raise ValueError(f"is_extension_installed: type must be 'contain' or 'not_contain', got {kind!r}")
    found = rules["expected"] in (result or "")
    return float(found if kind == "contain" else not found)


METRICS = {
    f.__name__: f
    for f in (
        check_thunderbird_prefs, check_thunderbird_filter, check_thunderbird_folder, check_json_settings,
        check_json_keybindings, compare_config, compare_answer, is_extension_installed,
    )
}
