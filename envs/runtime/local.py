"""The local Runtime: every command in a fresh bubblewrap sandbox over a private, persistent workdir.

Each `exec` starts `bwrap` (~5-10 ms) with: all namespaces unshared (no network unless asked: only `lo`), the system
directories read-only, the host's home folders and everything else absent, a private writable workdir (the only state that
persists between commands), a size-capped tmpfs on /tmp, a non-root uid inside and, when we run as root, a dedicated
non-root uid outside (so RLIMIT_NPROC holds and nothing the agent runs is root on the host), no capabilities, no nested
user namespaces, rlimits (CPU, address space, processes, file size, open files), a wall timeout that kills the whole
process group (and with it bwrap's pid namespace), and an output cap.

`isolation="none"` runs the same commands in a plain subprocess (rlimits, timeout and cap still apply, nothing else):
only when asked explicitly, with a loud warning.

File access (`read_file`, `write_file`) also goes through the sandbox, never through host paths: the agent controls the
workdir, and a symlink it planted must not make the host (root) read or write outside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from envs.runtime.command_runtime import CommandRuntime, check_command
from envs.runtime.process import ProcessGroups, RawResult, run_capped

log = logging.getLogger(__name__)

INNER_UID = 1000  # the agent's uid inside the sandbox ("agent" in the sandbox's /etc/passwd)
UID_BASE = 1_500_000_000  # host uids leased to sandboxes when we run as root (far from real users and subuid ranges)
UID_COUNT = 4096
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "nextstate-sandbox-uids"
SYSTEM_RO_DIRS = ("/usr", "/etc")
SYSTEM_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SANDBOX_GITCONFIG = "/opt/nextstate/gitconfig"  # git's system config inside the sandbox (GIT_CONFIG_SYSTEM)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided on this machine (the message says how to get it)."""


@dataclass
class Limits:
    """Per-command resource limits. Sizes in bytes; `processes` counts the sandbox uid's processes."""

    cpu_seconds: int = 120
    memory_bytes: int = 4 << 30  # RLIMIT_AS per process: a 10 GB allocation fails with ENOMEM
    processes: int = 256  # RLIMIT_NPROC: a fork bomb stops here
    file_bytes: int = 1 << 30  # RLIMIT_FSIZE: one file cannot grow past this
    open_files: int = 1024
    output_bytes: int = 1 << 20  # stdout+stderr kept per command; past it the command is stopped (truncated=True)
    tmpfs_bytes: int = 256 << 20  # size of the sandbox's /tmp
    timeout_s: float = 60.0  # default wall timeout of exec()

    def ulimit_prelude(self) -> str:
        # bash's ulimit sets soft and hard limits; without CAP_SYS_RESOURCE the agent cannot raise them again
        return (
            f"ulimit -c 0 -t {int(self.cpu_seconds)} -v {self.memory_bytes // 1024} -u {int(self.processes)} "
            f"-f {self.file_bytes // 1024} -n {int(self.open_files)}"
        )


@dataclass
class Mount:
    """A host path made visible inside the sandbox at `target`."""

    source: str
    target: str
    writable: bool = False


@dataclass
class LocalConfig:
    isolation: str = "bwrap"  # "bwrap" | "none" (plain subprocess: no isolation, explicit opt-in only)
    workdir: str | None = None  # host dir to use as the workdir (kept on close); None: a fresh one, removed on close
    root_dir: str | None = None  # where fresh workdirs are created (default: the system temp dir)
    mount_point: str = "/workspace"  # where the workdir appears inside the sandbox (and the commands' cwd)
    mounts: list[Mount] = field(default_factory=list)
    network: bool = False
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    host_uid: int | None = None  # when root: the host uid to run sandboxes as (None: lease a free one)
    hostname: str = "sandbox"

    def __post_init__(self) -> None:
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation={self.isolation!r}: use 'bwrap' (sandboxed) or 'none' (plain subprocess)")
        if not self.mount_point.startswith("/"):
            raise ValueError(f"mount_point must be absolute, got {self.mount_point!r}")
        if isinstance(self.limits, dict):
            self.limits = Limits(**self.limits)
        self.mounts = [Mount(**m) if isinstance(m, dict) else m for m in self.mounts]


