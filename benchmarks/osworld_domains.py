"""How many tasks of each OSWorld domain load in the gui family, and why the others are refused.

    python benchmarks/osworld_domains.py --osworld /path/to/OSWorld/evaluation_examples [--commit SHA] [--json out.json]
                                         [--run DOMAIN,...]

For each domain of `test_all.json`: the tasks `GUIEnv.validate_task` accepts (every setup step, getter and metric is
one NextState has), the refusals grouped by reason (the metric, getter or step named), and how many of the loaded
tasks need nothing from the web (no file to fetch, no web page to open: they can run offline as they are; the
others need their files in $NEXTSTATE_OSWORLD_FILES, or a live site). Loading is not running: an app missing from the
desktop's guest root is refused when the task starts. `--run` plays the loaded tasks of those domains that need no
web on the local (sandboxed) desktop, left untouched (`DONE` right after setup): the setup's one-line refusal, or the
score and any evaluator error; around the run, the host's packages, users and files are compared before and after
(benchmarks/osworld_os_tasks.py's check). Run it with a fresh HOME and NEXTSTATE_CACHE outside /root and /home
(`HOME=$(mktemp -d) NEXTSTATE_CACHE=$(mktemp -d) python ...`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine_state  # noqa: E402
from benchmarks.osworld_os_tasks import compare, host_state  # noqa: E402
from envs.gui.env import GUIEnv  # noqa: E402
from envs.gui.osworld_tasks import remote_files, web_pages  # noqa: E402


def refusal_key(reason: str) -> str:
    """The unsupported name a refusal is about ("metric 'x'", "setup step 'y'", ...), else the reason itself."""
    m = re.search(r"(metric|getter|setup step) '([^']+)'", reason)
    return f"{m[1]} {m[2]}" if m else reason.split(": ", 1)[-1][:100]


def web_needs(task: dict) -> list[str]:
    """The web addresses a task needs: files it fetches, and pages the desktop's browser opens."""
    return list(remote_files(task)) + web_pages(task)


def measure(root: Path) -> dict[str, dict[str, object]]:
    index = json.loads((root / "test_all.json").read_text())
    out: dict[str, dict[str, object]] = {}
    for domain, ids in index.items():
        loaded, offline, refused = 0, 0, Counter()
        for tid in ids:
            task = json.loads((root / "examples" / domain / f"{tid}.json").read_text())
            try:
                GUIEnv.validate_task(task)
            except (ValueError, TypeError) as exc:
                refused[refusal_key(str(exc).splitlines()[0])] += 1
                continue
            loaded += 1
            offline += not web_needs(task)
        out[domain] = {"tasks": len(ids), "load": loaded, "load_offline": offline,
                       "refused": dict(refused.most_common())}
    return out


def run_untouched(root: Path, domains: list[str]) -> dict[str, dict[str, object]]:
    """Each loaded, web-free task of `domains` on the local desktop, untouched: its setup refusal or its score."""
    from envs.gui.osworld_tasks import load_osworld_examples

    got = load_osworld_examples(root, exclude_domains=(), domains=domains)
    env = GUIEnv(max_steps=5)
    out: dict[str, dict[str, object]] = {}
    try:
        for task in (t for t in got.tasks if not web_needs(t)):
            t0 = time.monotonic()
            rec: dict[str, object] = {"domain": task["domain"]}
            try:
                env.reset(options={"task": task})
            except Exception as exc:  # a setup refusal (an app the guest lacks) or failure, in one line
                rec["setup_refused"] = str(exc).splitlines()[0][:200]
            else:
                _, score, *_ = env.step("DONE")
                ev = env.last_evaluation
                rec.update(score=score, infeasible=task["evaluator"].get("func") == "infeasible",
                           evaluator_error=(ev.error if ev else "") or None)
            rec["s"] = round(time.monotonic() - t0, 2)
            out[task["id"]] = rec
            said = rec.get("setup_refused") or f"score {rec['score']}"
            print(f"  {task['domain']:20s} {task['id'][:8]} {said}")
    finally:
        env.close()
    return out


def by_domain(runs: dict[str, dict[str, object]]) -> dict[str, dict[str, int]]:
    """Per domain: tasks, refused at setup, played, above 0 (feasible ones), evaluator errors."""
    out: dict[str, dict[str, int]] = {}
    for r in runs.values():
        d = out.setdefault(str(r["domain"]), {"tasks": 0, "refused_at_setup": 0, "played": 0, "above_0": 0,
                                              "evaluator_errors": 0})
        d["tasks"] += 1
        if "score" not in r:
            d["refused_at_setup"] += 1
            continue
        d["played"] += 1
        d["above_0"] += int(not r["infeasible"] and float(r["score"]) > 0)  # type: ignore[arg-type]
        d["evaluator_errors"] += int(bool(r["evaluator_error"]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--osworld", type=Path, required=True, help="OSWorld's evaluation_examples directory")
    p.add_argument("--commit", default="", help="the OSWorld commit the tree is from (recorded in the JSON)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--run", default="", help="comma-separated domains to play untouched on the local desktop")
    args = p.parse_args()
    t0 = time.monotonic()
    domains = measure(args.osworld)
    total = {k: sum(int(d[k]) for d in domains.values()) for k in ("tasks", "load", "load_offline")}
    for name, d in domains.items():
        print(f"{name:22s} {d['load']:3d}/{d['tasks']:<3d} load ({d['load_offline']} of them need no web)"
              + (f"; refused: {d['refused']}" if d["refused"] else ""))
    print(f"{'all':22s} {total['load']:3d}/{total['tasks']:<3d} load")
    runs: dict[str, dict[str, object]] = {}
    host: dict[str, object] = {}
    above: list[str] = []
    errors = 0
    if args.run:
        before, machine_before = host_state(), machine_state()
        t_run = time.monotonic()
        runs = run_untouched(args.osworld, args.run.split(","))
        run_s = round(time.monotonic() - t_run, 1)
        changes = compare(before, host_state())
        host = {"run_s": run_s, "machine_before": machine_before, "machine_after": machine_state(),
                "host_unchanged": not changes, "host_changes": changes}
        played = [r for r in runs.values() if "score" in r]
        above = [tid for tid, r in runs.items() if "score" in r and not r["infeasible"] and float(r["score"]) > 0]
        errors = sum(bool(r["evaluator_error"]) for r in played)
        print(f"untouched: {len(runs)} tasks, {len(runs) - len(played)} refused at setup, {len(played)} played, "
              f"{errors} evaluator errors, above 0: {above}; {run_s} s; host unchanged: {not changes}"
              + (f" ({changes})" if changes else ""))
    if args.json:
        report = {"command": "python " + " ".join(sys.argv), "osworld_commit": args.commit, "summary": total,
                  "domains": domains, "untouched": runs, "untouched_by_domain": by_domain(runs), **host,
                  "wall_s": round(time.monotonic() - t0, 2)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if above or errors or host.get("host_changes") else 0


if __name__ == "__main__":
    raise SystemExit(main())
