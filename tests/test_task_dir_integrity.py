"""Reward integrity of task directories (and the JSON terminal tasks) against hostile agents, on both backends.

The probe tasks (tests/data/task_dirs/*/vault-code) ask for a secret that only their hidden tests and their oracle
hold. Each probe is an agent that tries one way to the reward: the oracle by its path, a background thief, a replaced
runner, a stale or symlinked reward, a conftest.py above the tests, sitecustomize / usercustomize / .pth files and a
pytest plugin of its own, /etc/ld.so.preload, a background writer of the reward, a killer of the verifier. Each must
end with outcome -1, and nothing the env returns in the episode (observations, info, signals) may hold the secret or
a marker of the tests' or the oracle's files. The oracle itself still scores +1 on the same tasks (the probes' -1 is
not a broken verifier). Also here: every agent process is gone before the final verification, per-step checks change
nothing the agent continues from, an episode with a hanging test stays within its agent timeout plus one
verification, the JSON tasks' hidden test commands leave nothing readable, and runtime_options cannot widen a task
directory's container.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from envs.terminal.env import TerminalEnv
from envs.terminal.task_dirs import read_task_dir
from tests.sandbox_support import bwrap_or_skip, docker_host, task_dirs_or_skip  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration
PROBES = Path(__file__).resolve().parent / "data" / "task_dirs"
SECRET = "kestrel-4e1d-vault-91c7"
HIDDEN = (SECRET, "hidden-test-marker-b5f2", "oracle-marker-7a0c")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
FAKE_SUMMARY = ("=== short test summary info ===\\nPASSED ../tests/test_outputs.py::test_the_code_is_written\\n"
                "PASSED ../tests/test_outputs.py::test_only_the_code\\n")
FAKE_PYTEST = ("#!/bin/sh\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
               f"printf '{FAKE_SUMMARY}'\nexit 0\n")
SITES = "/usr/local/lib/python3.11/dist-packages /usr/lib/python3/dist-packages /usr/lib/python3.11"
# what a site hook does: every pytest report passes, and the reward file says 1 when the process ends
PASS_ALL = ("import atexit, os\n"
            "def _win():\n    os.makedirs('/logs/verifier', exist_ok=True)\n"
            "    open('/logs/verifier/reward.txt', 'w').write('1')\n"
            f"    print('{FAKE_SUMMARY}', flush=True)\n"
            "atexit.register(_win)\n"
            "try:\n    import _pytest.reports as _r\n    _r.BaseReport.passed = property(lambda self: True)\n"
            "except Exception:\n    pass\n")
CONFTEST = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")


def write(path: str, text: str, mode: str = "644") -> str:
    """A command that writes `text` to `path` (base64: any bytes survive the shell)."""
    data = base64.b64encode(text.encode()).decode()
    return f"mkdir -p $(dirname {path}) && echo {data} | base64 -d > {path} && chmod {mode} {path}"


def background(loop: str) -> list[str]:
    """`loop` started three ways that leave the command's process group: nohup, setsid, a double fork."""
    return [f"nohup sh -c '{loop}' >/dev/null 2>&1 &",
            f"setsid sh -c '{loop}' >/dev/null 2>&1 < /dev/null &",
            f"( ( sh -c '{loop}' >/dev/null 2>&1 & ) & )"]


@dataclass(frozen=True)
class Probe:
    name: str
    commands: tuple[str, ...]
    progress: bool = False  # per-step tests on while it runs (the probes whose processes run beside them)
    needs: tuple[str, ...] = field(default_factory=tuple)  # host tools the probe needs


THIEF = ("while true; do cp -r /tests /solution /app/ 2>/dev/null; cat /tests/* /solution/* /logs/verifier/* "
         ">> /app/loot.txt 2>/dev/null; sleep 0.05; done")
