"""Does a judge slower than the env slow the farm down? Env steps/s with the judge off vs an LLM judge with injected
latency, measured in the same run.

    python benchmarks/judge.py [--env toolcall] [--episodes 64] [--num-envs 16] [--max-steps 4]
                               [--latency-s 1.0 [3.0 ...]] [--no-inline] [--m 1] [--judge-concurrency 64] [--rounds 2]
                               [--farm local|ray] [--judge-nice 0] [--json out.json]

The judge is a real HTTP server in its own process (`python -m rollout.server --replay ... --latency-s L`: every
vote takes L seconds and answers \\boxed{1}) reached by the real LLMJudge; the env is a real env on a real farm; the
policy is a fixed action (made unique per call so that no step hits the judge cache), so the env and the judge are what
is measured. Three arms, interleaved over `--rounds`:

  off        judge disabled (the baseline)
  async@L    the runner's way: each step's judgement runs in the background; the env never waits for it (one arm per
             judge latency L: its env steps/s should not depend on L)
  inline@L   each step waits for its judgement before the next action (what a reward call inside the step loop costs)

Env steps/s counts env steps from the first reset to the last env step; `lag_s` is how long the last judgements took
after the last env step (the judge backlog, paid once at the end of a batch, not per step); driver CPU per step is the
CPU time of this process (env threads, runner, judge client) per env step, the judge's cost to the rollout process.
On a small machine the judge server's own CPU competes with the envs; `--judge-nice 19` lowers its priority, standing
in for a judge that runs on other machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state  # noqa: E402
from benchmarks.timed_farm import TimedFarm  # noqa: E402
from prm.judge import StepContext  # noqa: E402
from prm.llm_judge import LLMJudge, LLMJudgeConfig  # noqa: E402
from rollout.episodes.collect import collect  # noqa: E402
from rollout.farm.core import FarmConfig, make_farm  # noqa: E402
from rollout.policy.base import SamplingParams  # noqa: E402
from prm.client.retry import RetryPolicy  # noqa: E402
from rollout.episodes.runner import EpisodeRequest, RunnerConfig  # noqa: E402
from rollout.policy.fixed import FixedPolicy  # noqa: E402  (numbered actions: no two steps alike, no judge cache hits)
from rollout.server.app import ServerProcess  # noqa: E402

ACTIONS = {
    "toolcall": '<tool_call>\n{{"name": "python", "arguments": {{"code": "print(6 * 7)  # call {n}"}}}}\n</tool_call>',
    "terminal": "```bash\necho step {n} && ls /\n```",
    "swe": "```bash\ngit status  # {n}\n```",
}


async def inline_episode(
    farm: TimedFarm, policy: FixedPolicy, judge: LLMJudge, req: EpisodeRequest, sp: SamplingParams
):
    """The same episode as the runner plays it, but each judgement is awaited before the next action."""
    async with farm.lease() as slot:
        first = await farm.reset(slot, req.task, req.seed)
        messages = [dict(first.obs)]
        for t in range(64):
            c = await policy.generate(messages, sp)
            r = await farm.step(slot, c.text)
            await judge.score(
                StepContext(
                    first.info.get("family", "generic"),
                    str(req.task.get("id")),
                    first.obs["content"],
                    list(messages),
                    c.text,
                    r.info["next_state"],
                    r.info.get("signals", {}),
                    t,
                )
            )
            messages += [{"role": "assistant", "content": c.text}, dict(r.obs)]
            if r.terminated or r.truncated:
                return


def _cpu_s() -> float:
    """CPU seconds used by this (the driver) process so far: envs' threads, runner, judge client."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def one_arm(arm: str, args: argparse.Namespace, tasks: list[dict], judge_url: str) -> dict[str, Any]:
    farm_cfg = FarmConfig(backend=args.farm, num_envs=args.num_envs, envs_per_worker=args.num_envs)
    farm = TimedFarm(make_farm(args.env, {"max_steps": args.max_steps}, farm_cfg))
    await farm.farm.start()
    judge = None
    if arm != "off":
        judge = LLMJudge(
            LLMJudgeConfig(
                urls=[judge_url + "/v1"],
                m=args.m,
                max_tokens=256,
                cache_size=0,
                max_concurrency=args.judge_concurrency,
                retry=RetryPolicy(attempts=2, timeout_s=max(args.latency_s) * 10 + 30),
            )
        )
    policy = FixedPolicy(ACTIONS.get(args.env, "action {n}"))
    sp = SamplingParams(max_new_tokens=16)
    cfg = RunnerConfig(run_id=f"bench-{arm}", sampling=sp, judge_enabled=judge is not None)
    reqs = [EpisodeRequest(f"{arm}-{i}", f"g{i // 4}", tasks[i % len(tasks)], seed=i) for i in range(args.episodes)]
    t0 = time.time()  # the farm's clock (benchmarks.timed_farm): t0 and t_end are compared with its times
    cpu0 = _cpu_s()
    try:
        if arm == "inline":
            await asyncio.gather(*(inline_episode(farm, policy, judge, r, sp) for r in reqs))
            trajs = []
        else:
            trajs = await collect(farm, policy, judge, reqs, cfg, max_retries=0)  # what the RL loop runs
        t_end = time.time()
        cpu = _cpu_s() - cpu0
    finally:
        await farm.farm.close()
        if judge is not None:
            await judge.close()
    bad = [t for t in trajs if t.status.value != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes did not finish ok, e.g. {bad[0].status.value}: {bad[0].reason[-500:]}")
    if arm == "async":
        judged = [s.judge for t in trajs for s in t.steps]
        assert all(j is not None and j.votes == [1] * args.m for j in judged), "a judgement is missing or invalid"
    env_s = farm.t_last - (farm.t_first or t0)
    return {
        "arm": arm,
        "env_steps": farm.steps,
        "env_s": env_s,
        "steps_per_s": farm.steps / env_s if env_s > 0 else 0.0,
        "wall_s": t_end - t0,
        "lag_s": max(t_end - farm.t_last, 0.0),
        "judge_requests": judge.stats.requests if judge else 0,
        "driver_cpu_ms_per_step": cpu / farm.steps * 1000 if farm.steps else 0.0,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import envs

    tasks = [dict(t) for t in envs.task_set(args.env, "train")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-judge-"))
    (tmp / "votes.json").write_text(json.dumps(["The step made progress. \\boxed{1}"]))
    results: list[dict[str, Any]] = []
    arms = [("off", 0.0)] + [("async", lat) for lat in args.latency_s]
    if not args.no_inline:
        arms.append(("inline", args.latency_s[0]))
    servers: dict[float, ServerProcess] = {}
    try:
        for lat in args.latency_s:  # one judge server per latency, all up for the whole run
            servers[lat] = ServerProcess(
                ["--replay", str(tmp / "votes.json"), "--latency-s", str(lat)],
                log_path=str(tmp / f"server-{lat}.log"),
                nice=args.judge_nice,
            ).start()
        for rnd in range(args.rounds):
            for arm, lat in arms:
                r = await one_arm(arm, args, tasks, servers[lat].url if arm != "off" else "")
                r.update(round=rnd, latency_s=lat, name=arm if arm == "off" else f"{arm}@{lat:g}s")
                results.append(r)
                print(
                    f"round {rnd} {r['name']:>12}: {r['env_steps']} env steps in {r['env_s']:.2f} s = "
                    f"{r['steps_per_s']:.1f} steps/s; all judged after {r['wall_s']:.2f} s (lag {r['lag_s']:.2f} s); "
                    f"driver CPU {r['driver_cpu_ms_per_step']:.2f} ms/step",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
    summary: dict[str, Any] = {}
    for name in dict.fromkeys(r["name"] for r in results):
        rows = [r for r in results if r["name"] == name]
        keys = ("steps_per_s", "env_s", "wall_s", "lag_s", "driver_cpu_ms_per_step")
        summary[name] = {k: statistics.median(r[k] for r in rows) for k in keys}
    base = summary["off"]["steps_per_s"]
    for m in summary.values():
        m["ratio_to_off"] = m["steps_per_s"] / base if base else 0.0
    return {"config": vars(args), "rounds": results, "median": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="toolcall")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--max-steps", type=int, default=4)
    ap.add_argument(
        "--latency-s",
        type=float,
        nargs="+",
        default=[1.0],
        help="injected latency of every judge request; several values: one async arm each",
    )
    ap.add_argument("--no-inline", action="store_true", help="skip the inline arm (slow: it pays every latency)")
    ap.add_argument("--m", type=int, default=1, help="votes per step")
    ap.add_argument("--judge-concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--farm", default="local", choices=["local", "ray"])
    ap.add_argument(
        "--judge-nice",
        type=int,
        default=0,
        help="run the judge server at this nice level (stands in for a judge on other machines)",
    )
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    before = machine_state()
    out = asyncio.run(main_async(args))
    out = {"command": " ".join(["python benchmarks/judge.py", *sys.argv[1:]]), **out,
           "machine_before": before, "machine_after": machine_state()}
    print("\nmedian over rounds (env steps/s, ratio to judge off):")
    for name, m in out["median"].items():
        print(
            f"  {name:>12}: {m['steps_per_s']:8.1f} steps/s  x{m['ratio_to_off']:.2f}   "
            f"wall {m['wall_s']:.2f} s, judge lag after the last env step {m['lag_s']:.2f} s, "
            f"driver CPU {m['driver_cpu_ms_per_step']:.2f} ms/step"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
