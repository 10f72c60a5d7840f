"""Cost of one python tool call, against the cheapest possible baseline measured in the same run.

    python benchmarks/toolcall_interpreter.py [--calls 200] [--threads 4] [--docker] [--json out.json]

Baseline: `subprocess.run([python, "-I", "-S", "-c", "pass"])` (a bare interpreter start, no limits, no pipes read).
Measured: PythonInterpreter.run("print(1)") in its bubblewrap sandbox (the default) and unsandboxed (`sandbox="none"`,
what the tool did before it had a sandbox: a host temp dir, rlimits, pipes, process-group kill), serial and from threads,
a full ToolCallEnv step (parse + run + render + signals), and with --docker the docker sandbox. The rounds are
interleaved (one call of each kind in turn) so that a shared machine's load hits every kind alike; reports median
milliseconds per call and ratios to the baseline and between the sandboxes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state  # noqa: E402
from envs.toolcall.env import ToolCallEnv  # noqa: E402
from envs.toolcall.interpreter import PythonInterpreter  # noqa: E402


def timed_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def interleaved(cases: dict, n: int) -> dict[str, float]:
    """Median ms per call of each case, the cases taking turns (one warm-up call each first)."""
    for fn in cases.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(n):
        for k, fn in cases.items():
            samples[k].append(timed_ms(fn))
    return {k: statistics.median(v) for k, v in samples.items()}


def threaded_ms(fn, n: int, threads: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: fn(), range(n)))
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--docker", action="store_true", help="also the docker sandbox (needs DOCKER_HOST and its image)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    before = machine_state()
    sandboxed = PythonInterpreter()
    plain = PythonInterpreter(sandbox="none")
    env = ToolCallEnv()
    env.reset(seed=0)
    action = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'

    def env_step():
        if env.step_index >= env.max_steps - 1:
            env.reset(seed=0)
        env.step(action)

    bare = [sys.executable, "-I", "-S", "-c", "pass"]
    cases = {
        "baseline_bare_start": lambda: subprocess.run(bare),
        "run_bwrap": lambda: sandboxed.run("print(1)"),
        "run_unsandboxed": lambda: plain.run("print(1)"),
        "env_step_bwrap": env_step,
    }
    docker = None
    if args.docker:
        docker = PythonInterpreter(sandbox="docker")
        cases["run_docker"] = lambda: docker.run("print(1)")
    med = interleaved(cases, args.calls)
    site = interleaved({"python_with_site_start": lambda: subprocess.run([sys.executable, "-I", "-c", "pass"])},
                       max(args.calls // 8, 5))
    t = args.threads
    report: dict[str, float] = {"calls": args.calls, "loadavg_before": os.getloadavg()[0]}
    report.update({f"{k}_ms": round(v, 2) for k, v in {**med, **site}.items()})
    report[f"baseline_bare_start_{t}_threads_ms_per_call"] = round(threaded_ms(cases["baseline_bare_start"], args.calls, t), 2)
    report[f"run_bwrap_{t}_threads_ms_per_call"] = round(threaded_ms(cases["run_bwrap"], args.calls, t), 2)
    report[f"run_unsandboxed_{t}_threads_ms_per_call"] = round(threaded_ms(cases["run_unsandboxed"], args.calls, t), 2)
    b = med["baseline_bare_start"]
    report["ratio_run_bwrap_to_bare"] = round(med["run_bwrap"] / b, 2)
    report["ratio_run_unsandboxed_to_bare"] = round(med["run_unsandboxed"] / b, 2)
    report["ratio_run_bwrap_to_unsandboxed"] = round(med["run_bwrap"] / med["run_unsandboxed"], 2)
    report["extra_ms_bwrap_over_unsandboxed"] = round(med["run_bwrap"] - med["run_unsandboxed"], 2)
    report["ratio_env_step_to_bare"] = round(med["env_step_bwrap"] / b, 2)
    report["ratio_site_start_to_bare"] = round(site["python_with_site_start"] / b, 2)
    if docker is not None:
        report["ratio_run_docker_to_bwrap"] = round(med["run_docker"] / med["run_bwrap"], 2)
    report["loadavg_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))
    env.close()
    for i in (sandboxed, plain, docker):
        if i is not None:
            i.close()
    if args.json:
        out = {"command": " ".join(["python benchmarks/toolcall_interpreter.py", *sys.argv[1:]]), **report,
               "machine_before": before, "machine_after": machine_state()}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