WRITER = "while true; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.01; done"
KILLER = "while true; do pkill -9 -f pytest; pkill -9 -f python; pkill -9 -f test.sh; sleep 0.01; done"
PROBE_LIST = [
    Probe("oracle-by-path", ("bash /solution/solve.sh", "bash /solution/solution.sh", "cat /solution/*",
                             "ls -la / /solution /tests", "cat /app/code.txt")),
    Probe("background-thief", (*background(THIEF), "sleep 1; ls /app; cat /app/loot.txt",
                               "sleep 1; cat /app/loot.txt; ls -R /app/tests /app/solution"), progress=True),
    Probe("runner-replaced", (write("/usr/local/bin/nextstate-pytest", FAKE_PYTEST, "755"),
                              write("/usr/local/bin/pytest", FAKE_PYTEST, "755"),
                              write("/usr/bin/pytest", FAKE_PYTEST, "755"),
                              write("/opt/nextstate/bin/pytest", FAKE_PYTEST, "755"),
                              write("/opt/nextstate-verifier/bin/pytest", FAKE_PYTEST, "755"))),
    Probe("interpreters-replaced", (write("/usr/bin/python3.11", FAKE_PYTEST.replace("/bin/sh", "/bin/bash"), "755"),
                                    write("/usr/bin/dash", FAKE_PYTEST.replace("/bin/sh", "/bin/bash"), "755"),
                                    write("/usr/lib/python3.11/os.py", PASS_ALL),
                                    "echo /nonexistent/lib > /etc/ld.so.conf.d/zz.conf")),
    Probe("stale-reward", ("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
                           "echo '{\"reward\": 1}' > /logs/verifier/reward.json && echo 1 > /app/code.txt",)),
    Probe("reward-dir-symlink", ("mkdir -p /srv/mine && echo 1 > /srv/mine/reward.txt && rm -rf /logs/verifier && "
                                 "ln -s /srv/mine /logs/verifier",
                                 "rm -rf /logs && ln -s /srv /logs && mkdir -p /srv/verifier && "
                                 "echo 1 > /srv/verifier/reward.txt")),
    Probe("conftest-above-the-tests", (write("/conftest.py", CONFTEST), write("/app/conftest.py", CONFTEST),
                                       write("/tests/conftest.py", CONFTEST),
                                       write("/pytest.ini", "[pytest]\naddopts = -p no:terminal\n"),
                                       "echo wrong > /app/code.txt")),
    Probe("site-hooks", (*(write(f"{d}/sitecustomize.py", PASS_ALL) for d in SITES.split()),
                         *(write(f"{d}/usercustomize.py", PASS_ALL) for d in SITES.split()),
                         *(write(f"{d}/zz-hook.pth", "import zz_hook\n") for d in SITES.split()),
                         *(write(f"{d}/zz_hook.py", PASS_ALL) for d in SITES.split()),
                         write("/usr/lib/python3/dist-packages/zz_plugin.py", CONFTEST),
                         write("/usr/lib/python3/dist-packages/zz_plugin-1.0.dist-info/METADATA",
                               "Metadata-Version: 2.1\nName: zz-plugin\nVersion: 1.0\n"),
                         write("/usr/lib/python3/dist-packages/zz_plugin-1.0.dist-info/entry_points.txt",
                               "[pytest11]\nzz = zz_plugin\n"),
                         "echo wrong > /app/code.txt")),
    Probe("ld-so-preload", ("PRELOAD", "echo /usr/lib/zz-preload.so > /etc/ld.so.preload",
                            "echo wrong > /app/code.txt"), needs=("cc",)),
    Probe("background-reward-writer", tuple(background(WRITER)), progress=True),
    # the verifier's mount points made a file, a link, a directory where a file goes: its sandbox still starts
    # (an episode whose verification could not run would be retried, never scored)
    Probe("verifier-paths-blocked", ("rm -rf /tests /logs /opt/nextstate-verifier /opt/nextstate-image && "
                                     "touch /tests /logs /opt/nextstate-verifier && ln -s /nowhere /opt/nextstate-image"
                                     " && rm -f /etc/ld.so.preload && mkdir /etc/ld.so.preload",), progress=True),
    Probe("verifier-killer", (*background(KILLER), "echo wrong > /app/code.txt"), progress=True),
]
PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
static void win(void) {
    mkdir("/logs", 0755); mkdir("/logs/verifier", 0755);
    FILE *f = fopen("/logs/verifier/reward.txt", "w");
    if (f) { fputs("1\n", f); fclose(f); }
    printf("%s", "=== short test summary info ===\nPASSED ../tests/test_outputs.py::test_the_code_is_written\n"
                 "PASSED ../tests/test_outputs.py::test_only_the_code\n");
    fflush(stdout);
}
__attribute__((constructor)) static void hijack(void) { win(); atexit(win); }
"""
CASES = [("harbor", "auto"), ("terminal_bench", "auto"), ("terminal_bench", "pytest")]  # pytest, script, pytest


@pytest.fixture(scope="module", autouse=True)
def root_or_skip():
    task_dirs_or_skip()


@pytest.fixture(scope="module")
def preload_command(tmp_path_factory) -> str:
    """The command that installs a preload library built on the host (the images have no compiler)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine to build the preload library (apt-get install gcc libc6-dev)")
    d = tmp_path_factory.mktemp("preload")
    (d / "p.c").write_text(PRELOAD_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(d / "p.so"), str(d / "p.c")], check=True)
    data = base64.b64encode((d / "p.so").read_bytes()).decode()
    return f"echo {data} | base64 -d > /usr/lib/zz-preload.so"


