"""Benchmark: what the isolated verification of a task directory costs as the agent writes more.

    python benchmarks/verify_snapshot.py [--task envs/terminal/task_dirs/harbor/count-log-levels --format harbor]
                                         [--backends local docker] [--sizes-mib 0 10 100] [--rounds 3] [--json out.json]

The verifier never runs in the agent's sandbox: it takes a snapshot of the agent's files into a fresh sandbox (locally
the overlay's upper layer copied into a layer over the same root; on docker a `docker commit` and a new container).
That copy grows with what the agent wrote, so for each size S (MiB, written as S files of 1 MiB plus 1000 small files
when S > 0) this times `env.verify()` after the agent wrote S, against S = 0 (the baseline) measured in the same
rounds, interleaved. The task's tests themselves are the same in every case.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import save_report  # noqa: E402
from envs.terminal.env import TerminalEnv  # noqa: E402
from envs.terminal.task_dirs import read_task_dir  # noqa: E402


def one(task: dict, backend: str, options: dict, size_mib: int) -> float:
    env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=options, progress_from_tests=False)
    try:
        env.reset(options={"task": task["id"]})
        if size_mib:
            r = env.runtime.exec(f"mkdir -p /var/tmp/agent && cd /var/tmp/agent && for i in $(seq {size_mib}); do "
                                 "head -c 1048576 /dev/urandom > big$i; done && for i in $(seq 1000); do "
                                 "echo $i > small$i; done", timeout=300)
            assert r.ok, r.stderr
        t0 = time.monotonic()
        env.verify()
        return time.monotonic() - t0
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", type=Path, default=Path("envs/terminal/task_dirs/harbor/count-log-levels"))
    p.add_argument("--format", default="harbor", choices=["harbor", "terminal_bench"])
    p.add_argument("--backends", nargs="+", default=["local"], choices=["local", "docker"])
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--sizes-mib", nargs="+", type=int, default=[0, 10, 100])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    task = read_task_dir(args.task, args.format)
    sizes = sorted(set([0, *args.sizes_mib]))
    load_start = os.getloadavg()
    times: dict[str, dict[int, list[float]]] = {b: {s: [] for s in sizes} for b in args.backends}
    for backend in args.backends:
        options = {"docker_host": args.docker_host} if backend == "docker" and args.docker_host else {}
        one(task, backend, options, 0)  # builds, unpacks, imports: not timed
        for _ in range(args.rounds):
            for size in sizes:
                times[backend][size].append(one(task, backend, options, size))
    results = {}
    for backend, by_size in times.items():
        base = statistics.median(by_size[0])
        results[backend] = {str(s): {"verify_s_median": round(statistics.median(v), 3),
                                     "vs_nothing_written": round(statistics.median(v) / base, 2), "runs": len(v)}
                            for s, v in by_size.items()}
    report = {"command": "python benchmarks/verify_snapshot.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_start": load_start,
                          "load_avg_end": os.getloadavg()},
              "task": task["id"], "results": results}
    save_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
