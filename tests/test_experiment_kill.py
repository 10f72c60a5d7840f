"""An experiment's pool worker leaves once its driver dies, wherever the driver's death finds it
(rollout/experiment/core.py: `_stop_with_driver`, `execute_run`).

The kernel sends PR_SET_PDEATHSIG each time the worker's parent *thread* exits: a killed driver's threads die one
after another, and the worker is re-parented to each in turn, so it gets one SIGTERM per driver thread, tens of ms
apart (benchmarks/kill_experiment.py saw two, 27-45 ms apart). A later one that landed in `execute_run`'s `finally`
raised past its exit, and concurrent.futures then handed the worker the next run, or left it waiting for one for
ever, with the driver gone. These tests put a driver's death at two such moments, deterministically: a fake run (the
pool's initializer replaces `build_start` in the worker) kills the driver itself, and a hook in the worker makes the
next SIGTERM land where the real ones did. A few seconds each (mostly the worker's start).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: Imported by the spawned worker (its sys.path is the driver's). `init` is the pool's initializer.
STUB = '''
import os, signal, sys, time
from pathlib import Path

from rollout.experiment import core as experiment

OUT = Path(os.environ["KILL_TEST_DIR"])
DRIVER_PID = None
runs = 0


def kill_driver_and_wait():
    """What a driver's death is to its worker: SIGTERM (PR_SET_PDEATHSIG), here raising SystemExit in this loop. The
    other driver threads' SIGTERMs (before the fix, each a SystemExit too) are let by first, until its last thread is
    gone (this worker re-parented to init), so that the one that counts is the next one the test brings, where it
    brings it."""
    if os.getppid() != DRIVER_PID:  # never signal anything but the driver
        raise RuntimeError("the driver is gone already")
    first, end = None, time.monotonic() + 10
    while True:
        try:
            if first is None and os.getppid() == DRIVER_PID:
                os.kill(DRIVER_PID, signal.SIGKILL)  # its SIGTERM may come before os.kill returns
            if time.monotonic() >= end:
                break
            if first is not None and os.getppid() != DRIVER_PID:  # re-parented to init: the last driver thread left
                end = min(end, time.monotonic() + 0.2)
            time.sleep(0.01)
        except SystemExit as e:
            if first is None:
                first = e
    if first is not None:
        raise first
    (OUT / "no-sigterm").write_text("the driver's death sent this worker no SIGTERM")


class SigtermOnFlush:
    """sys.stdout whose flush brings the next SIGTERM (another driver thread's exit): execute_run's `finally` flushes
    first."""

    def __init__(self, real):
        self.real = real

    def write(self, s):
        return self.real.write(s)

    def flush(self):
        os.kill(os.getpid(), signal.SIGTERM)
        self.real.flush()


def run_then_sigterm_while_unwinding(cfg):
    """A run killed mid-way; a second SIGTERM comes while execute_run unwinds it."""
    global runs
    runs += 1
    if runs > 1:
        run_forever(cfg)
    try:
        kill_driver_and_wait()
    finally:
        sys.stdout = SigtermOnFlush(sys.stdout)


def load_average_killing_the_driver():
    """The driver dies as this worker takes a run: the SIGTERM lands before the run's try."""
    experiment._load_average = real_load_average
    kill_driver_and_wait()
    return []


def run_forever(cfg):
    (OUT / "second-run").write_text(str(os.getpid()))
    time.sleep(600)


real_load_average = experiment._load_average


def init(driver_pid, case):
    global DRIVER_PID
    DRIVER_PID = driver_pid
    (OUT / "worker.pid").write_text(str(os.getpid()))
    experiment.build_start = run_then_sigterm_while_unwinding if case == "unwinding" else run_forever
    if case == "starting":
        experiment._load_average = load_average_killing_the_driver
    experiment._stop_with_driver(driver_pid)
'''

#: The driver: a pool as run_experiment's (spawn, one worker), the worker's initializer `stub.init`; two runs queued.
DRIVER = '''
import multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor

sys.path[:0] = [sys.argv[1], sys.argv[2]]
from rollout.experiment.core import execute_run
import stub

if __name__ == "__main__":
    case, out = sys.argv[3], sys.argv[2]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=stub.init,
                             initargs=(os.getpid(), case)) as pool:
        futures = [pool.submit(execute_run, {}, os.path.join(out, f"run{i}.log"), True) for i in range(2)]
        for f in futures:
            f.result()
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("case", ["unwinding", "starting"])
def test_a_pool_worker_leaves_when_its_driver_dies_whatever_it_is_doing(tmp_path, case):
    """`unwinding`: the driver dies during a run, and a second SIGTERM comes while execute_run unwinds it (in its
    `finally`); `starting`: the driver dies as the worker starts a run, before the run's try. Either way the worker
    must be gone at once, not take the next run (queued) nor wait for one."""
    (tmp_path / "stub.py").write_text(textwrap.dedent(STUB))
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    with open(tmp_path / "driver.err", "wb") as err:  # a file: the worker inherits it (a pipe would wait for it)
        driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(REPO), str(tmp_path), case],
                                  cwd=tmp_path, env={**os.environ, "KILL_TEST_DIR": str(tmp_path)},
                                  stdout=subprocess.DEVNULL, stderr=err)
    worker = None
    try:
        driver.wait(timeout=300)  # the worker kills the driver once it is in the run
        assert driver.returncode == -signal.SIGKILL, \
            f"the driver was not killed ({driver.returncode}):\n{(tmp_path / 'driver.err').read_text()[-3000:]}"
        worker = int((tmp_path / "worker.pid").read_text())
        deadline = time.monotonic() + 20  # less than UNWIND_GRACE_S: that net must not be what ends it
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (tmp_path / "no-sigterm").exists()
        assert not _alive(worker), (
            f"the pool worker {worker} is still alive 20 s after its driver died"
            + (", running the next run" if (tmp_path / "second-run").exists() else ""))
        assert not (tmp_path / "second-run").exists(), "the worker started the next run after its driver died"
    finally:
        if driver.poll() is None:
            driver.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
