"""Cost of one python tool call, against the cheapest possible baseline measured in the same run.

    python benchmarks/toolcall_interpreter.py [--calls 200] [--threads 4] [--json out.json]

Baseline: `subprocess.run([python, "-I", "-S", "-c", "pass"])` (a bare interpreter start, no limits, no pipes read).
Measured: PythonInterpreter.run("print(1)") (temp dir, rlimits, pipes, process-group kill), serial and from threads,
and a full ToolCallEnv step (parse + run + render + signals). Reports milliseconds per call and ratios to the baseline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state  # noqa: E402
from envs.toolcall.env import ToolCallEnv  # noqa: E402
from envs.toolcall.interpreter import PythonInterpreter  # noqa: E402


def per_call_ms(fn, n: int) -> float:
    fn()  # warm up
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1000


def threaded_ms(fn, n: int, threads: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: fn(), range(n)))
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    before = machine_state()
    interp = PythonInterpreter()
    env = ToolCallEnv()
    env.reset(seed=0)
    action = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'

    def env_step():
        if env.step_index >= env.max_steps - 1:
            env.reset(seed=0)
        env.step(action)

    bare = per_call_ms(lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"]), args.calls)
    site = per_call_ms(lambda: subprocess.run([sys.executable, "-I", "-c", "pass"]), args.calls // 4)
    run = per_call_ms(lambda: interp.run("print(1)"), args.calls)
    step = per_call_ms(env_step, args.calls)
    bare_threads = threaded_ms(
        lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"]), args.calls, args.threads
    )
    run_threads = threaded_ms(lambda: interp.run("print(1)"), args.calls, args.threads)
    report = {
        "calls": args.calls,
        "baseline_bare_start_ms": round(bare, 2),
        "python_with_site_start_ms": round(site, 2),
        "interpreter_run_ms": round(run, 2),
        "env_step_ms": round(step, 2),
        f"baseline_bare_start_{args.threads}_threads_ms_per_call": round(bare_threads, 2),
        f"interpreter_run_{args.threads}_threads_ms_per_call": round(run_threads, 2),
        "ratio_run_to_bare": round(run / bare, 2),
        "ratio_site_start_to_bare": round(site / bare, 2),
        "ratio_env_step_to_bare": round(step / bare, 2),
    }
    print(json.dumps(report, indent=2))
    env.close()
    if args.json:
        out = {"command": " ".join(["python benchmarks/toolcall_interpreter.py", *sys.argv[1:]]), **report,
               "machine_before": before, "machine_after": machine_state()}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
