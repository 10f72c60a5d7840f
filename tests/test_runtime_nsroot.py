"""The throwaway-root sandbox of the local desktops, on its own: uid mapping, the overlay, binds, network, lifetime."""

from __future__ import annotations

import os
import time

import pytest

from envs.runtime.nsroot import Bind, NamespaceRoot
from envs.runtime.sandbox_root import DESKTOP_UID_BASE, ensure_sandbox_root

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lower():
    if os.geteuid() != 0:
        pytest.skip("the desktop sandbox maps a uid range: it needs root")
    return ensure_sandbox_root()


def test_a_root_of_its_own_over_the_shared_tree(lower, tmp_path):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "f").write_text("from the host\n")
    ns = NamespaceRoot(lower, uid_base=DESKTOP_UID_BASE, binds=[Bind(str(tmp_path / "ro"), "/mnt/ro")], hostname="t")
    try:
        r = ns.run(["/bin/sh", "-c", "id -u; hostname; cat /proc/self/uid_map; echo x > /etc/written && cat /etc/written; "
                    "cat /mnt/ro/f; echo y > /mnt/ro/f 2>&1; ls /sys/class/net 2>/dev/null; cat /proc/net/dev | tail -n +3; "
                    "pwd"], uid=0, cwd="/tmp")
        out = r.stdout.decode()
        lines = out.splitlines()
        assert lines[0] == "0" and lines[1] == "t"
        assert lines[2].split() == ["0", str(DESKTOP_UID_BASE), "65536"]  # root inside is a non-root host uid
        assert "x" in lines and "from the host" in lines and "Read-only file system" in r.stderr.decode() + out
        assert [ln.split(":")[0].strip() for ln in out.splitlines() if ln.strip().startswith("lo:")] == ["lo"]
        assert lines[-1] == "/tmp"  # the working directory is resolved inside, never on the host
        assert not (lower / "etc" / "written").exists() and (tmp_path / "ro" / "f").read_text() == "from the host\n"
        assert ns.run(["id", "-u"], uid=1000).stdout == b"1000\n"
        assert ns.run(["/bin/sh", "-c", "echo password | sudo -S id -u"], uid=1000).stdout == b"0\n"
        inside = [p for p in ns.pids() if p != ns.launcher.pid]
        assert inside == [ns.init_pid]  # only its pid 1 is left between commands
        ns.run(["/bin/sh", "-c", "setsid sleep 1000 > /dev/null 2>&1 < /dev/null &"], uid=1000)
        assert len(ns.pids()) == 3  # launcher, pid 1, the daemon
    finally:
        ns.close()
    deadline = time.monotonic() + 5
    while ns.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ns.pids() == [] and not ns.scratch.exists()  # everything inside ended with it


def test_a_second_sandbox_starts_from_the_pristine_tree(lower):
    for expect in (b"absent\n", b"absent\n"):
        ns = NamespaceRoot(lower, uid_base=DESKTOP_UID_BASE)
        try:
            r = ns.run(["/bin/sh", "-c", "test -e /etc/mark && echo present || echo absent; touch /etc/mark"], uid=0)
            assert r.stdout == expect
        finally:
            ns.close()
