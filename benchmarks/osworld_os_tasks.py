"""Every real OSWorld `os` task on the local GUI backend, with the host checked before and after.

    python benchmarks/osworld_os_tasks.py --osworld /path/to/OSWorld/evaluation_examples [--json out.json]
                                          [--isolation sandbox] [--no-solve]

For each example file of the `os` domain (listed in test_all.json or not): does it load (else the one-line reason),
does it run (setup, then the evaluator, without an error of ours), what does an untouched desktop score (`DONE` right
after setup: a feasible task must score 0), and, for the tasks this script knows a shell solution for, what that scores
(it runs as the desktop's user, with `sudo` where the task needs root: installing and removing packages, changing login
shells, writing `/`). Around all of it, the host's state: `dpkg -l`, /etc/passwd, /etc/group and /etc/shadow, `getent
passwd` / `getent group`, and a metadata hash (path, type, mode, owner, size, mtime, link target) of every file under
/etc, /usr, /root and /home. Run it with a fresh HOME outside /root and /home (the script's own caches must not count):

    HOME=$(mktemp -d) NEXTSTATE_CACHE=$(mktemp -d) python benchmarks/osworld_os_tasks.py --osworld ...

Other processes on a shared machine can change /root or /home meanwhile: the report lists every changed path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state  # noqa: E402
from envs.gui.env import GUIEnv  # noqa: E402
from envs.gui.osworld_tasks import load_osworld_examples  # noqa: E402

TREES = ("/etc", "/usr", "/root", "/home")
# Shell solutions of ours, run on the desktop as its user: they show that what the tasks want done (packages, users'
# shells, files in /) happens inside the sandbox, scored by OSWorld's own evaluators, and that the host is untouched.
SOLUTIONS = {
    "c56de254-a3ec-414e-81a6-83d2ce8c41fa": "echo password | sudo -S apt-get install -y python3-lxml",
    "43c2d64c-bab5-4dcb-a30c-b888321c319a": "echo password | sudo -S mkdir /test",
    "ddc75b62-7311-4af8-bfb3-859558542b36": "echo password | sudo -S apt-get remove -y gnome-mahjongg",
    "6ebbfb01-ea72-4226-a2a6-dc428e111ed2": "echo password | sudo -S chsh -s /bin/bash user",
    "e0df059f-28a6-4169-924f-b9623e7184cc": "mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2",
    "7688b85f-87a4-4e4a-b2f8-f3d6c3f29b82": "mv ~/Desktop/todo.txt ~/Desktop/done/",
    "cc9d4f34-1ca0-4a1b-8ff2-09302696acb9": "pkill -f '^/bin/sh ./my_process.sh'; true",
    "a4d98375-215b-4a4d-aee9-3d4370fccc41": "gsettings set org.gnome.desktop.screensaver lock-enabled true",
    "bedcedc4-4d72-425e-ad62-21960b11fe0d": "gsettings set org.gnome.desktop.session idle-delay 0",
    "f9be0997-4b7c-45c5-b05c-4612b44a6118": "gsettings set org.gnome.desktop.notifications show-banners false",
    "3ce045a0-877b-42aa-8d2c-b4a863336ab8": "gsettings set org.gnome.desktop.interface text-scaling-factor 1.5",
    "13584542-872b-42d8-b299-866967b5c3ef": "echo 'XTerm*geometry: 132x43' > ~/.Xdefaults",
}


def tree_digest(root: str) -> tuple[str, dict[str, str]]:
    """A hash of every entry's metadata under `root`, and the per-entry records (for the diff)."""
    records: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
            records[path] = f"{st.st_mode:o}:{st.st_uid}:{st.st_gid}:{st.st_size}:{st.st_mtime_ns}:{link}"
    h = hashlib.sha256()
    for path in sorted(records):
        h.update(f"{path}\0{records[path]}\n".encode())
    return h.hexdigest(), records


