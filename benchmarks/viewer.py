"""Does the run viewer stay fast on a long run? Time to the first page of episodes in headless Chromium for a generated
100k-step run against a 1k-step run (the baseline: the page's own cost), and against loading every step at once (what
a viewer without lazy chunks would do), measured in the same run.

    python benchmarks/viewer.py [--steps 100000] [--small 1000] [--rounds 3] [--json docs/benchmarks/viewer.json]

The runs are written with the records' own types (train.records.Step / Trajectory: the fields a real run writes, a
judge of 3 votes with raw answers, GUI steps with PNG screenshots) by `write_synthetic_run`, the viewer is built by
`rollout.view.build_viewer` as `python -m rollout.view` builds it, and the page is opened from disk (file://) in
Debian's chromium driven by playwright. "first page" is the page's own mark (performance.now() when the first table
of episodes is in the DOM, from navigation start); "all steps" loads every chunk after that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state  # noqa: E402
from prm.judge import Judgement  # noqa: E402
from train.records import EpisodeStatus, Step, Trajectory  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def headless_browser() -> Iterator[Any]:
    """Debian's chromium under playwright (no browser download), with a fresh profile."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="nsv-chromium-") as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                   args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 1200})
        try:
            yield ctx
        finally:
            ctx.close()


def write_synthetic_run(root: Path, steps: int, *, steps_per_episode: int = 10, gui_every: int = 5,
                        seed: int = 0) -> dict[str, int]:
    """A run directory with about `steps` steps: metrics rows, episodes (some aborted, every `gui_every`-th a GUI one
    with screenshots), steps with judge votes and raw answers. Returns what it wrote."""
    from PIL import Image

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    shots = root / "screenshots" / "a0" / "shared"
    shots.mkdir(parents=True, exist_ok=True)
    for i, color in enumerate(((40, 90, 160), (200, 120, 40))):
        Image.new("RGB", (320, 200), color).save(shots / f"screen{i}.png")
    per_iteration = 64
    n_episodes = max(1, steps // steps_per_episode)
    iterations = max(1, n_episodes // per_iteration)
    written = {"episodes": 0, "steps": 0, "aborted": 0}
    with (root / "episodes.jsonl").open("w") as eps, (root / "trajectories.jsonl").open("w") as trs:
        for e in range(n_episodes):
            k, g, j = e // per_iteration, (e % per_iteration) // 4, e % 4
            gui = e % gui_every == 0
            tr = Trajectory(run_id="synthetic", episode_id=f"it{k}-g{g}-s{j}", group_id=f"it{k}-g{g}",
                            task_id=f"task-{rng.randrange(500):04d}", iteration=k, family="gui" if gui else "terminal",
                            screenshot=f"screenshots/a0/shared/screen0.png" if gui else None)
            for t in range(steps_per_episode):
                votes = [rng.choice((1, -1, None)) if rng.random() < 0.1 else rng.choice((1, -1)) for _ in range(3)]
                valid = [v for v in votes if v is not None]
                tr.steps.append(Step(
                    run_id="synthetic", episode_id=tr.episode_id, group_id=tr.group_id, task_id=tr.task_id,
                    step_index=t, action=f"```bash\necho step {t} of episode {e}\n```",
                    next_state={"role": "user", "content": f"step {t}\n" + "output line\n" * rng.randrange(1, 30)},
                    signals={"exit_code": rng.choice((0, 0, 1)), "error": False}, status="ok",
                    judge=Judgement(sum(valid) / len(valid) if valid else 0.0, votes,
                                    [f"the command ran; \\boxed{{{v}}}" for v in votes], latency_s=rng.random(),
                                    prompt_tokens=900, completion_tokens=120),
                    outcome=None if t < steps_per_episode - 1 else float(rng.random() < 0.3),
                    reward=rng.uniform(-1, 2), advantage=rng.uniform(-2, 2) if rng.random() < 0.8 else None,
                    weight_version=k, prompt_tokens=rng.randrange(200, 4000), output_tokens=rng.randrange(5, 200),
                    iteration=k, screenshot=f"screenshots/a0/shared/screen{t % 2}.png" if gui else None))
            tr.status = EpisodeStatus.ABORTED if rng.random() < 0.02 else EpisodeStatus.OK
            tr.reason = "Traceback ...\nEnvError: the desktop died" if tr.status == EpisodeStatus.ABORTED else ""
            tr.outcome = tr.steps[-1].outcome
            for s in tr.steps:
                trs.write(json.dumps(s.to_json()) + "\n")
            eps.write(json.dumps(tr.summary()) + "\n")
            written["episodes"] += 1
            written["steps"] += len(tr.steps)
            written["aborted"] += tr.status == EpisodeStatus.ABORTED
    with (root / "metrics.jsonl").open("w") as f:
        for k in range(iterations):
            f.write(json.dumps({"kind": "train", "iteration": k, "accuracy": rng.random(), "mean_outcome": rng.random(),
                                "train/loss": rng.random(), "judge/unanimous_fraction": rng.random(),
                                "judge/latency_p50_s": rng.random()}) + "\n")
        f.write(json.dumps({"kind": "eval", "iteration": iterations, "accuracy": rng.random()}) + "\n")
    (root / "config.yaml").write_text("run:\n  name: synthetic\n")
    return written


def first_page_ms(ctx: Any, index_html: Path, load_all: bool = False) -> dict[str, float]:
    """Open the viewer; ms to its first page (the page's mark) and, with `load_all`, to every chunk loaded."""
    page = ctx.new_page()
    try:
        page.goto(index_html.resolve().as_uri())
        page.wait_for_selector("body[data-ready=episodes]", timeout=120_000)
        out = {"first_page_ms": page.evaluate("window.NSV_T0")}
        if load_all:
            out["all_steps_ms"] = page.evaluate(
                "(async () => { const t = performance.now(); const n = NSV.data.counts.chunks;"
                " await Promise.all([...Array(n).keys()].map(i => NSV.loadChunk(i)));"
                " return performance.now() - t + window.NSV_T0; })()")
        return out
    finally:
        page.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from rollout.view import build_viewer

    result: dict[str, Any] = {"machine_before": machine_state(), "steps": args.steps, "small": args.small}
    with tempfile.TemporaryDirectory(prefix="nsv-bench-") as tmp:
        runs = {}
        for name, n in (("small", args.small), ("large", args.steps)):
            t0 = time.perf_counter()
            wrote = write_synthetic_run(Path(tmp) / name, n)
            gen_s = time.perf_counter() - t0
            built = build_viewer(Path(tmp) / name)
            runs[name] = built.out_dir / "index.html"
            result[name] = {**wrote, "generate_s": round(gen_s, 2), "build_s": round(built.seconds, 2),
                            "chunks": built.chunks, "index_mb": round(built.index_bytes / 1e6, 2),
                            "data_mb": round(built.data_bytes / 1e6, 1)}
        times: dict[str, list[float]] = {"small_first_page_ms": [], "large_first_page_ms": [], "large_all_steps_ms": []}
        with headless_browser() as ctx:
            for _ in range(args.rounds):  # interleaved: the machine's load changes both alike
                times["small_first_page_ms"].append(first_page_ms(ctx, runs["small"])["first_page_ms"])
                big = first_page_ms(ctx, runs["large"], load_all=True)
                times["large_first_page_ms"].append(big["first_page_ms"])
                times["large_all_steps_ms"].append(big["all_steps_ms"])
        med = {k: round(statistics.median(v), 1) for k, v in times.items()}
        result.update(rounds=times, median=med,
                      large_vs_small_first_page=round(med["large_first_page_ms"] / med["small_first_page_ms"], 2),
                      all_steps_vs_first_page=round(med["large_all_steps_ms"] / med["large_first_page_ms"], 2))
    result["machine_after"] = machine_state()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
