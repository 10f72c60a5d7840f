"""Run a task directory's tests on the agent's files, out of the agent's reach, and read their outcome as each format does.

Where the tests run: never in the agent's sandbox. `run_tests` takes a snapshot of the agent's filesystem into a fresh
sandbox of the same backend (`runtime.snapshot`: the overlay's upper layer copied under a new namespace sandbox, or
`docker commit` and a new container) in which no process of the agent's runs; with `final=True` every process of the
agent's ends first (its pid namespace or container is torn down) and its sandbox closes, so the episode is over. The
new sandbox gets the harness's files, bound from the host: the tests at `/tests` (a fresh copy for this run; Terminal-
Bench's `run-tests.sh` beside them), the runner read-only at `RUNNER_MOUNT`, the task's built root read-only at
`IMAGE_MOUNT` (the interpreter the runner uses, `envs.terminal.test_runner`), an empty `/etc/ld.so.preload`, and an
empty `/logs/verifier` of its own. The tests run as root in the image's WORKDIR within the time given; then every
process of that sandbox ends, and only then is the reward read: from what *this run* wrote under `/logs/verifier`
(never a file the agent left, never through a symlink) for Harbor, from the runner's `-rA` summary for Terminal-Bench.
Harbor's reward file is `reward.txt` (a number) or `reward.json` (`{"reward": x}`, else the mean of its numbers).

`test_runner` picks how the tests run: `pytest` runs them with the harness's runner (for Harbor its exit code becomes
`reward.txt`, as the boilerplate test.sh does); `script` runs the task's script as it is (`bash /tests/test.sh`): the
image's bash and tools *as the agent left them* run the tests, and the runner is `pytest` first on PATH; `auto` (the
default) is `script` unless the script fetches from the web (the stock boilerplate: uv and pytest from the web).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.runtime.nsroot import Bind
from envs.runtime.rootfs_runtime import put_tree
from envs.terminal.script_rules import fetches_from_web
from envs.terminal.test_runner import IMAGE_MOUNT, RUNNER_MOUNT, TEST_PATH_HEAD, Interpreter

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


@dataclass(frozen=True)
class TaskImage:
    """What the verifier needs of a task's built environment: its root on the host, and the Python in it."""

    root: Path  # the built root, unpacked (the local sandbox's lower layer)
    interpreter: Interpreter
    runner: Path  # the runner's folder on the host (`test_runner.ensure_runner`)
    workdir: str
    env: dict[str, str]


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


def run_tests(runtime: Any, task: dict[str, Any], image: TaskImage, test_runner: str = "auto", *, final: bool = True,
              timeout: float | None = None) -> TestRun:
    """The task's tests on a snapshot of `runtime`'s files, in a sandbox no agent process is in (see above). `final`:
    the agent's processes end first and `runtime` closes. `timeout`: the run's limit (default: the task's)."""
    runner = choose_runner(task, test_runner)
    with tempfile.TemporaryDirectory(prefix="nextstate-verify-") as tmp:
        tests = _stage_tests(task, Path(tmp) / "tests", runtime.root_host_uid)
        binds = [Bind(str(tests), TESTS_DIR, readonly=False), Bind(str(image.runner), RUNNER_MOUNT),
                 Bind(str(image.root), IMAGE_MOUNT), Bind(str(image.runner / "empty"), "/etc/ld.so.preload")]
        verifier = runtime.snapshot(binds, end_processes=final, empty_dirs=[REWARD_DIR],
                                    pid1=image.interpreter.argv("--idle"))
        try:
            raw = verifier.run_argv(_argv(task, runner, image), env=_env(image), user="0",
                                    timeout=float(task["test_timeout_s"] if timeout is None else timeout))
            verifier.end_processes()  # nothing the tests started outlives them: the reward is what they left
            written = {name: verifier.read_written(f"{REWARD_DIR}/{name}", 1 << 16)
                       for name in ("reward.txt", "reward.json")}
        finally:
            verifier.close()
    output = (raw.stdout + raw.stderr).decode("utf-8", errors="replace")
    statuses = parse_pytest_summary(output)
    if task["format"] == "harbor":
        text = written["reward.txt"] if written["reward.txt"] is not None else written["reward.json"]
        reward = parse_reward((text or b"").decode("utf-8", errors="replace"))
        failed = [n for n, s in statuses.items() if s in ("FAILED", "ERROR")]
        return TestRun(reward, int(reward >= 1.0), 1, failed, output, raw.timed_out)
    ok = [n for n, s in statuses.items() if s in ("PASSED", "XFAIL")]
    failed = [n for n, s in statuses.items() if s in ("FAILED", "ERROR", "XPASS")]
    total = len(ok) + len(failed)
    reward = len(ok) / total if total else 0.0
    return TestRun(reward, len(ok), max(total, 1), failed, output, raw.timed_out)


def _argv(task: dict[str, Any], runner: str, image: TaskImage) -> list[str]:
    if runner == "script":  # the task's own script, run by the image's bash as the agent left it
        script = "test.sh" if task["format"] == "harbor" else "run-tests.sh"
        return ["/bin/bash", "-c", f"cd {shlex.quote(image.workdir)} 2>/dev/null; exec bash {TESTS_DIR}/{script}"]
    target = f"{TESTS_DIR}/test_outputs.py" if _has(task, "test_outputs.py") else TESTS_DIR
    reward = ["--reward", f"{REWARD_DIR}/reward.txt"] if task["format"] == "harbor" else []
    return image.interpreter.argv(*reward, "--chdir", image.workdir, target, "-rA")


def _env(image: TaskImage) -> dict[str, str]:
    path = image.env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return {"LANG": "C.UTF-8", "TERM": "dumb", **image.env, "HOME": "/root", "USER": "root", "LOGNAME": "root",
            "TEST_DIR": TESTS_DIR, "PATH": f"{TEST_PATH_HEAD}:{path}", **image.interpreter.env()}


def _stage_tests(task: dict[str, Any], dest: Path, owner: int) -> Path:
    """This run's copy of the tests (and Terminal-Bench's run-tests.sh), owned by the sandbox's root."""
    staged = task.get("tests_dir")
    if staged:
        shutil.copytree(staged, dest, symlinks=True)
    else:
        dest.mkdir()
    if task["format"] == "terminal_bench" and task.get("test_script"):  # Terminal-Bench runs it from the tests dir
        shutil.copyfile(task["test_script"], dest / "run-tests.sh")
    os.chmod(dest.parent, 0o711)
    for dirpath, _, filenames in os.walk(dest):
        for p in [dirpath, *(os.path.join(dirpath, n) for n in filenames)]:
            os.lchown(p, owner, owner)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o644 | (0o111 if os.path.isdir(p) else 0))
    return dest


def _has(task: dict[str, Any], name: str) -> bool:
    return bool(task.get("tests_dir")) and (Path(task["tests_dir"]) / name).is_file()


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
    """The oracle's files at /solution (Harbor's solution/ folder; Terminal-Bench's solution.sh), for a replay of the
    oracle that the env itself plays (a demonstration), never in an agent's episode."""
    src = task.get("solution_dir") or task["solution_script"]
    put_tree(runtime, tree_tar(src), SOLUTION_DIR)


def unmount_solution(runtime: Any) -> None:
    runtime.run(f"rm -rf {SOLUTION_DIR}", user="0", timeout=30)


__all__ = ["REWARD_DIR", "TEST_RUNNERS", "TaskImage", "TestRun", "choose_runner", "mount_solution",
           "parse_pytest_summary", "parse_reward", "run_tests", "tree_tar", "unmount_solution"]