def host_state() -> dict[str, object]:
    def out(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout

    state: dict[str, object] = {
        "dpkg -l": out(["dpkg", "-l"]),
        "getent passwd": out(["getent", "passwd"]),
        "getent group": out(["getent", "group"]),
    }
    for f in ("/etc/passwd", "/etc/group", "/etc/shadow"):
        state[f] = Path(f).read_text() if os.path.exists(f) else ""
    for t in TREES:
        state[f"tree {t}"] = tree_digest(t)
    return state


def compare(before: dict[str, object], after: dict[str, object]) -> dict[str, object]:
    changes: dict[str, object] = {}
    for key, old in before.items():
        new = after[key]
        if key.startswith("tree "):
            (h0, r0), (h1, r1) = old, new  # type: ignore[misc]
            if h0 != h1:
                changed = sorted(p for p in set(r0) | set(r1) if r0.get(p) != r1.get(p))
                changes[key] = changed[:50] + ([f"... {len(changed) - 50} more"] if len(changed) > 50 else [])
        elif old != new:
            changes[key] = "differs"
    return changes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--osworld", type=Path, required=True, help="OSWorld's evaluation_examples directory")
    p.add_argument("--isolation", default="sandbox", choices=["sandbox", "none"])
    p.add_argument("--no-solve", action="store_true", help="only untouched runs, no shell solutions")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.isolation == "none":
        print("WARNING: isolation=none runs OSWorld's setup commands (sudo apt-get ...) on this machine", file=sys.stderr)
    files = sorted((args.osworld / "examples" / "os").glob("*.json"))
    t0 = time.monotonic()
    machine_before = machine_state()
    before = host_state()
    loaded = load_osworld_examples(args.osworld, domains=("os",), index=None)
    results: dict[str, dict[str, object]] = {tid: {"loads": False, "refused": why} for tid, why in loaded.skipped.items()}
    env = GUIEnv(isolation=args.isolation, max_steps=5)
    try:
        for task in loaded.tasks:
            tid = task["id"]
            r: dict[str, object] = {"loads": True, "feasible": task["evaluator"].get("func") != "infeasible"}
            results[tid] = r
            try:
                env.reset(options={"task": task})
                _, score, *_ = env.step("DONE")
                ev = env.last_evaluation
                r["untouched"] = score
                r["runs"] = ev is not None and not ev.error
                if ev is not None and ev.error:
                    r["error"] = ev.error
                if tid in SOLUTIONS and not args.no_solve:
                    env.reset(options={"task": task})
                    res = env.desktop.execute(SOLUTIONS[tid], shell=True, timeout=120)
                    _, solved, *_ = env.step("DONE")
                    r["solved"] = solved
                    if not res.ok:
                        r["solution_stderr"] = res.stderr[-300:]
            except Exception as exc:  # a setup that fails is a task that does not run here; say why
                r["runs"] = False
                r["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            print(f"{tid[:8]} runs={r.get('runs')} untouched={r.get('untouched')} solved={r.get('solved', '-')}"
                  f"{'  ' + str(r['error'])[:120] if 'error' in r else ''}", flush=True)
    finally:
        env.close()
    after = host_state()
    changes = compare(before, after)
    feasible_above_zero = [t for t, r in results.items() if r.get("feasible") and (r.get("untouched") or 0) > 0]
    summary = {
        "os_task_files": len(files),
        "load": sum(1 for r in results.values() if r["loads"]),
        "run": sum(1 for r in results.values() if r.get("runs")),
        "untouched_zero": sum(1 for r in results.values() if r.get("runs") and r.get("untouched") == 0),
        "feasible_untouched_above_zero": feasible_above_zero,
        "solved": sum(1 for r in results.values() if r.get("solved") == 1.0),
        "solutions_tried": sum(1 for r in results.values() if "solved" in r),
        "host_changes": changes,
        "host_unchanged": not changes,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    print("\nrefused at load:")
    for tid, r in sorted(results.items()):
        if not r["loads"]:
            print(f"  {tid[:8]}: {str(r['refused'])[:160]}")
    print("\n" + json.dumps(summary, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"command": " ".join(["python benchmarks/osworld_os_tasks.py", *(sys.argv[1:] if argv is None else argv)]),
               "summary": summary, "tasks": results, "machine_before": machine_before, "machine_after": machine_state()}
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0 if not changes and not feasible_above_zero else 1


if __name__ == "__main__":
    sys.exit(main())
