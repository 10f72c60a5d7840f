"""A code-interpreter tool: run Python in a fresh child process, sandboxed, with resource limits and a wall timeout.

Each call is stateless: a new `python -I -S` process that reads its code on stdin, sets its rlimits in a tiny bootstrap
before the user's code runs, works in a fresh private directory, and is killed with its whole process group (SIGKILL)
when the call ends or times out. Output is read from pipes with a cap (head and tail kept, a marker in between), so
printing 100 MB costs a bounded amount of memory.

Where the process runs (`sandbox`):
- `bwrap` (default): the same bubblewrap sandbox as the terminal family's commands (`envs.runtime.local.BwrapSandbox`):
  no network (only its own `lo`), the system read-only, the interpreter's own tree read-only (a hard-linked mirror when
  the sandbox uid cannot reach it, e.g. pyenv under /root), a private tmpfs /tmp and working dir, uid 1000 inside and a
  leased non-root uid outside when we are root, no capabilities, its own pid namespace (nothing outlives the call), and
  RLIMIT_NPROC on top of the other limits.
- `docker`: a container per interpreter (`envs.runtime.docker.DockerRuntime`: no network, read-only root, non-root,
  pids and memory cgroup limits), one `docker exec` per call, the image's `python3`.
- `none`: a plain child process as the calling user (rlimits, timeout and cap only): no security boundary, opt-in only.

Why the bootstrap instead of `preexec_fn`: the farm steps many envs from a thread pool, and `preexec_fn` is not safe to
use with threads. Why `-S` plus explicit site-packages paths: processing the interpreter's .pth files costs ~30 ms per
start; adding the directories to sys.path directly keeps installed packages importable at ~10 ms per call. Why the exit
report (the bootstrap's last line on stderr): a sandbox reports a signal death as 128 + N, like a shell; the report tells
a normal `exit(137)` from a SIGKILL.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field

from envs.runtime.process import as_user

log = logging.getLogger(__name__)

#: Runs in the child: set rlimits (soft and hard), make packages importable, read the code from stdin (then stdin is
#: /dev/null), run it as main.py (__main__) in a fresh directory, print the user's traceback without the bootstrap's own
#: frame, and report its exit status last. Arguments are plain strings: importing json would double the start-up time.
_BOOTSTRAP = r"""
import sys, os, resource, builtins
for item in sys.argv[1].split(","):
    name, soft, hard = item.split(":")
    resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
sys.path.extend(p for p in sys.argv[2].split(":") if p)
src = sys.stdin.buffer.read()
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
work = sys.argv[3]
os.makedirs(work, exist_ok=True)
os.chdir(work)
with open("main.py", "wb") as f:
    f.write(src)
sys.argv = ["main.py"]
builtins.exit = builtins.quit = sys.exit
sys.stdout.reconfigure(line_buffering=True)
g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
code = 0
try:
    exec(compile(src.decode("utf-8"), "main.py", "exec"), g)
except SystemExit as e:
    code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stdout.flush()
        print(code, file=sys.stderr)
        code = 1
