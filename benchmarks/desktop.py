"""Benchmark: many local desktops at once, against OSWorld's way of doing the same thing, measured in the same run.

    python benchmarks/desktop.py [--desktops 16] [--actions 20] [--screenshots 20] [--isolation sandbox,none]
                                 [--docker] [--json out.json]
    python benchmarks/desktop.py --apps calc writer impress gimp vlc thunderbird chromium [--desktops 4] [--resets 2]
                                 [--json out.json]

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

With --apps, the run measures the applications of OSWorld's domains instead, one arm after the other, each on N
sandboxed desktops at once, after a baseline arm (the sign-up form task, the desktop the figures above were measured
on) in the same run: each desktop opens the app (with a small generated document, image, video or page where it takes
one, copied in by the task's setup as OSWorld's tasks do), the reset waits for its window, then memory is read once the
app has settled (its desktop's PSS steady): PSS and USS of every process of the sandbox (its pid namespace) and what its
throwaway root and /tmp hold (tmpfs: memory too); then `--resets` more resets with the app (a new sandbox each: the
default fresh_root_per_episode), timed.
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
from envs.runtime.owned import process_tree_pss_kib

#: the app arms: what each desktop opens (the file made by `make_app_files`, in ~/Desktop), and the window title that
#: says it is up. Launched as OSWorld's tasks launch them, with the flags that skip first-run dialogs.
APPS = {
    "calc": {"file": "sheet.xlsx", "command": ["libreoffice", "--calc", "--norestore"], "window": "LibreOffice Calc"},
    "writer": {"file": "report.docx", "command": ["libreoffice", "--writer", "--norestore"],
               "window": "LibreOffice Writer"},
    "impress": {"file": "slides.pptx", "command": ["libreoffice", "--impress", "--norestore"],
                "window": "LibreOffice Impress"},
    "gimp": {"file": "photo.png", "command": ["gimp", "--no-splash"], "window": "GIMP"},
    "vlc": {"file": "clip.y4m", "command": ["vlc", "--no-audio", "--no-video-title-show", "--loop",
                                            "--no-qt-privacy-ask"], "window": "VLC media player"},
    "thunderbird": {"file": None, "command": ["thunderbird"], "window": "Thunderbird"},
    "chromium": {"file": "page.html", "command": ["chromium", "--no-first-run", "--no-default-browser-check",
                                                  "--password-store=basic"], "window": "Chromium"},
}


def make_app_files(out: Path) -> dict[str, Path]:
    """The small documents the app arms open, generated here (nothing downloaded): a sheet, a report, slides, a photo,
    a 4-second video (raw YUV4MPEG2: VLC demuxes it without a codec library) and a page."""
    import numpy as np
    import openpyxl
    from docx import Document
    from PIL import Image
    from pptx import Presentation

    out.mkdir(parents=True, exist_ok=True)
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["Region", "Q1", "Q2", "Q3", "Q4", "Total"])
    for i in range(2, 42):
        ws.append([f"Region {i - 1}", *[(i * 37 + q * 11) % 500 for q in range(4)], f"=SUM(B{i}:E{i})"])
    wb.save(out / "sheet.xlsx")
    doc = Document()
    doc.add_heading("Quarterly report", 0)
    for i in range(12):
        doc.add_paragraph(f"Section {i + 1}. " + "Sales grew in every region this quarter. " * 8)
    doc.save(out / "report.docx")
    prs = Presentation()
    for i in range(5):
        slide = prs.slides.add_slide(prs.slide_layouts[1])
        slide.shapes.title.text = f"Slide {i + 1}"
        slide.placeholders[1].text = "First point\nSecond point\nThird point"
    prs.save(out / "slides.pptx")
    y, x = np.mgrid[0:600, 0:800]
    Image.fromarray(np.stack([x * 255 // 800, y * 255 // 600, (x + y) * 255 // 1400], -1).astype(np.uint8)).save(
        out / "photo.png")
    w, h, frames = 320, 240, 100  # 4 s at 25 fps
    with open(out / "clip.y4m", "wb") as f:
        f.write(f"YUV4MPEG2 W{w} H{h} F25:1 Ip A1:1 C420jpeg\n".encode())
        for t in range(frames):
            luma = ((np.arange(w)[None, :] + 3 * t + np.arange(h)[:, None]) % 256).astype(np.uint8)
            f.write(b"FRAME\n" + luma.tobytes() + np.full(w * h // 2, 128, np.uint8).tobytes())
    (out / "page.html").write_text("<!doctype html><title>Benchmark page</title><h1>Benchmark page</h1>"
                                   + "<p>Some text on a local page.</p>" * 50)
    return {name: out / spec["file"] for name, spec in APPS.items() if spec["file"]}


def app_task(app: str, files: dict[str, Path]) -> dict:
    """An OSWorld-format task that opens `app` (and its file, copied to ~/Desktop by a download step)."""
    spec = APPS[app]
    config, command = [], list(spec["command"])
    if spec["file"]:
        guest = f"/home/user/Desktop/{spec['file']}"
        config.append({"type": "download", "parameters": {"files": [{"url": files[app].as_uri(), "path": guest}]}})
        command.append(guest)
    config.append({"type": "launch", "parameters": {"command": command}})
    return {"id": f"bench-app-{app}", "instruction": f"(benchmark) {app} is open.", "config": config,
            "evaluator": {"func": "infeasible"}, "nextstate": {"ready": {"window": spec["window"]}}}

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
            argv = Path(f"/proc/{p}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            if len(argv) == 1 and b" " in argv[0]:  # a process that rewrote its title (Chromium's): the kernel's name
                names[p] = Path(f"/proc/{p}/comm").read_text().strip()
                continue
            exe = os.path.basename(argv[0].decode())
            script = next((os.path.basename(a.decode()) for a in argv[1:] if a.endswith(b".py")), "")
            names[p] = f"{exe} {script}".strip()
        except OSError:
            pass
    return names


def smaps_kib(pid: int) -> dict[str, int]:
    """Pss, Uss (Private_Clean + Private_Dirty) and Rss of one process, in KiB (zeros for a process that is gone)."""
    got = {"pss": 0, "uss": 0, "rss": 0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Pss", "Rss"):
                got[key.lower()] = int(rest.split()[0])
            elif key in ("Private_Clean", "Private_Dirty"):
                got["uss"] += int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return got


def desktop_memory(env: GUIEnv) -> dict[str, object]:
    """One sandboxed desktop's memory: PSS / USS / RSS summed over every process of its sandbox, per process name, and
    the bytes its tmpfs mounts hold (the throwaway root's upper layer, /tmp, /dev/shm: memory too; pages of them a
    process maps are in its PSS as well)."""
    d = env.desktop
    pids = d.pids()
    names = process_names(pids)
    total = {"pss": 0, "uss": 0, "rss": 0}
    by_proc: dict[str, int] = defaultdict(int)
    for pid in pids:
        m = smaps_kib(pid)
        for k in total:
            total[k] += m[k]
        by_proc[names.get(pid, "?")] += m["pss"]
    out: dict[str, object] = {f"{k}_kib": v for k, v in total.items()}
    out["pss_by_process_kib"] = dict(by_proc)
    ns = getattr(d.place, "ns", None)
    if ns is not None:
        r = ns.run(["df", "-B1", "--output=used", "/", "/tmp", "/dev/shm"], uid=0, timeout=30)
        used = [int(x) for x in r.stdout.decode().split()[1:]] if r.returncode == 0 else []
        if len(used) == 3:
            out["tmpfs_kib"] = dict(zip(("root", "tmp", "shm"), (u // 1024 for u in used)))
    return out


def settle_memory(env: GUIEnv, max_s: float, interval_s: float = 1.0) -> float:
    """Wait until the desktop's PSS is steady (three readings `interval_s` apart within 2 % of each other), at most
    `max_s`; returns the seconds waited. An app keeps loading (fonts, plugins, caches) after its window appears."""
    t0 = time.perf_counter()
    readings = [process_tree_pss_kib(env.desktop.pids())]
    while time.perf_counter() - t0 < max_s:
        time.sleep(interval_s)
        readings.append(process_tree_pss_kib(env.desktop.pids()))
        last = readings[-3:]
        if len(last) == 3 and max(last) - min(last) <= 0.02 * max(max(last), 1):
            break
    return time.perf_counter() - t0


def a11y_read(env: GUIEnv) -> tuple[float | None, int | None]:
    """One read of the desktop's accessibility tree: (seconds, XML characters), (None, None) past its timeout."""
    from envs.runtime.desktop import DesktopError

    t = time.perf_counter()
    try:
        xml = env.desktop.a11y_tree()
    except DesktopError:
        return None, None
    return time.perf_counter() - t, len(xml)


