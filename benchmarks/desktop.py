"""Benchmark: many local desktops at once, against OSWorld's way of doing the same thing, measured in the same run.

    python benchmarks/desktop.py [--desktops 16] [--actions 20] [--screenshots 20] [--isolation sandbox,none]
                                 [--docker] [--json out.json]

`--isolation` lists the local backend's isolations to measure one after the other in this run (default: both, the
sandbox, then unsandboxed as before it existed; `sandbox-same-root` is the sandbox with fresh_root_per_episode=false),
with the ratios to the last one at the end. OSWorld's ways run where the desktop's own processes run (in its sandbox,
with the sandbox's python3, when it has one).

With N desktops running at once (each a GUIEnv on its own Xvfb display, all driven concurrently from threads):
- start: a desktop from nothing (Xvfb + session bus + AT-SPI bus + action worker + a11y worker)
- reset: `env.reset()` on a bundled task (kill the last episode's processes, fresh HOME, launch the app, wait for its
  window and a11y tree, settle, observe), against a fresh desktop per reset (start + reset, then close)
- screenshot: ours (PIL ImageGrab of the display, to an array) vs OSWorld's server path (`pyautogui.screenshot()` then
  PNG encoding, the body of its /screenshot route, timed inside a long-lived process on the same display; the route's
  cursor overlay and file write are left out, so a lower bound of its cost)
- action: ours (pyautogui in the long-lived worker, one JSON round trip) vs OSWorld's (`python -c "import pyautogui;
  import time; pyautogui.FAILSAFE = False; <code>"`, a new interpreter per action, as its /execute runs it)
- a11y: the AT-SPI tree dump of our long-lived worker vs OSWorld's /accessibility walk, also in a long-lived process
  (benchmarks/osworld_a11y.py: the same per-node queries as that route, a thread per application; without the
  `libreoffice --version` the route also runs per call, so a lower bound of its cost), interleaved
- step: a full `env.step()` (action, settle, screenshot, a11y tree, window list, milestone checks)
- memory: PSS of every process of a desktop (X server, buses, workers, the task's app)
With --docker, one desktop in the guest container is measured through OSWorld's HTTP API as well.
All latencies are medians (p90 in brackets) over all desktops; ratios compare the two approaches within this run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state
from envs.gui.env import GUIEnv
from envs.runtime.osworld import PKGS_PREFIX

TASK = "ns-form-name-alice"
OSWORLD_SCREENSHOT = (
    "import io,sys,time,pyautogui\n"
    "for line in sys.stdin:\n"
    "    t=time.perf_counter(); img=pyautogui.screenshot(); buf=io.BytesIO(); img.save(buf, format='PNG')\n"
    "    print(time.perf_counter()-t, flush=True)\n"
)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(xs) * 1000, "p90_ms": pct(xs, 0.9) * 1000, "n": len(xs)}


def fmt(s: dict[str, float]) -> str:
    return f"{s['median_ms']:8.1f} ms [{s['p90_ms']:7.1f}]"


def timed(fn, *a, **kw) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t, out


def process_names(pids: list[int]) -> dict[int, str]:
    names = {}
    for p in pids:
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            exe = os.path.basename(argv[0].decode())
            script = next((os.path.basename(a.decode()) for a in argv[1:] if a.endswith(b".py")), "")
            names[p] = f"{exe} {script}".strip()
        except OSError:
            pass
    return names


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def bench_desktop(env: GUIEnv, n_actions: int, n_shots: int, sizes: dict[str, list[int]]) -> dict[str, list[float]]:
    """All per-desktop latencies on one env (already reset on TASK); the a11y documents' sizes go to `sizes`."""
    d = env.desktop
    out: dict[str, list[float]] = defaultdict(list)
    # OSWorld's /screenshot body, in a long-lived process on this display (its server is long-lived too), interleaved
    env_vars = d._task_env()
    python = d.place.worker_python

    def inside(argv: list[str]) -> list[str]:
        return list(d.place.argv(argv)[0])

    proc = subprocess.Popen(
        inside([python, "-c", OSWORLD_SCREENSHOT]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_vars,
    )
    try:
        for _ in range(n_shots):
            out["shot_ours"].append(timed(d.screenshot)[0])
            proc.stdin.write("\n")
            proc.stdin.flush()
            out["shot_osworld"].append(float(proc.stdout.readline()))
    finally:
        proc.stdin.close()
        proc.wait()
    for i in range(n_actions):
        code = f"pyautogui.moveTo({600 + i}, {400 + i})"
        out["act_ours"].append(timed(d.act, code)[0])
        # the interpreter binary itself (not a pyenv shim): the baseline pays only what OSWorld's /execute pays
        argv = inside([python, "-c", PKGS_PREFIX.format(command=code)])
        out["act_osworld"].append(timed(subprocess.run, argv, env=env_vars, capture_output=True, check=True)[0])
    # OSWorld's /accessibility walks the tree in its long-lived server process: the same in benchmarks/osworld_a11y.py,
    # interleaved with ours; both timed from here, the XML included (ours travels as JSON over a pipe too)
    gi = d.place.gi_python or "/usr/bin/python3"
    script = d.place.path(str(Path(__file__).resolve().parent / "osworld_a11y.py"))
    baseline = subprocess.Popen(inside([gi, "-P", script]),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env_vars)

    def osworld_dump() -> str:
        baseline.stdin.write("\n")
        baseline.stdin.flush()
        return json.loads(baseline.stdout.readline())["xml"]

    try:
        osworld_dump()  # its first dump connects to AT-SPI; the route's server did that long before
        for _ in range(max(3, n_shots // 4)):
            t_ours, xml_ours = timed(d.a11y_tree)
            t_osworld, xml_osworld = timed(osworld_dump)
            out["a11y_ours"].append(t_ours)
            out["a11y_osworld"].append(t_osworld)
        sizes["a11y_ours_xml_chars"].append(len(xml_ours))
        sizes["a11y_osworld_xml_chars"].append(len(xml_osworld))
    finally:
        baseline.stdin.close()
        baseline.wait()
    name = next(e for e in env.current_elements()[0] if e.name == "Name" and e.role == "text")
    x, y = name.center
    for i in range(max(3, n_actions // 4)):
        action = f"pyautogui.click({x}, {y})" if i % 2 == 0 else "pyautogui.moveTo(700, 500)"
        out["step"].append(timed(env.step, action)[0])
    return out


MODES = {  # --isolation names -> GUIEnv options
    "sandbox": {"isolation": "sandbox"},
    "sandbox-same-root": {"isolation": "sandbox", "fresh_root_per_episode": False},
    "none": {"isolation": "none"},
}


def measure_local(mode: str, args) -> dict[str, object]:
    n = args.desktops
    opts = MODES[mode]
    results: dict[str, object] = {"loadavg_before": os.getloadavg()}
    envs = [GUIEnv(max_steps=10_000, **opts) for _ in range(n)]
    pool = ThreadPoolExecutor(n)
    try:
        t0 = time.perf_counter()
        first = list(pool.map(lambda e: timed(e.reset, options={"task": TASK})[0], envs))
        results["start_and_first_reset_wall_s"] = time.perf_counter() - t0
        results["start_and_first_reset"] = summary(first)
        resets = list(pool.map(lambda e: [timed(e.reset, options={"task": TASK})[0] for _ in range(args.resets)], envs))
        results["reset"] = summary([x for r in resets for x in r])

        # memory while all N desktops show the task's app (after a reset)
        per_desktop, by_proc = [], defaultdict(float)
        for e in envs:
            pids = e.desktop.pids()
            names = process_names(pids)
            total = 0
            for pid in pids:
                kib = pss_kib(pid)
                total += kib
                by_proc[names.get(pid, "?")] += kib / n  # summed within a desktop, averaged over desktops
            per_desktop.append(total)
        results["memory_per_desktop_mib"] = statistics.mean(per_desktop) / 1024
        results["memory_total_mib"] = sum(per_desktop) / 1024
        results["memory_by_process_mib"] = {k: round(v / 1024, 1) for k, v in sorted(by_proc.items())}

        sizes: dict[str, list[int]] = defaultdict(list)
        per = list(pool.map(lambda e: bench_desktop(e, args.actions, args.screenshots, sizes), envs))
        merged: dict[str, list[float]] = defaultdict(list)
        for d in per:
            for k, v in d.items():
                merged[k].extend(v)
        for k, v in merged.items():
            results[k] = summary(v)
        for k, v in sizes.items():  # the two dumps describe the same tree: their sizes should be close
            results[k] = statistics.median(v)
    finally:
        list(pool.map(lambda e: e.close(), envs))
        pool.shutdown()

    # a new desktop per reset (the alternative to reusing one), measured with the same concurrency
    def fresh(_: int) -> float:
        t = time.perf_counter()
        e = GUIEnv(**opts)
        try:
            e.reset(options={"task": TASK})
        finally:
            e.close()
        return time.perf_counter() - t

    with ThreadPoolExecutor(n) as pool2:
        results["reset_fresh_desktop"] = summary(list(pool2.map(fresh, range(n))))
    results["loadavg_after"] = os.getloadavg()
    return results


def report_local(mode: str, r: dict, n: int) -> None:
    print(f"\n== local backend, {mode} ==")
    print(
        f"machine load average before/after: {r['loadavg_before'][0]:.1f} / {r['loadavg_after'][0]:.1f} "
        "(a shared machine: other users' work is in these numbers)"
    )
    print(
        f"start + first reset, {n} at once: wall {r['start_and_first_reset_wall_s']:.1f} s; per desktop "
        f"{fmt(r['start_and_first_reset'])}"
    )
    print(f"reset (env.reset, this mode)    {fmt(r['reset'])}")
    print(
        f"reset (new desktop each time)   {fmt(r['reset_fresh_desktop'])}   "
        f"ratio {r['reset_fresh_desktop']['median_ms'] / r['reset']['median_ms']:.1f}x"
    )
    print(f"screenshot ours                 {fmt(r['shot_ours'])}")
    print(
        f"screenshot OSWorld (pyautogui+PNG) {fmt(r['shot_osworld'])}   "
        f"ratio {r['shot_osworld']['median_ms'] / r['shot_ours']['median_ms']:.1f}x"
    )
    print(f"action ours (long-lived worker) {fmt(r['act_ours'])}")
    print(
        f"action OSWorld (python -c each) {fmt(r['act_osworld'])}   "
        f"ratio {r['act_osworld']['median_ms'] / r['act_ours']['median_ms']:.1f}x"
    )
    print(f"a11y tree ours (worker)         {fmt(r['a11y_ours'])}")
    print(
        f"a11y tree OSWorld-style walk     {fmt(r['a11y_osworld'])}   "
        f"ratio {r['a11y_osworld']['median_ms'] / r['a11y_ours']['median_ms']:.1f}x   (XML {r['a11y_osworld_xml_chars']:.0f}"
        f" vs our {r['a11y_ours_xml_chars']:.0f} characters)"
    )
    print(f"env.step (act+settle+observe)   {fmt(r['step'])}")
    print(
        f"memory per desktop (PSS)        {r['memory_per_desktop_mib']:.1f} MiB  (all {n}: {r['memory_total_mib']:.0f} MiB)"
    )
    for name, mib in r["memory_by_process_mib"].items():
        print(f"    {name:40s} {mib:6.1f} MiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--desktops", type=int, default=16)
    p.add_argument("--actions", type=int, default=20)
    p.add_argument("--screenshots", type=int, default=20)
    p.add_argument("--resets", type=int, default=3, help="resets per desktop (after the first)")
    p.add_argument("--isolation", default="sandbox,none", help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--docker", action="store_true", help="also measure one desktop in the guest container")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    modes = [m.strip() for m in args.isolation.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--isolation {args.isolation!r}: choose from {', '.join(MODES)}")
    n = args.desktops
    results: dict[str, object] = {
        "desktops": n,
        "cpus": os.cpu_count(),
        "task": TASK,
        "command": " ".join(["python benchmarks/desktop.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine_before": machine_state(),
    }
    print(f"{n} desktops at once on {os.cpu_count()} CPUs; task {TASK}; modes {', '.join(modes)}")
    for mode in modes:
        results[mode] = measure_local(mode, args)
        report_local(mode, results[mode], n)
    if len(modes) > 1:
        base = results[modes[-1]]
        print(f"\n== ratios to {modes[-1]} (same run) ==")
        for mode in modes[:-1]:
            r = results[mode]
            keys = ("start_and_first_reset", "reset", "reset_fresh_desktop", "shot_ours", "act_ours", "a11y_ours", "step")
            row = {k: r[k]["median_ms"] / base[k]["median_ms"] for k in keys}
            row["memory_per_desktop"] = r["memory_per_desktop_mib"] / base["memory_per_desktop_mib"]
            results[f"ratio_{mode}_to_{modes[-1]}"] = row
            print(f"{mode}: " + ", ".join(f"{k} {v:.2f}x" for k, v in row.items()))
    if args.docker:
        results["docker_guest"] = dg = bench_docker(args)
        print("\ndocker guest through OSWorld's HTTP API (1 desktop):")
        for k in ("start", "reset", "reset_fresh_container", "screenshot", "action", "a11y", "step"):
            print(f"    {k:12s} {fmt(dg[k])}")
        print(f"    memory       {dg['memory_mib']:.1f} MiB (container cgroup)")
    results["machine_after"] = machine_state()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def bench_docker(args) -> dict[str, object]:
    host = os.environ.get("DOCKER_HOST")
    if not host:
        from envs.runtime.dockerd import DockerDaemon

        host = DockerDaemon().start()
    t, env = timed(GUIEnv, backend="docker", docker_host=host, docker_fresh_container=False, max_steps=10_000)
    out: dict[str, object] = {}
    try:
        start, _ = timed(env.reset, options={"task": TASK})
        out["start"] = summary([start])
        out["reset"] = summary([timed(env.reset, options={"task": TASK})[0] for _ in range(args.resets)])
        d = env.desktop
        out["screenshot"] = summary([timed(d.screenshot)[0] for _ in range(args.screenshots)])
        out["action"] = summary([timed(d.act, f"pyautogui.moveTo({600 + i}, 400)")[0] for i in range(args.actions)])
        out["a11y"] = summary([timed(d.a11y_tree)[0] for _ in range(5)])
        out["step"] = summary([timed(env.step, "pyautogui.moveTo(700, 500)")[0] for _ in range(5)])
        out["memory_mib"] = d.memory_kib() / 1024
    finally:
        env.close()
    # the default (docker_fresh_container=true): every reset after the first starts a new container
    env = GUIEnv(backend="docker", docker_host=host, max_steps=10_000)
    try:
        env.reset(options={"task": TASK})
        out["reset_fresh_container"] = summary([timed(env.reset, options={"task": TASK})[0] for _ in range(args.resets)])
    finally:
        env.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
