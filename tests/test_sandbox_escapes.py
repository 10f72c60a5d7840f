"""Escape attempts against both sandbox backends. Each must be contained, and nothing on the host may change.

Host canaries: a directory of files outside the workdir (must stay unreadable and intact), the listing of the host's home
folders and /tmp (nothing may appear), a TCP server on the host's loopback (must stay unreachable), and, for the local
backend, the processes of the sandbox's host uid (none may outlive a command).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path

import pytest

from tests.sandbox_support import bwrap_or_skip, docker_host, processes_of_uid  # noqa: F401 (fixture)

# xdist may run these tests at the same moment on several workers: each sandbox leases its own host uid, and the host
# canary counts in /tmp only what a probe would write (names starting ESCAPE_MARKER, or "pwned"), so a neighbour test's
# folders are not mistaken for an escape
pytestmark = pytest.mark.integration
ESCAPE_MARKER = "escape-"

HOME_DIRS = [p for p in ("/root", "/home") if os.path.isdir(p)]


@pytest.fixture(params=["local", "docker"])
def runtime(request, tmp_path_factory):
    if request.param == "local":
        bwrap_or_skip()
        from envs.runtime.local import Limits, LocalRuntime

        rt = LocalRuntime(limits=Limits(processes=64, memory_bytes=1 << 30, timeout_s=20, output_bytes=1 << 20))
    else:
        host = request.getfixturevalue("docker_host")
        from envs.runtime.docker import DockerConfig, DockerRuntime
        from envs.runtime.local import Limits

        rt = DockerRuntime(
            DockerConfig(
                docker_host=host, pids=64, memory_bytes=1 << 30, limits=Limits(timeout_s=20, output_bytes=1 << 20)
            )
        )
    yield rt
    rt.close()


@pytest.fixture
def host_canary(tmp_path_factory):
    """Files outside any workdir, plus listings of places an escape would write to; checked after the test."""
    d = tmp_path_factory.mktemp("canary")
    secret = d / "secret.txt"
    secret.write_text("host secret " + uuid.uuid4().hex)
    os.chmod(d, 0o755)
    os.chmod(secret, 0o644)  # readable by anyone on the host: only the sandbox boundary keeps it out
    before = {
        "secret": secret.read_text(),
        "tmp": set(os.listdir("/tmp")),
        "homes": {h: set(os.listdir(h)) for h in HOME_DIRS},
        "root": set(os.listdir("/")),
    }
    yield secret
    assert secret.read_text() == before["secret"], "a host file changed"
    assert set(os.listdir("/")) == before["root"], "something appeared in the host's /"
    for h, names in before["homes"].items():
        assert set(os.listdir(h)) == names, f"the host's {h} changed"
    new_tmp = {n for n in set(os.listdir("/tmp")) - before["tmp"] if n.startswith(ESCAPE_MARKER) or "pwned" in n}
    assert not new_tmp, f"files appeared in the host's /tmp: {new_tmp}"


def _after_escape_is_clean(rt) -> None:
    """The runtime still works, and (local) no process of the sandbox uid survives the command."""
    r = rt.exec("echo still-here")
    assert r.exit_code == 0 and r.stdout.strip() == "still-here"
    uid = getattr(rt, "host_uid", None)
    if uid is not None:
        assert processes_of_uid(uid) == [], "processes of the sandbox uid outlived the command"


def test_network_is_unreachable(runtime, host_canary):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        probe = (
            "import socket\n"
            "for addr in [('127.0.0.1', %d), ('1.1.1.1', 80), ('151.101.0.223', 443)]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=3); print('CONNECTED', addr)\n"
            "    except OSError as e:\n"
            "        print('blocked', addr, type(e).__name__)\n"
            "try:\n"
            "    socket.getaddrinfo('pypi.org', 443); print('RESOLVED')\n"
            "except OSError as e:\n"
            "    print('no dns', type(e).__name__)\n"
        ) % port
        runtime.write_file("probe.py", probe)
        r = runtime.exec("python3 probe.py; cat /proc/net/dev")
        assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout, r.stdout
        assert r.stdout.count("blocked") == 3
        interfaces = [ln.split(":")[0].strip() for ln in r.stdout.splitlines() if ":" in ln and "|" not in ln]
        assert [i for i in interfaces if not i.startswith("blocked")] == ["lo"], r.stdout
        assert not accepted, "the sandbox reached a server on the host's loopback"
    finally:
        server.close()
    _after_escape_is_clean(runtime)


def test_writes_outside_the_workdir_fail(runtime, host_canary):
    marker = f"{ESCAPE_MARKER}{uuid.uuid4().hex[:8]}"
    system = [
        f"/usr/{marker}",
        f"/etc/{marker}",
        f"/bin/{marker}",
        f"/usr/lib/{marker}",
        str(host_canary),
        f"{host_canary.parent}/{marker}",
    ]
    private = [f"/{marker}", f"../{marker}", f"/var/tmp/{marker}", f"/tmp/{marker}"]
    r = runtime.exec(
        f"for p in {' '.join(system + private)}; do (echo x > $p) 2>/dev/null && echo WROTE $p; done; true"
    )
    wrote = {ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("WROTE ")}
    assert not wrote & set(system), f"wrote to read-only or host paths: {wrote & set(system)}"
    # whatever the sandbox could write to its own private root, /tmp or /var/tmp, the host never sees it
    for p in [f"/{marker}", f"/tmp/{marker}", f"/var/tmp/{marker}", f"/usr/{marker}", f"/etc/{marker}"]:
        assert not Path(p).exists(), f"{p} appeared on the host"
    _after_escape_is_clean(runtime)


def test_host_home_and_files_are_invisible(runtime, host_canary):
    r = runtime.exec(
        f"cat {host_canary} 2>&1; ls -a /root /home 2>&1; cat /root/.bashrc 2>&1; "
        f"ls {Path(__file__).resolve().parent} 2>&1; cat /etc/shadow 2>&1 | head -1; echo done"
    )
    secret = host_canary.read_text()
    assert secret not in r.stdout
    assert "test_sandbox_escapes.py" not in r.stdout, "the host's source tree is visible"
    assert "root:" not in r.stdout, "the host's /etc/shadow is readable"
    # a symlink planted in the workdir must not make the host read or write outside it
    runtime.exec(f"ln -s {host_canary} leak; ln -s /etc/passwd pw")
    with pytest.raises((FileNotFoundError, OSError)):
        data = runtime.read_file("leak")
        assert secret.encode() not in data
        raise FileNotFoundError("read returned other content")
    with pytest.raises(OSError):
        runtime.write_file("pw", "pwned\n")
    assert "pwned" not in Path("/etc/passwd").read_text()
    _after_escape_is_clean(runtime)


def test_fork_bomb_is_contained(runtime, host_canary):
    r = runtime.exec(":(){ :|:& };: ; sleep 1; echo survived", timeout=15)
    assert r.stdout.strip().endswith("survived") or r.timed_out
    _after_escape_is_clean(runtime)


# Forkers that keep the pids limit full after the command returns: cleaning up must not need a new process (a forked
# `kill` lost that race in CI and the next command could not start). Deterministic, unlike the shell bomb above.
_TABLE_FILLER = """python3 -c "
import os, time
def refill():
    while True:
        try:
            if os.fork() == 0:
                time.sleep(1000)
                os._exit(0)
        except OSError:
            time.sleep(0.001)
