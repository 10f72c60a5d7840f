"""The process helper and the local runtime's behaviour (not escapes: see test_sandbox_escapes.py)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import pytest

from envs.runtime import Runtime
from envs.runtime.backends import make_runtime
from envs.runtime.process import run_capped
from tests.sandbox_support import bwrap_or_skip, processes_of_uid


# ----- run_capped: a plain child process -----
def test_run_capped_feeds_stdin_and_separates_streams():
    r = run_capped(["bash", "-c", "cat; echo err >&2; exit 3"], timeout=30, output_limit=1 << 20, stdin=b"x" * 200_000)
    assert r.exit_code == 3 and r.stdout == b"x" * 200_000 and r.stderr == b"err\n"
    assert not r.timed_out and not r.truncated


def test_run_capped_timeout_kills_the_whole_group():
    r = run_capped(["bash", "-c", "sleep 100 & sleep 100 & echo started; wait"], timeout=1, output_limit=1000)
    assert r.timed_out and r.stdout == b"started\n" and r.exit_code == 128 + 9


def test_run_capped_stops_at_the_output_cap():
    r = run_capped(
        [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('y' * 4096)"], timeout=60, output_limit=100_000
    )
    assert r.truncated and not r.timed_out and len(r.stdout) == 100_000


def test_run_capped_reports_signals_as_shells_do():
    r = run_capped(["bash", "-c", "kill -TERM $$"], timeout=10, output_limit=100)
    assert r.exit_code == 128 + 15


def test_make_runtime_rejects_unknown_options():
    with pytest.raises(ValueError, match="known"):
        make_runtime("local", {"isolation": "bwrap", "colour": "red"})
    with pytest.raises(ValueError, match="runtime limit"):
        make_runtime("local", {"limits": {"cpu_seconds": 1, "gpus": 2}})
    with pytest.raises(ValueError, match="use one of"):
        make_runtime("vm")


# ----- LocalRuntime -----
@pytest.fixture
def rt():
    bwrap_or_skip()
    r = make_runtime("local", {"limits": {"timeout_s": 20}})
    yield r
    r.close()


@pytest.mark.integration
def test_protocol_files_and_state_between_commands(rt):
    assert isinstance(rt, Runtime)
    rt.write_file("dir/a b.txt", b"\x00\x01binary")
    assert rt.read_file("dir/a b.txt") == b"\x00\x01binary"
    assert rt.read_file("/workspace/dir/a b.txt") == b"\x00\x01binary"
    r = rt.exec("cd dir && export X=1 && ls")
    assert r.ok and r.stdout == "a b.txt\n"
    r = rt.exec("pwd; echo ${X:-unset}; id -un; echo $HOME")
    assert r.stdout.split() == ["/workspace", "unset", "agent", "/workspace"]  # cwd and variables reset, files stay
    with pytest.raises(FileNotFoundError):
        rt.read_file("missing.txt")
    with pytest.raises(OSError):
        rt.write_file("/usr/x.txt", "no")


@pytest.mark.integration
def test_limits_are_applied(rt):
    r = rt.exec("ulimit -t; ulimit -v; ulimit -u; ulimit -f; ulimit -n")
    cpu, mem, procs, fsize, nofile = r.stdout.split()
    assert (cpu, mem, procs, fsize, nofile) == ("120", str(4 << 20), "256", str(1 << 20), "1024")
    r = rt.exec("ulimit -u 100000")  # the agent cannot raise its own hard limits
    assert r.exit_code != 0
    r = rt.exec("head -c 2000000000 /dev/zero > big", timeout=60)
    assert r.exit_code != 0 and os.path.getsize(rt.workdir / "big") <= 1 << 30


@pytest.mark.integration
def test_close_kills_running_commands_and_removes_the_workdir():
    bwrap_or_skip()
    rt = make_runtime("local")
    workdir = rt.workdir
    results = []
    t = threading.Thread(target=lambda: results.append(rt.exec("sleep 100", timeout=100)))
    t.start()
    time.sleep(1.0)
    rt.close()
    t.join(30)
    assert not t.is_alive() and results and results[0].exit_code == 128 + 9
    assert not workdir.exists()
    if rt.host_uid is not None:
        assert processes_of_uid(rt.host_uid) == []
    with pytest.raises(RuntimeError, match="closed"):
        rt.exec("true")


@pytest.mark.integration
def test_each_runtime_has_its_own_uid_and_workdir():
    bwrap_or_skip()
    a, b = make_runtime("local"), make_runtime("local")
    try:
        assert a.workdir != b.workdir
        if os.geteuid() == 0:
            assert a.host_uid != b.host_uid and a.host_uid >= 1_000_000_000
        a.write_file("secret", "a")
        assert b.exec("ls /workspace").stdout == ""
    finally:
        a.close()
        b.close()


def test_unsandboxed_mode_is_loud(caplog):
    with caplog.at_level(logging.WARNING):
        rt = make_runtime("local", {"isolation": "none"})
    try:
        assert any("UNSANDBOXED" in r.message for r in caplog.records)
        r = rt.exec("pwd; echo hi > f; cat f")
        assert r.stdout.splitlines() == [str(rt.workdir), "hi"]
    finally:
        rt.close()


@pytest.mark.integration
def test_commands_of_any_length_and_the_ones_bash_cannot_receive(rt):
    """A command is never an argv string (one holds at most 128 KiB): 300 kB runs; stdin still reaches write_file's cat.
    A NUL byte or a lone surrogate is a ValueError that says where, before anything starts."""
    r = rt.exec("printf %s " + "x" * 300_000 + ' | wc -c; echo "[${__nextstate_cmd-}]" $#')
    assert r.ok and r.stdout.split() == ["300000", "[]", "0"], r.stderr[-500:]
    rt.write_file("big.txt", "y" * 300_000)
    assert rt.exec("wc -c < big.txt").stdout.strip() == "300000"
    with pytest.raises(ValueError, match="NUL byte .character 6."):
        rt.exec("echo a\0b")
    with pytest.raises(ValueError, match="lone surrogate"):
        rt.exec("echo \udc80")
