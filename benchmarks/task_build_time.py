"""Benchmark: a task environment's build time, this checkout's builder against a baseline checkout's, interleaved.

    python benchmarks/task_build_time.py --baseline /path/to/other/checkout [--rounds 3] [--json out.json]
                                         [--tasks DIR ...] [--heavy]

Each task directory (default: the bundled Harbor and Terminal-Bench ones; `--heavy` adds one of our own that installs
numpy, pandas and scipy from PyPI and a compiler from Debian) is built by each checkout's `build_task_environment` in
a subprocess of its own (`PYTHONPATH` = that checkout), with a cache folder per checkout: one untimed build first
(the bases, and whatever a builder prepares once per base), then `--rounds` timed rounds, the two checkouts
alternating within a round so that load on the machine falls on both alike. A round removes the built tarball before
building again. Reported: each build's `build_s` (the builder's own timing) and its wall time, medians per task and
checkout, and this checkout's median over the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "envs" / "terminal" / "task_dirs"
HEAVY_DOCKERFILE = """FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev make && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir numpy==2.2.6 pandas==2.2.3 scipy==1.15.3
WORKDIR /app
COPY service.log /app/service.log
"""
BUILD = """
import json, sys, time
from envs.terminal.task_dirs import read_task_dir
from envs.terminal.task_image import build_task_environment
t0 = time.monotonic()
built = build_task_environment(read_task_dir(sys.argv[1], sys.argv[2]))
print(json.dumps({"build_s": built.build_s, "wall_s": round(time.monotonic() - t0, 2), "tarball": built.tarball,
                  "size_mib": round(built.size_bytes / 2**20, 1)}))
"""


def heavy_task(where: Path) -> Path:
    """Our own Harbor task (the bundled count-log-levels with a Dockerfile that installs a scientific stack)."""
    import shutil

    d = where / "heavy-scientific-stack"
    shutil.copytree(BUNDLED / "harbor" / "count-log-levels", d)
    (d / "environment" / "Dockerfile").write_text(HEAVY_DOCKERFILE)
    return d


def build(checkout: Path, cache: Path, task_dir: Path, fmt: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "NEXTSTATE_TASK_ENV_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-c", BUILD, str(task_dir), fmt], cwd=checkout, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    Path(out.pop("tarball")).unlink()  # the next round builds again
    for meta in cache.glob("*.json"):
        meta.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="another checkout of this repository (e.g. main)")
    p.add_argument("--tasks", type=Path, nargs="*", default=None, help="task directories (default: the bundled ones)")
    p.add_argument("--heavy", action="store_true", help="add our own task that installs numpy, pandas, scipy")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="nextstate-build-time-", dir=os.environ.get("TMPDIR")))
    os.chmod(work, 0o755)  # the sandboxes' uids pass through the caches below
    dirs = args.tasks or sorted(d for fmt in ("harbor", "terminal_bench") for d in (BUNDLED / fmt).iterdir())
    tasks = [(d, "harbor" if (d / "task.toml").exists() else "terminal_bench") for d in dirs]
    if args.heavy:
        tasks.append((heavy_task(work), "harbor"))
    checkouts = {"this": REPO, "baseline": args.baseline.resolve()}
    caches = {name: work / f"cache-{name}" for name in checkouts}
    rows = []
    for task_dir, fmt in tasks:
        row: dict = {"task": task_dir.name, "format": fmt, "warmup": {}, "rounds": {n: [] for n in checkouts}}
        for name, checkout in checkouts.items():
            row["warmup"][name] = build(checkout, caches[name], task_dir, fmt)
        for _ in range(args.rounds):
            for name, checkout in checkouts.items():
                row["rounds"][name].append(build(checkout, caches[name], task_dir, fmt))
        timed = {n: [r["build_s"] for r in rs if "build_s" in r] for n, rs in row["rounds"].items()}
        row["median_build_s"] = {n: statistics.median(v) if v else None for n, v in timed.items()}
        if all(row["median_build_s"].values()):
            row["ratio"] = round(row["median_build_s"]["this"] / row["median_build_s"]["baseline"], 2)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("task", "median_build_s") if k in row} | {"ratio": row.get("ratio")}),
              flush=True)
    report = {"command": "python benchmarks/task_build_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"cpus": os.cpu_count(), "load_avg_end": os.getloadavg()}, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
