"""The docker Runtime: one container per env (docker SDK), commands via `exec`, removed on close.

Containers run with `network_mode=none`, memory / CPU / pids limits, all capabilities dropped, `no-new-privileges`, a
non-root user, and (by default) a read-only root filesystem with size-capped tmpfs mounts for the workdir and /tmp (a
task directory's container relaxes the capabilities, `no-new-privileges` and the cleanup below: it is a whole machine,
as under Docker). Each
command gets the same rlimits as the local backend (CPU, address space, file size, open files), an in-container
`timeout -s KILL`, and a client-side deadline and output cap; when either trips, every process of the agent's uid in the
container is killed (`kill -9 -1` as that uid: the container's init survives, the container stays usable).

Images come from the local engine only (no registry is reachable here): by default the test image that
`envs.runtime.images` builds with debootstrap.

`snapshot(binds)` is a new container over this one's files (`docker commit`, which pauses it: a consistent copy) with
host binds and the harness's own pid 1, and none of this one's processes: where a task's tests run
(`envs.terminal.verifier`). Binds are host paths, so the engine must run on this machine (it does for
`envs.runtime.dockerd`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import shlex
import shutil
import socket
import struct
import tarfile
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envs.runtime.command_runtime import CommandRuntime, check_command
from envs.runtime.host_paths import read_beneath
from envs.runtime.local import Limits
from envs.runtime.nsroot import Bind
from envs.runtime.process import RawResult

log = logging.getLogger(__name__)

LABEL = "nextstate.sandbox"
OWNER_LABEL = "nextstate.owner"  # "<hostname>:<pid>" of the process that owns the container


@dataclass
class DockerConfig:
    image: str | None = None  # None: the locally built test image (built on first use)
    docker_host: str | None = None  # None: $DOCKER_HOST, else the default socket
    workdir: str = "/workspace"
    workdir_tmpfs: bool = True  # the workdir is a size-capped tmpfs (False: it lives in the container's layer)
    workdir_bytes: int = 1 << 30
    read_only_rootfs: bool = True
    network: bool = False
    memory_bytes: int = 2 << 30  # cgroup memory limit (swap included)
    cpus: float = 1.0
    pids: int = 256  # cgroup pids limit: a fork bomb stops here
    user: str = "60001:60001"  # not root, and not a uid a host account is likely to have
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    # A sandbox drops every capability and ends what a command leaves running. A task directory's container is a
    # whole machine, as under Docker: DOCKER_DEFAULT_CAPABILITIES, setuid programs work, daemons stay up.
    capabilities: list[str] = field(default_factory=list)  # what the commands keep (names as in capabilities(7))
    keep_background: bool = False  # processes a command starts in the background outlive it
    no_new_privileges: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.limits, dict):
            self.limits = Limits(**self.limits)


# what `docker run` grants a container unless told otherwise (moby's default capability set)
DOCKER_DEFAULT_CAPABILITIES = [
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "NET_RAW",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
]
# the exec wrapper's own (it drops to the agent's uid), and its setup steps' (saving and restoring the agent's files
# whatever their modes: `throwaway_state`)
_WRAPPER_CAPABILITIES = ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"]


def docker_client(docker_host: str | None = None):
    import docker

    host = docker_host or os.environ.get("DOCKER_HOST")
    return docker.DockerClient(base_url=host, timeout=120) if host else docker.from_env(timeout=120)


class DockerRuntime(CommandRuntime):
    """A Runtime (see envs.runtime) in one docker container."""

    place = "the container"

    def __init__(
        self, config: DockerConfig | None = None, *, client=None, container_kwargs: dict | None = None,
        prepare_workdir: bool = True, fresh_dirs: Mapping[str, Path] | None = None, **overrides
    ):
        """`prepare_workdir=False`: run nothing in the new container before the caller does (a snapshot's: its files
        are an agent's); `fresh_dirs`: container path -> the host folder bound there, readable with `read_written`."""
        cfg = config or DockerConfig(**overrides)
        if config is not None and overrides:
            raise TypeError("pass either a DockerConfig or keyword options, not both")
        self.config = cfg
        self.limits = cfg.limits
        self._own_client = client is None
        self.client = client or docker_client(cfg.docker_host)
        self._closed = False
        self._lock = threading.Lock()
        if cfg.image is None:
            from envs.runtime.images import ensure_image

            self.image = ensure_image(self.client)
        else:
            self.image = cfg.image
        self._extra = dict(container_kwargs or {})
        self._fresh = dict(fresh_dirs or {})
        try:
            self.container = self._start(self._extra, prepare_workdir)
        except BaseException:
            if self._own_client:
                self.client.close()
            raise
        self._owned: dict[str, list] = {"images": [], "dirs": []}  # removed with the container (`adopt`)
        # removed on close(), on garbage collection, and at interpreter exit (a crashed caller leaks no container)
        self._finalizer = weakref.finalize(
            self, _remove_container, self.client, self.container.id, self.client if self._own_client else None,
            self._owned
        )

    def adopt(self, *, images: Sequence[str] = (), dirs: Sequence[Path] = ()) -> None:
        """Remove these images and host folders too when this runtime closes (after its container)."""
        self._owned["images"] += list(images)
        self._owned["dirs"] += list(dirs)

    def _start(self, extra: dict[str, Any], prepare_workdir: bool = True):
        import docker

        cfg = self.config
        # docker mounts tmpfs noexec by default; scripts in the workdir and /tmp must run, as they do locally
        tmpfs = {"/tmp": f"size={cfg.limits.tmpfs_bytes},mode=1777,exec"}
        uid, _, gid = cfg.user.partition(":")
        if cfg.workdir_tmpfs:
            tmpfs[cfg.workdir] = f"size={cfg.workdir_bytes},mode=0755,uid={uid},gid={gid or uid},exec"
        env = {"HOME": cfg.workdir, "LANG": "C.UTF-8", "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1", **cfg.env}
        kwargs: dict[str, Any] = dict(
            image=self.image,
            command=["sleep", "infinity"],
            detach=True,
            init=True,  # a real init as pid 1 reaps orphans (sleep would not)
            network_mode="host" if cfg.network else "none",
            mem_limit=cfg.memory_bytes,
            memswap_limit=cfg.memory_bytes,
            nano_cpus=int(cfg.cpus * 1e9),
            pids_limit=cfg.pids,
            cap_drop=["ALL"],
            # the wrapper's for itself and setup steps (root); the agent's commands keep cfg.capabilities only
            cap_add=sorted({*_WRAPPER_CAPABILITIES, *(c.upper() for c in cfg.capabilities)}),
            security_opt=["no-new-privileges"] if cfg.no_new_privileges else [],
            user="0",  # only the idle init runs as (capability-less) root; commands run as cfg.user, so their
            # `kill -9 -1` cleanup cannot reach init and stop the container
            working_dir=cfg.workdir,
            read_only=cfg.read_only_rootfs,
            tmpfs=tmpfs,
            environment=env,
            labels={LABEL: "1", OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}"},
            ulimits=[docker.types.Ulimit(name="core", soft=0, hard=0)],
        )
        kwargs.update(extra)
        kwargs.pop("detach")
        container = self.client.containers.create(**kwargs)
        try:
            container.start()
        except BaseException:  # a container that cannot start (a mount point blocked, say) is not left behind
            container.remove(force=True)
            raise
        if not cfg.workdir_tmpfs and prepare_workdir:
            q = shlex.quote(cfg.workdir)
            self._root_exec(
                f'mkdir -p {q} && {{ [ "$(stat -c %u:%g {q})" = {cfg.user} ] || chown {cfg.user} {q}; }}', container
            )
        return container

    # ----- more than the protocol -----
    def run(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int | None = None,
        user: str | None = None,
        workdir: str | None = None,
    ) -> RawResult:
        """Run `cmd`; return its exit code and raw output. `user="0"` runs a trusted setup step as root."""
        if self._closed:
            raise RuntimeError("this DockerRuntime is closed")
        timeout = self.limits.timeout_s if timeout is None else float(timeout)
        limit = self.limits.output_bytes if output_limit is None else output_limit
        uid, _, gid = (user or self.config.user).partition(":")
        check_command(cmd)
        argv = [
            "/bin/bash",
            "-c",
            _WRAPPER,
            "nextstate-exec",
            uid,
            gid or uid,
            str(max(int(timeout + 0.999), 1)),
            self.limits_prelude(),
            ",".join(["-all", *(f"+{c.lower()}" for c in self.config.capabilities)]),
            "1" if self.config.keep_background else "0",
        ]
        t0 = time.monotonic()
        code, out, err, timed_out, truncated = _exec_capped(
            self.client.api,
            self.container.id,
            argv,
            stdin=cmd.encode("utf-8") + b"\0" + (stdin or b""),  # the command first: see _WRAPPER
            deadline=t0 + timeout + 5.0,
            limit=limit,
            user="0",
            workdir=workdir or self.config.workdir,
        )
        if code == 137 and time.monotonic() - t0 >= timeout - 0.05:
            timed_out = True  # the in-container timeout fired
        if (timed_out or truncated) and not self.config.keep_background:  # the wrapper may not have cleaned up
            self._kill_agent_processes(user or self.config.user)
        return RawResult(code, out, err, timed_out, truncated, time.monotonic() - t0)

    @contextlib.contextmanager
    def throwaway_state(self) -> Iterator[None]:
        """Commands run within it change nothing the next command sees: the workdir, /tmp and /dev/shm (all an
        agent's uid may write in the sandbox container) are saved first, as root where that uid cannot read, and put
        back after. For hidden checks between an agent's commands (whose processes each command's cleanup ended)."""
        if self.config.keep_background:
            raise RuntimeError("throwaway_state needs a container whose commands leave no process running")
        saved = f"/tmp/.nextstate-saved-{os.urandom(6).hex()}"
        dirs = " ".join(shlex.quote(d.lstrip("/")) for d in (self.config.workdir, "tmp", "dev/shm"))
        self._root_exec(f"mkdir -m 700 {saved} && tar -C / --exclude={saved.lstrip('/')} -cpf {saved}/s.tar {dirs}")
        try:
            yield
        finally:
            wipe = " ".join(shlex.quote(d) for d in (self.config.workdir, "/tmp", "/dev/shm"))
            self._root_exec(f"find {wipe} -mindepth 1 -maxdepth 1 ! -path {saved} -exec rm -rf {{}} + ; "
                            f"tar -C / -xpf {saved}/s.tar && rm -rf {saved}")

    def run_argv(self, argv: list[str], *, timeout: float, env: Mapping[str, str], user: str = "0",
                 output_limit: int | None = None) -> RawResult:
        """Run `argv` itself (no shell of the image's first), in `/`, as `user`: a trusted program over an agent's
        files. Past `timeout` the client stops reading; the caller ends the container (`end_processes`)."""
        if self._closed:
            raise RuntimeError("this DockerRuntime is closed")
        t0 = time.monotonic()
        limit = self.limits.output_bytes if output_limit is None else output_limit
        code, out, err, timed_out, truncated = _exec_capped(
            self.client.api, self.container.id, argv, stdin=None, deadline=t0 + timeout, limit=limit, user=user,
            workdir="/", environment=dict(env))
        return RawResult(code, out, err, timed_out, truncated, time.monotonic() - t0)

    def snapshot(self, binds: Sequence[Bind] = (), *, end_processes: bool, empty_dirs: Sequence[str] = (),
                 pid1: list[str] | None = None) -> DockerRuntime:
        """A new container over this one's files as they are now (`docker commit`, paused while it copies), with
        `binds` and, at each of `empty_dirs`, a fresh host folder (read back with `read_written`), whose pid 1 is
        `pid1` (a program of the harness's: the image's own may be the agent's). `end_processes`: this container is
        removed first (every process of it ends) and this runtime closes."""
        import docker

        if not pid1:
            raise ValueError("a docker snapshot needs pid1: the harness's program that keeps its container up")
        images = [self.container.commit(repository="nextstate/snapshot", tag=self.container.id[:12]).id]
        holder = Path(tempfile.mkdtemp(prefix="nextstate-fresh-"))
        try:
            if end_processes:
                self.end_processes()
            mounts = [docker.types.Mount(b.target, b.source, type="bind", read_only=b.readonly) for b in binds]
            fresh = {}
            for i, target in enumerate(empty_dirs):
                fresh[target] = holder / str(i)
                fresh[target].mkdir(mode=0o755)
                mounts.append(docker.types.Mount(target, str(fresh[target]), type="bind", read_only=False))
            extra = {**self._extra, "command": list(pid1), "entrypoint": [], "mounts": mounts, "init": False}
            snap = lambda image: DockerRuntime(replace(self.config, image=image), container_kwargs=extra,  # noqa: E731
                                               prepare_workdir=False, fresh_dirs=fresh)
            try:
                runtime = snap(images[-1])
            except docker.errors.APIError:  # a mount point the agent's files block (a file where a folder goes...)
                images.append(self._cleared(images[-1], mounts, pid1))
                runtime = snap(images[-1])
            runtime.adopt(images=images[::-1], dirs=[holder])
            return runtime
        except BaseException:
            _remove_container(self.client, None, None, {"images": images[::-1], "dirs": [holder]})
            raise
        finally:
            if end_processes:
                self.close()

    def _cleared(self, image: str, mounts: list, pid1: list[str]) -> str:
        """`image` with its mounts' targets made real folders (or empty files) where the agent's files were in the way:
        unpacked by the engine into a container that runs nothing (created, never started), then committed."""
        container = self.client.containers.create(image=image, command=list(pid1), entrypoint=[], network_mode="none",
                                                  labels={LABEL: "1", OWNER_LABEL: f"{socket.gethostname()}:"
                                                          f"{os.getpid()}"})
        try:
            if not container.put_archive("/", _mount_points(mounts)):
                raise RuntimeError(f"the engine did not unpack the mount points into {container.id[:12]}")
            return container.commit(repository="nextstate/snapshot", tag=f"{container.id[:12]}-cleared").id
        finally:
            container.remove(force=True)

    def end_processes(self) -> None:
        """End every process of the container (it stops; the host folders bound in stay readable until close)."""
        try:
            self.container.kill()
        except Exception as exc:  # already stopped: nothing runs
            log.debug("killing container %s: %s", self.container.id[:12], exc)
        self.container.wait(timeout=60)

    def read_written(self, path: str, limit: int = 1 << 20) -> bytes | None:
        """A regular file written under one of `fresh_dirs` (read on the host, no symlink followed), else None."""
        for target, host in self._fresh.items():
            if path.startswith(target.rstrip("/") + "/"):
                return read_beneath(host, path[len(target.rstrip("/")) + 1:], limit)
        raise ValueError(f"{path} is under none of this container's fresh folders ({', '.join(self._fresh)})")

    @property
    def root_host_uid(self) -> int:
        return 0  # no user namespace: root inside is the host's root

    def limits_prelude(self) -> str:
        lim = self.limits
        # no `ulimit -u` here: container uids are host uids (no userns remap), the cgroup pids limit does that job
        return (
            f"ulimit -c 0 -t {lim.cpu_seconds} -v {lim.memory_bytes // 1024} -f {lim.file_bytes // 1024} "
            f"-n {lim.open_files}"
        )

    def _kill_agent_processes(self, user: str) -> None:
        # `kill -1` as the agent's uid reaches every process of that uid except the caller (and init is not that uid)
        try:
            _exec_capped(
                self.client.api,
                self.container.id,
                ["/bin/sh", "-c", "kill -9 -1"],
                stdin=None,
                deadline=time.monotonic() + 15,
                limit=4096,
                user=user,
                workdir="/",
            )
        except Exception as exc:
            log.warning("cleaning up processes after a timeout failed: %s", exc)

    def _root_exec(self, cmd: str, container=None) -> None:
        c = container or self.container
        code, out = c.exec_run(["/bin/sh", "-c", cmd], user="0")
        if code != 0:
            raise RuntimeError(f"container setup step failed ({code}): {cmd}\n{out.decode(errors='replace')}")


# Runs as the container's (capability-less but for SETUID/SETGID/KILL) root: drops to the agent's uid for the command,
# under an in-container `timeout`, then kills every process of that uid that the command left behind (background jobs,
# a fork bomb), so each command starts from a clean process table as it does in the local backend.
# The cleanup must not need a new process: a fork bomb that outlives the command keeps the cgroup's pids limit full, so
# a forked `kill` can fail (it did in CI, and the next command could not start). The wrapper therefore becomes the
# killer itself (`exec`, same pid) and uses bash's builtin kill. kill(-1) signals every process of the uid except the
# caller while holding the kernel's task list, and a fork that races it is cancelled, so one call empties the table;
# the second is for safety.
# The command arrives on stdin, ended by a NUL byte, before the command's own stdin (never on an argv: one argv string
# holds at most 128 KiB); the agent's bash reads it up to the NUL (`read` takes one byte at a time from a pipe, so the
# rest of stdin stays for the command). With keep_background, nothing is cleaned up: the timeout ends the command's
# shell only, and what it started keeps running, as after a `docker exec`.
_WRAPPER = r"""
uid=$1 gid=$2 secs=$3 prelude=$4 caps=$5 keep=$6
drop=(setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --bounding-set="$caps")
agent='IFS= read -r -d "" __nextstate_cmd || exit 126; '"$prelude"' || exit 126
eval "unset __nextstate_cmd; $__nextstate_cmd"'
timeout -s KILL "$secs" "${drop[@]}" /bin/bash -c "$agent" bash
code=$?
[ "$keep" = 1 ] && exit "$code"
exec "${drop[@]}" /bin/bash -c 'kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null; exit "$1"' bash "$code"
"""


def _exec_capped(
    api,
    container_id: str,
    argv: list[str],
    *,
    stdin: bytes | None,
    deadline: float,
    limit: int,
    user: str,
    workdir: str,
    environment: dict[str, str] | None = None,
) -> tuple[int, bytes, bytes, bool, bool]:
    """docker exec with a client-side deadline and output cap, reading the multiplexed stream from the raw socket."""
    exec_id = api.exec_create(
        container_id, argv, stdout=True, stderr=True, stdin=stdin is not None, user=user, workdir=workdir,
        environment=environment
    )["Id"]
    sock_io = api.exec_start(exec_id, socket=True)
    sock = getattr(sock_io, "_sock", sock_io)
    bufs = {1: bytearray(), 2: bytearray()}
    total = 0
    timed_out = truncated = False
    try:
        if stdin is not None:
            sock.sendall(stdin)
            sock.shutdown(socket.SHUT_WR)
        pending = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([sock], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = sock.recv(65536)
            if not chunk:
                break
            pending += chunk
            while len(pending) >= 8:
                stream, size = struct.unpack(">BxxxL", pending[:8])
                if len(pending) < 8 + size:
                    break
                data, pending = pending[8 : 8 + size], pending[8 + size :]
                if stream in bufs:
                    room = max(limit - total, 0)
                    bufs[stream] += data[:room]
                    total += len(data)
            if total > limit:
                truncated = True
                break
    finally:
        sock_io.close()
        if sock is not sock_io:
            sock.close()
    code = -1
    for _ in range(50):  # the exec may need a moment to be reaped after its stream closed
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            code = info.get("ExitCode")
            code = -1 if code is None else int(code)
            break
        if timed_out or truncated:
            break
        time.sleep(0.02)
    return code, bytes(bufs[1]), bytes(bufs[2]), timed_out, truncated


def _mount_points(mounts: list) -> bytes:
    """A tar archive of the mounts' targets (and their parents) as real directories, or empty files for a file's:
    unpacked by the engine, it replaces whatever an agent left in their way (a file, a symlink, a directory where a
    file goes), so its files cannot stop the verifier's container from starting."""
    buf = io.BytesIO()
    made: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in mounts:
            parts = [p for p in m["Target"].split("/") if p]
            is_dir = os.path.isdir(m["Source"])
            for i in range(len(parts)):
                name = "/".join(parts[: i + 1])
                if name in made:
                    continue
                made.add(name)
                info = tarfile.TarInfo(name)
                if i < len(parts) - 1 or is_dir:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                else:
                    info.mode = 0o644
                tar.addfile(info, io.BytesIO(b"") if info.isfile() else None)
    return buf.getvalue()


def _remove_container(client, container_id: str | None, close_client, owned: dict[str, list] | None = None) -> None:
    """Remove the container, then what it owned (`adopt`: snapshot images, newest first, and host folders)."""
    if container_id is not None:
        try:
            client.api.remove_container(container_id, force=True)
        except Exception as exc:  # already gone, or the engine is down: nothing left to own
            log.warning("removing container %s failed: %s", container_id[:12], exc)
    for image in (owned or {}).get("images", []):
        try:
            client.api.remove_image(image, force=True)
        except Exception as exc:
            log.warning("removing image %s failed: %s", image[:19], exc)
    for d in (owned or {}).get("dirs", []):
        shutil.rmtree(d, ignore_errors=True)
    if close_client is not None:
        close_client.close()


def remove_stale_containers(client) -> list[str]:
    """Remove sandbox containers whose owning process (on this host) is gone; return their ids."""
    host = socket.gethostname()
    removed = []
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        owner = c.labels.get(OWNER_LABEL, "")
        h, _, pid = owner.partition(":")
        if h != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        c.remove(force=True)
        removed.append(c.id)
    return removed
