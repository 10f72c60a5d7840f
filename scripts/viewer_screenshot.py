"""A PNG of the run viewer on a run directory, as a user sees it in Chromium: the episode with the most steps that
has screenshots (or the first episode) opened, its step cards with screenshots, votes and raw answers.

    python scripts/viewer_screenshot.py outputs/<run> --out docs/images/viewer_gui.png [--tab episode|metrics]

It builds the viewer as `python -m rollout.view` does, opens viewer/index.html from disk in headless Chromium
(benchmarks/viewer.py's browser: Debian's chromium under playwright) and waits until every screenshot on the page
has loaded before taking the picture.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.viewer import headless_browser  # noqa: E402
from rollout.records import read_jsonl  # noqa: E402
from rollout.view import build_viewer  # noqa: E402


def pick_episode(run_dir: Path) -> str:
    """The training episode with the most steps among those with screenshots, else the longest."""
    steps = read_jsonl(run_dir / "trajectories.jsonl")
    if not steps:
        raise SystemExit(f"error: {run_dir / 'trajectories.jsonl'} holds no steps")
    count: dict[str, list[int]] = {}
    for s in steps:
        c = count.setdefault(s["episode_id"], [0, 0])
        c[0] += bool(s.get("screenshot"))
        c[1] += 1
    return max(count, key=lambda e: (count[e][0] > 0, count[e][1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--tab", choices=("episode", "metrics"), default="episode")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=1400, help="the picture's height (the page is cut there)")
    args = ap.parse_args()
    if not (args.run_dir / "episodes.jsonl").exists():
        raise SystemExit(f"error: {args.run_dir} is not a run directory (no episodes.jsonl)")
    built = build_viewer(args.run_dir)
    episode = pick_episode(args.run_dir)
    with headless_browser() as ctx:
        page = ctx.new_page()
        page.set_viewport_size({"width": args.width, "height": args.height})
        page.goto((built.out_dir / "index.html").as_uri())
        page.wait_for_selector("body[data-ready=episodes]", timeout=60_000)
        if args.tab == "metrics":
            page.click("nav a[data-tab=metrics]")
            page.wait_for_selector(".chart")
        else:
            page.evaluate("id => { location.hash = '#episode=' + encodeURIComponent(id); }", episode)
            page.wait_for_selector("body[data-ready=episode]", timeout=60_000)
            page.wait_for_function("[...document.querySelectorAll('.step .shots img')].every("
                                   "i => i.complete && i.naturalWidth > 0)", timeout=60_000)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
    print(f"wrote {args.out} ({args.tab} {episode if args.tab == 'episode' else ''})")


if __name__ == "__main__":
    main()