for _ in range(16):
    try:
        if os.fork() == 0:
            refill()
    except OSError:
        break
time.sleep(1)
print('table full')
\""""


def test_forkers_that_outlive_the_command_are_killed(runtime, host_canary):
    r = runtime.exec(_TABLE_FILLER, timeout=15)
    assert "table full" in r.stdout
    _after_escape_is_clean(runtime)


def test_10gb_allocation_fails(runtime, host_canary):
    r = runtime.exec("python3 -c \"b = b'x' * (10 * 1024**3); print('ALLOCATED', len(b))\"", timeout=60)
    assert "ALLOCATED" not in r.stdout
    assert r.exit_code != 0
    _after_escape_is_clean(runtime)


def test_infinite_output_is_capped(runtime, host_canary):
    r = runtime.exec("yes escape-output", timeout=60)
    assert r.truncated and not r.timed_out
    assert len(r.stdout) + len(r.stderr) <= (1 << 20)
    _after_escape_is_clean(runtime)


def test_rm_rf_root_only_empties_the_sandbox(runtime, host_canary):
    runtime.exec("echo keep > mine.txt")
    runtime.exec("rm -rf --no-preserve-root / 2>/dev/null; ls / | wc -l", timeout=60)
    assert Path("/usr/bin/env").exists() and Path("/etc/passwd").exists()
    _after_escape_is_clean(runtime)


def test_command_that_never_ends_is_killed(runtime, host_canary):
    r = runtime.exec("echo start; while true; do :; done", timeout=2)
    assert r.timed_out and r.stdout.startswith("start")
    r = runtime.exec("setsid bash -c 'sleep 1000' & sleep 1000", timeout=2)
    assert r.timed_out
    _after_escape_is_clean(runtime)


def test_killing_the_parent_is_contained(runtime, host_canary):
    """The command SIGKILLs every process it may signal (-1), pid 1 and its parent: only the sandbox's own processes
    die. Host processes outlive it: one of this test's uid and, for the local backend, one of the sandbox's own host uid
    outside the sandbox (`kill -1` reaches every process of that uid unless the pid namespace confines it)."""
    import subprocess
    import time

    bystanders = [subprocess.Popen(["sleep", "600"])]
    uid = getattr(runtime, "host_uid", None)
    if uid is not None:
        bystanders.append(subprocess.Popen(["sleep", "600"], user=uid))
    try:
        r = runtime.exec("echo before; sleep 600 & kill -9 -1; echo killed-all; kill -9 1; kill -9 $PPID; echo after",
                         timeout=10)
        assert "before\nkilled-all\n" in r.stdout, r  # the kills ran (the sandbox's own sleep was one of them)
        time.sleep(0.2)  # a SIGKILL is delivered at once, but let the kernel finish
        assert [b.poll() for b in bystanders] == [None] * len(bystanders), "the sandbox killed host processes"
    finally:
        for b in bystanders:
            b.kill()
            b.wait()
    _after_escape_is_clean(runtime)


# ----- every family, through its env: the python tool, a terminal command, a SWE command, a desktop task -----
# One probe, run the way each family runs code. It tries to read a host file, write the host's /tmp, /etc, /root and
# /home and the canary's directory, reach a listener on the host's loopback, and leave a daemon behind (double fork +
# setsid); it reports what it saw and its uid. The host then checks that nothing arrived, that no daemon survived, and
# that the code ran as non-root on the host.
PROBE = r"""
import os, socket, sys
canary, port, marker, sleep_arg = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
seen = []
try:
    seen.append("READ " + open(canary).read())