class UidLease:
    """An exclusive host uid for this sandbox (an flock on a per-uid file, released when the process dies)."""

    def __init__(self, uid: int | None = None):
        self._fd: int | None = None
        if uid is not None:  # chosen by the caller, who may share it on purpose: no lease
            self.uid = uid
            return
        UID_LOCK_DIR.mkdir(mode=0o755, exist_ok=True)
        for cand in _uid_candidates():
            fd = os.open(UID_LOCK_DIR / f"{cand}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = cand, fd
            return
        raise SandboxUnavailable(f"all {UID_COUNT} sandbox uids from {UID_BASE} are leased; close some runtimes")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_uid_cursor = [os.getpid() * 7]


def _uid_candidates() -> list[int]:
    # start at a process-dependent offset so concurrent processes rarely contend for the same lock
    start = _uid_cursor[0]
    _uid_cursor[0] += 1
    return [UID_BASE + (start + i) % UID_COUNT for i in range(UID_COUNT)]


class BwrapSandbox:
    """The bubblewrap sandbox every local command runs in: the terminal and SWE runtime's commands and the python tool's
    calls. Owns a leased host uid (as root), the sandbox's passwd/group/gitconfig, and the argv prefix.

    `workdir` is bound read-write at `mount_point`; without one, `mount_point` is a fresh tmpfs in every command (nothing
    persists between commands). `mounts` whose source the sandbox uid cannot reach (e.g. under /root, mode 700) must be
    mirrored first (`envs.runtime.host_paths.reachable_copy`)."""

    def __init__(
        self,
        *,
        workdir: Path | None,
        mount_point: str = "/workspace",
        mounts: list[Mount] | None = None,
        network: bool = False,
        env: dict[str, str] | None = None,
        tmpfs_bytes: int = 256 << 20,
        hostname: str = "sandbox",
        host_uid: int | None = None,
        root_dir: str | None = None,
        as_pid_1: bool = True,
    ):
        if shutil.which("bwrap") is None:
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed: apt-get install bubblewrap, or pass isolation='none' to run "
                "commands unsandboxed on the host"
            )
        self.workdir = workdir
        self.mount_point = mount_point
        self.mounts = list(mounts or [])
        self.network = network
        self.env = dict(env or {})
        self.tmpfs_bytes = tmpfs_bytes
        self.hostname = hostname
        self.as_pid_1 = as_pid_1
        self._lease = UidLease(host_uid) if os.geteuid() == 0 else None
        self.host_uid: int | None = self._lease.uid if self._lease is not None else None
        self.etc = Path(tempfile.mkdtemp(prefix="nextstate-sbx-etc-", dir=root_dir))
        os.chmod(self.etc, 0o755)
        write_identity_files(self.etc, mount_point)
        self._prefix = self._build(self.mounts, network)
        self._finalizer = weakref.finalize(self, _release, self.etc, self._lease)

    def argv(self, inner: list[str], *, extra_mounts: list[Mount] | None = None, network: bool | None = None) -> list[str]:
        """The full argv that runs `inner` in the sandbox (run it with `user=self.host_uid`)."""
        prefix = self._prefix
        if extra_mounts or (network is not None and network != self.network):
            prefix = self._build(self.mounts + list(extra_mounts or []), self.network if network is None else network)
        return prefix + list(inner)

    def close(self) -> None:
        self._finalizer()

    def sandbox_env(self) -> dict[str, str]:
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": self.mount_point,
            "USER": "agent",
            "LOGNAME": "agent",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "GIT_CONFIG_SYSTEM": SANDBOX_GITCONFIG,
        }
        env.update(self.env)
        return env

    def _build(self, mounts: list[Mount], network: bool) -> list[str]:
        a = ["bwrap", "--unshare-all"]
        if network:
            a.append("--share-net")
        # --as-pid-1: the command is the namespace's init, so bwrap leaves no orphaned init process behind and
        # everything the command started dies (synchronously) when it exits. (Without it bwrap's own init is pid 1 and
        # the command gets ordinary signal semantics: an init ignores signals it has no handler for, SIGXCPU included.)
        # No --new-session: the child already runs in its own session without a terminal (run_capped), and staying in
        # bwrap's process group lets killpg reach it.
        a += ["--die-with-parent", *(["--as-pid-1"] if self.as_pid_1 else [])]
        a += [
            "--unshare-user",
            "--disable-userns",
            "--uid",
            str(INNER_UID),
            "--gid",
            str(INNER_UID),
            "--cap-drop",
            "ALL",
            "--hostname",
            self.hostname,
        ]
        for d in SYSTEM_RO_DIRS:
            if os.path.isdir(d):
                a += ["--ro-bind", d, d]
        for top in SYSTEM_TOP_LINKS:
            if os.path.islink(top):
                a += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                a += ["--ro-bind", top, top]
        etc = self.etc
        a += ["--ro-bind", str(etc / "passwd"), "/etc/passwd", "--ro-bind", str(etc / "group"), "/etc/group"]
        a += ["--ro-bind", str(etc / "gitconfig"), SANDBOX_GITCONFIG]
        a += ["--proc", "/proc", "--dev", "/dev", "--size", str(self.tmpfs_bytes), "--tmpfs", "/tmp", "--dir", "/var/tmp"]
        if self.workdir is not None:
            a += ["--bind", str(self.workdir), self.mount_point]
        else:
            a += ["--size", str(self.tmpfs_bytes), "--tmpfs", self.mount_point]
        for m in mounts:
            a += ["--bind" if m.writable else "--ro-bind", m.source, m.target]
        a += ["--remount-ro", "/"]  # the sandbox's own root (mount points, /bin -> usr/bin links) is read-only too
        a += ["--chdir", self.mount_point, "--clearenv"]
        for k, v in self.sandbox_env().items():
            a += ["--setenv", k, v]
        a.append("--")
        return a


