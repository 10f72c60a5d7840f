"""Spreadsheet metrics (LibreOffice Calc's xlsx / csv files), read with openpyxl and pandas.

`compare_table(result, expected, rules=[...])` applies OSWorld's rules in order and scores 1 only if all hold. A rule
names its sheets as OSWorld does: an int or `RI<n>` (the n-th sheet of the result), `RN<name>`, `EI<n>`, `EN<name>`
(the expected book's). Rule types: sheet_name, sheet_data (pandas values rounded to `precision`), sheet_print (the
CSV export `<book>-<sheet>.csv` a postconfig step wrote beside the book), sheet_fuzzy, chart, pivot_table, style,
freeze, zoom, data_validation, row_props, col_props, filter, check_cell. Cell values are the values saved with the file
(openpyxl's `data_only`): what LibreOffice computed, as OSWorld reads them from the sheet XML (numbers as floats).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.gui.metrics.general import match_value_to_rule

log = logging.getLogger(__name__)


@dataclass
class _Books:
    """The two books in each of the forms the rules read them."""

    result: str
    expected: str | None
    xl: dict[str, Any]  # "R"/"E" -> openpyxl workbook (styles, charts, pivots)
    values: dict[str, Any]  # "R"/"E" -> openpyxl workbook with cached values (data_only)
    names: dict[str, list[str]]  # "R"/"E" -> sheet names

    def sheet(self, idx: int | str) -> tuple[str, str]:
        """(side "R"/"E", sheet name) for an OSWorld sheet index; name "" when it is out of range."""
        if isinstance(idx, int):
            side, key = "R", idx
        elif isinstance(idx, str) and idx[:2] in ("RI", "EI", "RN", "EN"):
            side, key = idx[0], (int(idx[2:]) if idx[1] == "I" else idx[2:])
        else:
            raise ValueError(f"compare_table: bad sheet index {idx!r} (an int, RI<n>, RN<name>, EI<n> or EN<name>)")
        if isinstance(key, str):
            return side, key
        names = self.names.get(side) or []
        return side, names[key] if 0 <= key < len(names) else ""

    def path(self, side: str) -> str | None:
        return self.result if side == "R" else self.expected

    def ws(self, idx: int | str, values: bool = False) -> Any:
        side, name = self.sheet(idx)
        book = (self.values if values else self.xl).get(side)
        return book[name] if book is not None and name in book.sheetnames else None


def _open(path: str) -> tuple[Any, Any]:
    import openpyxl

    return openpyxl.load_workbook(path), openpyxl.load_workbook(path, data_only=True)


def cell_value(ws: Any, coordinate: str) -> Any:
    """A cell's saved value as OSWorld reads it: numbers as floats, text as text, None when empty."""
    if ws is None:
        return None
    v = ws[coordinate].value
    if isinstance(v, bool):
        return None  # OSWorld's reader has no case for boolean cells
    if isinstance(v, (int, float)):
        return float(v)
    return v


def cell_style(prop: str, cell: Any, dxf: Any = None) -> Any:
    """One style property of a cell (or of a conditional format's differential style `dxf` applied to it)."""
    from openpyxl.cell.cell import MergedCell

    src = dxf if dxf is not None else cell
    filled = cell.value is not None
    if prop == "merge":
        return isinstance(cell, MergedCell)
    if prop == "number_format":
        if not filled or cell.data_type != "n":
            return None
        return dxf.numFmt.formatCode if dxf is not None and dxf.numFmt is not None else cell.number_format
    if prop.startswith("font_"):
        if not filled or src.font is None:
            return None
        attr = {"font_name": "name", "font_family": "family", "font_bold": "b", "font_italic": "i",
                "font_underline": "u", "font_size": "sz"}.get(prop)
        if prop == "font_color":
            return src.font.color.rgb if src.font.color is not None else None
        if attr is None:
            raise ValueError(f"compare_table: unknown style property {prop!r}")
        return getattr(src.font, attr)
    if prop == "fill_type":
        return getattr(src.fill, "tagname", None) if src.fill is not None else None
    if prop in ("bgcolor", "fgcolor"):  # a cell keeps its solid colour in fgColor, a conditional format in bgColor
        try:
            return (dxf.fill.bgColor if dxf is not None else cell.fill.fgColor).rgb
        except AttributeError:
            return None
    if prop == "hyperlink":
        return (cell.hyperlink or "") if filled else None
    raise ValueError(f"compare_table: unknown style property {prop!r}")


