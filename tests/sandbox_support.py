"""Fixtures and helpers shared by the sandbox tests (runtimes, terminal, swe). Import the fixtures you use by name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def bwrap_or_skip() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed on this machine")


def task_dirs_or_skip() -> None:
    """Skip unless this machine can build a task directory's environment and run its local sandbox."""
    if os.geteuid() != 0:
        pytest.skip("building a task environment (chroot) and its sandbox (a uid range) needs root")
    for tool in ("unshare", "chroot", "nsenter", "debootstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed on this machine")


def docker_or_skip() -> str:
    """Return a DOCKER_HOST with the test image built; start a private engine when none is given and dockerd exists."""
    if shutil.which("dockerd") is None and not os.environ.get("DOCKER_HOST"):
        pytest.skip("no dockerd binary on this machine (apt-get install docker.io) and no DOCKER_HOST")
    import docker  # noqa: F401 (the docker extra, always installed: a broken one fails)
    return _docker_host()


_engine: dict[str, object] = {}


def test_engine_root() -> Path:
    """This test session's private docker engine: one for every pytest-xdist worker (named after the session's cache
    folder, which the workers share), started by the first worker that needs it and stopped by the controller at the
    end (conftest.pytest_unconfigure). A worker never stops it: another may still have containers in it."""
    from conftest import TEST_CACHE

    return Path(f"/tmp/nextstate-test-dockerd-{TEST_CACHE.name.rsplit('-', 1)[-1]}")


def start_test_engine() -> str:
    """DOCKER_HOST of the session's engine, started (under a lock: workers race for it) unless it is running."""
    import fcntl

    from envs.runtime.dockerd import DockerDaemon

    root = test_engine_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return DockerDaemon(root).start()


def stop_session_engine() -> None:
    """Stop the session's engine if one was started, and drop its data root (conftest, controller only)."""
    from envs.runtime.dockerd import DockerDaemon

    root = test_engine_root()
    if not root.exists():
        return
    DockerDaemon(root).stop()
    with open("/proc/mounts") as f:
        still_mounted = any(str(root) in line for line in f)
    if not still_mounted:
        shutil.rmtree(root, ignore_errors=True)
    root.with_name(root.name + ".lock").unlink(missing_ok=True)


def _docker_host() -> str:
    if "host" in _engine:
        return str(_engine["host"])
    from envs.runtime.docker import docker_client
    from envs.runtime.images import ensure_image

    host = os.environ.get("DOCKER_HOST") or start_test_engine()
    client = docker_client(host)
    try:
        ensure_image(client)
    finally:
        client.close()
    _engine["host"] = host
    return host


@pytest.fixture(scope="session")
def docker_host():
    return docker_or_skip()


def processes_of_uid(uid: int) -> list[int]:
    """Host pids of live (not zombie) processes whose real uid is `uid` (read from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith(("Z", "X")):
                pids.append(int(entry))
        except OSError:
            continue
    return pids
