"""Benchmark: Terminal-Bench / Harbor task directories end to end, per task and backend.

    python benchmarks/task_dirs.py DIR --format harbor|terminal_bench [--backends local docker] [--json out.json]
                                   [--docker-host unix:///...] [--test-runner auto|script|pytest]

For each task directory under DIR: does it load (or the one-line refusal); its environment's build time and tarball
size (`envs.terminal.task_image`; a second run takes it from the cache: build_s 0); then on each backend: reset time
(a fresh sandbox or container over the built root, the instruction as the first observation; then again, as a later
episode of the task), the untouched environment's outcome and the time of that verification (the tests on the state
the agent was given: should be -1, a reward of 0), and the oracle's
outcome (its solution replayed as the demonstration: should be +1). Failures are recorded with their first line,
never raised, so one broken task does not stop the run. Each task's built environment (tarball, unpacked root, docker
image: about 1-2 GB together) is removed after it is measured, unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import save_report  # noqa: E402
from envs.terminal.env import TerminalEnv  # noqa: E402
from envs.terminal.task_dirs import load_task_dirs  # noqa: E402
from envs.terminal.task_image import build_task_environment  # noqa: E402


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def measure_backend(task: dict[str, Any], backend: str, options: dict[str, Any], test_runner: str,
                    progress_steps: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=options, progress_from_tests=False,
                      test_runner=test_runner)
    try:
        t0 = time.monotonic()
        env.reset(options={"task": task["id"]})
        out["reset_s"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
        out["untouched_outcome"] = env.verify()
        out["verify_s"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
        env.reset(options={"task": task["id"]})  # a later episode: no unpack or import left to do
        out["reset_again_s"] = round(time.monotonic() - t0, 3)
    except Exception as exc:
        out["error"] = one_line(exc)
        env.close()
        return out
    env.close()
    env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=options, progress_from_tests=False,
                      test_runner=test_runner)
    try:
        if not task.get("solution_script"):
            out["oracle_outcome"] = None
            out["oracle_error"] = "no oracle"
        else:
            t0 = time.monotonic()
            env.demonstration(task["id"])
            out["oracle_outcome"] = 1.0
            out["oracle_s"] = round(time.monotonic() - t0, 2)
    except Exception as exc:
        out["oracle_outcome"] = -1.0 if "does not pass" in str(exc) else None
        out["oracle_error"] = one_line(exc)
    finally:
        env.close()
    if progress_steps:
        out.update(step_costs(task, backend, options, test_runner, progress_steps))
    return out


def step_costs(task: dict[str, Any], backend: str, options: dict[str, Any], test_runner: str, steps: int
               ) -> dict[str, Any]:
    """Median wall time of one step (`true`) without and with per-step tests (`progress_from_tests`): what a
    progress signal costs each step."""
    out: dict[str, Any] = {}
    for key, progress in (("step_s", False), ("step_progress_s", True)):
        env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=options, progress_from_tests=progress,
                          test_runner=test_runner, max_steps=steps + 1)
        try:
            env.reset(options={"task": task["id"]})
            times = []
            for _ in range(steps):
                t0 = time.monotonic()
                env.step("```bash\ntrue\n```")
                times.append(time.monotonic() - t0)
            out[key] = round(statistics.median(times), 3)
        except Exception as exc:
            out[f"{key}_error"] = one_line(exc)
        finally:
            env.close()
    return out


HANGING_TEST = ("import socket\n\n\ndef test_waits_for_a_client_that_never_comes():\n"
                "    socket.create_server(('127.0.0.1', 0)).accept()\n")


def hanging_episode(backend: str, options: dict[str, Any], agent_timeout: float = 30.0, test_timeout: float = 60.0
                    ) -> dict[str, Any]:
    """One episode of a task of our own whose test blocks on a socket (tests/data/task_dirs/harbor/vault-code with its
    test replaced), per-step tests on, the agent running `true` until its timeout is used up: the episode's wall time
    against its bound, the agent timeout plus one verification (per-step checks are cut at `progress_timeout` and
    count against the agent's time)."""
    import shutil
    import tempfile

    from envs.terminal.task_dirs import read_task_dir

    source = Path(__file__).resolve().parents[1] / "tests" / "data" / "task_dirs" / "harbor" / "vault-code"
    with tempfile.TemporaryDirectory(prefix="nextstate-hang-") as tmp:
        task_dir = Path(tmp) / "hanging-test"
        shutil.copytree(source, task_dir)
        (task_dir / "tests" / "test_outputs.py").write_text(HANGING_TEST)
        toml = task_dir / "task.toml"
        toml.write_text(toml.read_text().replace("timeout_sec = 60.0", f"timeout_sec = {test_timeout}")
                        .replace("timeout_sec = 300.0", f"timeout_sec = {agent_timeout}", 1))
        task = read_task_dir(task_dir, "harbor")
        env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=options, progress_from_tests=True,
                          max_steps=1000)
        try:
            env.reset(options={"task": task["id"]})  # the build, outside the clock
            t0 = time.monotonic()
            env.reset(options={"task": task["id"]})
            steps, done = 0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step("```bash\ntrue\n```")
                steps, done = steps + 1, terminated or truncated
            wall = time.monotonic() - t0
        finally:
            env.close()
    return {"agent_timeout_s": agent_timeout, "test_timeout_s": test_timeout, "progress_timeout_s": env.progress_timeout,
            "steps": steps, "outcome": reward, "wall_s": round(wall, 1), "bound_s": agent_timeout + test_timeout,
            "without_the_budget_s": steps * test_timeout}  # each step's check waiting the verifier's whole timeout