# ----- the rule types -----
def _sheet_data(b: _Books, r: dict[str, Any]) -> bool | None:
    import pandas as pd

    frames = []
    for key in ("sheet_idx0", "sheet_idx1"):
        side, name = b.sheet(r[key])
        path = b.path(side)
        try:
            frames.append(pd.read_excel(path, sheet_name=name).round(r.get("precision", 4)))
        except Exception as exc:  # a missing sheet or book: the rule cannot hold
            log.debug("sheet_data: %s[%s]: %s", path, name, exc)
            return None if key == "sheet_idx0" else False
    return bool(frames[0].equals(frames[1]))


def _printed(b: _Books, idx: int | str) -> list[str] | None:
    side, name = b.sheet(idx)
    book = b.path(side)
    if book is None:
        return None
    csv = Path(book).with_name(f"{Path(book).stem}-{name}.csv")
    try:
        data = csv.read_bytes()
    except OSError:
        return None
    for enc in ("utf-8", "utf-8-sig", "latin-1"):
        try:
            lines = [line.strip() for line in data.decode(enc).splitlines()]
            break
        except UnicodeDecodeError:
            continue
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _sheet_print(b: _Books, r: dict[str, Any]) -> bool | None:
    a = _printed(b, r["sheet_idx0"])
    if a is None:
        return None
    e = _printed(b, r["sheet_idx1"]) or []
    if r.get("ignore_case", False):
        a, e = [s.lower() for s in a], [s.lower() for s in e]
    return a == e


def _normalize(value: Any, rl: dict[str, Any]) -> str:
    s = str(value)
    for old, new in rl.get("normalization", []):
        s = s.replace(old, new)
    if "trim_leadings" in rl:
        s = s.lstrip(rl["trim_leadings"])
    if "trim_trailings" in rl:
        s = s.rstrip(rl["trim_trailings"])
    if "ignore_chars" in rl:
        s = "".join(ch for ch in s if ch not in set(rl["ignore_chars"]))
    return s.lower() if rl.get("ignore_case", False) else s


def _sheet_fuzzy(b: _Books, r: dict[str, Any]) -> bool:
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.cell_range import MultiCellRange
    from rapidfuzz import fuzz

    w0, w1 = b.ws(r["sheet_idx0"], values=True), b.ws(r["sheet_idx1"], values=True)
    for rl in r["rules"]:
        for rng in MultiCellRange(rl["range"]):
            for row, col in rng.cells:
                coord = f"{get_column_letter(col)}{row}"
                v0, v1 = _normalize(cell_value(w0, coord), rl), _normalize(cell_value(w1, coord), rl)
                kind = rl["type"]
                ok = {"includes": v1 in v0, "included_by": v0 in v1, "exact_match": v0 == v1}.get(kind)
                if kind == "fuzzy_match":
                    ok = fuzz.ratio(v0, v1) >= rl.get("threshold", 85.0)
                if ok is None:
                    raise ValueError(f"sheet_fuzzy: unknown match type {kind!r}")
                if not ok:
                    return False
    return True


def _title(obj: Any) -> str | None:
    try:
        return obj.title.tx.rich.p[0].r[0].t
    except (AttributeError, IndexError, TypeError):
        return None


def _ref(data: Any) -> str:
    for kind in ("numRef", "strRef"):
        f = getattr(getattr(data, kind, None), "f", None)
        if f is not None:
            return f
    return ""