class ResetPhases:
    """Times the phases of one env's resets: a new desktop (sandbox, X session, workers), the task's setup (file copy,
    app launch), the wait for the app's window, the first observation (settle, screenshot, a11y tree). Wraps the env's
    own methods on this instance only."""

    PHASES = ("_ensure_desktop", "_wait_ready", "_observe_now")

    def __init__(self, env: GUIEnv):
        self.env = env
        self.marks: list[tuple[str, float, float]] = []
        for name in self.PHASES:
            setattr(env, name, self._wrap(name, getattr(env, name)))

    def _wrap(self, name: str, fn):
        def run(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.marks.append((name, t, time.perf_counter()))

        return run

    def reset(self, task: dict) -> dict[str, float]:
        self.marks.clear()
        t0 = time.perf_counter()
        self.env.reset(options={"task": task})
        total = time.perf_counter() - t0
        first = {}
        for name, start, end in self.marks:
            first.setdefault(name, (start, end))
        desk, wait, obs = (first[n] for n in self.PHASES)
        return {"total": total, "desktop": desk[1] - t0, "setup": wait[0] - desk[1], "window": wait[1] - wait[0],
                "observe": obs[1] - obs[0]}


def measure_app(app: str, task: dict, args) -> dict[str, object]:
    """N sandboxed desktops at once on `task` (an app arm, or the baseline form): first reset (a desktop from nothing,
    the app open), memory once settled, then `--resets` resets each, timed."""
    n = args.desktops
    results: dict[str, object] = {"task": task["id"], "machine_before": machine_state()}
    envs = [GUIEnv(max_steps=10_000, ready_timeout_s=args.app_ready_timeout_s) for _ in range(n)]
    clocks = [ResetPhases(e) for e in envs]
    pool = ThreadPoolExecutor(n)
    try:
        t0 = time.perf_counter()
        first = list(pool.map(lambda c: c.reset(task), clocks))
        results["start_and_first_reset_wall_s"] = time.perf_counter() - t0
        results["start_and_first_reset"] = summary([p["total"] for p in first])
        results["settle_s"] = list(pool.map(lambda e: settle_memory(e, args.app_settle_s), envs))
        mems = [desktop_memory(e) for e in envs]
        results["windows"] = sorted({w.title for e in envs for w in e.desktop.windows()})
        reads = list(pool.map(a11y_read, envs))  # the tree every observation reads, on all desktops at once
        results["a11y_read"] = summary([t for t, _ in reads if t is not None]) if any(t for t, _ in reads) else None
        results["a11y_read_timeouts"] = sum(t is None for t, _ in reads)
        results["a11y_xml_chars"] = statistics.median([c for _, c in reads if c is not None] or [0])
        resets = [p for ps in pool.map(lambda c: [c.reset(task) for _ in range(args.resets)], clocks) for p in ps]
        results["reset"] = summary([p["total"] for p in resets])
        results["reset_phases"] = {k: summary([p[k] for p in resets]) for k in resets[0]}
        # a11y tree reads that ran past the desktop's a11y timeout (the worker is then replaced)
        results["a11y_worker_restarts"] = sum(e.desktop._a11y.restarts for e in envs if e.desktop._a11y is not None)
    finally:
        list(pool.map(lambda e: e.close(), envs))
        pool.shutdown()
    for k in ("pss", "uss", "rss"):
        per = [m[f"{k}_kib"] / 1024 for m in mems]
        results[f"{k}_per_desktop_mib"] = statistics.mean(per)
        results[f"{k}_per_desktop_mib_each"] = [round(x, 1) for x in per]
    results["pss_total_mib"] = sum(m["pss_kib"] for m in mems) / 1024
    tm = [m["tmpfs_kib"] for m in mems if "tmpfs_kib" in m]
    if tm:
        results["tmpfs_per_desktop_mib"] = {k: round(statistics.mean(t[k] for t in tm) / 1024, 1) for k in tm[0]}
    by_proc: dict[str, float] = defaultdict(float)
    for m in mems:
        for name, kib in m["pss_by_process_kib"].items():
            by_proc[name] += kib / 1024 / n  # summed within a desktop, averaged over desktops
    results["pss_by_process_mib"] = {k: round(v, 1) for k, v in sorted(by_proc.items(), key=lambda kv: -kv[1])}
    results["machine_after"] = machine_state()
    return results


def measure_apps(args) -> dict[str, object]:
    """The baseline arm (the sign-up form), then each app arm, one after the other; ratios to the baseline."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nextstate-bench-apps-") as tmp:
        files = make_app_files(Path(tmp))
        arms = {"baseline": TASK, **{app: app_task(app, files) for app in args.apps}}
        out: dict[str, object] = {}
        for arm, task in arms.items():
            if isinstance(task, str):
                task = next(t for t in GUIEnv.tasks("all") if t["id"] == task)
            print(f"\n== {arm}: {args.desktops} desktops ==", flush=True)
            r = out[arm] = measure_app(arm, task, args)
            base = out["baseline"]
            r["ratio_to_baseline"] = {
                "pss_per_desktop": r["pss_per_desktop_mib"] / base["pss_per_desktop_mib"],
                "uss_per_desktop": r["uss_per_desktop_mib"] / base["uss_per_desktop_mib"],
                "reset": r["reset"]["median_ms"] / base["reset"]["median_ms"],
            }
            report_app(arm, r)
    return out


def report_app(arm: str, r: dict) -> None:
    tm = r.get("tmpfs_per_desktop_mib", {})
    print(f"load average {r['machine_before']['loadavg'][0]:.1f} -> {r['machine_after']['loadavg'][0]:.1f}; "
          f"windows: {r['windows']}")
    print(f"start + first reset {fmt(r['start_and_first_reset'])}; settled after "
          f"{statistics.median(r['settle_s']):.1f} s")
    print(f"reset (app open)    {fmt(r['reset'])}   {r['ratio_to_baseline']['reset']:.2f}x the baseline")
    phases = ", ".join(f"{k} {v['median_ms'] / 1000:.2f} s" for k, v in r["reset_phases"].items() if k != "total")
    print(f"    phases (medians): {phases}; a11y worker restarts {r['a11y_worker_restarts']}")
    a11y = f"{fmt(r['a11y_read'])}" if r["a11y_read"] else "-"
    print(f"a11y tree read      {a11y}, {r['a11y_xml_chars']:.0f} characters; {r['a11y_read_timeouts']} timed out")
    ratio = r["ratio_to_baseline"]["pss_per_desktop"]
    print(f"memory per desktop  PSS {r['pss_per_desktop_mib']:.1f} MiB ({ratio:.2f}x), USS {r['uss_per_desktop_mib']:.1f} MiB, RSS {r['rss_per_desktop_mib']:.1f} MiB; tmpfs "
          + ", ".join(f"{k} {v:.1f}" for k, v in tm.items()) + " MiB")
    for name, mib in list(r["pss_by_process_mib"].items())[:6]:
        print(f"    {name:40s} {mib:6.1f} MiB")


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
                kib = smaps_kib(pid)["pss"]
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
    p.add_argument("--apps", nargs="+", choices=list(APPS), default=None,
                   help="measure these apps open instead (memory, reset), after the baseline form, in sandboxes")
    p.add_argument("--app-settle-s", type=float, default=30.0, help="apps: at most this long for PSS to settle")
    p.add_argument("--app-ready-timeout-s", type=float, default=120.0, help="apps: for the app's window to appear")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.apps:
        results = {
            "desktops": args.desktops,
            "cpus": os.cpu_count(),
            "resets_per_desktop": args.resets,
            "command": " ".join(["python benchmarks/desktop.py", *(sys.argv[1:] if argv is None else argv)]),
            "machine_before": machine_state(),
        }
        print(f"{args.desktops} sandboxed desktops at once on {os.cpu_count()} CPUs; "
              f"arms: baseline {' '.join(args.apps)}")
        results["apps"] = measure_apps(args)
        results["machine_after"] = machine_state()
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2))
        return 0
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