def write_identity_files(etc: Path, home: str) -> None:
    """The sandbox's /etc/passwd and /etc/group (uid 1000 "agent", home at the mount point) and git's system config."""
    (etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/usr/sbin/nologin\nagent:x:{INNER_UID}:{INNER_UID}:agent:{home}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nagent:x:{INNER_UID}:\nnogroup:x:65534:\n")
    # git refuses repositories owned by another uid (a read-only repo cache, a checkout made by setup code);
    # inside the sandbox every repository is the agent's to use
    (etc / "gitconfig").write_text("[safe]\n\tdirectory = *\n")
    for f in etc.iterdir():
        os.chmod(f, 0o644)


def _release(etc: Path, lease: UidLease | None) -> None:
    shutil.rmtree(etc, ignore_errors=True)
    if lease is not None:
        lease.release()


class LocalRuntime(CommandRuntime):
    """A Runtime (see envs.runtime) backed by bubblewrap, or by a plain subprocess when `isolation="none"`."""

    def __init__(self, config: LocalConfig | None = None, **overrides):
        cfg = config or LocalConfig(**overrides)
        if config is not None and overrides:
            raise TypeError("pass either a LocalConfig or keyword options, not both")
        self.config = cfg
        self.limits = cfg.limits
        self._groups = ProcessGroups()
        self._lock = threading.Lock()
        self._closed = False
        self._owns_dir = cfg.workdir is None
        if cfg.isolation == "none":
            log.warning(
                "UNSANDBOXED runtime (isolation='none'): commands run as plain subprocesses on the host, with host "
                "network and filesystem access; only rlimits, the timeout and the output cap apply"
            )
        if cfg.workdir is None:
            base = Path(tempfile.mkdtemp(prefix="nextstate-sbx-", dir=cfg.root_dir))
            os.chmod(base, 0o755)
            self.workdir = base / "home"
            self.workdir.mkdir(mode=0o755)
        else:
            self.workdir = Path(cfg.workdir).resolve()
            self.workdir.mkdir(parents=True, exist_ok=True)
            base = None
        self.sandbox: BwrapSandbox | None = None
        if cfg.isolation == "bwrap":
            try:
                self.sandbox = BwrapSandbox(
                    workdir=self.workdir,
                    mount_point=cfg.mount_point,
                    mounts=cfg.mounts,
                    network=cfg.network,
                    env=cfg.env,
                    tmpfs_bytes=cfg.limits.tmpfs_bytes,
                    hostname=cfg.hostname,
                    host_uid=cfg.host_uid,
                    root_dir=cfg.root_dir,
                )
            except BaseException:
                if base is not None:
                    _rmtree(base)
                raise
        self.as_root = os.geteuid() == 0
        self.host_uid = self.sandbox.host_uid if self.sandbox is not None else None
        if self.host_uid is not None:
            os.chown(self.workdir, self.host_uid, self.host_uid)
        self._mount_over: list[Mount] = []  # over the workdir, while `throwaway_state` runs
        self._plain_etc = None
        if self.sandbox is None:
            self._plain_etc = Path(tempfile.mkdtemp(prefix="nextstate-sbx-etc-", dir=cfg.root_dir))
            write_identity_files(self._plain_etc, cfg.mount_point)
        self._finalizer = weakref.finalize(self, _cleanup, self._groups, base, self.sandbox, self._plain_etc)

    # ----- more than the protocol -----
    def run(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int | None = None,
        extra_mounts: list[Mount] | None = None,
        network: bool | None = None,
    ) -> RawResult:
        """Like exec() but returns raw bytes; `extra_mounts` / `network` apply to this one command (trusted setup steps)."""
        if self._closed:
            raise RuntimeError("this LocalRuntime is closed")
        check_command(cmd)
        limit = self.limits.output_bytes if output_limit is None else output_limit
        timeout = self.limits.timeout_s if timeout is None else float(timeout)
        # The command reaches bash through an inherited memfd, not argv (one argv string holds at most 128 KiB,
        # MAX_ARG_STRLEN). One bash reads it, closes the fd, sets the limits and evaluates it (no second exec).
        cmd_fd = command_fd(cmd)
        inner = ["/bin/bash", "-c", fd_command_script(cmd_fd, self.limits.ulimit_prelude()), "bash"]
        if self.sandbox is not None:
            mounts = [*(extra_mounts or []), *self._mount_over]
            argv, env, cwd = self.sandbox.argv(inner, extra_mounts=mounts, network=network), None, None
        else:
            argv, env, cwd = inner, self._plain_env(), str(self.workdir)
        try:
            return run_capped(
                argv,
                timeout=timeout,
                output_limit=limit,
                stdin=stdin,
                env=env,
                cwd=cwd,
                user=self.host_uid,
                pass_fds=(cmd_fd,),
                groups=self._groups,
            )
        finally:
            os.close(cmd_fd)

    @contextlib.contextmanager
    def throwaway_state(self) -> Iterator[None]:
        """Commands run within it change nothing the next command sees: they run on a copy of the workdir (removed
        after), and nothing else persists between commands anyway (a fresh /tmp, every process ended with its
        command). For hidden checks between an agent's commands."""
        holder = Path(tempfile.mkdtemp(prefix="nextstate-throwaway-", dir=self.config.root_dir))
        os.chmod(holder, 0o711)  # the sandbox uid reaches the copy through it
        copy = holder / "home"
        saved = self.workdir, self._mount_over
        try:
            subprocess.run(["cp", "-a", "--", str(self.workdir), str(copy)], check=True, capture_output=True)
            if self.sandbox is not None:
                self._mount_over = [Mount(str(copy), self.config.mount_point, writable=True)]
            else:
                self.workdir = copy
            yield
        finally:
            self.workdir, self._mount_over = saved
            _rmtree(holder)

    # ----- internals -----
    def _plain_env(self) -> dict[str, str]:
        assert self._plain_etc is not None
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": str(self.workdir),
            "USER": "agent",
            "LOGNAME": "agent",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            **self.config.env,
        }
        env["HOME"] = str(self.workdir)
        env["GIT_CONFIG_SYSTEM"] = str(self._plain_etc / "gitconfig")
        return env



