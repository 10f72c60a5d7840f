"""Sandbox and SWE timings, local (bubblewrap) and docker side by side, with baselines measured in the same run.

    python benchmarks/sandbox.py [--n 50] [--swe-n 10] [--docker-host unix:///...] [--no-docker] [--json out.json]

Measures (medians; the machine is shared, so also p90):
- start + `echo`: a plain `bash -c` subprocess (baseline), the local runtime unsandboxed (isolation=none), the local
  bubblewrap sandbox, and `exec` in a running docker container; docker container start + first exec + removal.
- SWE episode reset with the environment (venv / image) already built: checkout at base_commit + setup commit.
- grading per instance: the gold patch applied to a fresh checkout, the official eval script, swebench's report.
Targets (issue 4): local start + echo <= 20 ms, SWE reset <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import machine_state  # noqa: E402


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p90 = xs[max(math.ceil(0.9 * len(xs)) - 1, 0)]  # nearest rank
    return {"median_ms": 1000 * statistics.median(xs), "p90_ms": 1000 * p90, "n": len(xs)}


def interleaved(fns: dict[str, object], n: int, rounds: int) -> dict[str, dict]:
    """Time each fn n times per round, the fns interleaved round by round (so load spikes hit all of them alike);
    report the median over everything and the best round's median (the least disturbed by other work)."""
    per: dict[str, list[list[float]]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name].append(timed(fn, n))
    out = {}
    for name, rs in per.items():
        flat = [x for r in rs for x in r]
        out[name] = {**stats(flat), "best_round_median_ms": 1000 * min(statistics.median(r) for r in rs)}
    return out


def bench_exec(n: int, docker_host: str | None, rounds: int = 1) -> dict[str, dict]:
    from envs.runtime.local import LocalRuntime

    res: dict[str, dict] = {}
    plain = LocalRuntime(isolation="none")
    sbx = LocalRuntime()
    try:
        sbx.exec("echo warm")
        res.update(
            interleaved(
                {
                    "baseline: subprocess bash -c echo": lambda: subprocess.run(
                        ["bash", "-c", "echo hi"], capture_output=True, check=True
                    ),
                    "local runtime, isolation=none": lambda: plain.exec("echo hi"),
                    "local bwrap sandbox: start + echo": lambda: sbx.exec("echo hi"),
                },
                n,
                rounds,
            )
        )
    finally:
        plain.close()
        sbx.close()
    if docker_host:
        from envs.runtime.docker import DockerConfig, DockerRuntime, docker_client

        client = docker_client(docker_host)
        rt = DockerRuntime(DockerConfig(docker_host=docker_host), client=client)
        try:
            rt.exec("echo warm")
            res["docker: exec echo in a running container"] = stats(timed(lambda: rt.exec("echo hi"), n))
        finally:
            rt.close()

        def start_exec_remove():
            r = DockerRuntime(DockerConfig(docker_host=docker_host), client=client)
            r.exec("echo hi")
            r.close()

        res["docker: container start + echo + remove"] = stats(timed(start_exec_remove, max(n // 5, 5)))
        client.close()
    return res


def bench_terminal(n: int, runtime: str, options: dict) -> dict[str, dict]:
    """Terminal episode reset: a fresh runtime (a workdir, or a container) plus the task's setup commands."""
    from envs.terminal.env import TerminalEnv

    env = TerminalEnv(runtime=runtime, runtime_options=options, progress_from_tests=False)
    try:
        env.reset(options={"task": "text-count-errors"})  # one setup command
        return {
            f"terminal {runtime}: episode reset (1 setup command)": stats(
                timed(lambda: env.reset(options={"task": "text-count-errors"}), n)
            )
        }
    finally:
        env.close()


def bench_swe(n: int, runtime: str, options: dict, grade_ids: list[str] | None) -> dict[str, dict]:
    from envs.swe.env import SWEEnv
    from envs.swe.grading import repo_spec
    from envs.swe.instances import bundled_instances

    instances = bundled_instances("all")
    env = SWEEnv(runtime=runtime, runtime_options=options)
    res: dict[str, dict] = {}
    try:
        first = instances[0]
        t0 = time.perf_counter()
        env.reset(options={"task": first})  # builds the environment if it is not cached on disk yet
        first_s = time.perf_counter() - t0
        res[f"swe {runtime}: first reset in a fresh process (finds interpreters, loads/builds the environment)"] = {
            "median_ms": 1000 * first_s,
            "p90_ms": 1000 * first_s,
            "n": 1,
        }
        for inst in instances:  # every environment built and loaded before timing
            env.backend.environment(inst, repo_spec(inst))
        resets = timed(lambda: env.reset(options={"task": first}), n)
        res[f"swe {runtime}: episode reset, warm environment"] = stats(resets)
        grades = []
        per_instance = {}
        for inst in instances:
            if grade_ids is not None and inst["instance_id"] not in grade_ids:
                continue
            t0 = time.perf_counter()
            report = env.grade_patch(inst, inst["patch"])
            dt = time.perf_counter() - t0
            assert report["resolved"], f"{inst['instance_id']}: the gold patch did not resolve it"
            grades.append(dt)
            per_instance[inst["instance_id"]] = round(1000 * dt)
        res[f"swe {runtime}: grading per instance (gold patch)"] = {**stats(grades), "per_instance_ms": per_instance}
    finally:
        env.close()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50, help="repetitions of each exec measurement per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the local exec measurements")
    p.add_argument("--swe-n", type=int, default=10, help="repetitions of the SWE reset measurement")
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--no-docker", action="store_true")
    p.add_argument(
        "--docker-grade",
        default="nextstate__textkit-1,nextstate__minicalc-1",
        help="instances graded on docker (comma-separated; 'all' for every one)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    docker_host = None if args.no_docker else args.docker_host
    load = os.getloadavg()
    before = machine_state()
    results = bench_exec(args.n, docker_host, args.rounds)
    results.update(bench_terminal(args.swe_n, "local", {}))
    if docker_host:
        results.update(bench_terminal(max(args.swe_n // 2, 3), "docker", {"docker_host": docker_host}))
    results.update(bench_swe(args.swe_n, "local", {}, None))
    if docker_host:
        ids = None if args.docker_grade == "all" else args.docker_grade.split(",")
        results.update(bench_swe(max(args.swe_n // 2, 3), "docker", {"docker_host": docker_host}, ids))
    base = results["baseline: subprocess bash -c echo"]["median_ms"]
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sandbox timings (load average at start {load[0]:.1f} on {os.cpu_count()} CPUs)")
    for col in ("measurement", "median ms", "p90 ms", "best round median ms", "n", "x baseline"):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    for name, r in results.items():
        ratio = f"{r['median_ms'] / base:.1f}" if "echo" in name else ""
        best = f"{r['best_round_median_ms']:.1f}" if "best_round_median_ms" in r else ""
        table.add_row(name, f"{r['median_ms']:.1f}", f"{r['p90_ms']:.1f}", best, str(r["n"]), ratio)
    Console(width=150).print(table)
    for name, r in results.items():
        if "per_instance_ms" in r:
            print(f"{name}: {r['per_instance_ms']}")
    if args.json:
        command = " ".join(["python benchmarks/sandbox.py", *(sys.argv[1:] if argv is None else argv)])
        args.json.write_text(json.dumps({"command": command, "load_average": load, "machine_before": before,
                                         "machine_after": machine_state(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