except OSError:
    seen.append("noread")
for d in ("/tmp", "/etc", "/root", "/home", "/usr", os.path.dirname(canary)):
    try:
        with open(os.path.join(d, marker), "w") as f:
            f.write("x")
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", port), timeout=3)
    seen.append("CONNECTED")
except OSError:
    seen.append("noconnect")
seen.append("uid %d" % os.getuid())
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", sleep_arg])
    os._exit(0)
os.wait()
print("PROBE " + " | ".join(seen))
"""


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    yield server
    server.close()


def _nothing_arrived(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except (TimeoutError, OSError):
        return True
    conn.close()
    return False


def _probe_args(host_canary, listener) -> tuple[list[str], str, str]:
    marker = f"{ESCAPE_MARKER}{uuid.uuid4().hex[:8]}"
    sleep_arg = str(4000 + int(uuid.uuid4().int % 900))  # a duration nothing else on this machine sleeps
    return [str(host_canary), str(listener.getsockname()[1]), marker, sleep_arg], marker, sleep_arg


def _shell_probe(args: list[str]) -> str:
    """A shell command that runs PROBE with python3 (base64: no quoting trouble)."""
    import base64
    import shlex

    b64 = base64.b64encode(PROBE.encode()).decode()
    return f"echo {b64} | base64 -d > /tmp/probe.py && python3 /tmp/probe.py {' '.join(map(shlex.quote, args))}"


def _check(output: str, host_canary, listener, marker: str, sleep_arg: str) -> None:
    assert "PROBE" in output, output[-2000:]
    assert host_canary.read_text() not in output and "READ" not in output
    assert "CONNECTED" not in output and _nothing_arrived(listener)
    for d in ("/tmp", "/etc", "/root", "/home", "/usr", str(host_canary.parent)):
        assert not os.path.exists(os.path.join(d, marker)), f"{d}/{marker} appeared on the host"
    import time

    for _ in range(100):  # killing is asynchronous: give the kernel a moment
        if not _live_with_arg(sleep_arg):
            return
        time.sleep(0.05)
    raise AssertionError(f"a daemon of the probe outlived its sandbox: {_live_with_arg(sleep_arg)}")


def _live_with_arg(arg: str) -> list[tuple[int, int]]:
    """(pid, host uid) of live processes whose command line is `sleep <arg>`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] != [b"sleep", arg.encode()]:
                    continue
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            if not status["State"].strip().startswith(("Z", "X")):
                found.append((int(entry), int(status["Uid"].split()[0])))
        except (OSError, ValueError, KeyError):
            continue
    return found


