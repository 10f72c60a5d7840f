"""The local Runtime over a whole root tree: a task's built environment (a Terminal-Bench / Harbor Dockerfile's
image), run as the container it describes would be, without docker.

A `NamespaceRoot` (`envs.runtime.nsroot`) over the tree: an overlay whose writes live in a size-capped tmpfs and vanish
on close, no network but loopback, uids 0..65535 mapped onto unprivileged host uids, so the image's root user is root
inside (what task Dockerfiles and oracles assume: `/app` owned by root, files under /usr/local) and nothing on the host.
Each command runs in a fresh `bash` as the image's user, in its WORKDIR with its ENV, under rlimits and a wall timeout
that kills the command's process group. Like a container (and unlike the bwrap runtime), processes a command starts in
the background keep running until the runtime closes, which ends every process of the namespace at once.

`snapshot(binds)` is a new sandbox over what this one wrote (its upper layer copied, stacked over the same tree), with
the harness's binds and none of this one's processes: where a task's tests run (`envs.terminal.verifier`).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from envs.runtime.command_runtime import CommandRuntime, check_command
from envs.runtime.local import DEFAULT_PATH, Limits, command_fd, fd_command_script
from envs.runtime.nsroot import Bind, NamespaceLimits, NamespaceRoot
from envs.runtime.process import ProcessGroups, RawResult, run_capped

log = logging.getLogger(__name__)


@dataclass
class RootfsConfig:
    lower: str  # the root tree (read-only, shared by every sandbox over it)
    uid_base: int  # the host uid of uid 0 inside (the tree's owners were shifted by it)
    workdir: str = "/"
    user: str = "0"  # "uid" or "uid:gid" inside
    env: dict[str, str] = field(default_factory=dict)
    storage_bytes: int = 4 << 30  # cap of the tmpfs holding everything the sandbox writes
    hostname: str = "sandbox"
    limits: Limits = field(default_factory=Limits)
    # set by `snapshot`, not by options: read-only layers over `lower`, host binds, directories that start empty
    layers: tuple[str, ...] = ()
    binds: tuple[Bind, ...] = ()
    empty_dirs: tuple[str, ...] = ()


class RootfsRuntime(CommandRuntime):
    place = "the task sandbox"

    def __init__(self, config: RootfsConfig, *, owned_dirs: Sequence[Path] = ()):
        """`owned_dirs`: host folders this runtime removes when it closes (a snapshot's copied layer)."""
        self.config = config
        self.limits = config.limits
        self._groups = ProcessGroups()
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.ns = NamespaceRoot(
                Path(config.lower),
                uid_base=config.uid_base,
                hostname=config.hostname,
                upper_bytes=config.storage_bytes,
                tmp_bytes=config.limits.tmpfs_bytes,
                limits=NamespaceLimits(processes=config.limits.processes, open_files=config.limits.open_files,
                                       file_bytes=config.limits.file_bytes),
                layers=[Path(p) for p in config.layers],
                binds=list(config.binds),
                empty_dirs=config.empty_dirs,
            )
        except BaseException:
            _remove(owned_dirs)
            raise
        self._finalizer = weakref.finalize(self, _stop, self._groups, self.ns, list(owned_dirs))

    @property
    def root_host_uid(self) -> int:
        """The host uid of root inside (what a host folder bound in must belong to for root to write it)."""
        return self.config.uid_base

    def run(self, cmd: str, *, timeout: float | None = None, stdin: bytes | None = None,
            output_limit: int | None = None, user: str | None = None, workdir: str | None = None) -> RawResult:
        """Run `cmd` (bash) inside; `user="0"` runs a trusted step (tests, the oracle's files) as root."""
        if self._closed:
            raise RuntimeError("this RootfsRuntime is closed")
        check_command(cmd)
        timeout = self.limits.timeout_s if timeout is None else float(timeout)
        limit = self.limits.output_bytes if output_limit is None else output_limit
        uid, _, gid = (user or self.config.user).partition(":")
        cmd_fd = command_fd(cmd)  # through an inherited fd, never an argv (see envs.runtime.local)
        # core dumps and CPU time here; processes, files and open files come from prlimit (NamespaceLimits)
        script = fd_command_script(cmd_fd, f"ulimit -c 0 -t {int(self.limits.cpu_seconds)}")
        argv = self.ns.enter(["/bin/bash", "-c", script, "bash"], uid=int(uid), gid=int(gid or uid),
                             cwd=workdir or self.config.workdir)
        env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "TERM": "dumb", "HOME": "/root" if uid == "0" else "/",
               **self.config.env}
        if user is not None and uid == "0":  # a trusted step as root: root's home, not the agent's
            env["HOME"] = "/root"
        try:
            return run_capped(argv, timeout=timeout, output_limit=limit, stdin=stdin, env=env,
                              pass_fds=(cmd_fd,), groups=self._groups)
        finally:
            os.close(cmd_fd)

    def run_argv(self, argv: list[str], *, timeout: float, env: Mapping[str, str], user: str = "0",
                 output_limit: int | None = None) -> RawResult:
        """Run `argv` itself inside, in `/`, as `user` (a trusted program over a tree an agent wrote: no program of
        the tree runs before it, not even to change directory)."""
        if self._closed:
            raise RuntimeError("this RootfsRuntime is closed")
        uid, _, gid = user.partition(":")
        limit = self.limits.output_bytes if output_limit is None else output_limit
        return run_capped(self.ns.enter(argv, uid=int(uid), gid=int(gid or uid), cwd=None), timeout=timeout,
                          output_limit=limit, env=dict(env), groups=self._groups)

    def snapshot(self, binds: Sequence[Bind] = (), *, end_processes: bool, empty_dirs: Sequence[str] = (),
                 pid1: list[str] | None = None) -> RootfsRuntime:
        """A new sandbox over this one's files as they are now (its writes copied into a layer over the same tree),
        with `binds` and `empty_dirs`, and none of this one's processes. `end_processes`: this sandbox's processes end
        first (every one, by its pid namespace) and this runtime closes, so the copy is exact; else they keep running
        and the copy is taken beside them. (`pid1` is for docker: here pid 1 is always the harness's own.)"""
        holder = Path(tempfile.mkdtemp(prefix="nextstate-writes-"))
        os.chmod(holder, 0o711)  # the new sandbox's root must reach the layer to mount it
        layer = holder / "layer"
        layer.mkdir()
        try:
            if end_processes:
                self._groups.kill_all()
                self.ns.end_processes()
            self.ns.copy_writes(layer)
            if end_processes:
                self.close()
            config = replace(self.config, layers=(str(layer), *self.config.layers), binds=tuple(binds),
                             empty_dirs=tuple(empty_dirs))
        except BaseException:
            _remove([holder])
            raise
        return RootfsRuntime(config, owned_dirs=[holder])

    def end_processes(self) -> None:
        """End every process inside; what the sandbox wrote stays readable (`read_written`) until close."""
        self._groups.kill_all()
        self.ns.end_processes()

    def read_written(self, path: str, limit: int = 1 << 20) -> bytes | None:
        return self.ns.read_written(path, limit)

    def pids(self) -> list[int]:
        return self.ns.pids()


def _stop(groups: ProcessGroups, ns: NamespaceRoot, owned_dirs: list[Path]) -> None:
    groups.kill_all()
    ns.close()
    _remove(owned_dirs)


def _remove(dirs: Sequence[Path]) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def put_tree(runtime: CommandRuntime, tar_bytes: bytes, dest: str, timeout: float = 60.0) -> None:
    """Replace `dest` inside `runtime` with the contents of a tar archive, as root (a local rootfs or docker runtime)."""
    q = shlex.quote(dest)
    raw = runtime.run(f"rm -rf {q} && mkdir -p {q} && tar -x --no-same-owner -f - -C {q}", timeout=timeout,
                      stdin=tar_bytes, user="0")  # type: ignore[call-arg]
    if raw.exit_code != 0:
        raise OSError(f"copying files to {dest} in {runtime.place} failed ({raw.exit_code}): "
                      f"{raw.stderr.decode(errors='replace')[-500:]}")


__all__ = ["RootfsConfig", "RootfsRuntime", "put_tree"]