def remove_built(built: Any, docker_host: str | None) -> None:
    """Drop one task's environment from the cache (and the engine): the disk a run of many tasks would fill."""
    import shutil

    from envs.terminal.task_image import TASK_UID_BASE, task_cache_dir

    tarball = Path(built.tarball)
    tarball.unlink(missing_ok=True)
    tarball.with_suffix(".json").unlink(missing_ok=True)
    shutil.rmtree(task_cache_dir() / "roots" / f"{built.key}-u{TASK_UID_BASE}", ignore_errors=True)
    if docker_host is not None:
        from envs.runtime.docker import docker_client

        client = docker_client(docker_host)
        try:
            client.images.remove(built.docker_tag, force=True)
        except Exception:
            pass
        finally:
            client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tasks", type=Path)
    p.add_argument("--format", required=True, choices=["harbor", "terminal_bench"])
    p.add_argument("--backends", nargs="+", default=["local"], choices=["local", "docker"])
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--test-runner", default="auto", choices=["auto", "script", "pytest"])
    p.add_argument("--json", type=Path)
    p.add_argument("--keep", action="store_true", help="keep each task's built environment in the cache")
    p.add_argument("--progress-steps", type=int, default=0,
                   help="also time N steps without and with per-step tests (progress_from_tests)")
    p.add_argument("--hanging-test", action="store_true",
                   help="also run one episode, per backend, of a task of ours whose test blocks on a socket: its wall "
                        "time against the agent timeout plus one verification")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    got = load_task_dirs(args.tasks, args.format)
    rows: list[dict[str, Any]] = [{"task": Path(d).name, "refused": why} for d, why in got.refused.items()]
    for task in got.tasks:
        row: dict[str, Any] = {"task": task["id"], "from": task["base_image"]}
        t0 = time.monotonic()
        try:
            built = build_task_environment(task)
            row.update(build_s=built.build_s, size_mib=round(built.size_bytes / 2**20, 1), base=built.base)
        except Exception as exc:
            last = [line for line in str(exc).splitlines() if line.strip()][-1:]  # a failed step's last output line
            row.update(build_error=one_line(exc), build_error_last_line=last[0][:300] if last else "",
                       build_s=round(time.monotonic() - t0, 1))
            rows.append(row)
            print(f"{task['id']}: build failed: {row['build_error']}", flush=True)
            continue
        for backend in args.backends:
            options = {"docker_host": args.docker_host} if backend == "docker" and args.docker_host else {}
            row[backend] = measure_backend(task, backend, options, args.test_runner, args.progress_steps)
        rows.append(row)
        if not args.keep:
            remove_built(built, args.docker_host if "docker" in args.backends else None)
        print(json.dumps(row), flush=True)
    built_rows = [r for r in rows if "build_s" in r and "build_error" not in r]
    summary: dict[str, Any] = {
        "tasks": len(rows),
        "refused": sum("refused" in r for r in rows),
        "loaded": len(got.tasks),
        "build_failed": sum("build_error" in r for r in rows),
        "built": len(built_rows),
    }
    if built_rows:
        fresh = [r["build_s"] for r in built_rows if r["build_s"] > 0]
        summary["build_s_median"] = statistics.median(fresh) if fresh else 0.0
        summary["size_mib_median"] = statistics.median(r["size_mib"] for r in built_rows)
    for backend in args.backends:
        ran = [r[backend] for r in built_rows if backend in r and "error" not in r[backend]]
        with_oracle = [m for m in ran if m.get("oracle_error") != "no oracle"]
        summary[backend] = {
            "ran": len(ran),
            "errors": sum("error" in r.get(backend, {}) for r in built_rows),
            "untouched_zero": sum(m["untouched_outcome"] == -1.0 for m in ran),
            "oracle_one": sum(m.get("oracle_outcome") == 1.0 for m in with_oracle),
            "with_oracle": len(with_oracle),
            # of every task that loaded: a build that fails counts against the oracle, as it would for a user
            "oracle_one_of_loaded": round(sum(m.get("oracle_outcome") == 1.0 for m in with_oracle)
                                          / len(got.tasks), 3) if got.tasks else None,
            "reset_s_median": statistics.median(m["reset_s"] for m in ran) if ran else None,
            "reset_again_s_median": statistics.median(m["reset_again_s"] for m in ran) if ran else None,
            "verify_s_median": statistics.median(m["verify_s"] for m in ran) if ran else None,
        }
        stepped = [m for m in ran if "step_progress_s" in m and "step_s" in m]
        if stepped:
            summary[backend]["step_s_median"] = statistics.median(m["step_s"] for m in stepped)
            summary[backend]["step_progress_s_median"] = statistics.median(m["step_progress_s"] for m in stepped)
    if args.hanging_test:
        for backend in args.backends:
            options = {"docker_host": args.docker_host} if backend == "docker" and args.docker_host else {}
            summary.setdefault("hanging_test", {})[backend] = hanging_episode(backend, options)
    report = {
        "command": "python benchmarks/task_dirs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
        "summary": summary,
        "rows": rows,
    }
    print(json.dumps(summary, indent=1))
    save_report(report, args.json, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
