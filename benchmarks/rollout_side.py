"""The whole rollout side at hundreds of episodes in flight: what one step costs the driver, part by part, and how
close end-to-end steps/s comes to the ideal (episodes in flight / policy latency).

    python benchmarks/rollout_side.py [--episodes 128 512 1024] [--latency-s 1.0] [--judge-latency-s 1.0] [--m 1]
                                      [--max-steps 4] [--waves 1 8] [--judge on off] [--runners 1 [2 ...]]
                                      [--gc python paced]
                                      [--baseline] [--event-loop auto|uvloop|asyncio] [--no-trace]
                                      [--policy sglang|openai] [--farm local|ray] [--no-profile] [--keep]
                                      [--json out.json]

Everything is real but the models: the policy and the judge are `python -m rollout.server --fixed-latency-s L`
processes on loopback (each request answered after L seconds with a valid action, or the judge's `\\boxed{1}`,
numbered per call so no two steps are alike and no judgement is shared), reached by the real clients
(`policy=sglang`: the chat template applied in the driver, exact token ids; the real LLMJudge); the env farm hosts
real tool-call envs (the calculator tool: a step costs the env ~0.1 ms); every episode and step is written to
episodes.jsonl / trajectories.jsonl on disk as the loop writes them; episodes come in task groups of 4
(`GROUP`: 4 samples of one task, as a collect makes them). Arms: each `--episodes` E x `--waves` K x
`--judge` on/off x `--runners` N x `--gc` python/paced (Python's own collector thresholds, or loop.gc_threshold's
default while episodes run: rollout/episodes/gc_pacing.py); each arm runs K x E episodes of `--max-steps` steps
through E env slots (farm.num_envs = E), refilled as episodes end (K = 1: one wave, all at once). `--baseline` runs each in-driver arm
first as the rollout side was before issue #33's CPU work (`Baseline`: the clients' request path, and servers of
their own as they were: `--lean off`), in the same run.

Figures per arm:
  steps/s       env steps from the first reset to the last env step; `ideal` = E / latency (every episode waits one
                policy latency per step, nothing else); `x ideal` is the ratio
  steady        with K > 1: env steps/s from the moment E episodes have ended (the first wave) to the last reset
                (after it no slot is refilled): the rate a long collect keeps its slots busy at
  breakdown     means and p95 of each part of a step's wall time (Step.timing, with RunnerConfig.trace_requests)
                and an episode's (lease wait, reset, last judgements), over the middle waves; the driver's event-loop
                lag (a 10 ms timer's lateness)
  driver CPU    CPU seconds of this process (getrusage) per env step, split by part with a sampling profiler (py-spy at
                --rate Hz on this process, every thread; idle samples dropped): each sample goes to the part of its
                innermost frame that belongs to one -- policy client (rollout/policy/), judge client (prm/llm_judge.py,
                prompt rendering, voting), farm (rollout/farm/), env code (envs/), records (JSONL lines, Step.to_json),
                runner (rollout/episodes/) -- and the rest (asyncio's loop, httpx/httpcore callbacks
                outside any part) is `loop+io`; the parts' shares of the samples times the process CPU give ms/step
  runner CPU    with --runners N > 1: the CPU of the runner actors' processes (psutil), per env step, next to the driver's
  servers CPU   the two fixed-latency servers' processes (psutil), per env step
  machine CPU   every process of the machine (psutil.cpu_times), per env step: where the 2 cores go (other users'
                processes included: compare it with the load average printed before and after)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, also when run as a file

import psutil  # noqa: E402

import envs  # noqa: E402
from benchmarks.machine import machine_state  # noqa: E402
from benchmarks.timed_farm import TimedFarm, steady_window  # noqa: E402
from prm.client.aiohttp_client import AiohttpClient  # noqa: E402
from prm.client.retry import RetryPolicy  # noqa: E402
from prm.client.router import ClientShards  # noqa: E402
from prm.client.timing import PHASES  # noqa: E402
from prm.llm_judge import LLMJudge, LLMJudgeConfig  # noqa: E402
from rollout.episodes.collect import CollectStats, collect  # noqa: E402
from rollout.episodes.gc_pacing import DEFAULT_THRESHOLD0  # noqa: E402
from rollout.episodes.runner import EpisodeRequest, RunnerConfig  # noqa: E402
from rollout.event_loop import run_async  # noqa: E402
from rollout.farm.core import FarmConfig, make_farm  # noqa: E402
from rollout.policy.base import SamplingParams  # noqa: E402
from rollout.policy.openai import OpenAIConfig, OpenAIPolicy  # noqa: E402
from rollout.policy.sglang import SGLangConfig, SGLangPolicy  # noqa: E402
from rollout.records import JsonlWriter  # noqa: E402
from rollout.server.app import ServerProcess  # noqa: E402
from rollout.server.backends import byte_chat_tokenizer  # noqa: E402

ENV_KWARGS = {"tools": ["calculator"]}  # the fixed policy server's toolcall action is a calculator call
JUDGE_TEXT = "The step made progress. \\boxed{1} {n}"
GROUP = 4  # episodes per task group

# (part, path fragments): a sample goes to the first part, innermost frame first, whose fragment is in the frame's file
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("records", ("rollout/records.py", "train/records.py", "write_records (")),
    ("judge client", ("prm/llm_judge.py", "prm/prompt.py", "prm/voting.py", "prm/hints.py")),
    ("policy client", ("rollout/policy/",)),
    ("env code", ("envs/",)),
    ("farm", ("rollout/farm",)),
    ("runner", ("rollout/episodes/",)),
]
PART_NAMES = [p for p, _ in PARTS] + ["loop+io"]


def classify(frames: list[str]) -> str:
    """The part of one sample (frames outermost first, as py-spy writes them: `func (path:line)`)."""
    for frame in reversed(frames):
        for part, fragments in PARTS:
            if any(f in frame for f in fragments):
                return part
    return "loop+io"


def parse_pyspy(path: Path) -> Counter:
    """Samples per part from py-spy's raw (collapsed) output: `thread (tid): name;frame;frame count` per line."""
    parts: Counter = Counter()
    if not path.exists():
        return parts
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0]
        part = "records" if "jsonl:" in thread else classify(frames[1:])
        parts[part] += int(count)
    return parts


