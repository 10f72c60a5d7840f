"""What does keeping GUI screenshots cost (`loop.save_screenshots`, on by default)? PNG writes of real desktop
screens against the GUI env step that produced them, measured in the same run.

    python benchmarks/screenshots.py [--steps 24] [--json docs/benchmarks/screenshots.json]

A real GUIEnv (Xvfb desktop, the bundled tasks' apps) is reset on bundled tasks and stepped with harmless pyautogui
actions (moving the pointer, clicking empty desktop); each step's wall time is measured, and each observation's
screenshot is written as the runner writes it (rollout.screenshots.write_png: PNG, compression level 1) and, for
reference, at PIL's default level 6. The runner writes in a worker thread while the episode goes on, so the ratio is
the CPU a step's screenshot costs next to the step, not time the episode waits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state  # noqa: E402
from envs.gui.env import GUIEnv  # noqa: E402
from rollout.screenshots import write_png  # noqa: E402

ACTIONS = ["```python\npyautogui.moveTo(900, 600)\n```", "```python\npyautogui.click(1100, 700)\n```",
           "```python\npyautogui.moveTo(640, 400)\n```"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = {"machine_before": machine_state()}
    env = GUIEnv(max_steps=args.steps + 1)
    step_s, png1_s, png6_s, png1_bytes, png6_bytes = [], [], [], [], []
    try:
        tasks = env.tasks("train")
        with tempfile.TemporaryDirectory() as tmp:
            done = 0
            for task in tasks:
                obs, _ = env.reset(options={"task": task})
                for a in ACTIONS * (args.steps // len(ACTIONS) + 1):
                    if done >= args.steps:
                        break
                    t0 = time.perf_counter()
                    obs, _, term, trunc, _ = env.step(a)
                    step_s.append(time.perf_counter() - t0)
                    for level, times, sizes in ((1, png1_s, png1_bytes), (6, png6_s, png6_bytes)):
                        t0 = time.perf_counter()
                        sizes.append(write_png(obs["image"], Path(tmp) / f"s{done}-{level}.png", level))
                        times.append(time.perf_counter() - t0)
                    done += 1
                    if term or trunc:
                        break
                if done >= args.steps:
                    break
    finally:
        env.close()
    med = {"step_s": statistics.median(step_s), "png_level1_s": statistics.median(png1_s),
           "png_level6_s": statistics.median(png6_s), "png_level1_kb": statistics.median(png1_bytes) / 1024,
           "png_level6_kb": statistics.median(png6_bytes) / 1024}
    result.update(steps=len(step_s), screen=list(obs["image"].shape), median={k: round(v, 4) for k, v in med.items()},
                  png_level1_vs_step=round(med["png_level1_s"] / med["step_s"], 3),
                  png_level6_vs_level1_time=round(med["png_level6_s"] / med["png_level1_s"], 2),
                  machine_after=machine_state())
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
