"""Stress: kill the experiment driver at many moments and check that none of its processes outlives it.

    python -m benchmarks.kill_experiment --trials 20 [--signal KILL|TERM] [--burn 2] [--at 0:60] [--deadline 150]

Each trial launches the CI-sized Table 4 tool-call experiment of tests/test_table4_experiments.py (2 workers, a tuning
stage, an SFT start), polls its process tree every 50 ms (every descendant ever seen, by pid and start time), kills the
driver at a random moment in `--at` seconds after its start (or after the first appearance of a file, `--at-file GLOB`),
and then waits for every descendant seen to be gone. A descendant alive `--deadline` s after the kill (the test's
120 s) is a failure; its Python stack (py-spy dump, when installed) is printed. Per trial: the phase the kill hit (the
files the experiment had written), how many processes there were, and the slowest one's time to go.

`--burn N` runs N CPU burners (`while True: pass`) alongside, as the full suite loads the machine; they are stopped
by pid at the end. Not part of the suite (minutes per trial); tests/test_experiment_kill.py checks the cause found
with it deterministically.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout's packages and tests/, also when run as a file

from tests.experiment_smoke import TOOLCALL_SMOKE  # noqa: E402


def phase(out: Path) -> str:
    """What the experiment had written: the last of starts, tune runs, table runs, report."""
    if (out / "report.md").exists():
        return "report"
    runs = [p for p in out.glob("**/run.log") if "tune" not in p.parts]
    if runs:
        return f"table({len(runs)} run.log)"
    tune = list(out.glob("tune/**/run.log"))
    if tune:
        return f"tune({len(tune)} run.log)"
    if list(out.glob("starts/*.log")):
        return "sft-start"
    if (out / "experiment.json").exists():
        return "planned"
    return "startup"


def key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return None


def alive(k: tuple[int, float]) -> bool:
    try:
        p = psutil.Process(k[0])
        return p.create_time() == k[1] and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def describe(k: tuple[int, float]) -> str:
    try:
        p = psutil.Process(k[0])
        return f"pid {k[0]} ppid {p.ppid()} {p.status()} {' '.join(p.cmdline())[:160]}"
    except psutil.Error:
        return f"pid {k[0]} (gone)"


def trial(n: int, args: argparse.Namespace, rng: random.Random) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="ns-kill-"))
    out = tmp / "exp"
    cmd = [sys.executable, "-m", "rollout.launch", *TOOLCALL_SMOKE, f"run.out_dir={out}",
           f"policy.warm_start.cache_dir={tmp / 'cache'}"]
    lo, hi = args.at
    at = rng.uniform(lo, hi)
    t0 = time.monotonic()
    driver = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(tmp / "driver.log", "wb"))
    root = psutil.Process(driver.pid)
    seen: dict[tuple[int, float], str] = {}

    def poll() -> None:
        try:
            kids = root.children(recursive=True)
        except psutil.Error:
            kids = []
        for c in kids:
            k = key(c)
            if k is not None and k not in seen:
                try:
                    seen[k] = " ".join(c.cmdline())[:120]
                except psutil.Error:
                    seen[k] = "?"

    killed_at = None
    base = None if args.at_file else 0.0  # --at counts from the driver's start, or from the file's appearance
    while driver.poll() is None:
        poll()
        now = time.monotonic() - t0
        if base is None and list(out.glob(args.at_file)):
            base = now
        if base is not None and now >= base + at:
            ph = phase(out)
            poll()
            driver.send_signal(getattr(signal, f"SIG{args.signal}"))
            killed_at = time.monotonic()
            break
        time.sleep(0.05)
    if killed_at is None:
        res = {"trial": n, "at": round(at, 1), "phase": "finished before the kill", "rc": driver.returncode}
        shutil.rmtree(tmp, ignore_errors=True)
        return res
    driver.wait()
    # after the kill: the descendants seen, and any they start while unwinding (re-parented: follow them by pid)
    gone: dict[tuple[int, float], float] = {}
    survivors: list[tuple[int, float]] = []
    dumped = False
    while True:
        if not dumped and time.monotonic() - killed_at > args.dump_after:
            dumped = True
            for k in [k for k in seen if k not in gone and alive(k)]:
                if "resource_tracker" not in seen[k] and shutil.which("py-spy"):
                    dump = subprocess.run(["py-spy", "dump", "--pid", str(k[0])], capture_output=True, text=True)
                    print(f"--- trial {n}: {args.dump_after:g} s after the kill, py-spy dump of {describe(k)}\n"
                          f"{dump.stdout}{dump.stderr}", file=sys.stderr, flush=True)
        for k in list(seen):
            if k in gone:
                continue
            if not alive(k):
                gone[k] = time.monotonic() - killed_at
            else:
                try:
                    for c in psutil.Process(k[0]).children(recursive=True):
                        ck = key(c)
                        if ck is not None and ck not in seen:
                            seen[ck] = " ".join(c.cmdline())[:120]
                except psutil.Error:
                    pass
        left = [k for k in seen if k not in gone]
        if not left:
            break
        if time.monotonic() - killed_at > args.deadline:
            survivors = left
            break
        time.sleep(0.1)
    res = {"trial": n, "at": round(killed_at - t0, 1), "phase": ph,
           "procs": len(seen), "slowest_s": round(max(gone.values(), default=0.0), 1),
           "slowest": seen[max(gone, key=gone.get)][:80] if gone else "", "left": len(survivors),
           "to_go_s": sorted((round(t, 1) for t in gone.values()), reverse=True)[:4]}
    if survivors:
        res["survivors"] = [describe(k) for k in survivors]
        for k in survivors:
            if shutil.which("py-spy"):
                dump = subprocess.run(["py-spy", "dump", "--pid", str(k[0])], capture_output=True, text=True)
                print(f"--- py-spy dump of {describe(k)}\n{dump.stdout}{dump.stderr}", file=sys.stderr)
            try:
                psutil.Process(k[0]).kill()
            except psutil.Error:
                pass
    if not survivors and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        res["dir"] = str(tmp)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--signal", default="KILL", choices=["KILL", "TERM", "INT"])
    ap.add_argument("--at", type=lambda s: tuple(float(x) for x in s.split(":")), default=(0.0, 90.0),
                    help="kill at a uniform random time in LO:HI seconds after the driver's start")
    ap.add_argument("--at-file", default=None, help="--at counts from the first appearance of this glob under the out dir")
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--slow", type=float, default=10.0, help="count the kills after which a process lived this long")
    ap.add_argument("--dump-after", type=float, default=15.0, help="py-spy dump what is still alive this long after")
    ap.add_argument("--burn", type=int, default=0, help="CPU burners alongside")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep every trial's directory")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)]
    results = []
    try:
        for n in range(args.trials):
            res = trial(n, args, rng)
            results.append(res)
            print(json.dumps(res), flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    killed = [r for r in results if "procs" in r]
    bad = [r for r in killed if r["left"]]
    slow = [r for r in killed if r["slowest_s"] > args.slow]
    print(f"{len(bad)} of {len(killed)} kills left a process behind {args.deadline:g} s after the kill; {len(slow)} had "
          f"one alive more than {args.slow:g} s; slowest to go: {max((r['slowest_s'] for r in killed), default=0)} s"
          f" ({len(results) - len(killed)} experiments finished before their kill)", flush=True)


if __name__ == "__main__":
    main()