class Profiler:
    """py-spy recording this process until stop() (SIGINT makes it write its output)."""

    def __init__(self, out: Path, rate: int):
        self.out = out
        exe = shutil.which("py-spy")
        if exe is None:
            raise SystemExit("py-spy is not installed (pip install py-spy), or run with --no-profile")
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(os.getpid()), "--rate", str(rate), "--format", "raw", "--threads",
             "--nonblocking", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        time.sleep(0.5)  # attached before the arm starts

    def stop(self) -> Counter:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return parse_pyspy(self.out)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _machine_cpu_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0.0)


class RecordWriter:
    """episodes.jsonl and trajectories.jsonl as the loop writes them (rollout.loop.RunWriter's two calls)."""

    def __init__(self, out: Path):
        self.episodes = JsonlWriter(out / "episodes.jsonl")
        self.steps = JsonlWriter(out / "trajectories.jsonl")

    def write_records(self, traj: Any) -> None:
        self.episodes.write(traj.summary())
        for s in traj.steps:
            self.steps.write(s.to_json(False))

    def close(self) -> None:
        self.episodes.close()
        self.steps.close()


def make_policy(kind: str, url: str, tokenizer_dir: str, episodes: int) -> Any:
    retry = RetryPolicy(attempts=2, timeout_s=120.0)
    if kind == "openai":
        return OpenAIPolicy(OpenAIConfig(urls=[url + "/v1"], retry=retry, api_key_env=None))
    return SGLangPolicy(SGLangConfig(urls=[url], tokenizer=tokenizer_dir, retry=retry, max_sessions=2 * episodes))


class Baseline:
    """The rollout side as it was before issue #33's CPU work (for `--baseline` arms, in the same run): the switches
    that keep the earlier paths (`lean = False`) -- the clients' request path (`ClientShards`, `AiohttpClient`: proxy
    variables read per request, bodies by the json module, trace signals on every request, an httpx.Request per
    request) -- and servers of their own as they were (`BASELINE_SERVER_ARGS`: bodies read by the json module,
    every request through FastAPI's layers, answers encoded through transformers). The earlier steady-state work's
    own baseline (httpx clients, asyncio loops, h11 servers) is in docs/performance.md with its run."""

    SWITCHES = (ClientShards, AiohttpClient)

    def __enter__(self) -> Baseline:
        self.saved = [cls.lean for cls in self.SWITCHES]
        for cls in self.SWITCHES:
            cls.lean = False
        return self

    def __exit__(self, *exc: Any) -> None:
        for cls, lean in zip(self.SWITCHES, self.saved):
            cls.lean = lean