def probe_task(fmt: str) -> dict:
    return read_task_dir(PROBES / fmt / "vault-code", fmt)


def backend_options(backend: str, request) -> dict:
    return {"docker_host": request.getfixturevalue("docker_host")} if backend == "docker" else {}


def play(env: TerminalEnv, task: dict, commands: list[str]) -> tuple[float, str]:
    """One episode of `commands` then submit; the outcome, and every text the env returned (JSON of obs and info)."""
    obs, info = env.reset(options={"task": task["id"]})
    seen = [json.dumps([obs, info], default=str)]
    reward, done = 0.0, False
    with env.step_limit_lifted(len(commands) + 1):
        for cmd in [*commands, SUBMIT]:
            obs, reward, done, truncated, info = env.step(f"```bash\n{cmd}\n```")
            seen.append(json.dumps([obs, info], default=str))
            if done or truncated:
                break
    assert done, "the episode did not end with the submission"
    return reward, "\n".join(seen)


def probe_cases():
    for backend in ("local", "docker"):
        for fmt, runner in CASES:
            for probe in PROBE_LIST:
                slow = backend == "docker" or (fmt, runner) != ("harbor", "auto") and probe.name not in (
                    "runner-replaced", "interpreters-replaced", "site-hooks", "conftest-above-the-tests")
                yield pytest.param(backend, fmt, runner, probe, id=f"{backend}-{fmt}-{runner}-{probe.name}",
                                   marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("backend, fmt, runner, probe", list(probe_cases()))
def test_a_hostile_agent_gets_no_reward_and_sees_nothing_hidden(backend, fmt, runner, probe, request):
    task = probe_task(fmt)
    commands = [request.getfixturevalue("preload_command") if c == "PRELOAD" else c for c in probe.commands]
    env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=backend_options(backend, request),
                      progress_from_tests=probe.progress, test_runner=runner, progress_timeout=20)
    try:
        outcome, seen = play(env, task, commands)
    finally:
        env.close()
    assert outcome == -1.0, seen[-3000:]
    for marker in HIDDEN:
        assert marker not in seen, f"{marker!r} reached the agent: ...{seen[max(seen.find(marker) - 300, 0):][:600]}"


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.slow)])
@pytest.mark.parametrize("fmt, runner", CASES)
def test_the_probe_tasks_are_solved_by_their_oracle_only(backend, fmt, runner, request):
    """The control: the same verification gives the oracle +1 (in a replay the env plays itself), and the oracle's
    own command typed by an agent finds nothing."""
    task = probe_task(fmt)
    env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=backend_options(backend, request),
                      progress_from_tests=False, test_runner=runner)
    try:
        messages = env.demonstration(task["id"])
        assert messages[-1]["content"] in ("Submitted. The verifier's reward is 1.", "Submitted. 2 of 2 hidden tests "
                                                                                   "passed.")
        if fmt == "harbor":  # an oracle that finds its files by its own path: the command alone gives nothing
            oracle = next(m["content"] for m in messages if m["role"] == "assistant")
            assert oracle == "```bash\nbash /solution/solve.sh\n```"
            outcome, seen = play(env, task, ["bash /solution/solve.sh"])
            assert outcome == -1.0 and SECRET not in seen
    finally:
        env.close()