def charts(ws: Any, props: list[str]) -> dict[str, dict[str, Any]]:
    """The sheet's charts keyed by their data series ("values,categories;..."), with the asked properties."""
    out: dict[str, dict[str, Any]] = {}
    for ch in getattr(ws, "_charts", []) if ws is not None else []:
        key = ";".join(f"{_ref(s.val)},{_ref(s.cat)}" for s in ch.series)
        info: dict[str, Any] = {}
        getters = {
            "title": lambda: _title(ch),
            "legend": lambda: ch.legend.position if ch.legend is not None else None,
            "anchor": lambda: [ch.anchor.editAs, ch.anchor._from.col, ch.anchor.to.row, ch.anchor.to.col,
                               ch.anchor.to.row],
            "width": lambda: ch.width,
            "height": lambda: ch.height,
            "type": lambda: ch.tagname,
            "direction": lambda: getattr(ch, "barDir", None),
            "xtitle": lambda: _title(ch.x_axis),
            "ytitle": lambda: _title(ch.y_axis),
            "ztitle": lambda: _title(getattr(ch, "z_axis", None)),
        }
        for p in props:
            info[p] = getters[p]()
        out[key] = info
    return out


def pivots(ws: Any, props: list[str]) -> dict[str, dict[str, Any]]:
    """The sheet's pivot tables keyed by their source range (trimmed of unused leading/trailing fields)."""
    from openpyxl.utils import coordinate_to_tuple

    out: dict[str, dict[str, Any]] = {}
    for pvt in getattr(ws, "_pivots", []) if ws is not None else []:
        fields = [[(it.h, it.x) for it in f.items if it.x is not None] for f in pvt.pivotFields]
        left = next((i for i, f in enumerate(fields) if f), len(fields))
        right = next((i for i, f in enumerate(reversed(fields[left:])) if f), len(fields) - left)
        used = fields[left : len(fields) - right]
        src = pvt.cache.cacheSource
        a, z = (coordinate_to_tuple(c) for c in src.worksheetSource.ref.split(":"))
        key = f"{src.type};{(a[0], a[1] + left)}:{(z[0], z[1] - right)};{src.worksheetSource.sheet}"
        info: dict[str, Any] = {}
        simple = {"name": "name", "show_total": "visualTotals", "show_empty_row": "showEmptyRow",
                  "show_empty_col": "showEmptyCol", "show_headers": "showHeaders", "location": "location"}
        for p, attr in simple.items():
            if p in props:
                info[p] = getattr(pvt, attr)
        if "filter" in props or "selection" in props:
            info["selection"] = used if "ordered" in props else [set(f) for f in used]
        if "filter" in props:
            info["filter_fields"] = {f.fld for f in pvt.pageFields}
        if "col_fields" in props:
            info["col_fields"] = [f.x - left for f in pvt.colFields]
        if "row_fields" in props:
            info["row_fields"] = [f.x - left for f in pvt.rowFields]
        if "data_fields" in props:
            named = "data_fields_name" in props
            info["data_fields"] = [f"{f.fld - left};{f.name if named else ''};{f.subtotal};{f.showDataAs}"
                                   for f in pvt.dataFields]
        out[key] = info
    return out


_CF_OPS = {
    "lessThan": lambda v, a: v < a[0], "lessThanOrEqual": lambda v, a: v <= a[0], "equal": lambda v, a: v == a[0],
    "notEqual": lambda v, a: v != a[0], "greaterThan": lambda v, a: v > a[0],
    "greaterThanOrEqual": lambda v, a: v >= a[0], "between": lambda v, a: min(a) <= v <= max(a),
    "notBetween": lambda v, a: not min(a) <= v <= max(a),
}


def _cf_operand(formula: str, ws_values: Any) -> Any:
    """A `cellIs` operand: a number, a quoted string or an absolute cell reference."""
    f = formula.strip()
    if m := re.fullmatch(r"\$?([A-Z]{1,3})\$?(\d+)", f):
        return cell_value(ws_values, f"{m[1]}{m[2]}")
    if len(f) >= 2 and f[0] == f[-1] == '"':
        return f[1:-1]
    return float(f)