def command_fd(cmd: str) -> int:
    """A memfd holding `cmd` (UTF-8), positioned at its start, for a child to read as an inherited fd."""
    fd = os.memfd_create("nextstate-command")
    data = memoryview(cmd.encode("utf-8"))
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fd_command_script(cmd_fd: int, prelude: str) -> str:
    """The `bash -c` script that reads the command from inherited fd `cmd_fd` (see `command_fd`), closes it, runs
    `prelude` (the limits; exit 126 if it fails) and evaluates the command in that same bash (no second exec)."""
    return (f'IFS= read -r -d "" __nextstate_cmd <&{cmd_fd}; exec {cmd_fd}<&-; '
            f'{prelude} || exit 126; eval "unset __nextstate_cmd; $__nextstate_cmd"')


def _cleanup(groups: ProcessGroups, base: Path | None, sandbox: BwrapSandbox | None, plain_etc: Path | None) -> None:
    groups.kill_all()
    if base is not None:  # a workdir we made (one given by the caller is kept)
        _rmtree(base)
    if sandbox is not None:
        sandbox.close()
    if plain_etc is not None:
        shutil.rmtree(plain_etc, ignore_errors=True)


def _rmtree(path: Path) -> None:
    def make_writable_and_retry(func, p, _exc):  # the agent may have removed write/exec bits from its own dirs
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700) if os.path.isdir(p) and not os.path.islink(p) else None
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)