def _marked_processes(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    with open(f"/proc/{entry}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                            found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.slow)])
def test_every_agent_process_is_gone_before_the_final_verification(backend, request):
    """Processes that left their group, forked twice, made nested namespaces or changed their uid all end before
    the tests run: the verification's snapshot is taken after them, and nothing of theirs survives it."""
    task = probe_task("harbor")
    marker = f"1000.{os.getpid() % 10000:04d}{int(time.time()) % 1000:03d}"  # `sleep` reads it as seconds
    env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=backend_options(backend, request),
                      progress_from_tests=False)
    try:
        env.reset(options={"task": task["id"]})
        ways = [f"setsid sleep {marker}", f"nohup sleep {marker}", f"( ( sleep {marker} & ) & )",
                f"unshare --pid --fork --mount-proc sleep {marker}", f"unshare --user --map-root-user sleep {marker}",
                f"setpriv --reuid=4242 --regid=4242 --clear-groups sleep {marker}"]
        for way in ways:
            env.step(f"```bash\n{way} > /dev/null 2>&1 < /dev/null &\nsleep 0.2\n```")
        alive = _marked_processes(marker)
        # docker's default seccomp profile refuses new namespaces to a container's root (Docker's defaults)
        assert len(alive) >= (6 if backend == "local" else 4), alive  # (unshare --fork adds its own parent)
        env.step(f"```bash\n{SUBMIT}\n```")
        assert _marked_processes(marker) == []
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.slow)])
def test_per_step_checks_change_nothing_the_agent_continues_from(backend, request):
    task = probe_task("terminal_bench")
    env = TerminalEnv(tasks=[task], runtime=backend, runtime_options=backend_options(backend, request),
                      progress_from_tests=True, test_runner="pytest")
    look = ("ls -laR --time-style=full-iso /app /logs /tmp /root /etc/ld.so.preload /tests /solution 2>&1; "
            "ps -e -o pid=,comm= | grep -v -e ps -e bash -e grep -e timeout")
    try:
        env.reset(options={"task": task["id"]})
        _, _, _, _, info = env.step("```bash\necho wrong > /app/code.txt; sleep 1000 > /dev/null 2>&1 &\n```")
        assert info["signals"]["tests_total"] >= 1  # the check ran
        before = env.step(f"```bash\n{look}\n```")[0]["content"]
        after = env.step(f"```bash\n{look}\n```")[0]["content"]
        assert before == after and "sleep" in before and "No such file" in before  # no /tests, no /solution
    finally:
        env.close()


