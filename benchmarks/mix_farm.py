"""Benchmark of the mixed farm (env=mix): each family's env throughput when every family is served at once, against
the same family alone on a farm of its own, measured in the same run.

    python benchmarks/mix_farm.py                                  # toolcall, terminal, gui, swe
    python benchmarks/mix_farm.py --families toolcall,terminal --episodes 16 --json out.json

For each family: `--episodes` episodes on `--slots` env slots of that family, each action a fixed, valid one that
makes the env do real work (a python tool call in the sandbox, a shell command in bubblewrap, a pyautogui click on a
Xvfb desktop, `git status` in the SWE checkout), no judge. "alone": one family's farm, nothing else running;
"mixed": every family's farm at once behind one MixFarm (the same quotas), each family's episodes started together.
A family's rate is its env steps / the seconds until its last episode ended. Rounds alternate alone and mixed
(`--rounds`, after an untimed warm-up pass that builds the caches), and the median of each is reported;
ratio = mixed / alone (1.0: the mix costs that family nothing).

On a 2-core machine the families share the CPUs, so a ratio below 1 is the contention a mix adds; the quotas keep
that family's slots its own (a slow family cannot take a fast family's slots, nor the reverse).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, also when run as a file

from benchmarks.machine import machine_state  # noqa: E402
from rollout.build import compose_launch_config, plan_run  # noqa: E402
from rollout.episodes.collect import collect  # noqa: E402
from rollout.episodes.runner import EpisodeRequest, RunnerConfig  # noqa: E402
from rollout.farm.core import FarmConfig, MixFarm  # noqa: E402
from rollout.policy.base import SamplingParams  # noqa: E402
from rollout.policy.fixed import FixedPolicy  # noqa: E402  (answers at once: the envs are measured, not a model)

log = logging.getLogger("benchmarks.mix_farm")

#: one valid action per family that makes its env do real work every step
ACTIONS = {
    "toolcall": '<tool_call>\n{{"name": "python", "arguments": {{"code": "print(6 * 7)  # call {n}"}}}}\n</tool_call>',
    "terminal": "```bash\necho step {n} && ls /\n```",
    "gui": "pyautogui.click(40, 40)",
    "swe": "```bash\ngit status  # {n}\n```",
}


async def run_families(families: dict[str, Any], names: list[str], episodes: int, slots: int,
                       max_steps: int) -> dict[str, dict[str, float]]:
    """Run `episodes` episodes of each family in `names` on one MixFarm (one family: its farm alone)."""
    farm = MixFarm({f: (families[f].name, {**families[f].kwargs, "max_steps": max_steps},
                        FarmConfig(num_envs=slots, max_starting=slots)) for f in names})
    await farm.start()
    cfg = RunnerConfig(run_id="bench", sampling=SamplingParams(max_new_tokens=16), judge_enabled=False)
    t0 = time.perf_counter()
    out: dict[str, dict[str, float]] = {}

    async def family(f: str) -> None:
        tasks = families[f].train_tasks
        reqs = [EpisodeRequest(f"{f}-{i}", f"{f}-{i}", tasks[i % len(tasks)], seed=i, family=f) for i in range(episodes)]
        trajs = await collect(farm, FixedPolicy(ACTIONS[families[f].name]), None, reqs, cfg, max_retries=0)
        seconds = time.perf_counter() - t0
        steps = sum(len(t.steps) for t in trajs)
        out[f] = {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds,
                  "aborted": sum(t.status.value == "aborted" for t in trajs)}

    try:
        await asyncio.gather(*(family(f) for f in names))
    finally:
        await farm.close()
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    names = args.families.split(",")
    unknown = [f for f in names if f not in ACTIONS]
    if unknown:
        raise SystemExit(f"--families: no fixed action for {unknown}; known: {', '.join(ACTIONS)}")
    plan = plan_run(compose_launch_config(["env=mix", "env.families={" + ", ".join(f"{f}: 1" for f in names) + "}"]))
    families = {f.family: f for f in plan.env.families}
    alone: dict[str, list[float]] = {f: [] for f in names}
    mixed: dict[str, list[float]] = {f: [] for f in names}
    rounds = []
    if args.warmup:  # first resets build what is cached afterwards (SWE venvs, desktop roots): not measured
        print("warm-up: one untimed mixed pass", flush=True)
        await run_families(families, names, min(args.episodes, args.slots), args.slots, 1)
    for r in range(args.rounds):
        for f in names:
            res = await run_families(families, [f], args.episodes, args.slots, args.max_steps)
            alone[f].append(res[f]["steps_per_s"])
            rounds.append({"round": r, "phase": "alone", "family": f, **res[f]})
            print(f"round {r + 1} alone  {f:9s} {res[f]['steps_per_s']:7.1f} steps/s ({res[f]['steps']} steps)",
                  flush=True)
        res = await run_families(families, names, args.episodes, args.slots, args.max_steps)
        for f in names:
            mixed[f].append(res[f]["steps_per_s"])
            rounds.append({"round": r, "phase": "mixed", "family": f, **res[f]})
            print(f"round {r + 1} mixed  {f:9s} {res[f]['steps_per_s']:7.1f} steps/s ({res[f]['steps']} steps)",
                  flush=True)
    figures = {}
    for f in names:
        a, m = statistics.median(alone[f]), statistics.median(mixed[f])
        figures[f] = {"alone_steps_per_s": a, "mixed_steps_per_s": m, "ratio": m / a if a else None}
    total_alone = sum(v["alone_steps_per_s"] for v in figures.values())
    total_mixed = sum(v["mixed_steps_per_s"] for v in figures.values())
    return {"families": figures, "sum_alone_steps_per_s": total_alone, "sum_mixed_steps_per_s": total_mixed,
            "rounds": rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="toolcall,terminal,gui,swe", help="comma-separated (env=mix family names)")
    p.add_argument("--episodes", type=int, default=8, help="episodes per family per phase")
    p.add_argument("--slots", type=int, default=4, help="env slots per family (its quota)")
    p.add_argument("--max-steps", type=int, default=4, help="steps per episode")
    p.add_argument("--rounds", type=int, default=2, help="alternating alone / mixed rounds (median reported)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="an untimed mixed pass first (builds the caches every later reset uses)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    before = machine_state()
    result = asyncio.run(main_async(args))
    result.update({"args": vars(args), "machine_before": before, "machine_after": machine_state()})
    print(f"\n{'family':10s} {'alone st/s':>11s} {'mixed st/s':>11s} {'mixed/alone':>12s}")
    for f, v in result["families"].items():
        ratio = "-" if v["ratio"] is None else f"{v['ratio']:.2f}"
        print(f"{f:10s} {v['alone_steps_per_s']:11.1f} {v['mixed_steps_per_s']:11.1f} {ratio:>12s}")
    print(f"{'all':10s} {result['sum_alone_steps_per_s']:11.1f} {result['sum_mixed_steps_per_s']:11.1f} "
          f"(sum of the families' rates)")
    print(f"load before {before['loadavg']}, after {result['machine_after']['loadavg']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
