"""Shared helpers for the gui tests: what the machine has, and a docker engine + guest image when it has docker."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from envs.runtime.rootfs_image import find_debootstrap


def require_desktop_tools() -> None:
    """Skip unless this machine has the desktop programs (Xvfb, D-Bus, xdotool); pyautogui (the gui extra, always
    installed) must import: a broken one fails."""
    for exe in ("Xvfb", "dbus-daemon", "xdotool"):
        if shutil.which(exe) is None:
            pytest.skip(f"{exe} is not installed (scripts/install.sh installs the desktop packages)")
    try:
        import pyautogui  # noqa: F401  (imports only inside a display; here we just need it installed)
    except KeyError:
        pass  # pyautogui is installed; it just has no DISPLAY in this process


def docker_engine() -> str:
    """DOCKER_HOST: the one set, else this test session's private engine (tests/sandbox_support.py)."""
    if shutil.which("dockerd") is None and not os.environ.get("DOCKER_HOST"):
        pytest.skip("dockerd is not installed (apt-get install docker.io) and no DOCKER_HOST")
    import docker  # noqa: F401 (the docker extra, always installed: a broken one fails)
    host = os.environ.get("DOCKER_HOST")
    if host:
        return host
    if os.geteuid() != 0:
        pytest.skip("starting a private docker engine needs root; set DOCKER_HOST to use a running one")
    from sandbox_support import start_test_engine

    return start_test_engine()


def guest_image(host: str) -> str:
    """The desktop guest image in the engine at `host`, built (minutes, once; the rootfs is cached) if missing."""
    import docker

    from envs.runtime.guest_image import ensure_image

    if find_debootstrap() is None or os.geteuid() != 0:
        client = docker.DockerClient(base_url=host)
        try:
            from envs.runtime.guest_image import GuestRecipe

            client.images.get(GuestRecipe().tag)
            return GuestRecipe().tag
        except docker.errors.ImageNotFound:
            pytest.skip("the guest image is missing and cannot be built here (needs root and debootstrap)")
        finally:
            client.close()
    client = docker.DockerClient(base_url=host)
    try:
        return ensure_image(client)
    finally:
        client.close()
