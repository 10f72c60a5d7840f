"""Own a private Docker engine: start `dockerd` with its own data root and socket, stop it by pid.

This machine (and CI) must not touch the host's networking, so the engine runs with `--bridge=none --iptables=false`.
Used by `.ci/run` (`python -m envs.runtime.dockerd start|stop`) and by tests that need an engine.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path(os.environ.get("NEXTSTATE_DOCKERD_ROOT", "/tmp/nextstate-dockerd"))


@dataclass
class DockerDaemon:
    root: Path = DEFAULT_ROOT

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pidfile(self) -> Path:
        return self.root / "dockerd.pid"

    def pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def start(self, timeout: float = 60.0) -> str:
        """Start the engine (or reuse the one already running under `root`); return its DOCKER_HOST."""
        if self.pid() and self.ping():
            return self.host
        exe = shutil.which("dockerd")
        if exe is None:
            raise FileNotFoundError("dockerd not found: install docker.io (apt-get install docker.io)")
        self.root.mkdir(parents=True, exist_ok=True)
        log_path = self.root / "dockerd.log"
        cmd = [
            exe,
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.internal.pid'}",
            f"--host={self.host}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
        ]
        with log_path.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.pidfile.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {proc.returncode}; see {log_path}:\n{_tail(log_path)}")
            if self.ping():
                return self.host
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"dockerd did not answer on {self.socket} within {timeout:.0f} s; see {log_path}")

    def ping(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            import docker

            client = docker.DockerClient(base_url=self.host, timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the engine we started (by the pid we recorded), SIGKILL if it lingers."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            _reap(pid)
            time.sleep(0.2)
        else:
            log.warning("dockerd (pid %d) ignored SIGTERM; killing it", pid)
            os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)
        self._unmount_leftovers()

    def _unmount_leftovers(self) -> None:
        """dockerd leaves the host netns bind-mounted under its exec root (after a host-network container): unmount
        what is still mounted under our root, so the root can be deleted."""
        root = str(self.root.resolve()) + "/"
        try:
            with open("/proc/mounts") as f:
                points = [line.split()[1] for line in f if line.split()[1].startswith(root)]
        except OSError:
            return
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", point], capture_output=True)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    args = p.parse_args(argv)
    d = DockerDaemon(args.root)
    if args.action == "start":
        print(d.start())
    elif args.action == "stop":
        d.stop()
    else:
        print(f"pid={d.pid()} host={d.host} answering={d.ping()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