BASELINE_SERVER_ARGS = ["--lean", "off"]
# `--gc`: the episodes' garbage collector as Python sets it (700) or paced (loop.gc_threshold's default)
GC_THRESHOLDS = {"python": 0, "paced": DEFAULT_THRESHOLD0}


async def one_arm(args: argparse.Namespace, episodes: int, waves: int, judge_on: bool, runners: int,
                  urls: dict[str, str], tokenizer_dir: str, tasks: list[dict], tmp: Path, server_pids: list[int],
                  baseline: bool = False, gc_mode: str = "paced") -> dict[str, Any]:
    scpu0 = _pids_cpu_s(server_pids)
    name = (f"E={episodes} waves={waves} judge={'on' if judge_on else 'off'} runners={runners}"
            + (" baseline" if baseline else "") + (f" gc={gc_mode}" if gc_mode != "paced" else ""))
    out = tmp / name.replace(" ", "_").replace("=", "")
    out.mkdir(parents=True)
    farm_cfg = FarmConfig(backend=args.farm, num_envs=episodes, envs_per_worker=max(1, episodes // 2))
    env_kwargs = {**ENV_KWARGS, "max_steps": args.max_steps}
    sp = SamplingParams(max_new_tokens=64)
    cfg = RunnerConfig(run_id="bench", sampling=sp, judge_enabled=judge_on, trace_requests=args.trace,
                       gc_threshold=GC_THRESHOLDS[gc_mode])
    # task groups as a collect makes them: GROUP samples of one task (they share a first prompt), seeds of their own
    reqs = [EpisodeRequest(f"e{i}", f"g{i // GROUP}", tasks[(i // GROUP) % len(tasks)], seed=i)
            for i in range(episodes * waves)]
    judge_cfg = LLMJudgeConfig(urls=[urls["judge"] + "/v1"], m=args.m, max_tokens=64, cache_size=0,
                               # an episode has up to two judgements in flight (a 1 s judge beside ~1 s turns)
                               max_concurrency=2 * episodes * args.m, api_key_env=None,
                               retry=RetryPolicy(attempts=2, timeout_s=120.0))
    records = RecordWriter(out)
    stats = CollectStats()
    profiler = None
    farm = policy = judge = None
    try:
        if runners > 1:
            from rollout.episodes.pool import RunnerPool, RunnerSpec, runner_farm_config  # the Ray runner actors

            def runner_farm(index: int, n: int) -> TimedFarm:
                return TimedFarm(make_farm("toolcall", env_kwargs, runner_farm_config(farm_cfg, index, n)))

            spec = RunnerSpec(farm=runner_farm,
                              policy=functools.partial(make_policy, args.policy, urls["policy"], tokenizer_dir, episodes),
                              judge=functools.partial(LLMJudge, judge_cfg) if judge_on else (lambda: None))
            pool = RunnerPool(spec, runners)
            await pool.start()
            try:
                profiler = Profiler(out / "pyspy.txt", args.rate) if args.profile else None
                t0, cpu0, mcpu0, rcpu0 = time.perf_counter(), _cpu_s(), _machine_cpu_s(), _pids_cpu_s(pool.pids())
                trajs = await pool.collect(reqs, cfg, max_retries=0, on_episode=records.write_records, stats=stats)
                t_end, cpu, mcpu = time.perf_counter(), _cpu_s() - cpu0, _machine_cpu_s() - mcpu0
                runner_cpu = _pids_cpu_s(pool.pids()) - rcpu0
                parts = profiler.stop() if profiler else Counter()
                times = _merge_times(await pool.call_each(_farm_times))
            finally:
                await pool.close()
        else:
            farm = TimedFarm(make_farm("toolcall", env_kwargs, farm_cfg))
            await farm.farm.start()
            policy = make_policy(args.policy, urls["policy"], tokenizer_dir, episodes)
            judge = LLMJudge(judge_cfg) if judge_on else None
            if hasattr(policy, "start"):
                await policy.start()  # its health check: setup, not steps
            profiler = Profiler(out / "pyspy.txt", args.rate) if args.profile else None
            lag = LoopLag()
            t0, cpu0, mcpu0 = time.perf_counter(), _cpu_s(), _machine_cpu_s()
            try:
                trajs = await collect(farm, policy, judge, reqs, cfg, max_retries=0,
                                      on_episode=records.write_records, stats=stats)
            finally:
                lag.stop()
            t_end, cpu, mcpu = time.perf_counter(), _cpu_s() - cpu0, _machine_cpu_s() - mcpu0
            parts = profiler.stop() if profiler else Counter()
            runner_cpu = 0.0
            times = farm.times()
    finally:
        if profiler is not None:
            profiler.stop()  # a no-op once stopped
        records.close()
        if farm is not None:
            await farm.farm.close()
        if judge is not None:
            await judge.close()
        if policy is not None:
            await policy.close()
    bad = [t for t in trajs if t.status.value != "ok"]
    if bad:
        raise RuntimeError(f"{name}: {len(bad)} episodes did not end ok, e.g. {bad[0].status.value}: {bad[0].reason[-800:]}")
    if judge_on:
        judged = [s.judge for t in trajs for s in t.steps]
        assert all(j is not None and j.votes == [1] * args.m for j in judged), "a judgement is missing or invalid"
    server_cpu = _pids_cpu_s(server_pids) - scpu0
    steps = len(times["steps"])
    env_s = max(times["steps"]) - min(times["resets"])  # from the first reset to the last env step
    sps = steps / env_s if env_s > 0 else 0.0
    ideal = episodes / args.latency_s
    w0, w1, w_steps = steady_window(times, episodes) if waves > 1 else (0.0, 0.0, 0)
    steady_sps = w_steps / (w1 - w0) if w_steps else None
    total = sum(parts.values())
    per_step_ms = cpu / steps * 1000 if steps else 0.0
    split = {p: per_step_ms * parts[p] / total for p in PART_NAMES} if total else {}
    row = {
        "name": name, "episodes": episodes, "judge": judge_on, "runners": runners, "baseline": baseline,
        "gc": gc_mode, "gc_threshold": GC_THRESHOLDS[gc_mode],
        "env_steps": steps,
        "env_s": env_s, "wall_s": t_end - t0, "steps_per_s": sps, "ideal_steps_per_s": ideal, "x_ideal": sps / ideal,
        "driver_cpu_ms_per_step": per_step_ms, "driver_cpu_ms_by_part": split,
        "runner_cpu_ms_per_step": runner_cpu / steps * 1000 if steps else 0.0,
        "machine_cpu_ms_per_step": mcpu / steps * 1000 if steps else 0.0,
        "server_cpu_ms_per_step": server_cpu / steps * 1000 if steps else 0.0,  # both fixed-latency servers
        "profile_samples": total,
        "judge_lag_s": max(t_end - t0 - env_s, 0.0),
        "waves": waves, "steady_window_s": w1 - w0, "steady_steps": w_steps, "steady_steps_per_s": steady_sps,
        "steady_x_ideal": steady_sps / ideal if steady_sps is not None else None,
        "loop_lag_ms": lag.summary() if runners == 1 else None,
        "breakdown": breakdown(trajs, episodes, waves),
    }
    parts_text = " ".join(f"{p} {v:.2f}" for p, v in split.items())
    steady = (f"steady {steady_sps:.0f} steps/s (x{steady_sps / ideal:.2f}) over {w1 - w0:.1f} s; "
              if steady_sps is not None else "")
    print(f"{name}: {steps} steps in {env_s:.2f} s = {sps:.0f} steps/s (ideal {ideal:.0f}, x{sps / ideal:.2f}); "
          + steady +
          f"driver CPU {per_step_ms:.2f} ms/step [{parts_text}]"
          + (f"; runners {row['runner_cpu_ms_per_step']:.2f} ms/step" if runners > 1 else "")
          + f"; servers {row['server_cpu_ms_per_step']:.2f}; machine {row['machine_cpu_ms_per_step']:.2f} ms/step; all done after {t_end - t0:.2f} s", flush=True)
    return row


def _farm_times(runner: Any) -> dict[str, list[float]]:
    """In a runner actor: its TimedFarm's reset, env step and episode end times (wall clock)."""
    return runner.farm.times()


def _merge_times(per_runner: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    return {k: sorted(t for r in per_runner for t in r[k]) for k in ("resets", "steps", "ends")}


class LoopLag:
    """How late this process's event loop runs a callback: a task asking to wake every `every_s`, and how much
    later than asked it woke (the wait every other ready callback -- a response, a step -- has at that moment)."""

    def __init__(self, every_s: float = 0.01):
        self.every_s = every_s
        self.lags: list[float] = []
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.every_s)
            self.lags.append(time.perf_counter() - t - self.every_s)

    def stop(self) -> None:
        self.task.cancel()

    def summary(self) -> dict[str, float]:
        return _stats([x * 1000 for x in self.lags])


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    ys = sorted(xs)
    return {"n": len(ys), "mean": sum(ys) / len(ys), "p50": ys[len(ys) // 2], "p95": ys[int(0.95 * (len(ys) - 1))],
            "max": ys[-1]}


# the wall time of one step, part by part (Step.timing; seconds): the turn is policy + env + runner; the request's
# own phases split the policy call (client = the call less its requests: prompt rendering, tokenizing, parsing)
STEP_PARTS = ["policy_s", "policy_pool_wait_s", "policy_connect_s", "policy_send_s", "policy_server_s",
              "policy_read_s", "policy_client_s", "env_s", "runner_s", "turn_s", "judge_s", "judge_slot_wait_s", "judge_pool_wait_s",
              "judge_server_s", "judge_read_s", "judge_client_s"]
EPISODE_PARTS = ["lease_wait_s", "reset_s", "judge_wait_s"]


def breakdown(trajs: list[Any], episodes: int, waves: int) -> dict[str, dict[str, float]]:
    """Means and percentiles (ms) of each part of a step's and an episode's wall time, over the episodes of the
    middle waves (2 .. waves-1, by request order: slots are leased first come first served) when there are 3 or more
    waves, else over every episode."""
    middle = trajs[episodes:episodes * (waves - 1)] if waves >= 3 else trajs
    per: dict[str, list[float]] = {k: [] for k in STEP_PARTS + EPISODE_PARTS}
    for t in middle:
        for k in EPISODE_PARTS:
            if k in t.timing:
                per[k].append(t.timing[k] * 1000)
        for s in t.steps:
            tm = dict(s.timing)
            tm["turn_s"] = tm.get("policy_s", 0.0) + tm.get("env_s", 0.0) + tm.get("runner_s", 0.0)
            for who in ("policy", "judge"):
                if f"{who}_requests" in tm:
                    tm[f"{who}_client_s"] = tm[f"{who}_s"] - sum(tm.get(f"{who}_{p}", 0.0)
                                                                 for p in (*PHASES, "slot_wait_s"))
            for k in STEP_PARTS:
                if k in tm:
                    per[k].append(tm[k] * 1000)
    return {k: _stats(v) for k, v in per.items() if v}


def breakdown_table(rows: list[dict[str, Any]]) -> str:
    names = [r["name"] for r in rows]
    lines = ["| part (ms, mean / p95) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in STEP_PARTS + EPISODE_PARTS:
        cells = []
        for r in rows:
            st = r["breakdown"].get(k)
            cells.append(f"{st['mean']:.1f} / {st['p95']:.1f}" if st else "")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lag = [r.get("loop_lag_ms") for r in rows]
    lines.append("| driver loop lag | " + " | ".join(f"{x['mean']:.1f} / {x['p95']:.1f}" if x else "" for x in lag)
                 + " |")
    return "\n".join(lines)


def _pids_cpu_s(pids: list[int | None]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except (psutil.Error, TypeError):
            pass
    return total


def start_servers(args: argparse.Namespace, tmp: Path, extra: list[str], tag: str) -> dict[str, ServerProcess]:
    """The fixed-latency policy and judge servers (`extra`: their event loop and HTTP parser)."""
    servers = {
        "policy": ServerProcess(["--fixed-latency-s", str(args.latency_s), "--env", "toolcall", *extra],
                                log_path=str(tmp / f"policy-server{tag}.log")),
        "judge": ServerProcess(["--fixed-latency-s", str(args.judge_latency_s), "--fixed-text", JUDGE_TEXT, *extra],
                               log_path=str(tmp / f"judge-server{tag}.log")),
    }
    try:
        for s in servers.values():
            s.start()
    except BaseException:
        for s in servers.values():
            s.stop()
        raise
    return servers


def run_arms(args: argparse.Namespace) -> dict[str, Any]:
    """Every arm, each on an event loop of its own (`--event-loop`)."""
    tasks = [dict(t) for t in envs.task_set("toolcall", "train")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-rollout-side-"))
    tokenizer_dir = tmp / "tokenizer"
    byte_chat_tokenizer().save_pretrained(str(tokenizer_dir))  # the policy's tokenizer: the server's byte-level one
    servers: dict[bool, dict[str, ServerProcess]] = {}
    rows = []
    try:
        servers[False] = start_servers(args, tmp, ["--event-loop", args.event_loop], "")
        if args.baseline:
            servers[True] = start_servers(args, tmp, ["--event-loop", args.event_loop, *BASELINE_SERVER_ARGS],
                                          "-baseline")
        for episodes, waves, judge, runners in itertools.product(args.episodes, args.waves, args.judge, args.runners):
            for baseline, gc_mode in itertools.product([True, False] if args.baseline and runners == 1 else [False],
                                                       args.gc):
                here = servers[baseline]
                urls = {k: s.url for k, s in here.items()}
                with Baseline() if baseline else contextlib.nullcontext():
                    arm = one_arm(args, episodes, waves, judge == "on", runners, urls, str(tokenizer_dir), tasks, tmp,
                                  [s.proc.pid for s in here.values()], baseline, gc_mode)
                    rows.append(run_async(arm, args.event_loop))
    finally:
        for group in servers.values():
            for s in group.values():
                s.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"config": vars(args), "rows": rows}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| episodes | waves | judge | runners | clients | gc | steps/s | x ideal | steady steps/s | steady x ideal "
            "| ideal | driver CPU ms/step | "
            + " | ".join(PART_NAMES) + " | runner CPU ms/step | servers CPU ms/step | machine CPU ms/step |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        parts = r["driver_cpu_ms_by_part"]
        lines.append(
            f"| {r['episodes']} | {r['waves']} | {'on' if r['judge'] else 'off'} | {r['runners']} | "
            f"{'before' if r.get('baseline') else 'after'} | {r.get('gc', 'python')} | {r['steps_per_s']:.0f} | "
            f"{r['x_ideal']:.2f} | "
            + (f"{r['steady_steps_per_s']:.0f} | {r['steady_x_ideal']:.2f} | " if r["steady_steps_per_s"] else " | | ")
            + f"{r['ideal_steps_per_s']:.0f} | {r['driver_cpu_ms_per_step']:.2f} | "
            + " | ".join(f"{parts.get(p, 0.0):.2f}" for p in PART_NAMES)
            + f" | {r['runner_cpu_ms_per_step']:.2f} | {r['server_cpu_ms_per_step']:.2f} | "
              f"{r['machine_cpu_ms_per_step']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, nargs="+", default=[128, 512, 1024], help="episodes in flight, one arm each")
    ap.add_argument("--latency-s", type=float, default=1.0, help="the policy server's latency per request")
    ap.add_argument("--waves", type=int, nargs="+", default=[1, 8],
                    help="episodes per slot: 1 = one wave (E episodes at once); K > 1 = K x E episodes through E "
                         "slots, refilled as episodes end, with the steady-state figure over the middle of the run")
    ap.add_argument("--no-trace", dest="trace", action="store_false",
                    help="no per-request phases in the breakdown (RunnerConfig.trace_requests off)")
    ap.add_argument("--judge-latency-s", type=float, default=1.0, help="the judge server's latency per vote")
    ap.add_argument("--m", type=int, default=1, help="judge votes per step")
    ap.add_argument("--max-steps", type=int, default=4, help="steps per episode (the env's step limit)")
    ap.add_argument("--judge", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--runners", type=int, nargs="+", default=[1], help="rollout runners (1: in the driver)")
    ap.add_argument("--baseline", action="store_true",
                    help="also run each runners=1 arm as the rollout side was before issue #33's CPU work "
                         "(Baseline: the earlier request path and servers), first")
    ap.add_argument("--gc", nargs="+", default=["paced"], choices=list(GC_THRESHOLDS),
                    help="the garbage collector while episodes run: python (its own thresholds) or paced "
                         "(loop.gc_threshold's default); both: before/after arms in one run")
    ap.add_argument("--event-loop", default="auto", choices=["auto", "uvloop", "asyncio"],
                    help="the driver's and the servers' event loop")
    ap.add_argument("--policy", default="sglang", choices=["sglang", "openai"], help="the policy client")
    ap.add_argument("--farm", default="local", choices=["local", "ray"])
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="no per-part split (no py-spy)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (records, server logs, py-spy output)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    before = machine_state()
    out = run_arms(args)
    out = {"command": " ".join(["python benchmarks/rollout_side.py", *sys.argv[1:]]), **out,
           "machine_before": before, "machine_after": machine_state()}
    print("\n" + table(out["rows"]))
    print("\nwhere a step's wall time goes (ms, mean / p95):\n" + breakdown_table(out["rows"]))
    print(f"\nload before: {before['uptime']}\nload after:  {out['machine_after']['uptime']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
