"""vLLM servers the launcher starts and owns (`policy=vllm` without `policy.urls`, `judge.model_path`): each one
`python -m vllm.entrypoints.openai.api_server` with the interpreter of vLLM's own virtual environment
(`scripts/install_vllm.sh`: vLLM pins torch and transformers versions this project's lock does not have), on
loopback, in its own process group, its output in a log file; healthy once `GET /health` answers 200.

Ownership: `stop()` signals the process group by pid (SIGTERM, then SIGKILL), then kills whatever still carries the
server's marker variable (vLLM's engine and worker processes inherit it); a watchdog process does the same once the
owner is gone, however it died (envs/runtime/owned.py), so a killed launcher leaves no server behind.

The environment of every server: `VLLM_SERVER_DEV_MODE=1` (the pause, reload, prefix-cache and weight-version
endpoints a weight sync needs), `VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache on the CPU build), `VLLM_CPU_OMP_THREADS_BIND`
(its cores) and `VLLM_CACHE_ROOT` (its torch.compile artifacts: under the project's cache root, so a test session, whose
cache root is fresh, never reads an earlier run's).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from envs.cache import cache_dir
from envs.runtime.owned import OwnedProcess, kill_marked, process_tree_pss_kib, spawn, start_watchdog

log = logging.getLogger(__name__)

#: the install script's virtual environment (scripts/install_vllm.sh); NEXTSTATE_VLLM_VENV moves it
VENV_ENV = "NEXTSTATE_VLLM_VENV"
PYTHON_ENV = "NEXTSTATE_VLLM_PYTHON"  # or name the interpreter itself
MARKER = "NEXTSTATE_VLLM_SERVER"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` command fails in the vllm-cpu distribution


def default_venv() -> Path:
    """Where scripts/install_vllm.sh puts vLLM's virtual environment: $NEXTSTATE_VLLM_VENV, else
    /opt/nextstate/vllm-venv as root, else ~/.local/share/nextstate/vllm-venv."""
    if os.environ.get(VENV_ENV):
        return Path(os.environ[VENV_ENV]).expanduser()
    if os.geteuid() == 0:
        return Path("/opt/nextstate/vllm-venv")
    return Path("~/.local/share/nextstate/vllm-venv").expanduser()


class VLLMNotInstalled(RuntimeError):
    pass


def find_python(explicit: str | None = None) -> str:
    """vLLM's interpreter: `explicit` (policy.server.python), else $NEXTSTATE_VLLM_PYTHON, else the install script's
    virtual environment; a clear error naming the install step when there is none."""
    candidates = [explicit] if explicit else [os.environ.get(PYTHON_ENV) or str(default_venv() / "bin" / "python")]
    python = candidates[0]
    if not python or not Path(python).is_file():
        raise VLLMNotInstalled(
            f"no vLLM interpreter at {python}: install vLLM in its own virtual environment with "
            f"`scripts/install_vllm.sh` (README, 'vLLM'), or point policy.server.python (or ${PYTHON_ENV}) at one")
    return python


def vllm_version(python: str) -> str:
    """The vLLM version importable by `python` (raises VLLMNotInstalled when it is not)."""
    done = subprocess.run([python, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise VLLMNotInstalled(f"{python} cannot import vllm: {done.stderr.strip().splitlines()[-1:] or done.stderr}"
                               " (run scripts/install_vllm.sh)")
    return done.stdout.strip()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class VLLMServerOptions:
    """`policy.server.*`: how the launcher starts the vLLM servers it owns."""

    num_servers: int = 1  # servers started, each on its own port (episodes are spread over them)
    python: str | None = None  # vLLM's interpreter; None: $NEXTSTATE_VLLM_PYTHON, else scripts/install_vllm.sh's venv
    dtype: str = "float32"  # the served weights' dtype (the parity tolerance is for float32: docs/policies.md)
    max_model_len: int = 2048  # context length (prompt + output); the tiny model's max_position_embeddings
    kv_cache_gb: int = 1  # VLLM_CPU_KVCACHE_SPACE: GiB of KV cache per server (CPU build)
    # VLLM_CPU_OMP_THREADS_BIND: "auto" (vLLM binds its worker to a core and leaves one for others), "nobind", or a
    # core list such as "0-1"
    cpus: str = "auto"
    enforce_eager: bool = False  # no torch.compile (starts faster; decodes slower)
    host: str = "127.0.0.1"
    port: int = 0  # the first server's port (the next ones count up from it); 0: free ports
    start_timeout_s: float = 900.0  # a server not healthy by then is stopped and the start fails (its log quoted)
    extra_args: list[str] = field(default_factory=list)  # more `vllm serve` arguments, as written on its command line
    log_dir: str | None = None  # the servers' logs; None: <run dir>/servers
    cache_dir: str | None = None  # VLLM_CACHE_ROOT (torch.compile artifacts); None: <cache root>/vllm

    def __post_init__(self) -> None:
        if self.num_servers < 1:
            raise ValueError(f"policy.server.num_servers must be >= 1, got {self.num_servers}")
        if self.kv_cache_gb < 1:
            raise ValueError(f"policy.server.kv_cache_gb must be an integer >= 1 (vLLM reads whole GiB), got "
                             f"{self.kv_cache_gb}")
        self.extra_args = [str(a) for a in self.extra_args]


class VLLMServer:
    """One owned vLLM server on `model_dir`: `start()` (returns once healthy), `stop()`, `restart(model_dir)`."""

    def __init__(self, model_dir: str, options: VLLMServerOptions, *, name: str, log_path: str | Path, port: int = 0,
                 served_name: str = "nextstate", logprobs_mode: str = "processed_logprobs", max_logprobs: int = 20,
                 max_num_seqs: int | None = None):
        self.model_dir = str(model_dir)
        self.options = options
        self.name = name
        self.log_path = Path(log_path)
        self.port = port or free_port(options.host)
        self.served_name = served_name
        self.logprobs_mode = logprobs_mode
        self.max_logprobs = max_logprobs
        self.max_num_seqs = max_num_seqs
        self.python = find_python(options.python)
        self.marker = f"{name}-{uuid.uuid4().hex[:12]}"
        self.proc: OwnedProcess | None = None
        self._watchdog: OwnedProcess | None = None
        self.start_s = 0.0  # how long the last start took (to healthy)

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        o = self.options
        cmd = [self.python, "-m", SERVER_MODULE, "--model", self.model_dir, "--served-model-name", self.served_name,
               "--host", o.host, "--port", str(self.port), "--dtype", o.dtype, "--max-model-len", str(o.max_model_len),
               "--logprobs-mode", self.logprobs_mode, "--max-logprobs", str(self.max_logprobs),
               "--seed", "0", "--disable-log-stats",
               # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded request's prompt is
               # prefilled in chunks (many long prompts at once); whole-prompt prefills never hit that path
               "--no-enable-chunked-prefill"]
        if self.max_num_seqs:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if o.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd + list(o.extra_args)

    def environment(self) -> dict[str, str]:
        o = self.options
        env = {k: v for k, v in os.environ.items() if k not in (MARKER,)}
        env.update({
            MARKER: self.marker,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(o.kv_cache_gb),
            "VLLM_CPU_OMP_THREADS_BIND": o.cpus,
            "VLLM_CACHE_ROOT": str(Path(o.cache_dir).expanduser() if o.cache_dir else cache_dir("vllm")),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "NO_PROXY": ",".join(filter(None, [os.environ.get("NO_PROXY"), o.host, "localhost"])),
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("PYTHONPATH", None)  # vLLM's venv must not see this project's site-packages
        return env

    def start(self) -> str:
        """Start the server and wait until it answers /health (or fail, quoting the end of its log)."""
        if self.proc is not None and self.proc.alive():
            return self.url
        t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== {self.name}: {' '.join(self.command())}\n".encode())
            out.flush()
            self.proc = spawn(self.name, self.command(), env=self.environment(), stdout=out.fileno(),
                              stderr=subprocess.STDOUT)
        self._watchdog = self._watchdog or start_watchdog(MARKER, self.marker)
        log.info("%s: pid %d, port %d, model %s, log %s", self.name, self.proc.pid, self.port, self.model_dir,
                 self.log_path)
        deadline = t0 + self.options.start_timeout_s
        while not self.healthy():
            if not self.proc.alive():
                self._kill_leftovers()
                raise RuntimeError(f"{self.name} exited with code {self.proc.popen.returncode} before it was healthy; "
                                   f"the end of its log ({self.log_path}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} was not healthy after {self.options.start_timeout_s:.0f} s; the end "
                                   f"of its log ({self.log_path}):\n{self.log_tail()}")
            time.sleep(0.5)
        self.start_s = time.monotonic() - t0
        log.info("%s healthy at %s after %.1f s", self.name, self.url, self.start_s)
        return self.url

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after a grace period, then whatever still carries the marker."""
        if self.proc is not None:
            self.proc.stop(grace_s=20.0)
            log.info("%s (pid %d) stopped", self.name, self.proc.pid)
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        killed = kill_marked(MARKER, self.marker)
        if killed:
            log.info("%s: %d process(es) left outside its group (vLLM's helpers) killed by its marker", self.name, killed)

    def close(self) -> None:
        """Stop the server and its watchdog."""
        self.stop()
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def restart(self, model_dir: str) -> float:
        """The fallback weight sync: stop, start on `model_dir` (same port); returns the seconds it took."""
        t0 = time.monotonic()
        self.stop()
        self.model_dir = str(model_dir)
        self.start()
        return time.monotonic() - t0

    def memory_kib(self) -> int:
        """Proportional set size of every process of the server (its engine and worker included)."""
        from envs.runtime.owned import pids_with_marker

        return process_tree_pss_kib(pids_with_marker(MARKER, self.marker))


__all__ = ["VLLMNotInstalled", "VLLMServer", "VLLMServerOptions", "default_venv", "find_python", "free_port",
           "vllm_version"]
