"""Benchmark of the env farm: every ratio is measured against a baseline run in the same process, in the same run.

    python -m benchmarks.farm                 # all four sections (a few minutes on a 2-core machine)
    python -m benchmarks.farm --sections 1,2 --seconds 2 --json out.json

1. per-step cost on a trivial env, like for like: one farm.step vs one bare Ray actor call (latency), and a batch of
   64 envs through farm.step_many vs one bare Ray call carrying the same 64 steps (and vs 64 bare calls in flight);
2. throughput at 64 envs: farm vs gymnasium AsyncVectorEnv on the same env (interleaved runs, best of --repeats);
3. 256 and 512 envs in flight, each step sleeping 50 ms (simulated I/O): wall time per round and memory per env;
4. fault recovery: a worker process killed by pid mid-run: time to healthy again, aborted episodes recorded, lost.

Timings on a shared machine are noisy (±30% or worse); compare ratios within one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, also when run as a file

import psutil  # noqa: E402

from benchmarks.bench_envs import TrivialEnv, register_bench_envs  # noqa: E402
from benchmarks.machine import machine_state  # noqa: E402
from rollout.episodes.collect import CollectStats, collect  # noqa: E402
from rollout.episodes.runner import EpisodeRequest, RunnerConfig  # noqa: E402
from rollout.farm.core import EnvFarm, FarmConfig, init_ray, make_farm  # noqa: E402
from rollout.policy.fixed import FixedPolicy  # noqa: E402  (answers at once: the farm is measured, not a model)
from rollout.records import JsonlWriter, read_jsonl  # noqa: E402

log = logging.getLogger("benchmarks.farm")


@dataclass
class Report:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)  # section, measurement, value, note
    figures: dict[str, float] = field(default_factory=dict)

    def add(self, section: str, name: str, value: float, fmt: str, unit: str, note: str = "", key: str = "") -> None:
        self.rows.append((section, name, f"{value:{fmt}} {unit}".strip(), note))
        self.figures[key or f"{section}/{name}"] = value


async def timed_loop(seconds: float, body: Callable[[], Awaitable[int]]) -> float:
    """Run `body` (returning how many steps it did) repeatedly for `seconds`; steps per second."""
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        n += await body()
    return n / elapsed


async def started_farm(env: str, kwargs: dict[str, Any] | None = None, **cfg: Any) -> EnvFarm:
    farm = make_farm(env, kwargs or {}, FarmConfig(backend="ray", **cfg))
    await farm.start()
    return farm


async def reset_all(farm: EnvFarm, n: int) -> None:
    async for r in farm.reset_many([(s, None, None) for s in range(n)]):
        r.unwrap()


async def step_round(farm: EnvFarm, n: int) -> int:
    async for r in farm.step_many([(s, "x") for s in range(n)]):
        r.unwrap()
    return n


def uss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().uss
        except psutil.Error:
            pass
    return total / 2**20


# ----- 1. per-step cost: one step against one call, a batch against a batch -----
class BareEnvActor:
    """The baselines: trivial envs in one Ray actor, no farm machinery. `step` is one call per step of env 0;
    `step_one(i, a)` one call per env; `step_batch(actions)` one call for a whole batch (env i gets actions[i])."""

    def __init__(self, n: int = 1) -> None:
        self.envs = [TrivialEnv() for _ in range(n)]
        for env in self.envs:
            env.reset()

    def step(self, action: str):
        return self.envs[0].step(action)

    def step_one(self, i: int, action: str):
        return self.envs[i].step(action)

    def step_batch(self, actions: list[str]):
        return [env.step(a) for env, a in zip(self.envs, actions)]


async def section_overhead(rep: Report, seconds: float, batch: int = 64) -> None:
    import ray

    env = TrivialEnv()
    env.reset()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            env.step("x")
        n += 1000
    direct_s = (time.perf_counter() - t0) / n

    # baselines: one actor hosting `batch` envs, called the three plain ways
    actor = ray.remote(BareEnvActor).remote(batch)
    await actor.step.remote("warm")
    actions = ["x"] * batch

    async def bare_call() -> int:
        await actor.step.remote("x")
        return 1

    async def bare_batch_call() -> int:  # one Ray call carries the whole batch
        await actor.step_batch.remote(actions)
        return 1

    async def bare_calls_in_flight() -> int:  # one Ray call per env, all in flight together
        await asyncio.gather(*(actor.step_one.remote(i, "x") for i in range(batch)))
        return 1

    bare_s = 1 / await timed_loop(seconds, bare_call)
    bare_batch_s = 1 / await timed_loop(seconds, bare_batch_call)
    bare_calls_s = 1 / await timed_loop(seconds, bare_calls_in_flight)
    ray.kill(actor)

    farm = await started_farm("bench_trivial", num_envs=batch, envs_per_worker=batch)
    try:
        await reset_all(farm, batch)
        for _ in range(20):
            await step_round(farm, batch)

        async def single() -> int:
            await farm.step(0, "x")
            return 1

        async def farm_batch() -> int:
            await step_round(farm, batch)
            return 1

        single_s = 1 / await timed_loop(seconds, single)
        farm_batch_s = 1 / await timed_loop(seconds, farm_batch)
    finally:
        await farm.close()
    s = "1 per-step cost"
    rep.add(s, "direct in-process env.step", direct_s * 1e6, ".1f", "us", key="direct_us")
    rep.add(s, "one step: a bare Ray actor call", bare_s * 1e6, ".0f", "us", "baseline", key="bare_ray_us")
    rep.add(s, "one step: farm.step (one env, one step at a time)", single_s * 1e6, ".0f", "us",
            f"{single_s / bare_s:.2f}x the bare Ray call (target <= 2x)", key="farm_single_us")
    rep.add(s, f"batch of {batch}: one bare Ray call carrying it", bare_batch_s * 1e6, ".0f", "us",
            "baseline", key="bare_ray_batch_us")
    rep.add(s, f"batch of {batch}: {batch} bare Ray calls in flight", bare_calls_s * 1e6, ".0f", "us",
            f"{bare_calls_s / bare_batch_s:.2f}x the batched Ray call", key="bare_ray_calls_us")
    rep.add(s, f"batch of {batch}: farm.step_many", farm_batch_s * 1e6, ".0f", "us",
            f"{farm_batch_s / bare_batch_s:.2f}x the batched Ray call (target <= 2x), "
            f"{farm_batch_s / bare_calls_s:.2f}x {batch} calls in flight", key="farm_batch_us")
    rep.figures["batch"] = batch
    rep.figures["ratio_single_vs_bare_ray"] = single_s / bare_s
    rep.figures["ratio_batch_vs_bare_ray_batch"] = farm_batch_s / bare_batch_s
    rep.figures["ratio_batch_vs_bare_ray_calls"] = farm_batch_s / bare_calls_s


# ----- 2. throughput at 64 envs -----
def async_vector_env_rate(seconds: float, n: int = 64) -> float:
    import gymnasium as gym

    vec = gym.vector.AsyncVectorEnv([TrivialEnv] * n, shared_memory=False)  # Text spaces cannot live in shared memory
    try:
        vec.reset()
        actions = tuple(["x"] * n)
        for _ in range(10):
            vec.step(actions)
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            vec.step(actions)
            steps += n
        return steps / (time.perf_counter() - t0)
    finally:
        vec.close()


async def section_throughput(rep: Report, seconds: float, repeats: int) -> None:
    ave, rounds, runner_style, ray_calls = [], [], [], []
    for _ in range(repeats):  # interleaved, so that both sides see the same machine load
        ave.append(async_vector_env_rate(seconds))
        farm = await started_farm("bench_trivial", num_envs=64, envs_per_worker=64)
        try:
            await reset_all(farm, 64)
            for _ in range(20):
                await step_round(farm, 64)
            rounds.append(await timed_loop(seconds, lambda: step_round(farm, 64)))

            async def episode_loop(slot: int, until: float) -> int:  # what the runner does: await farm.step per episode
                k = 0
                while time.perf_counter() < until:
                    await farm.step(slot, "x")
                    k += 1
                return k

            t0 = time.perf_counter()
            done = await asyncio.gather(*(episode_loop(s, t0 + seconds) for s in range(64)))
            runner_style.append(sum(done) / (time.perf_counter() - t0))
        finally:
            await farm.close()
    farm = await started_farm("bench_trivial", num_envs=64, envs_per_worker=64, transport="ray")
    try:
        await reset_all(farm, 64)
        for _ in range(10):
            await step_round(farm, 64)
        ray_calls.append(await timed_loop(seconds, lambda: step_round(farm, 64)))
    finally:
        await farm.close()
    s = "2 throughput, 64 envs"
    base = max(ave)
    rep.add(s, "gymnasium AsyncVectorEnv (64 subprocesses)", base, ",.0f", "steps/s", f"best of {repeats}", key="ave_sps")
    rep.add(s, "farm, step_many rounds (1 worker x 64 envs)", max(rounds), ",.0f", "steps/s",
            f"{max(rounds) / base:.2f}x AsyncVectorEnv (target >= 3x)", key="farm_rounds_sps")
    rep.add(s, "farm, 64 coroutines awaiting farm.step (coalesced)", max(runner_style), ",.0f", "steps/s",
            f"{max(runner_style) / base:.2f}x AsyncVectorEnv", key="farm_coalesced_sps")
    rep.add(s, "farm over plain Ray calls (transport=ray)", max(ray_calls), ",.0f", "steps/s",
            f"{max(ray_calls) / base:.2f}x AsyncVectorEnv", key="farm_raycalls_sps")
    rep.figures["ratio_farm_vs_async_vector_env"] = max(rounds) / base
    rep.figures["ave_all"] = ave  # type: ignore[assignment]
    rep.figures["farm_rounds_all"] = rounds  # type: ignore[assignment]


# ----- 3. hundreds of envs with 50 ms I/O steps -----
async def section_many(rep: Report, seconds: float, sizes: list[int], envs_per_worker: int) -> None:
    s = "3 envs in flight, 50 ms steps"
    driver = psutil.Process()
    for n in sizes:
        driver_before = driver.memory_full_info().uss / 2**20
        farm = await started_farm("bench_sleep", {"step_s": 0.05}, num_envs=n, envs_per_worker=envs_per_worker,
                                  max_starting=0)
        try:
            await reset_all(farm, n)
            await step_round(farm, n)
            await step_round(farm, n)
            rounds, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                await step_round(farm, n)
                rounds += 1
            per_round = (time.perf_counter() - t0) / rounds
            workers_mb = uss_mb([w.pid for w in farm.workers() if w])
            driver_mb = driver.memory_full_info().uss / 2**20 - driver_before
            n_workers = len(farm.workers())
        finally:
            await farm.close()
        # the same load as real episodes: n concurrent runner episodes of 10 steps each
        farm = await started_farm("bench_episode", num_envs=n, envs_per_worker=envs_per_worker, max_starting=0)
        try:
            reqs = [EpisodeRequest(f"e{i}", f"g{i}", {"id": f"t{i}", "steps": 10, "step_s": 0.05}) for i in range(n)]
            t0 = time.perf_counter()
            stats = CollectStats()
            await collect(farm, FixedPolicy(ids=True), None, reqs, RunnerConfig(run_id="bench", judge_enabled=False), stats=stats)
            episode_round = (time.perf_counter() - t0) / 10
            assert stats.finished == n, stats
        finally:
            await farm.close()
        rep.add(s, f"{n} envs: wall per step_many round", per_round * 1e3, ".1f", "ms",
                f"ideal 50 ms; {n_workers} workers x {envs_per_worker} envs", key=f"round_ms_{n}")
        rep.add(s, f"{n} envs: {n} runner episodes x 10 steps, per step", episode_round * 1e3, ".1f", "ms",
                "incl. each episode's reset", key=f"episode_round_ms_{n}")
        rep.add(s, f"{n} envs: memory per env (workers' USS / envs)", workers_mb / n, ".2f", "MB",
                f"workers {workers_mb:.0f} MB total; driver +{driver_mb:.0f} MB (target <= 40 MB/env)",
                key=f"mb_per_env_{n}")


# ----- 4. fault recovery -----
async def section_fault(rep: Report, out_dir: Path) -> None:
    s = "4 fault recovery"
    farm = await started_farm("bench_episode", num_envs=64, envs_per_worker=32, max_worker_restarts=3)
    path = out_dir / "episodes.jsonl"
    writer = JsonlWriter(path)
    try:
        victim = farm.workers()[0]
        reqs = [EpisodeRequest(f"e{i}", f"g{i % 16}", {"id": f"t{i}", "steps": 10, "step_s": 0.05}) for i in range(128)]
        stats = CollectStats()
        job = asyncio.ensure_future(
            collect(farm, FixedPolicy(ids=True), None, reqs, RunnerConfig(run_id="bench", judge_enabled=False),
                    on_episode=lambda t: writer.write(t.summary()), stats=stats)
        )
        while farm.metrics().steps < 64 * 3:
            await asyncio.sleep(0.005)
        t_kill = time.perf_counter()
        os.kill(victim.pid, signal.SIGKILL)
        healthy_s = None
        while not job.done():
            m = farm.metrics()
            if healthy_s is None and m.restarts >= 1 and m.workers_alive == m.workers:
                healthy_s = time.perf_counter() - t_kill
            await asyncio.sleep(0.005)
        trajs = await job
        writer.flush()
        m = farm.metrics()
    finally:
        writer.close()
        await farm.close()
    rows = read_jsonl(path)
    on_disk = {r["status"]: 0 for r in rows}
    for r in rows:
        on_disk[r["status"]] += 1
    finished_ids = {r["episode_id"].split("#")[0] for r in rows if r["status"] != "aborted"}
    lost = len(reqs) - len(finished_ids) - stats.gave_up
    rep.add(s, "kill -> every worker healthy again", healthy_s if healthy_s is not None else float("nan"), ".2f", "s",
            "target <= 5 s", key="healthy_s")
    rep.add(s, "failure detected -> worker back (farm)", m.last_recovery_s or float("nan"), ".2f", "s",
            key="detect_to_up_s")
    rep.add(s, "aborted episodes recorded (on disk)", on_disk.get("aborted", 0), "d", "",
            f"all retried: {stats.retried}; gave up: {stats.gave_up}", key="aborted")
    rep.add(s, "episodes started = finished + aborted", stats.started, "d", "",
            f"{stats.finished} + {stats.aborted}; {len(trajs)} returned, {len(rows)} on disk", key="started")
    rep.add(s, "lost episodes", lost, "d", "", "requests without a finished episode", key="lost")


def print_report(rep: Report, json_path: str | None, machine_before: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="NextState env farm benchmark (ratios are within this run)")
        for col in ("section", "measurement", "value", "note"):
            table.add_column(col)
        for row in rep.rows:
            table.add_row(*row)
        Console(width=160).print(table)
    except ImportError:
        for row in rep.rows:
            print(" | ".join(row))
    f = rep.figures
    checks: dict[str, bool] = {}
    if "ratio_single_vs_bare_ray" in f:
        checks["one farm step <= 2x one bare Ray call"] = f["ratio_single_vs_bare_ray"] <= 2
        checks["a farm batch <= 2x one bare Ray call carrying the same batch"] = f["ratio_batch_vs_bare_ray_batch"] <= 2
    if "ratio_farm_vs_async_vector_env" in f:
        checks["farm >= 3x AsyncVectorEnv at 64 envs"] = f["ratio_farm_vs_async_vector_env"] >= 3
    sizes = [k for k in f if k.startswith("mb_per_env_")]
    if sizes:
        checks[">= 256 envs in flight, <= 40 MB per env"] = (
            max(int(k.rsplit("_", 1)[1]) for k in sizes) >= 256 and all(f[k] <= 40 for k in sizes)
        )
    if "healthy_s" in f:
        checks["worker killed: recovery <= 5 s, lost = 0"] = f["healthy_s"] <= 5 and f["lost"] == 0
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared: figures are noisy)")
    if json_path:
        out = {"command": " ".join(["python -m benchmarks.farm", *sys.argv[1:]]), "figures": rep.figures,
               "checks": checks, "machine_before": machine_before, "machine_after": machine_state()}
        Path(json_path).write_text(json.dumps(out, indent=2, default=str))


async def main_async(args: argparse.Namespace) -> Report:
    register_bench_envs()
    init_ray(None)
    rep = Report()
    sections = {int(x) for x in args.sections.split(",")}
    if 1 in sections:
        await section_overhead(rep, args.seconds)
    if 2 in sections:
        await section_throughput(rep, args.seconds, args.repeats)
    if 3 in sections:
        await section_many(rep, args.seconds, [int(x) for x in args.sizes.split(",")], args.envs_per_worker)
    if 4 in sections:
        with tempfile.TemporaryDirectory(prefix="farm-bench-") as d:
            await section_fault(rep, Path(d))
    return rep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="1,2,3,4")
    p.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure")
    p.add_argument("--repeats", type=int, default=2, help="section 2: interleaved repetitions (best of)")
    p.add_argument("--sizes", default="256,512", help="section 3: envs in flight")
    p.add_argument("--envs-per-worker", type=int, default=64, help="section 3")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    before = machine_state()
    rep = asyncio.run(main_async(args))
    print_report(rep, args.json, before)
    import ray

    ray.shutdown()


if __name__ == "__main__":
    main()