def styles(ws: Any, ws_values: Any, props: list[str]) -> dict[str, Any]:
    """Each cell's asked style properties, with conditional formats applied: a `cellIs` rule's style replaces the
    cell's own where its condition holds; rules of other types enter as their (type, formulas, style) so that two
    books differing in them differ here too."""
    out: dict[str, Any] = {}
    if ws is None:
        return out
    for col in ws.iter_cols():
        for c in col:
            out[c.coordinate] = [cell_style(p, c) for p in props]
    for fmt in ws.conditional_formatting:
        for rule in fmt.rules:
            if rule.type != "cellIs" or rule.operator not in _CF_OPS:
                out[f"cf:{fmt.sqref}:{rule.priority}"] = (rule.type, tuple(rule.formula), repr(rule.dxf))
                continue
            try:
                args = [_cf_operand(f, ws_values) for f in rule.formula]
            except ValueError:
                out[f"cf:{fmt.sqref}:{rule.priority}"] = (rule.type, tuple(rule.formula), repr(rule.dxf))
                continue
            for rng in fmt.cells:
                for row, colno in rng.cells:
                    cell = ws.cell(row=row, column=colno)
                    v = cell_value(ws_values, cell.coordinate)
                    try:
                        active = v is not None and _CF_OPS[rule.operator](v, args)
                    except TypeError:
                        active = False
                    if active:
                        out[cell.coordinate] = [cell_style(p, cell, rule.dxf) for p in props]
    return out


def _dims(ws: Any, obj: str, props: list[str]) -> dict[Any, dict[str, Any]]:
    if ws is None:
        return {}
    return {k: {p: getattr(d, p) for p in props} for k, d in getattr(ws, f"{obj}_dimensions").items()}


def filters(ws: Any) -> dict[str, Any]:
    if ws is None:
        return {}
    af = ws.auto_filter
    columns = []
    for fc in af.filterColumn:
        c: dict[str, Any] = {"col_id": fc.colId, "hidden_button": fc.hiddenButton, "show_button": fc.showButton}
        if fc.filters is not None:
            c["filters_blank"], c["filters"] = fc.filters.blank, set(fc.filters.filter)
        if fc.customFilters is not None:
            c["custom_filters_op"] = fc.customFilters._and
            c["custom_filters"] = {(f.operator, f.val) for f in fc.customFilters.customFilter}
        columns.append(c)
    out: dict[str, Any] = {"ref": af.ref, "filter_column": sorted(columns, key=lambda c: c["col_id"])}
    ss = af.sortState
    if ss is not None:
        out["sort_state"] = {
            "sort": ss.columnSort, "case": ss.caseSensitive, "method": ss.sortMethod, "ref": ss.ref,
            "condition": [(c.descending, c.sortBy, c.ref, c.customList, c.dxfId, c.iconSet, c.iconId)
                          for c in ss.sortCondition],
        }
    return out


def _data_validation(b: _Books, r: dict[str, Any]) -> bool | None:
    ws = b.ws(r["sheet_idx"])
    if ws is None:
        return None
    found = ws.data_validations.dataValidation
    if len(found) < len(r["dv_props"]):
        return False
    # every validation of the sheet matches one of the wanted property sets
    return all(any(all(match_value_to_rule(getattr(dv, a), m) for a, m in want.items()) for want in r["dv_props"])
               for dv in found)


def _check_cell(b: _Books, r: dict[str, Any]) -> bool | None:
    ws = b.ws(r["sheet_idx"])
    if ws is None:
        return None
    cell = ws[r["coordinate"]]
    for prop, rule in r["props"].items():
        if prop == "value":
            v = cell_value(b.ws(r["sheet_idx"], values=True), r["coordinate"])
        else:
            try:
                v = cell_style(prop, cell)
            except (AttributeError, ValueError):
                v = None
        if not match_value_to_rule(v, rule):
            return False
    return True


