"""Run a task directory's tests on the agent's final state, and read their outcome the way each format does.

The tests are copied to `/tests` (the path both formats expect) only for the run, and removed after it, so the agent
never sees them. Harbor's `tests/test.sh` writes a reward to `/logs/verifier/reward.txt` (a number) or `reward.json`
(`{"reward": x}`, else the mean of its numbers); Terminal-Bench's `run-tests.sh` prints pytest's `-rA` summary,
read as passed / total by `parse_pytest_summary`.

`test_runner` picks how the tests run: `script` runs the task's script as it is; `pytest` runs the tests with the
`nextstate-pytest` runner the builder put in the root (`envs.terminal.task_image`), in place of a script that would fetch
uv and pytest from the web at test time; `auto` (the default) is `script` unless the script fetches from the web.
Either way `pytest` is on PATH (last) while the tests run, so a script that calls it without installing it works.
"""

from __future__ import annotations

import io
import json
import math
import re
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.runtime.rootfs_runtime import put_tree
from envs.terminal.script_rules import fetches_from_web
from envs.terminal.task_image import TEST_PATH_TAIL, TEST_RUNNER

TEST_RUNNERS = ("auto", "script", "pytest")
TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
REWARD_DIR = "/logs/verifier"
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)", re.MULTILINE)


@dataclass
class TestRun:
    reward: float  # in [0, 1]: the fraction of tests passed (Terminal-Bench) or the reward file's value (Harbor)
    passed: int
    total: int
    failed: list[str] = field(default_factory=list)  # failing test names, when the format names them
    output: str = ""
    timed_out: bool = False


def parse_pytest_summary(output: str) -> dict[str, str]:
    """Test name -> status from pytest's `-rA` short test summary (Terminal-Bench's pytest parser reads the same)."""
    _, marker, summary = output.rpartition("short test summary info")
    statuses: dict[str, str] = {}
    for status, name in _SUMMARY_LINE.findall(summary if marker else ""):
        statuses[name] = status
    return statuses


def tree_tar(path: str | Path) -> bytes:
    """A directory (or one file) as an uncompressed tar archive, owned by root, paths relative to it."""
    buf = io.BytesIO()
    src = Path(path)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            return info

        if src.is_dir():
            for item in sorted(src.iterdir()):
                tar.add(str(item), arcname=item.name, filter=owned_by_root)
        else:
            tar.add(str(src), arcname=src.name, filter=owned_by_root)
    return buf.getvalue()


def choose_runner(task: dict[str, Any], test_runner: str) -> str:
    if test_runner not in TEST_RUNNERS:
        raise ValueError(f"test_runner={test_runner!r}: use one of {', '.join(TEST_RUNNERS)}")
    script = task.get("test_script")
    if script is None:
        return "pytest"
    if test_runner != "auto":
        return test_runner
    return "pytest" if fetches_from_web(Path(script).read_text(encoding="utf-8", errors="replace")) else "script"


def run_tests(runtime: Any, task: dict[str, Any], test_runner: str = "auto") -> TestRun:
    """Copy the tests in, run them as root within the task's test timeout, read the outcome, remove the tests."""
    runner = choose_runner(task, test_runner)
    staged = task.get("tests_dir")
    put_tree(runtime, tree_tar(staged) if staged else _empty_tar(), TESTS_DIR)
    if task["format"] == "terminal_bench" and task.get("test_script"):  # Terminal-Bench runs it from the tests dir
        runtime.run(f"cat > {TESTS_DIR}/run-tests.sh", stdin=Path(task["test_script"]).read_bytes(), user="0")
    clear = f"mkdir -p {REWARD_DIR} && rm -f {REWARD_DIR}/reward.txt {REWARD_DIR}/reward.json"
    runtime.run(clear, user="0", timeout=30)
    if runner == "pytest":
        target = f"{TESTS_DIR}/test_outputs.py" if _has(task, "test_outputs.py") else TESTS_DIR
        cmd = f"{TEST_RUNNER} {shlex.quote(target)} -rA"
        if task["format"] == "harbor":  # what Harbor's boilerplate test.sh does with pytest's exit code
            cmd = f"{cmd}; code=$?; [ $code -eq 0 ] && echo 1 > {REWARD_DIR}/reward.txt || echo 0 > " \
                  f"{REWARD_DIR}/reward.txt; exit $code"
    elif task["format"] == "harbor":
        cmd = f"bash {TESTS_DIR}/test.sh"
    else:
        cmd = f"bash {TESTS_DIR}/run-tests.sh"
    setup = f'export TEST_DIR={TESTS_DIR} PATH="$PATH:{TEST_PATH_TAIL}"'
    raw = runtime.run(f"{setup}; {cmd}", timeout=float(task["test_timeout_s"]), user="0")
    output = (raw.stdout + raw.stderr).decode("utf-8", errors="replace")
    statuses = parse_pytest_summary(output)
    try:
        if task["format"] == "harbor":
            reward = _read_reward(runtime)
            failed = [n for n, s in statuses.items() if s in ("FAILED", "ERROR")]
            return TestRun(reward, int(reward >= 1.0), 1, failed, output, raw.timed_out)
        ok = [n for n, s in statuses.items() if s in ("PASSED", "XFAIL")]
        failed = [n for n, s in statuses.items() if s in ("FAILED", "ERROR", "XPASS")]
        total = len(ok) + len(failed)
        reward = len(ok) / total if total else 0.0
        return TestRun(reward, len(ok), max(total, 1), failed, output, raw.timed_out)
    finally:
        runtime.run(f"rm -rf {TESTS_DIR}", user="0", timeout=30)


def _has(task: dict[str, Any], name: str) -> bool:
    return bool(task.get("tests_dir")) and (Path(task["tests_dir"]) / name).is_file()


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    return buf.getvalue()


def _read_reward(runtime: Any) -> float:
    raw = runtime.run(f"cat {REWARD_DIR}/reward.txt 2>/dev/null || cat {REWARD_DIR}/reward.json 2>/dev/null",
                      user="0", timeout=30)
    return parse_reward(raw.stdout.decode("utf-8", errors="replace"))


def parse_reward(text: str) -> float:
    """Harbor's reward file as a number in [0, 1]: reward.txt (one number) or reward.json (`{"reward": x}`, else the
    mean of its numbers). Missing, unreadable, not finite: 0 (a verifier that wrote nothing failed)."""
    text = text.strip()
    if not text:
        return 0.0
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError:
        return 0.0
    if isinstance(value, dict):
        numbers = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        value = value.get("reward", sum(numbers) / len(numbers) if numbers else 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return min(max(float(value), 0.0), 1.0)


def mount_solution(runtime: Any, task: dict[str, Any]) -> None:
    """The oracle's files at /solution (Harbor's solution/ folder; Terminal-Bench's solution.sh), for the oracle only."""
    src = task.get("solution_dir") or task["solution_script"]
    put_tree(runtime, tree_tar(src), SOLUTION_DIR)


def unmount_solution(runtime: Any) -> None:
    runtime.run(f"rm -rf {SOLUTION_DIR}", user="0", timeout=30)


__all__ = ["TEST_RUNNERS", "TestRun", "choose_runner", "mount_solution", "parse_pytest_summary", "parse_reward",
           "run_tests", "tree_tar", "unmount_solution"]
