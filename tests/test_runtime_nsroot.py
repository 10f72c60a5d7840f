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


@pytest.fixture
def layer_dir():
    """A folder the sandboxes' uids can reach (pytest's tmp_path is under a mode-700 folder), removed after."""
    import shutil
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="nextstate-test-layer-"))
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _sh(ns: NamespaceRoot, script: str, uid: int = 0) -> str:
    r = ns.run(["/bin/sh", "-c", script], uid=uid, timeout=60)
    return (r.stdout + r.stderr).decode()


def test_a_read_only_bind_stays_read_only_for_root_inside(lower, tmp_path):
    """Made before the user namespace, a read-only bind is locked: root inside can neither write it nor remount it
    writable, even where its files belong to uids mapped inside (which root there could otherwise write)."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "f").write_text("from the host\n")
    for p in (tmp_path / "ro", tmp_path / "ro" / "f"):
        os.chown(p, DESKTOP_UID_BASE, DESKTOP_UID_BASE)  # root's own files, inside
    ns = NamespaceRoot(lower, uid_base=DESKTOP_UID_BASE, binds=[Bind(str(tmp_path / "ro"), "/mnt/ro")])
    try:
        out = _sh(ns, "echo x > /mnt/ro/f; mount -o remount,bind,rw /mnt/ro && echo REMOUNTED; "
                      "echo y > /mnt/ro/f; chmod 777 /mnt/ro/f; cat /mnt/ro/f")
    finally:
        ns.close()
    assert "REMOUNTED" not in out and "from the host" in out
    assert (tmp_path / "ro" / "f").read_text() == "from the host\n"


def test_binds_land_where_the_tree_says_without_following_its_links(lower, tmp_path, layer_dir):
    """A bind target is made a real directory inside: a symlink in the way (an agent's, in a snapshot layer) is
    replaced in the sandbox's own overlay, never followed, so nothing is made or mounted on the host."""
    agent = NamespaceRoot(lower, uid_base=DESKTOP_UID_BASE)
    escape = tmp_path / "escape"
    try:
        _sh(agent, f"rm -rf /srv; ln -s {escape} /srv; ln -s {tmp_path}/preload /etc/ld.so.preload")
        agent.end_processes()
        agent.copy_writes(layer_dir)
    finally:
        agent.close()
    (tmp_path / "src").mkdir()
    (tmp_path / "empty").write_text("")
    ns = NamespaceRoot(lower, uid_base=DESKTOP_UID_BASE, layers=[layer_dir],
                       binds=[Bind(str(tmp_path / "src"), "/srv/data/in"), Bind(str(tmp_path / "empty"),
                                                                             "/etc/ld.so.preload")])
    try:
        out = _sh(ns, "stat -c %F /srv /srv/data/in /etc/ld.so.preload")
    finally:
        ns.close()
    assert out.split("\n")[:3] == ["directory", "directory", "regular empty file"], out
    assert not escape.exists() and not (tmp_path / "preload").exists()


def test_a_snapshot_of_a_sandbox_carries_its_writes_and_none_of_its_processes(lower, layer_dir):
    """`end_processes` ends everything inside, nested pid namespaces too; `copy_writes` then copies the writes (files,
    deletions, replaced directories) into a layer another sandbox stacks on the same tree; `empty_dirs` start empty
    there whatever the layer holds, and `read_written` reads back only what that sandbox wrote, through no link."""
    agent = NamespaceRoot(lower, uid_base=DESKTOP_UID_BASE)
    try:
        _sh(agent, "mkdir -p /app /logs/verifier && echo mine > /app/a && echo 1 > /logs/verifier/reward.txt && "
                   "rm /etc/hostname && rm -rf /usr/share/doc && mkdir /usr/share/doc && touch /usr/share/doc/x; "
                   "unshare --pid --fork sleep 1000 > /dev/null 2>&1 & setsid sleep 1000 > /dev/null 2>&1 &")
        assert len(agent.pids()) >= 4  # launcher, pid 1, the sleepers
        agent.end_processes()
        assert agent.pids() == []
        agent.copy_writes(layer_dir)
        assert agent.read_written("/app/a") == b"mine\n" and agent.read_written("/etc/passwd") is None
    finally:
        agent.close()
    ns = NamespaceRoot(lower, uid_base=DESKTOP_UID_BASE, layers=[layer_dir], empty_dirs=["/logs/verifier"])
    try:
        out = _sh(ns, "cat /app/a; ls /etc/hostname; ls /usr/share/doc; ls -A /logs/verifier | wc -l; "
                      "echo 0.5 > /logs/verifier/reward.txt; ln -s /etc/passwd /logs/verifier/reward.json")
        ns.end_processes()
        assert ns.read_written("/logs/verifier/reward.txt") == b"0.5\n"
        assert ns.read_written("/logs/verifier/reward.json") is None  # a link: not followed
    finally:
        ns.close()
    assert out.split("\n")[:3] == ["mine", "x", "0"] and "cannot access '/etc/hostname'" in out
