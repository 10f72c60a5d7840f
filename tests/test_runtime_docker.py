"""The docker runtime against a real engine (a private dockerd; skipped only where no dockerd binary exists)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from envs.runtime import Runtime
from tests.sandbox_support import docker_host  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(docker_host):
    from envs.runtime.backends import make_runtime

    r = make_runtime("docker", {"docker_host": docker_host, "limits": {"timeout_s": 20}})
    yield r
    r.close()


def test_protocol_limits_and_identity(rt):
    assert isinstance(rt, Runtime)
    rt.write_file("d/x.bin", b"\x00\xffdata")
    assert rt.read_file("d/x.bin") == b"\x00\xffdata" and rt.read_file("/workspace/d/x.bin") == b"\x00\xffdata"
    with pytest.raises(FileNotFoundError):
        rt.read_file("nope")
    r = rt.exec("id -u; ulimit -v; ulimit -f; cat /proc/self/status | grep CapEff; echo err >&2; exit 4")
    uid, vmem, fsize, caps = r.stdout.splitlines()
    assert uid == "60001" and vmem == str(4 << 20) and fsize == str(1 << 20) and caps.split()[1] == "0000000000000000"
    assert r.exit_code == 4 and r.stderr == "err\n"
    attrs = rt.container.attrs["HostConfig"]
    assert attrs["NetworkMode"] == "none" and attrs["PidsLimit"] == 256 and attrs["Memory"] == 2 << 30
    assert attrs["ReadonlyRootfs"] and "no-new-privileges" in attrs["SecurityOpt"]


def test_timeout_cap_and_background_cleanup(rt):
    r = rt.exec("sleep 60", timeout=1)
    assert r.timed_out and r.exit_code == 137
    r = rt.exec("yes", timeout=30)
    assert r.truncated and len(r.stdout) <= 1 << 20
    rt.exec("sleep 1000 >/dev/null 2>&1 &")
    assert rt.exec("ps -u 60001 -o comm= | grep -c sleep || true").stdout.strip() == "0"


def test_close_removes_the_container_and_a_crashed_owner_leaves_none(docker_host):
    import docker

    from envs.runtime.docker import DockerConfig, DockerRuntime, docker_client, remove_stale_containers

    client = docker_client(docker_host)
    try:
        rt = DockerRuntime(DockerConfig(docker_host=docker_host))
        cid = rt.container.id
        rt.close()
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(cid)
        # a process that dies without closing: the interpreter-exit finalizer removes its container
        code = (
            "from envs.runtime.docker import DockerRuntime, DockerConfig; import sys; "
            f"rt = DockerRuntime(DockerConfig(docker_host={docker_host!r})); print(rt.container.id); sys.exit(3)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(), timeout=300)
        assert out.returncode == 3, out.stderr
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(out.stdout.strip())
        assert remove_stale_containers(client) == []
    finally:
        client.close()


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


def test_a_whole_machine_container_keeps_dockers_capabilities_and_its_daemons(docker_host):
    """A task directory's container (envs.terminal.task_runtime) is a machine, as under Docker: root keeps Docker's
    default capabilities (it can switch users), and what a command starts in the background outlives it."""
    from envs.runtime.docker import DOCKER_DEFAULT_CAPABILITIES, DockerConfig, DockerRuntime

    rt = DockerRuntime(DockerConfig(docker_host=docker_host, user="0:0", workdir_tmpfs=False, read_only_rootfs=False,
                                    capabilities=list(DOCKER_DEFAULT_CAPABILITIES), keep_background=True,
                                    no_new_privileges=False, limits={"timeout_s": 20}))
    try:
        r = rt.exec("grep CapEff /proc/self/status; setpriv --reuid=4242 --regid=4242 --clear-groups id -u")
        caps, switched = r.stdout.split("\n")[:2]
        assert int(caps.split()[1], 16) != 0 and switched == "4242", r
        rt.exec("sleep 1000 >/dev/null 2>&1 &")
        assert rt.exec("ps -e -o comm= | grep -c '^sleep$' || true").stdout.strip() == "2"  # pid 1 and ours
        r = rt.exec("sleep 60", timeout=1)  # a timeout ends the command, not the machine
        assert r.timed_out and rt.exec("echo up").stdout == "up\n"
        assert "no-new-privileges" not in (rt.container.attrs["HostConfig"]["SecurityOpt"] or [])
    finally:
        rt.close()
