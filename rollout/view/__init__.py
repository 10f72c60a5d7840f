"""`python -m rollout.view outputs/<run>`: a static HTML viewer of a run, a folder that opens from disk.

Metric plots per iteration (train and eval rows, the judge's agreement, invalid votes, latency and tokens among
them), the episodes filterable by split, iteration, task, family, status and outcome (paged), and for each step of an
opened episode its action, next state, GUI screenshots (before and after), signals, judge votes and raw answers, hint,
R_t, advantage, weight version and tokens. `rollout.view.export` writes the data, `assets/` holds the page.
"""

from rollout.view.export import VIEWER_DIR, ViewerBuild, build_viewer

__all__ = ["VIEWER_DIR", "ViewerBuild", "build_viewer"]
