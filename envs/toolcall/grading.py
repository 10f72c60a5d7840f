"""Is the agent's answer right? math-verify decides, with guards so that no answer can hang an env.

math-verify bounds its sympy work with SIGALRM, which only works in a process's main thread, and the farm steps envs
from worker threads; some answers (`9^{9^{9^{9}}}`) make sympy run for ever. So:
1. equal plain numbers ("42" and "42.0", "0.5" and ".5") are accepted at once, exactly, without sympy;
2. in the main thread, math-verify runs in process with its own timeouts;
3. elsewhere, it runs in a helper process (one per host process, started on first use, stopped at exit, killed and
   restarted when a check runs past its timeout, which counts as a wrong answer).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction
from functools import lru_cache

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1000
_PLAIN = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)")

#: The helper: one JSON request per line ({"answer", "gold", "timeout"}), one reply line: "1", "0", or "E <reason>".
_WORKER = r"""
import json, sys
from math_verify import parse, verify
for line in sys.stdin:
    req = json.loads(line)
    try:
        t = req["timeout"]
        gold = parse("\\boxed{" + req["gold"] + "}", parsing_timeout=t)
        pred = parse("\\boxed{" + req["answer"] + "}", parsing_timeout=t)
        out = "1" if verify(gold, pred, timeout_seconds=t) else "0"
    except Exception as exc:
        out = "E " + type(exc).__name__ + ": " + str(exc).replace("\n", " ")
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
"""


def plain_number(text: str) -> Fraction | None:
    """The exact value of a plain decimal number ("42", "-3.50", ".5"), else None."""
    text = text.strip()
    return Fraction(text) if _PLAIN.fullmatch(text) else None


@lru_cache(maxsize=4096)
def _gold(answer: str):
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", parsing_timeout=5)


def _verify_here(answer: str, gold: str, timeout_s: int) -> bool:
    from math_verify import parse, verify

    pred = parse("\\boxed{" + answer + "}", parsing_timeout=timeout_s)
    return bool(verify(_gold(gold), pred, timeout_seconds=timeout_s))


class VerifyWorker:
    """A helper process running math-verify in its own main thread; thread-safe; owned by pid (process group)."""

    def __init__(self, python: str | None = None):
        self.python = python or sys.executable
        self._proc: subprocess.Popen | None = None
        self._answered = False  # the helper has answered once (its import of math-verify, ~1 s, is behind it)
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [self.python, "-I", "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        log.debug("math-verify helper started (pid %d)", proc.pid)
        self._answered = False
        return proc

    def verify(self, answer: str, gold: str, timeout_s: float = 10.0) -> bool:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            inner = max(1, int(timeout_s) // 2)
            try:
                proc.stdin.write(json.dumps({"answer": answer, "gold": gold, "timeout": inner}) + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                self._stop_locked()
                return False
            startup_s = 0.0 if self._answered else 30.0
            reply = _readline(proc, time.monotonic() + timeout_s + startup_s)
            if reply is None:
                log.warning(
                    "math-verify helper gave no answer within %.0f s for %r: killed, counted wrong",
                    timeout_s,
                    answer[:80],
                )
                self._stop_locked()
                return False
            self._answered = True
            if reply.startswith("E "):
                log.debug("math-verify raised on %r: %s", answer[:80], reply[2:])
            return reply == "1"

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


def _readline(proc: subprocess.Popen, deadline: float) -> str | None:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sel.select(timeout=remaining):
            return None
    line = proc.stdout.readline()  # the helper writes whole lines and flushes: this does not block past the select
    return line.strip() if line else None


_worker = VerifyWorker()
atexit.register(_worker.stop)


def answers_match(answer: str, gold: str, timeout_s: float = 10.0) -> bool:
    """Whether `answer` (the content of the agent's \\boxed{}) equals `gold`, by math-verify (see the module doc)."""
    answer, gold = answer.strip(), gold.strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    a, g = plain_number(answer), plain_number(gold)
    if a is not None and g is not None and a == g:
        return True
    if threading.current_thread() is threading.main_thread():
        return _verify_here(answer, gold, max(1, int(timeout_s) // 2))
    return _worker.verify(answer, gold, timeout_s)
