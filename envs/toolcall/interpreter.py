"""A code-interpreter tool: run Python in a fresh child process with resource limits and a wall-clock timeout.

Each call is stateless: a new temp dir, a new `python -I -S` process in its own session (process group), limits set by a
tiny bootstrap in the child before the user's code runs, and the whole group killed (SIGKILL) when the call ends or
times out. Output is read from pipes with a cap (head and tail kept, a marker in between), so printing 100 MB costs a
bounded amount of memory. This is a resource sandbox, not a security boundary: the code runs as the calling user.

Why the bootstrap instead of `preexec_fn`: the farm steps many envs from a thread pool, and `preexec_fn` is not safe to
use with threads. Why `-S` plus explicit site-packages paths: processing the interpreter's .pth files costs ~30 ms per
start; adding the directories to sys.path directly keeps installed packages importable at ~10 ms per call.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field

#: Runs in the child: set rlimits (soft and hard), make packages importable, run main.py as __main__, and print the
#: user's traceback without the bootstrap's own frame. Arguments are plain strings: importing json would double the
#: start-up time.
_BOOTSTRAP = r"""
import sys, resource, builtins
for item in sys.argv[1].split(","):
    name, soft, hard = item.split(":")
    resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
sys.path.extend(p for p in sys.argv[2].split(":") if p)
sys.argv = ["main.py"]
builtins.exit = builtins.quit = sys.exit
sys.stdout.reconfigure(line_buffering=True)
g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
try:
    with open("main.py", encoding="utf-8") as f:
        src = f.read()
    exec(compile(src, "main.py", "exec"), g)
except SystemExit:
    raise
except BaseException as e:
    import traceback
    sys.stdout.flush()
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    sys.exit(1)
"""

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

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "file_size_mb", "open_files", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"InterpreterLimits.{name} must be > 0, got {getattr(self, name)}")

    def rlimits(self) -> list[tuple[str, int, int]]:
        mb = 1024 * 1024
        return [
            ("RLIMIT_CPU", self.cpu_s, self.cpu_s + 1),
            ("RLIMIT_AS", self.memory_mb * mb, self.memory_mb * mb),
            ("RLIMIT_FSIZE", self.file_size_mb * mb, self.file_size_mb * mb),
            ("RLIMIT_NOFILE", self.open_files, self.open_files),
            ("RLIMIT_CORE", 0, 0),
        ]


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


def _site_paths() -> list[str]:
    paths = sysconfig.get_paths()
    out: list[str] = []
    for key in ("purelib", "platlib"):
        p = paths.get(key)
        if p and p not in out and os.path.isdir(p):
            out.append(p)
    return out


class PythonInterpreter:
    """Runs Python source in a fresh, resource-limited child process; thread-safe (no shared state per call)."""

    def __init__(self, limits: InterpreterLimits | None = None, *, python: str | None = None):
        self.limits = limits or InterpreterLimits()
        self.python = python or sys.executable
        self._paths = _site_paths()
        # Threads such as OpenBLAS's reserve address space per thread and would trip RLIMIT_AS at import.
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }

    def run(self, code: str) -> CodeResult:
        lim = self.limits
        workdir = tempfile.mkdtemp(prefix="ns-python-")
        t0 = time.monotonic()
        try:
            # surrogatepass: a lone surrogate (valid JSON, not UTF-8) reaches the child, which reports the decode error
            with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(code)
            rlimits = ",".join(f"{name}:{soft}:{hard}" for name, soft, hard in lim.rlimits())
            env = dict(self._env, HOME=workdir, TMPDIR=workdir)
            proc = subprocess.Popen(
                [self.python, "-I", "-S", "-c", _BOOTSTRAP, rlimits, ":".join(self._paths)],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: killpg reaches everything it forks
            )
            out, err = _CappedStream(lim.max_output_bytes), _CappedStream(lim.max_output_bytes)
            timed_out = _pump(proc, {proc.stdout: out, proc.stderr: err}, t0 + lim.timeout_s)
            # Kill the whole group before reaping the leader, so the group id cannot be reused in between; this also
            # ends anything the code left running in the background.
            _killpg(proc.pid)
            exit_code = proc.wait()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return CodeResult(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=exit_code,
            timed_out=timed_out,
            killed_reason=_killed_reason(exit_code, timed_out, lim),
            truncated=out.truncated or err.truncated,
            wall_s=time.monotonic() - t0,
        )


def _pump(proc: subprocess.Popen, streams: dict, deadline: float) -> bool:
    """Read both pipes until EOF, the leader's exit (its children may hold the pipes) or the deadline.

    Returns True when the deadline passed."""
    sel = selectors.DefaultSelector()
    for pipe in streams:
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ)
    try:
        leader_done_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return True
            if leader_done_at is None and _exited(proc.pid):
                leader_done_at = now
            if leader_done_at is not None and now - leader_done_at > 0.05:
                break  # the leader is gone and something it forked keeps the pipes open
            for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
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
        for pipe in streams:
            pipe.close()


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