@pytest.mark.parametrize("sandbox", ["bwrap", "docker"])
def test_toolcall_python_tool_contains_the_probe(sandbox, host_canary, listener, request):
    import json

    from envs.toolcall.env import ToolCallEnv

    if sandbox == "bwrap":
        bwrap_or_skip()
        env = ToolCallEnv()
    else:
        env = ToolCallEnv(sandbox="docker", docker_host=request.getfixturevalue("docker_host"))
    try:
        env.reset(seed=0)
        args, marker, sleep_arg = _probe_args(host_canary, listener)
        code = f"import sys\nsys.argv = ['probe', *{args!r}]\n" + PROBE
        obs, *_ = env.step("<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>")
        uid = 1000 if sandbox == "bwrap" else 60001  # the docker sandbox's user
        assert f"uid {uid}" in obs["content"], obs["content"]
        host_uid = getattr(env.tools["python"].interpreter._place, "host_uid", uid)
        assert host_uid is None or host_uid != 0  # as root: a leased non-root host uid
        _check(obs["content"], host_canary, listener, marker, sleep_arg)
    finally:
        env.close()


def test_terminal_command_contains_the_probe(host_canary, listener):
    bwrap_or_skip()
    from envs.terminal.env import TerminalEnv

    env = TerminalEnv()
    try:
        env.reset(options={"task": "text-top-word"})
        args, marker, sleep_arg = _probe_args(host_canary, listener)
        obs, *_ = env.step(f"```bash\n{_shell_probe(args)}\n```")
        assert "uid 1000" in obs["content"]
        _check(obs["content"], host_canary, listener, marker, sleep_arg)
    finally:
        env.close()


def test_swe_command_contains_the_probe(host_canary, listener):
    bwrap_or_skip()
    import swebench  # noqa: F401 (the swe extra, always installed: a broken one fails)
    import shutil
    import tempfile

    from envs.swe.env import SWEEnv

    # the sandbox's uid must reach the repos and venvs: a world-searchable cache (a test's private NEXTSTATE_CACHE is not)
    cache = Path(tempfile.mkdtemp(prefix="nextstate-swe-probe-cache-", dir="/tmp"))
    os.chmod(cache, 0o755)
    env = SWEEnv(cache_dir=str(cache), repos_dir=str(cache / "repos"))
    try:
        env.reset(options={"task": "nextstate__semverlite-1"})
        args, marker, sleep_arg = _probe_args(host_canary, listener)
        obs, *_ = env.step(f"```bash\n{_shell_probe(args)}\n```")
        assert "uid 1000" in obs["content"]
        _check(obs["content"], host_canary, listener, marker, sleep_arg)
    finally:
        env.close()
        shutil.rmtree(cache, ignore_errors=True)


def test_gui_task_setup_and_sandbox_root_contain_the_probe(host_canary, listener):
    """A desktop task whose setup runs the probe as the desktop's user, and again as the sandbox's root (sudo): neither
    reaches the host, every process of the desktop runs as a non-root host uid, and nothing survives the episode."""
    from tests.gui_support import require_desktop_tools

    require_desktop_tools()
    from envs.gui.env import GUIEnv
    from envs.runtime.sandbox_root import DESKTOP_UID_BASE

    args, marker, sleep_arg = _probe_args(host_canary, listener)
    probe = _shell_probe(args)
    task = {
        "id": "escape-probe",
        "instruction": "nothing",
        "config": [
            {"type": "execute", "parameters": {"command": f"{probe} > ~/as-user.txt 2>&1", "shell": True}},
            {"type": "execute", "parameters": {"command": f"echo password | sudo -S sh -c {_quote(probe)} "
                                                          "> ~/as-root.txt 2>&1", "shell": True}},
        ],
        "evaluator": {"func": "infeasible"},
    }
    env = GUIEnv()
    try:
        env.reset(options={"task": task})
        d = env.desktop
        as_user, as_root = d.read_file("~/as-user.txt").decode(), d.read_file("~/as-root.txt").decode()
        assert "uid 1000" in as_user and "uid 0" in as_root, (as_user, as_root)
        inside = [p for p in d.place.pids() if p != d.place.ns.launcher.pid]
        uids = {int(dict(ln.split(":", 1) for ln in open(f"/proc/{p}/status") if ":" in ln)["Uid"].split()[0])
                for p in inside if os.path.exists(f"/proc/{p}")}
        assert uids and min(uids) >= DESKTOP_UID_BASE, uids  # even the sandbox's root is a non-root host uid
        # the probe's daemons (one left by each run) live on in the desktop until the episode ends, as the desktop's
        # host uids: the sandbox's root and its user 1000 mapped above DESKTOP_UID_BASE, never a host uid of the test
        assert sorted(u for _, u in _live_with_arg(sleep_arg)) == [DESKTOP_UID_BASE, DESKTOP_UID_BASE + 1000]
        # the next episode: a new sandbox, the last one's daemons gone
        env.reset(options={"task": {**task, "id": "after-the-probe", "config": []}})
        _check(as_user + as_root, host_canary, listener, marker, sleep_arg)
    finally:
        env.close()


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)