except BaseException as e:
    import traceback
    sys.stdout.flush()
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    code = 1
sys.stdout.flush()
sys.stderr.write("%s%d\n" % (MARK, code & 0xFF))
sys.stderr.flush()
sys.exit(code)
"""

#: The bootstrap's last line on stderr says it exited by itself (and with which status): see the module docstring.
EXIT_MARK = "\x00nextstate-exit:"
_BOOTSTRAP = _BOOTSTRAP.replace("MARK", repr(EXIT_MARK))
SANDBOXES = ("bwrap", "docker", "none")
WORK_ROOT = "/workspace"  # the sandbox's private tmpfs; each call works in a fresh directory below it
DOCKER_OUTPUT_FACTOR = 16  # docker: a call printing more than this many times max_output_bytes is stopped

TRUNCATION_MARKER = "\n[... {} bytes of output truncated ...]\n"


@dataclass(frozen=True)
class InterpreterLimits:
    """Limits of one call. `memory_mb` caps the address space (RLIMIT_AS), so it counts virtual memory."""

    timeout_s: float = 8.0  # wall clock; the process group is killed after it
    cpu_s: int = 5  # RLIMIT_CPU: SIGXCPU at cpu_s, SIGKILL one second later
    memory_mb: int = 1024
    file_size_mb: int = 16  # RLIMIT_FSIZE: a bigger write fails with EFBIG
    open_files: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 4000  # per stream (stdout, stderr); head and tail are kept
    processes: int = 64  # RLIMIT_NPROC (processes and threads) in a sandbox (bwrap: per call; docker: the pids limit)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "file_size_mb", "open_files", "max_output_bytes", "processes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"InterpreterLimits.{name} must be > 0, got {getattr(self, name)}")

    def rlimits(self, processes: bool = True) -> list[tuple[str, int, int]]:
        """`processes=False` leaves RLIMIT_NPROC alone: unsandboxed, it would count every process of the user."""
        mb = 1024 * 1024
        out = [
            ("RLIMIT_CPU", self.cpu_s, self.cpu_s + 1),
            ("RLIMIT_AS", self.memory_mb * mb, self.memory_mb * mb),
            ("RLIMIT_FSIZE", self.file_size_mb * mb, self.file_size_mb * mb),
            ("RLIMIT_NOFILE", self.open_files, self.open_files),
            ("RLIMIT_CORE", 0, 0),
        ]
        if processes:
            out.append(("RLIMIT_NPROC", self.processes, self.processes))
        return out


@dataclass
class CodeResult:
    """What one run of the interpreter produced."""

    stdout: str
    stderr: str
    exit_code: int  # the process's exit status; -N when killed by signal N
    timed_out: bool = False  # the wall-clock timeout fired
    killed_reason: str | None = None  # why the process was killed, in words (None when it exited by itself)
    truncated: bool = False  # stdout or stderr exceeded max_output_bytes
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None


@dataclass
class _CappedStream:
    """Keeps the first and last bytes of a stream within `cap`, counting what is dropped in between."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        head_cap = self.cap - self.cap // 4
        room = head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.cap // 4:
                del self.tail[: len(self.tail) - self.cap // 4]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        dropped = self.total - len(self.head) - len(self.tail)
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = bytes(self.tail).decode("utf-8", errors="replace")
        return head + TRUNCATION_MARKER.format(dropped) + tail


@dataclass(frozen=True)
class PythonTree:
    """Where an interpreter lives: the trees a sandbox must mount (read-only, at their own paths) and its site dirs."""

    executable: str
    roots: tuple[str, ...]
    site_paths: tuple[str, ...]


@functools.lru_cache(maxsize=8)
def python_tree(python: str) -> PythonTree:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        paths = sysconfig.get_paths()
        facts = [sys.prefix, sys.base_prefix, paths.get("purelib"), paths.get("platlib")]
    else:
        probe = "import json, sys, sysconfig; p = sysconfig.get_paths(); " \
                "print(json.dumps([sys.prefix, sys.base_prefix, p.get('purelib'), p.get('platlib')]))"
        out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ValueError(f"python={python!r} does not run: {out.stderr.strip()[-300:]}")
        facts = json.loads(out.stdout)
    prefix, base, *site = facts
    site_paths = tuple(dict.fromkeys(p for p in site if p and os.path.isdir(p)))
    roots: list[str] = []
    for tree in (base, prefix, *site_paths, os.path.dirname(os.path.realpath(python))):
        tree = os.path.realpath(tree)
        if tree == "/usr" or tree.startswith("/usr/") or any(tree == r or tree.startswith(r + "/") for r in roots):
            continue  # /usr is in every sandbox already; nested trees come with their parent
        roots = [r for r in roots if not r.startswith(tree + "/")] + [tree]
    return PythonTree(python, tuple(roots), site_paths)


class PythonInterpreter:
    """Runs Python source in a fresh, resource-limited, sandboxed child process; thread-safe (no shared state per call).
    `sandbox`: "bwrap" (default), "docker" or "none" (see the module docstring); `docker_host` / `docker_image` configure
    the docker one (default: $DOCKER_HOST and the locally built sandbox image, whose python3 has no third-party
    packages). Call `close()` when done (a dropped interpreter is cleaned up too)."""

    def __init__(
        self,
        limits: InterpreterLimits | None = None,
        *,
        python: str | None = None,
        sandbox: str = "bwrap",
        docker_host: str | None = None,
        docker_image: str | None = None,
    ):
        if sandbox not in SANDBOXES:
            raise ValueError(f"sandbox={sandbox!r}: use one of {', '.join(SANDBOXES)}")
        if sandbox == "docker" and python is not None:
            raise ValueError("python= names a host interpreter; with sandbox=docker the image's python3 runs the code")
        self.limits = limits or InterpreterLimits()
        self.sandbox = sandbox
        self.python = python or sys.executable
        self._docker_opts = {"docker_host": docker_host, "image": docker_image}
        self._lock = threading.Lock()
        self._place = None  # BwrapSandbox or DockerRuntime, made on first use (demonstrations often need none)
        if sandbox == "none":
            log.warning(
                "UNSANDBOXED python tool (sandbox='none'): tool code runs as this user on the host, with its network "
                "and files; only rlimits, the timeout and the output cap apply"
            )
        # Threads such as OpenBLAS's reserve address space per thread and would trip RLIMIT_AS at import.
        self._env = {
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }

    def close(self) -> None:
        with self._lock:
            place, self._place = self._place, None
        if place is not None:
            place.close()

    def run(self, code: str) -> CodeResult:
        # surrogatepass: a lone surrogate (valid JSON, not UTF-8) reaches the child, which reports the decode error
        src = code.encode("utf-8", errors="surrogatepass")
        lim = self.limits
        rlimits = ",".join(f"{n}:{soft}:{hard}" for n, soft, hard in lim.rlimits(processes=self.sandbox != "none"))
        call = f"py-{uuid.uuid4().hex[:12]}"
        if self.sandbox == "docker":
            self._docker()  # the container starts before the call's clock does
            return self._run_docker(src, rlimits, call, time.monotonic())
        tree = python_tree(self.python)
        boot = [self.python, "-I", "-S", "-c", _BOOTSTRAP, rlimits, ":".join(tree.site_paths)]
        hostdir = None
        sandbox = self._bwrap(tree) if self.sandbox == "bwrap" else None  # a first call may mirror the interpreter
        t0 = time.monotonic()  # the wall timeout counts from here: preparing the sandbox is not the code's time
        if sandbox is not None:
            argv, kwargs = as_user(sandbox.argv([*boot, f"{WORK_ROOT}/{call}"]), sandbox.host_uid)
            env = None  # bwrap sets the sandbox's environment itself
        else:
            hostdir = tempfile.mkdtemp(prefix="ns-python-")
            argv, kwargs = [*boot, hostdir], {}
            env = dict(self._env, PATH=os.environ.get("PATH", "/usr/bin:/bin"), HOME=hostdir, TMPDIR=hostdir)
        out, err = _CappedStream(lim.max_output_bytes), _CappedStream(lim.max_output_bytes)
        try:
            proc = subprocess.Popen(
                argv,
                cwd=hostdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: killpg reaches everything it forks
                **kwargs,
            )
            timed_out = _pump(proc, src, {proc.stdout: out, proc.stderr: err}, t0 + lim.timeout_s)
            # Kill the whole group before reaping the leader, so the group id cannot be reused in between; this also
            # ends anything the code left running in the background.
            _killpg(proc.pid)
            status = proc.wait()
        finally:
            if hostdir is not None:
                shutil.rmtree(hostdir, ignore_errors=True)
        return self._result(out, err, status, timed_out, t0)

    # ----- internals -----
    def _bwrap(self, tree: PythonTree):
        from envs.runtime.host_paths import reachable_copy
        from envs.runtime.local import BwrapSandbox, Mount

        with self._lock:
            if self._place is None:
                mounts = [Mount(str(reachable_copy(r, name=f"python-{os.path.basename(r)}")), r) for r in tree.roots]
                self._place = BwrapSandbox(
                    workdir=None,
                    mount_point=WORK_ROOT,
                    mounts=mounts,
                    env=dict(self._env, HOME=WORK_ROOT),
                    tmpfs_bytes=max(self.limits.file_size_mb * 4, 64) << 20,
                    hostname="python",
                    as_pid_1=False,  # the code keeps ordinary signal semantics (SIGXCPU at the CPU limit)
                )
            return self._place

    def _docker(self):
        from envs.runtime.docker import DockerConfig, DockerRuntime
        from envs.runtime.local import Limits

        with self._lock:
            if self._place is None:
                lim = self.limits
                self._place = DockerRuntime(
                    DockerConfig(
                        **self._docker_opts,
                        pids=lim.processes,
                        memory_bytes=max(lim.memory_mb * 2, 512) << 20,
                        env=dict(self._env),
                        limits=Limits(timeout_s=lim.timeout_s, output_bytes=DOCKER_OUTPUT_FACTOR * lim.max_output_bytes),
                    )
                )
            return self._place

    def _run_docker(self, src: bytes, rlimits: str, call: str, t0: float) -> CodeResult:
        lim = self.limits
        # the image's own site dirs come from site.py (no -S): docker exec costs far more than .pth processing
        cmd = f"exec python3 -I -c {shlex.quote(_BOOTSTRAP)} {shlex.quote(rlimits)} '' /tmp/{call}"
        raw = self._docker().run(cmd, timeout=lim.timeout_s, stdin=src)
        out, err = _CappedStream(lim.max_output_bytes), _CappedStream(lim.max_output_bytes)
        out.feed(raw.stdout)
        err.feed(raw.stderr)
        status = 137 if raw.timed_out or raw.truncated else raw.exit_code
        return self._result(out, err, status, raw.timed_out, t0, stopped_at_cap=raw.truncated)

    def _result(self, out, err, status: int, timed_out: bool, t0: float, stopped_at_cap: bool = False) -> CodeResult:
        lim = self.limits
        stderr, reported = _strip_exit_report(err.text())
        exit_code = _exit_code(status, reported)
        reason = _killed_reason(exit_code, timed_out, lim)
        if stopped_at_cap and not timed_out:
            reason = f"stopped: more than {DOCKER_OUTPUT_FACTOR * lim.max_output_bytes} bytes of output"
        return CodeResult(
            stdout=out.text(),
            stderr=stderr,
            exit_code=exit_code,
            timed_out=timed_out,
            killed_reason=reason,
            truncated=out.truncated or err.truncated or stopped_at_cap,
            wall_s=time.monotonic() - t0,
        )


def _strip_exit_report(stderr: str) -> tuple[str, int | None]:
    """The user's stderr and the status the bootstrap reported (None: it did not get to report: killed)."""
    head, mark, tail = stderr.rpartition(EXIT_MARK)
    if not mark or not tail.endswith("\n") or not tail[:-1].isdigit():
        return stderr, None
    return head, int(tail[:-1])


def _exit_code(status: int, reported: int | None) -> int:
    """The process's exit status, -N when a signal N killed it. `status` is Popen's returncode of the outermost process
    (negative for a signal; a sandbox reports a signal death of its command as 128 + N)."""
    if status < 0 or reported is not None and reported == status:
        return status
    if status > 128 and reported is None:
        return -(status - 128)
    return status


def _pump(proc: subprocess.Popen, stdin: bytes, streams: dict, deadline: float) -> bool:
    """Feed `stdin`, read both pipes until EOF, the leader's exit (its children may hold the pipes) or the deadline.

    Returns True when the deadline passed."""
    sel = selectors.DefaultSelector()
    for pipe in streams:
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ)
    pending = memoryview(stdin)
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    try:
        leader_done_at: float | None = None
        while any(_registered(sel, pipe) for pipe in streams):
            now = time.monotonic()
            if now >= deadline:
                return True
            if leader_done_at is None and _exited(proc.pid):
                leader_done_at = now
            if leader_done_at is not None and now - leader_done_at > 0.05:
                break  # the leader is gone and something it forked keeps the pipes open
            for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
                if key.fileobj is proc.stdin:
                    try:
                        n = os.write(key.fd, pending[:65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        n = len(pending)
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if data:
                    streams[key.fileobj].feed(data)
                else:
                    sel.unregister(key.fileobj)
        return False
    finally:
        sel.close()
        for pipe in (*streams, proc.stdin):
            if not pipe.closed:
                pipe.close()


def _registered(sel: selectors.BaseSelector, f) -> bool:
    try:
        sel.get_key(f)
        return True
    except KeyError:
        return False


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (WNOWAIT)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _killed_reason(exit_code: int, timed_out: bool, lim: InterpreterLimits) -> str | None:
    if timed_out:
        return f"wall-clock timeout: still running after {lim.timeout_s:g} s"
    if exit_code >= 0:
        return None
    sig = -exit_code
    if sig == signal.SIGXCPU:
        return f"CPU time limit of {lim.cpu_s} s exceeded"
    if sig == signal.SIGKILL:
        return f"killed (SIGKILL): CPU time limit of {lim.cpu_s} s or memory exhausted"
    if sig == signal.SIGXFSZ:
        return f"file size limit of {lim.file_size_mb} MB exceeded"
    try:
        return f"killed by signal {signal.Signals(sig).name}"
    except ValueError:
        return f"killed by signal {sig}"


def limit_hit(result: CodeResult, limits: InterpreterLimits) -> str | None:
    """The rlimit behind the code's final exception (the last line of its traceback), in words, or None."""
    last = result.stderr.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError"):
        return f"memory limit of {limits.memory_mb} MB reached"
    if "[Errno 27]" in last:  # EFBIG
        return f"file size limit of {limits.file_size_mb} MB reached"
    if "[Errno 24]" in last:  # EMFILE
        return f"open files limit of {limits.open_files} reached"
    return None


__all__ = ["PythonInterpreter", "InterpreterLimits", "CodeResult", "limit_hit", "TRUNCATION_MARKER"]
