"""Fixtures and helpers shared by the sandbox tests (runtimes, terminal, swe). Import the fixtures you use by name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def bwrap_or_skip() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed on this machine")


def docker_or_skip() -> str:
    """Return a DOCKER_HOST with the test image built; start a private engine when none is given and dockerd exists."""
    if shutil.which("dockerd") is None and not os.environ.get("DOCKER_HOST"):
        pytest.skip("no dockerd binary on this machine (apt-get install docker.io) and no DOCKER_HOST")
    import docker  # noqa: F401 (the docker extra, always installed: a broken one fails)
    return _docker_host()


_engine: dict[str, object] = {}


def _docker_host() -> str:
    if "host" in _engine:
        return str(_engine["host"])
    from envs.runtime.docker import docker_client
    from envs.runtime.images import ensure_image

    host = os.environ.get("DOCKER_HOST")
    if not host:
        from envs.runtime.dockerd import DockerDaemon

        daemon = DockerDaemon(Path(f"/tmp/nextstate-test-dockerd-{os.getpid()}"))
        host = daemon.start()
        _engine["daemon"] = daemon
    client = docker_client(host)
    try:
        ensure_image(client)
    finally:
        client.close()
    _engine["host"] = host
    return host


def stop_test_engine() -> None:
    daemon = _engine.pop("daemon", None)
    _engine.pop("host", None)
    if daemon is not None:
        daemon.stop()  # type: ignore[attr-defined]
        root = str(daemon.root)  # type: ignore[attr-defined]
        with open("/proc/mounts") as f:
            still_mounted = any(root in line for line in f)
        if not still_mounted:  # the engine was this session's own: drop its data root too
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_host():
    host = docker_or_skip()
    yield host
    stop_test_engine()


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
