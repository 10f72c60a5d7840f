"""The sandboxed Python interpreter: real child processes in real bubblewrap sandboxes, real rlimits, real kills.
(Escapes, for every sandbox, are in test_sandbox_escapes.py.)"""

import os
import signal
import threading
import time

import pytest

from tests.sandbox_support import docker_host  # noqa: F401 (fixture)

from envs.toolcall.interpreter import CodeResult, InterpreterLimits, PythonInterpreter, _CappedStream, limit_hit
from tests.sandbox_support import bwrap_or_skip

pytestmark = pytest.mark.integration  # real processes and kernel limits (always present on Linux)


LIMITS = InterpreterLimits(timeout_s=30, cpu_s=1, memory_mb=512, file_size_mb=1, open_files=32)


@pytest.fixture(scope="module")
def interp():
    bwrap_or_skip()
    # A generous wall timeout (the machine may be loaded); the CPU limit stops busy loops after 1 s of CPU.
    i = PythonInterpreter(LIMITS)
    yield i
    i.close()


def _live_with_arg(arg: str) -> list[int]:
    """Host pids of live processes whose command line contains `arg`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if arg.encode() in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as st:
                        if st.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                            found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def test_runs_code_and_reports_output(interp):
    r = interp.run("import math\nprint(6 * 7)\nprint(math.sqrt(16))")
    assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("42\n4.0\n", "", 0, True)


def test_each_call_is_a_fresh_process_in_a_fresh_dir(interp):
    r1 = interp.run("import os\nopen('x.txt', 'w').write('hi')\nopen('/tmp/y', 'w').write('hi')\nprint(os.getcwd(), os.getpid())")
    r2 = interp.run("import os\nprint(os.path.exists('x.txt') or os.path.exists('/tmp/y'), os.getcwd(), os.getpid())")
    (cwd1, pid1), (exists, cwd2, pid2) = r1.stdout.split(), r2.stdout.split()
    assert exists == "False" and cwd1 != cwd2
    assert pid1 == pid2 == "2"  # each call runs in its own pid namespace (bwrap's init is 1)
    assert not os.path.exists(cwd1)  # the private dir never was on the host


def test_unsandboxed_calls_use_a_fresh_host_dir_each():
    i = PythonInterpreter(LIMITS, sandbox="none")
    r1 = i.run("import os\nopen('x.txt', 'w').write('hi')\nprint(os.getcwd(), os.getpid())")
    r2 = i.run("import os\nprint(os.path.exists('x.txt'), os.getcwd(), os.getpid())")
    (cwd1, pid1), (exists, cwd2, pid2) = r1.stdout.split(), r2.stdout.split()
    assert exists == "False" and cwd1 != cwd2 and pid1 != pid2
    assert not os.path.exists(cwd1)  # the temp dir is removed after the call
    assert i.run("exit(137)").exit_code == 137 and i.run("import os; os.abort()").exit_code == -signal.SIGABRT


def test_exception_traceback_points_at_user_code_only(interp):
    r = interp.run("x = 1\n1 / 0")
    assert r.exit_code == 1 and r.killed_reason is None
    assert 'File "main.py", line 2' in r.stderr and "ZeroDivisionError" in r.stderr
    assert "<string>" not in r.stderr  # the bootstrap's frame is hidden


def test_syntax_error_and_exit_codes(interp):
    assert "SyntaxError" in interp.run("def f(:\n pass").stderr
    assert interp.run("exit(3)").exit_code == 3
    assert interp.run("import sys; sys.exit(0)").exit_code == 0
    assert "EOFError" in interp.run("input()").stderr  # stdin is /dev/null


def test_infinite_loop_is_killed_by_the_cpu_limit(interp):
    r = interp.run("print('start')\nwhile True:\n    pass")
    assert r.killed_reason is not None and not r.ok and not r.timed_out
    assert r.exit_code in (-signal.SIGXCPU, -signal.SIGKILL) and "CPU time limit" in r.killed_reason
    assert r.stdout == "start\n"  # output printed before the kill survives (line-buffered stdout)


def test_sleeping_forever_hits_the_wall_timeout(interp):
    r = PythonInterpreter(InterpreterLimits(timeout_s=0.5)).run("import time\ntime.sleep(60)")
    assert r.timed_out and r.exit_code == -signal.SIGKILL and "timeout" in r.killed_reason


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_background_children_are_killed_with_the_group(sandbox):
    if sandbox == "bwrap":
        bwrap_or_skip()
    i = PythonInterpreter(LIMITS, sandbox=sandbox)
    arg = str(3000 + os.getpid() % 1000)  # a sleep length nothing else on this machine uses
    r = i.run(f"import subprocess\np = subprocess.Popen(['sleep', '{arg}'])\nprint(p.pid)")
    assert r.ok, r
    # SIGKILL was sent before run() returned; delivery is asynchronous. Dead = gone, or a zombie when this machine's
    # init does not reap orphans.
    for _ in range(200):
        if not _live_with_arg(arg):
            break
        time.sleep(0.05)
    assert not _live_with_arg(arg)
    i.close()


def test_exit_codes_and_signals_are_told_apart(interp):
    assert interp.run("exit(137)").exit_code == 137  # a normal exit, though a sandbox says 128 + 9 for a SIGKILL
    r = interp.run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert r.exit_code == -signal.SIGTERM and r.killed_reason == "killed by signal SIGTERM"
    assert interp.run("import sys; print('x', file=sys.stderr)").stderr == "x\n"  # the exit report is not shown


def test_allocating_10_gb_raises_memory_error(interp):
    r = interp.run("x = bytearray(10 * 1024**3)")
    assert r.exit_code == 1 and "MemoryError" in r.stderr
    assert limit_hit(r, interp.limits) == "memory limit of 512 MB reached"


def test_100_mb_of_output_is_truncated_with_a_marker(interp):
    interp = PythonInterpreter(InterpreterLimits(timeout_s=60, cpu_s=30))
    r = interp.run("import sys\nsys.stdout.write('x' * 100_000_000)\nprint('END')")
    assert r.truncated and r.exit_code == 0
    assert len(r.stdout) < 2 * interp.limits.max_output_bytes
    assert "bytes of output truncated" in r.stdout and r.stdout.endswith("END\n")  # head and tail are kept


def test_huge_file_fails_with_efbig(interp):
    r = interp.run("open('big', 'wb').write(b'x' * 10_000_000)")
    assert r.exit_code == 1 and "File too large" in r.stderr
    assert limit_hit(r, interp.limits) == "file size limit of 1 MB reached"


def test_open_file_limit(interp):
    r = interp.run("fs = [open('/dev/null') for _ in range(100)]")
    assert "Too many open files" in r.stderr
    assert limit_hit(r, interp.limits) == "open files limit of 32 reached"
    assert limit_hit(interp.run("print('MemoryError')\n1/0"), interp.limits) is None


def test_code_that_is_not_valid_utf8_is_reported_not_raised(interp):
    r = interp.run("print('\ud800')")
    assert r.exit_code == 1 and "UnicodeDecodeError" in r.stderr


def test_concurrent_calls_from_threads(interp):
    results: dict[int, CodeResult] = {}

    def work(i):
        results[i] = interp.run(f"print({i} * {i})")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {i: r.stdout for i, r in results.items()} == {i: f"{i * i}\n" for i in range(8)}


def test_installed_packages_are_importable(interp):
    assert interp.run("import numpy\nprint(int(numpy.arange(5).sum()))").stdout == "10\n"


def test_capped_stream_keeps_head_and_tail():
    s = _CappedStream(8)
    for chunk in (b"abcdef", b"ghijkl", b"mnop"):
        s.feed(chunk)
    assert s.truncated and s.total == 16
    assert s.text().startswith("abcdef") and s.text().endswith("op")
    small = _CappedStream(100)
    small.feed("héllo".encode())
    assert (small.text(), small.truncated) == ("héllo", False)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="memory_mb"):
        InterpreterLimits(memory_mb=0)
    with pytest.raises(ValueError, match="sandbox"):
        PythonInterpreter(sandbox="chroot")


def test_processes_are_limited(interp):
    code = (
        "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\n"
    )
    r = interp.run(code)
    assert r.stdout.startswith("stopped") and int(r.stdout.split()[1]) < 64, r


# ----- the docker sandbox -----
@pytest.fixture(scope="module")
def docker_interp(docker_host):
    i = PythonInterpreter(LIMITS, sandbox="docker", docker_host=docker_host)
    yield i
    i.close()


def test_docker_sandbox_runs_code_with_the_same_observations(docker_interp):
    r = docker_interp.run("import os\nprint(6 * 7, os.getuid() != 0)\n1 / 0")
    assert r.stdout == "42 True\n" and r.exit_code == 1 and 'File "main.py", line 3' in r.stderr
    assert docker_interp.run("exit(137)").exit_code == 137
    r = docker_interp.run("while True:\n    pass")
    assert not r.ok and "CPU time limit" in r.killed_reason
    r = docker_interp.run("import sys\nsys.stdout.write('x' * 1_000_000)")
    assert r.truncated and len(r.stdout) < 2 * LIMITS.max_output_bytes
    assert not docker_interp.run("import os; print(os.path.exists('x.txt')); open('x.txt', 'w')").stdout.startswith("True")
    assert docker_interp.run("import os; print(os.path.exists('x.txt'))").stdout == "False\n"



def test_a_private_cache_dir_does_not_stop_the_sandbox(tmp_path, monkeypatch):
    """Tests (and users) point NEXTSTATE_CACHE at private dirs; the interpreter's mirror lives with the images."""
    bwrap_or_skip()
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path))
    i = PythonInterpreter(LIMITS)
    try:
        assert i.run("print(6 * 7)").stdout == "42\n"
    finally:
        i.close()