def _pair(b: _Books, r: dict[str, Any], load: Any) -> bool:
    return load(b.ws(r["sheet_idx0"])) == load(b.ws(r["sheet_idx1"]))


def _rule(b: _Books, r: dict[str, Any]) -> bool | None:
    """Whether the rule holds; None when the result's sheet is missing (the whole comparison scores 0)."""
    t = r["type"]
    if t == "sheet_name":
        return b.names["R"] == b.names.get("E")
    if t == "sheet_data":
        return _sheet_data(b, r)
    if t == "sheet_print":
        return _sheet_print(b, r)
    if t == "sheet_fuzzy":
        return _sheet_fuzzy(b, r)
    if t == "chart":
        return _pair(b, r, lambda ws: charts(ws, r.get("chart_props", [])))
    if t == "pivot_table":
        return _pair(b, r, lambda ws: pivots(ws, r.get("pivot_props", [])))
    if t == "style":
        s0 = styles(b.ws(r["sheet_idx0"]), b.ws(r["sheet_idx0"], values=True), r.get("props", []))
        return s0 == styles(b.ws(r["sheet_idx1"]), b.ws(r["sheet_idx1"], values=True), r.get("props", []))
    if t == "freeze":
        w0 = b.ws(r["sheet_idx0"])
        if w0 is None:
            return None
        w1 = b.ws(r["sheet_idx1"])
        return w1 is not None and w0.freeze_panes == w1.freeze_panes
    if t == "zoom":
        ws = b.ws(r["sheet_idx"])
        return None if ws is None else match_value_to_rule(ws.sheet_view.zoomScale or 100.0, r)
    if t == "data_validation":
        return _data_validation(b, r)
    if t in ("row_props", "col_props"):
        obj = "row" if t == "row_props" else "column"
        return _pair(b, r, lambda ws: _dims(ws, obj, r.get("props", [])))
    if t == "filter":
        return _pair(b, r, filters)
    if t == "check_cell":
        return _check_cell(b, r)
    raise ValueError(f"compare_table: unknown rule type {t!r}")


def compare_table(result: str | None, expected: str | None = None, **options: Any) -> float:
    """1 when every rule of `options["rules"]` holds between the result book and the expected one (see above)."""
    if result is None or not Path(result).exists():
        return 0.0
    try:
        xl_r, val_r = _open(result)
    except Exception as exc:  # not a workbook openpyxl can read: the agent's file is wrong
        log.info("compare_table: cannot read %s: %s", result, exc)
        return 0.0
    xl, values, names = {"R": xl_r}, {"R": val_r}, {"R": list(xl_r.sheetnames)}
    if expected is not None:
        xl["E"], values["E"] = _open(expected)
        names["E"] = list(xl["E"].sheetnames)
    books = _Books(result, expected, xl, values, names)
    for r in options.get("rules", []):
        ok = _rule(books, r)
        if not ok:
            return 0.0
    return 1.0


def _lines(path: str) -> list[str]:
    data = Path(path).read_bytes()
    for enc in ("utf-8", "utf-8-sig", "latin-1"):
        try:
            return data.decode(enc).splitlines()
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace").splitlines()


def compare_csv(result: str | None, expected: str | list[str], **options: Any) -> float:
    """1 when the CSV file's lines equal those of the expected file (or of any of a list of them); `strict=False`
    strips each line, `ignore_case` folds case."""
    if result is None or not Path(result).exists():
        return 0.0
    got = _lines(result)
    for exp in [expected] if isinstance(expected, str) else expected:
        try:
            want = _lines(exp)
        except OSError:
            continue
        a, e = got, want
        if not options.get("strict", True):
            a, e = [s.strip() for s in a], [s.strip() for s in e]
        if options.get("ignore_case", False):
            a, e = [s.lower() for s in a], [s.lower() for s in e]
        if a == e:
            return 1.0
    return 0.0


METRICS = {f.__name__: f for f in (compare_table, compare_csv)}
