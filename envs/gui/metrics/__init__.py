"""OSWorld's metric functions, with OSWorld's names and calling convention, one module per file format or app.

A metric is called `metric(result_state, expected_state, **options)`, or `metric(result_state, **options)` when the task
has no `expected`, and returns a score in [0, 1]. `result_state` / `expected_state` come from getters
(envs.gui.getters, envs.gui.app_getters, envs.gui.browser_getters): command output, a local path of a fetched file,
the accessibility XML, a rule dict.

  general    text, lists, JSON / CSV records, the accessibility tree, sqlite, the os domain's checks
  sheets     LibreOffice Calc (xlsx, csv)          documents  LibreOffice Writer (docx, odt)
  slides     LibreOffice Impress (pptx, settings)  images     GIMP / VLC images
  media      VLC (status, vlcrc, audio, video)     apps       Thunderbird, VS Code settings
  browser    Chromium tabs, bookmarks, history; PDF text and pages

The heavy format libraries are imported inside the metrics, so importing this package stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable

from envs.gui.metrics import apps, browser, documents, general, images, media, sheets, slides
from envs.gui.metrics.general import (  # the names callers and tests use from envs.gui.metrics
    INFEASIBLE,
    check_accessibility_tree,
    check_csv,
    check_direct_json_object,
    check_gnome_favorite_apps,
    check_include_exclude,
    check_json,
    check_list,
    check_moved_jpgs,
    check_text_enlarged,
    compare_text_file,
    diff_text_file,
    exact_match,
    fuzzy_match,
    is_in_list,
    is_utc_0,
    literal_match,
    match_in_list,
    match_value_to_rule,
    run_sqlite3,
)

__all__ = ["METRICS", "apps", "browser", "documents", "general", "images", "media", "sheets", "slides", "INFEASIBLE",
           "check_accessibility_tree", "check_csv", "check_direct_json_object", "check_gnome_favorite_apps",
           "check_include_exclude", "check_json", "check_list", "check_moved_jpgs", "check_text_enlarged",
           "compare_text_file", "diff_text_file", "exact_match", "fuzzy_match", "is_in_list", "is_utc_0",
           "literal_match", "match_in_list", "match_value_to_rule", "run_sqlite3"]

METRICS: dict[str, Callable[..., float]] = {}
for _module in (general, sheets, documents, slides, images, media, apps, browser):
    _clash = set(METRICS) & set(_module.METRICS)
    if _clash:  # one name, one metric: a second definition would silently win
        raise RuntimeError(f"metric names defined twice: {sorted(_clash)} (in {_module.__name__})")
    METRICS.update(_module.METRICS)
