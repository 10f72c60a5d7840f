"""DockerGuest: our OSWorld guest server in a docker container, driven through OSWorld's HTTP API.

The container runs `envs.runtime.osworld_server` (an Xvfb desktop serving OSWorld's guest API) from NextState's source
tree, bind-mounted read-only, so the code under test is the code in your checkout. It has no network at all
(`network_mode="none"`): the API is reached through a unix socket in a host directory bind-mounted into the container.
That keeps every request a real HTTP request to OSWorld's routes (the same client code drives a real VM over TCP)
without giving the guest a network namespace with a route to anything, which `network_mode="host"` would.

Episodes: by default each episode gets a fresh container (the docker equivalent of reverting an OSWorld VM snapshot:
nothing an agent did survives); `fresh_container_per_episode=False` keeps the container and resets the session inside.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.runtime.osworld import OSWorldClient
from envs.runtime.xsession import DesktopError

log = logging.getLogger(__name__)

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout that holds envs/
GUEST_SRC = "/opt/nextstate"
GUEST_SOCK_DIR = "/run/nextstate"
LABEL = "nextstate.gui-guest"


@dataclass
class DockerGuestConfig:
    docker_host: str | None = None  # default: DOCKER_HOST
    image: str | None = None  # default: the guest recipe's tag (built on first use, see envs.runtime.guest_image)
    width: int = 1280
    height: int = 800
    action_timeout_s: float = 10.0
    mem_limit: str = "2g"
    start_timeout_s: float = 90.0
    fresh_container_per_episode: bool = True
    source_root: str | None = None  # the NextState tree to mount (default: the one this module lives in)
    recipe: Any = None  # with image None: the guest's recipe (envs.runtime.guest_image.guest_recipe; None: the default)


class DockerGuest(OSWorldClient):
    """An OSWorldClient that owns its container: started here, replaced per episode, removed on close."""

    def __init__(self, cfg: DockerGuestConfig | None = None):
        import docker

        self.cfg = cfg or DockerGuestConfig()
        self.docker = docker.DockerClient(base_url=self.cfg.docker_host) if self.cfg.docker_host else docker.from_env()
        self._sock_dir = Path(tempfile.mkdtemp(prefix="nextstate-guest-"))
        self._sock_dir.chmod(0o755)
        self.container = None
        try:
            if self.cfg.image is None:
                from envs.runtime.guest_image import ensure_image

                self.cfg.image = ensure_image(self.docker, self.cfg.recipe)
            super().__init__(f"unix://{self._sock_dir / 'guest.sock'}", action_timeout_s=self.cfg.action_timeout_s)
            self._start_container()
        except BaseException:
            self.close()
            raise

    def _start_container(self) -> None:
        sock = self._sock_dir / "guest.sock"
        sock.unlink(missing_ok=True)
        src = self.cfg.source_root or str(SOURCE_ROOT)
        apps_bin = f"{GUEST_SRC}/envs/gui/apps/bin"
        server = (
            f"python3 -P -m envs.runtime.osworld_server --uds {GUEST_SOCK_DIR}/guest.sock --home /home/user --wipe-home "
            f"--width {self.cfg.width} --height {self.cfg.height} --path-prepend {apps_bin} "
            f"--open-with dir=ns-files --open-with text=ns-editor --action-timeout {self.cfg.action_timeout_s}"
        )
        # D-Bus wants a machine id; a fresh rootfs has none
        command = ["/bin/sh", "-c", f"test -s /etc/machine-id || dbus-uuidgen --ensure=/etc/machine-id; exec {server}"]
        self.container = self.docker.containers.run(
            self.cfg.image,
            command,
            detach=True,
            network_mode="none",
            init=True,
            mem_limit=self.cfg.mem_limit,
            name=f"nextstate-gui-{uuid.uuid4().hex[:10]}",
            labels={LABEL: "1"},
            working_dir=GUEST_SRC,
            environment={
                "PYTHONPATH": GUEST_SRC,
                "NEXTSTATE_TK_PYTHON": "python3",
                "NEXTSTATE_GI_PYTHON": "python3",
                "HOME": "/home/user",
            },
            volumes={
                src: {"bind": GUEST_SRC, "mode": "ro"},
                str(self._sock_dir): {"bind": GUEST_SOCK_DIR, "mode": "rw"},
            },
        )
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while not sock.exists():
            self.container.reload()
            if self.container.status in ("exited", "dead"):
                logs = self.container.logs(tail=40).decode(errors="replace")
                raise DesktopError(f"the guest container exited while starting:\n{logs}")
            if time.monotonic() > deadline:
                raise DesktopError(
                    f"the guest container did not open its socket within {self.cfg.start_timeout_s:.0f} s"
                )
            time.sleep(0.05)
        self.wait_ready(timeout=max(deadline - time.monotonic(), 5.0))
        self._extensions = None
        self._home = None

    def _remove_container(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception as exc:  # already gone, or the engine is down: nothing left to stop here
                log.debug("removing guest container: %s", exc)
            self.container = None

    def new_session(self) -> None:
        if self.cfg.fresh_container_per_episode:
            self._remove_container()
            self._start_container()
        else:
            super().new_session()

    def memory_kib(self) -> int:
        """Memory the container uses now (cgroup accounting, as docker stats reports it)."""
        if self.container is None:
            return 0
        stats = self.container.stats(stream=False)
        return int(stats.get("memory_stats", {}).get("usage", 0)) // 1024

    def close(self) -> None:
        try:
            if hasattr(self, "http"):
                super().close()
        finally:
            self._remove_container()
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            if getattr(self, "docker", None) is not None:
                self.docker.close()
                self.docker = None


def remove_stale_guests(docker_host: str | None = None) -> int:
    """Remove guest containers left by a crashed process (found by our label, removed by id). Returns how many."""
    import docker

    client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
    try:
        stale = client.containers.list(all=True, filters={"label": LABEL})
        for c in stale:
            c.remove(force=True)
        return len(stale)
    finally:
        client.close()


__all__ = ["DockerGuest", "DockerGuestConfig", "remove_stale_guests"]