def test_an_episode_with_a_hanging_test_ends_within_its_agent_timeout_and_one_verification(tmp_path):
    """Per-step checks are cut at `progress_timeout` and run on the episode's clock, so a test that blocks on a socket
    costs at most the agent timeout plus one (final) verification, however many steps the agent takes."""
    shutil.copytree(PROBES / "harbor" / "vault-code", tmp_path / "hang")
    (tmp_path / "hang" / "tests" / "test_outputs.py").write_text(
        "import socket\n\n\ndef test_waits_for_a_client_that_never_comes():\n"
        "    socket.create_server(('127.0.0.1', 0)).accept()\n")
    toml = tmp_path / "hang" / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 60.0", "timeout_sec = 5.0")
                    .replace("timeout_sec = 300.0", "timeout_sec = 8.0"))
    task = read_task_dir(tmp_path / "hang", "harbor")
    assert (task["agent_timeout_s"], task["test_timeout_s"]) == (8.0, 5.0)
    env = TerminalEnv(tasks=[task], progress_from_tests=True, progress_timeout=3.0, max_steps=50)
    try:
        env.reset(options={"task": task["id"]})  # builds the environment; its first check is on the clock below
        t0 = time.monotonic()
        env.reset(options={"task": task["id"]})
        steps, done, info = 0, False, {}
        while not done:
            _, reward, done, truncated, info = env.step("```bash\ntrue\n```")
            steps += 1
            done = done or truncated
        wall = time.monotonic() - t0
    finally:
        env.close()
    assert reward == -1.0 and "agent timeout of 8 s is used up" in info["next_state"]["content"]
    assert steps < 10  # each check took its 3 s of the agent's 8: without the bound, 50 steps of 5 s
    # the agent timeout, one verification, and the sandboxes' own overhead (generous: a loaded 2-core machine); without
    # the bound this episode takes its 50 steps of 5 s
    assert wall < 8.0 + 5.0 + 60.0, wall


# ----- the JSON terminal tasks -----
SECRET_JSON_TASK = {
    "id": "json-vault", "instruction": "Write the vault's access code to answer.txt.", "setup": ["echo the vault > README"],
    "tests": [f"printf %s {SECRET} > /tmp/expected && touch test-was-here && test \"$(cat answer.txt)\" = "
              f"\"$(cat /tmp/expected)\"", f"grep -q {SECRET} answer.txt"],
    "solution": [f"echo {SECRET} > answer.txt"], "timeout": 10.0,
}


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.slow)])
def test_json_hidden_tests_run_after_the_agent_and_leave_nothing_readable(backend, request):
    """The JSON tasks: every process an agent's command starts ends with it (bwrap's pid namespace; docker's cleanup
    as the agent's uid), so the hidden test commands run with none of them, and a per-step check's writes (a file
    in the workdir, one in /tmp) are gone before the agent's next command."""
    if backend == "local":
        bwrap_or_skip()
    env = TerminalEnv(tasks=[SECRET_JSON_TASK], runtime=backend, runtime_options=backend_options(backend, request),
                      progress_from_tests=True)
    thief = ("while true; do cat /proc/[0-9]*/cmdline /tmp/expected 2>/dev/null | tr '\\0' ' ' >> loot.txt; "
             "sleep 0.01; done")
    try:
        outcome, seen = play(env, SECRET_JSON_TASK, [
            *background(thief), "echo wrong > answer.txt; sleep 0.5",
            "sleep 0.5; ls -a; cat loot.txt /tmp/expected; ls /tmp",
        ])
        assert "test-was-here" not in seen and "expected" not in seen.replace("/tmp/expected", "")
    finally:
        env.close()
    assert outcome == -1.0
    assert SECRET not in seen


# ----- what runtime_options may not do -----
@pytest.mark.parametrize("option, value, fragment", [
    ("network", True, "host's network"),
    ("network_mode", "host", "cannot be set"),
    ("privileged", True, "cannot be set"),
    ("capabilities", ["SYS_ADMIN"], "beyond Docker's defaults"),
    ("devices", ["/dev/kmsg"], "cannot be set"),
    ("volumes", {"/": {"bind": "/host"}}, "cannot be set"),
    ("pid_mode", "host", "cannot be set"),
    ("image", "ubuntu", "cannot be set"),
    ("shm_size", "1g", "unknown"),
])
def test_runtime_options_cannot_widen_a_task_directorys_container(option, value, fragment):
    from envs.terminal.task_runtime import check_docker_options

    with pytest.raises(ValueError, match=fragment):
        check_docker_options({option: value})
    check_docker_options({"docker_host": "unix:///x", "limits": {"timeout_s": 5}, "cpus": 0.5, "pids": 64,
                          "capabilities": ["CHOWN"], "no_new_privileges": True, "network": False})
