"""Terminal-Bench / Harbor task directories end to end: each bundled task built from its Dockerfile, solved by its
oracle (+1) and not by the untouched environment (-1), on the local namespace sandbox and on docker; what the agent
can and cannot see; the task's agent timeout; build errors; a short RL run over a folder of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envs.terminal.env import TerminalEnv
from envs.terminal.task_dirs import load_task_dirs, read_task_dir
from envs.terminal.task_image import BuildError, build_task_environment
from tests.sandbox_support import docker_host, task_dirs_or_skip  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "envs" / "terminal" / "task_dirs"
TASKS = [(fmt, t["id"]) for fmt in ("harbor", "terminal_bench") for t in load_task_dirs(BUNDLED / fmt, fmt).tasks]


@pytest.fixture(scope="module", autouse=True)
def builder_or_skip():
    task_dirs_or_skip()


def _task(fmt: str, name: str) -> dict:
    return read_task_dir(BUNDLED / fmt / name, fmt)


def _solved_and_not_untouched(task: dict, runtime: str, options: dict | None = None) -> None:
    env = TerminalEnv(tasks=[task], runtime=runtime, runtime_options=options, progress_from_tests=False)
    try:
        obs, info = env.reset(options={"task": task["id"]})
        assert obs["content"] == task["instruction"] and "bash" in info["system_prompt"]
        hidden = env.runtime.exec("ls /tests /solution /opt/nextstate-verifier", timeout=10)
        assert hidden.exit_code != 0 and hidden.stderr.count("No such file") == 3  # nothing hidden is there
        assert env.verify() == -1.0  # the untouched environment
        assert env.runtime.closed  # the verification ended the episode's sandbox first
        messages = env.demonstration(task["id"])  # raises unless the oracle's outcome is +1
        assert messages[-1]["content"].startswith("Submitted.")
    finally:
        env.close()


@pytest.mark.parametrize("fmt, name", TASKS)
def test_bundled_task_dirs_on_the_local_sandbox(fmt, name):
    _solved_and_not_untouched(_task(fmt, name), "local")


@pytest.mark.parametrize("fmt, name", TASKS)
def test_bundled_task_dirs_on_docker(fmt, name, docker_host):
    _solved_and_not_untouched(_task(fmt, name), "docker", {"docker_host": docker_host})


def test_check_agent_env_replays_an_oracle_that_reads_its_own_files():
    from envs import check_agent_env

    task = _task("harbor", "fix-config-port")  # its oracle copies /solution/config.ini
    env = TerminalEnv(tasks=[task], progress_from_tests=False, max_steps=3)
    try:
        check_agent_env(env, task=task)
        env.reset(options={"task": task["id"]})
        _, _, _, _, info = env.step("```bash\ncp /solution/config.ini /srv/web/config.ini\n```")
        assert info["signals"]["exit_code"] != 0  # the oracle's own command, typed by an agent: no /solution
    finally:
        env.close()


def test_the_sandbox_is_the_image_offline_and_thrown_away():
    task = _task("terminal_bench", "worker-report")
    env = TerminalEnv(tasks=[task], progress_from_tests=False)
    try:
        env.reset(options={"task": task["id"]})
        r = env.runtime.exec("id -un; pwd; echo $HOME; ls inbox; echo kept > mine.txt; "
                             "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'",
                             timeout=20)
        assert r.stdout.split()[:7] == ["worker", "/home/worker", "/home/worker", "a.txt", "b.txt", "c.txt", "d.txt"]
        assert r.exit_code != 0 and "Network is unreachable" in r.stderr  # no network
        loop = env.runtime.exec("python3 -c 'import socket; s = socket.create_server((\"127.0.0.1\", 0)); "
                                "socket.create_connection(s.getsockname(), timeout=2); print(\"loopback up\")'",
                                timeout=20)
        assert loop.stdout == "loopback up\n", loop.stderr  # servers inside reach each other, as in a container
        env.reset(options={"task": task["id"]})  # a new episode starts from the built image again
        assert env.runtime.exec("ls mine.txt", timeout=10).exit_code != 0
    finally:
        env.close()


def test_progress_signals_and_the_outcome_of_a_partial_solution():
    task = _task("harbor", "sort-scores")  # reward.json holds the fraction of its two checks that pass
    env = TerminalEnv(tasks=[task])
    try:
        env.reset(options={"task": task["id"]})
        _, _, _, _, info = env.step("```bash\necho ada > /data/top.txt\n```")
        assert info["signals"].get("progress") is True
        _, reward, done, _, info = env.step("```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")
        assert done and reward == 0.0 and "reward is 0.5" in info["next_state"]["content"]  # 2 * 0.5 - 1
    finally:
        env.close()


def test_the_agent_timeout_of_the_task_bounds_the_episode(tmp_path):
    shutil.copytree(BUNDLED / "harbor" / "count-log-levels", tmp_path / "t")
    toml = tmp_path / "t" / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\ntimeout_sec = 300.0", "[agent]\ntimeout_sec = 2.0"))
    task = read_task_dir(tmp_path / "t", "harbor")
    env = TerminalEnv(tasks=[task], progress_from_tests=False)
    try:
        env.reset(options={"task": task["id"]})
        _, _, done, _, info = env.step("```bash\nsleep 30\n```")
        assert not done and info["signals"]["timed_out"]
        _, reward, done, _, info = env.step("```bash\nls\n```")
        assert done and reward == -1.0 and "agent timeout of 2 s is used up" in info["next_state"]["content"]
    finally:
        env.close()


def test_build_errors_name_the_task_and_the_step(tmp_path):
    shutil.copytree(BUNDLED / "harbor" / "count-log-levels", tmp_path / "t")
    dockerfile = tmp_path / "t" / "environment" / "Dockerfile"
    dockerfile.write_text("FROM python:3.11-slim\nWORKDIR /app\nRUN echo building && exit 3\n")
    with pytest.raises(BuildError, match=r"'t': Dockerfile line 3 \(RUN\) failed \(exit 3\)") as err:
        build_task_environment(read_task_dir(tmp_path / "t", "harbor"))
    assert "building" in str(err.value)  # the step's own output
    dockerfile.write_text("FROM alpine:3.20\n")
    with pytest.raises(BuildError, match="FROM alpine:3.20 has no local base; map it with env.base_images"):
        build_task_environment(read_task_dir(tmp_path / "t", "harbor"))
    dockerfile.write_text("FROM python:3.11-slim\nCOPY missing.txt /app/\n")
    with pytest.raises(BuildError, match="missing.txt is not in the build context"):
        build_task_environment(read_task_dir(tmp_path / "t", "harbor"))


def test_a_workdir_after_user_belongs_to_that_user_and_root_paths_stay_roots(tmp_path):
    """As BuildKit builds it: WORKDIR creates its missing directories owned by the current USER (the step after it can
    write there), while a directory only root may create stays out of that user's reach (the build fails there, as
    it does under Docker)."""
    import tarfile

    shutil.copytree(BUNDLED / "harbor" / "count-log-levels", tmp_path / "t")
    dockerfile = tmp_path / "t" / "environment" / "Dockerfile"
    dockerfile.write_text("FROM python:3.11-slim\nRUN useradd -m builder\nUSER builder\nWORKDIR /srv/app/data\n"
                          "RUN touch made-by-builder.txt\n")
    built = build_task_environment(read_task_dir(tmp_path / "t", "harbor"))
    with tarfile.open(built.tarball) as tar:
        owners = {m.name.lstrip("./"): (m.uid, m.gid) for m in tar.getmembers()}
    uid, gid = (int(x) for x in built.uid_gid.split(":"))
    assert uid != 0 and owners["srv"] == (0, 0)  # it existed: untouched
    assert owners["srv/app"] == owners["srv/app/data"] == owners["srv/app/data/made-by-builder.txt"] == (uid, gid)
    dockerfile.write_text("FROM python:3.11-slim\nRUN useradd -m builder\nUSER builder\nRUN mkdir -p /logs/verifier\n")
    with pytest.raises(BuildError, match=r"line 4 \(RUN\) failed") as err:
        build_task_environment(read_task_dir(tmp_path / "t", "harbor"))
    assert "Permission denied" in str(err.value)


def test_one_build_per_content(tmp_path):
    task = _task("harbor", "count-log-levels")
    first = build_task_environment(task)
    again = build_task_environment(task)
    assert again.key == first.key and again.build_s == 0.0 and again.tarball == first.tarball
    assert first.env["PIP_BREAK_SYSTEM_PACKAGES"] == "1" and first.workdir == "/app"  # a python:* image's pip


def test_a_short_rl_run_over_a_folder_of_harbor_tasks(tmp_path):
    cmd = [sys.executable, "-m", "rollout.launch", "env=terminal", f"env.tasks={BUNDLED / 'harbor'}",
           "env.tasks_format=harbor", "loop.iterations=1", "loop.tasks_per_iteration=3", "loop.samples_per_task=2",
           "loop.eval_tasks=0", "env.max_steps=3", f"run.out_dir={tmp_path / 'run'}", "run.name=task-dirs"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert steps and all('"task_id": "' in s for s in steps)
    assert {"count-log-levels", "fix-config-port", "sort-scores"} & {s.split('"task_id": "')[1].split('"')[0]
                                                                     for s in steps}
