"""The worker side of the farm: `EnvHost` owns the envs of one process; `EnvWorker` runs batches of ops on them.

An op is `(op_id, slot, method, args, timeout_s)` with method "reset" (args `(task, seed)`) or "step" (args `(action,)`);
a result is `(op_id, kind, payload)` with kind "ok", "error" (the traceback text) or "timeout" (the timeout in seconds).
An ok payload is gymnasium's tuple, `(obs, info)` or `(obs, reward, terminated, truncated, info)`: plain tuples pickle
~5x faster than dataclasses, and the driver builds ResetResult / StepResult from them. Results are delivered as they
finish, not in submission order.

How a batch runs: ops of envs measured to be fast (below `fast_op_s`) run back to back on one pool thread (a "chunk": one
thread hop per batch instead of one per op, which is what makes trivial envs cheap); every other op (unknown, slow, any
first reset) gets its own pool thread, so a 50 ms I/O step never waits behind another env. If a chunk op stalls (past
`stall_s`), the ops behind it move to their own threads. A watchdog times out ops (closing their env, so the next reset
builds a fresh one); a thread stuck in a hung env is written off and the pool is replaced once too many are stuck.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import envs
from rollout.farm.channel import ChannelClosed, encode_frame, read_frame, serve

log = logging.getLogger(__name__)

Op = tuple[int, int, str, tuple, float]  # (op_id, slot, method, args, timeout_s)
Result = tuple[int, str, Any]  # (op_id, kind, payload)
Deliver = Callable[[list[Result]], None]


@dataclass
class ResetResult:
    obs: dict[str, Any]
    info: dict[str, Any]


@dataclass
class StepResult:
    obs: dict[str, Any]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


@dataclass
class WorkerInfo:
    """Who a worker is and where it runs (returned by `ping`)."""

    index: int
    pid: int
    node_id: str
    node_ip: str
    hostname: str


class EnvHost:
    """Owns the envs of one process, by slot id. Envs are built at their slot's first reset (or after being discarded).

    `reset` / `step` return ("ok", gymnasium's tuple) or ("error", traceback text); they never raise.
    """

    def __init__(self, env_name: str, env_kwargs: Mapping[str, Any]):
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs)
        self.envs: dict[int, Any] = {}

    def _env(self, slot: int):
        env = self.envs.get(slot)
        if env is None:
            env = self.envs[slot] = envs.make(self.env_name, **self.env_kwargs)
        return env

    def reset(self, slot: int, task: Any, seed: int | None) -> tuple[str, Any]:
        env = None
        try:
            env = self._env(slot)
            obs, info = env.reset(seed=seed, options={"task": task} if task is not None else None)
            return "ok", (obs, info)
        except Exception:
            self.discard(slot, env)
            return "error", traceback.format_exc()

    def step(self, slot: int, action: str) -> tuple[str, Any]:
        env = self.envs.get(slot)
        if env is None:
            return "error", (
                f"no env on slot {slot} in worker pid {os.getpid()}: it was never reset in this process "
                "(its worker restarted, or an earlier timeout/error discarded it); reset it first"
            )
        try:
            obs, reward, terminated, truncated, info = env.step(action)
            return "ok", (obs, float(reward), bool(terminated), bool(truncated), info)
        except Exception:
            self.discard(slot, env)
            return "error", traceback.format_exc()

    def detach(self, slot: int, env: Any = None) -> Any:
        """Forget the slot's env (only if it is still `env`, when given) and return it, unclosed."""
        current = self.envs.get(slot)
        if current is None or (env is not None and current is not env):
            return None
        return self.envs.pop(slot)

    def discard(self, slot: int, env: Any = None) -> None:
        """Forget and close the slot's env. With `env`, a late failure of an old env never discards its replacement."""
        gone = self.detach(slot, env)
        close_quietly(gone if gone is not None else env)

    def close(self) -> None:
        for slot in list(self.envs):
            self.discard(slot)

    def pid(self) -> int:
        return os.getpid()


def _sendable(result: Result) -> Result:
    import pickle

    try:
        pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        return result
    except Exception as exc:
        return (result[0], "error", f"the env's result cannot be sent to the driver (not picklable): {type(exc).__name__}: {exc}")


def close_quietly(env: Any) -> None:
    if env is None:
        return
    try:
        env.close()
    except Exception:
        log.warning("closing an env failed:\n%s", traceback.format_exc())


class DaemonPool:
    """A fixed-size pool of daemon threads, started on demand.

    Not ThreadPoolExecutor: its threads are joined at interpreter exit, so one thread stuck in a hung env would keep the
    process from ever exiting. `done(result, exc)` runs on the pool thread after each job.
    """

    def __init__(self, size: int, name: str):
        self.size = size
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._busy = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any, done: Callable[[Any, BaseException | None], None] | None = None):
        if self._closed:
            raise RuntimeError(f"pool {self.name} is shut down")
        with self._lock:
            self._busy += 1
            spawn = self._busy > self._threads and self._threads < self.size
            if spawn:
                self._threads += 1
        self._jobs.put((fn, args, done))
        if spawn:
            threading.Thread(target=self._serve, name=f"{self.name}-{self._threads}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, done = job
            try:
                result, exc = fn(*args), None
            except BaseException as e:  # reported to `done`; a job never kills its thread
                result, exc = None, e
            with self._lock:
                self._busy -= 1
            if done is not None:
                done(result, exc)

    def take_queued(self) -> list[tuple]:
        """Remove and return the jobs not started yet."""
        jobs = []
        try:
            while True:
                job = self._jobs.get_nowait()
                if job is not None:
                    jobs.append(job)
        except queue.Empty:
            pass
        with self._lock:
            self._busy -= len(jobs)
        return jobs

    def shutdown(self) -> None:
        """Stop idle threads; jobs not started are dropped; threads stuck in a job stay stuck (they are daemons)."""
        self._closed = True
        self.take_queued()
        for _ in range(self._threads):
            self._jobs.put(None)


class _Running:
    """An op on its own pool thread, watched for its timeout."""

    __slots__ = ("op", "deliver", "start", "deadline")

    def __init__(self, op: Op, deliver: Deliver, start: float):
        self.op = op
        self.deliver = deliver
        self.start = start
        self.deadline = start + op[4]


class _Chunk:
    """Fast ops run back to back on one thread. The watchdog may detach the ops not started yet (see EnvWorker)."""

    __slots__ = ("ops", "deliver", "submitted", "lock", "next", "current", "current_start", "detached", "done", "orphan")

    def __init__(self, ops: list[Op], deliver: Deliver, submitted: float):
        self.ops = ops
        self.submitted = submitted
        self.deliver = deliver
        self.lock = threading.Lock()
        self.next = 0
        self.current: Op | None = None
        self.current_start = 0.0
        self.detached = False
        self.done: list[tuple[Result, float, Op]] = []
        self.orphan: int | None = None  # op_id of the stalled op, now watched like a single op


class EnvWorker:
    """Hosts many envs in one process (a Ray actor, or in-process for the local backend) and runs op batches on them.

    Ray-facing methods are async; `submit` must be called on the worker's event loop.
    """

    def __init__(
        self,
        env_name: str,
        env_kwargs: Mapping[str, Any],
        *,
        index: int = 0,
        registration: tuple[Any, dict[str, Any]] | None = None,
        threads: int = 64,
        fast_op_s: float = 0.001,
        stall_s: float = 0.05,
        token: bytes = b"",
    ):
        if registration is not None:  # an env registered with envs.register() in the driver: register it here too
            entry_point, kwargs = registration
            envs.register(env_name, entry_point, overwrite=True, **kwargs)
        self.index = index
        self.host = EnvHost(env_name, env_kwargs)
        self.threads = max(int(threads), 2)
        self.fast_op_s = fast_op_s
        self.stall_s = stall_s
        self._token = token
        self._pool = DaemonPool(self.threads, "env")
        self._closer = DaemonPool(2, "env-close")
        self._ema: dict[tuple[int, str], float] = {}
        self._running: dict[int, _Running] = {}
        self._chunks: set[_Chunk] = set()
        self._stuck = 0  # pool threads written off to hung envs
        self._watchdog: asyncio.Task | None = None
        self._tick = 0.02
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: list[tuple[Callable[..., None], tuple]] = []
        self._inbox_lock = threading.Lock()
        self._inbox_armed = False
        self._server = None
        self.counters = {"ops": 0, "timeouts": 0, "errors": 0, "stalls": 0, "pool_replacements": 0}

    # ----- control (Ray calls) -----
    async def ping(self) -> WorkerInfo:
        node_id, node_ip = "local", "127.0.0.1"
        try:
            import ray

            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
                node_ip = ray.util.get_node_ip_address()
        except Exception:  # not in Ray (local backend) or Ray not importable
            pass
        return WorkerInfo(self.index, os.getpid(), node_id, node_ip, socket.gethostname())

    async def open_channel(self, unix: bool) -> str:
        """Listen for the driver's direct channel (see rollout.farm.channel); returns its address."""
        if self._server is not None:
            self._server.close()
        host = "127.0.0.1"
        if not unix:
            import ray

            host = ray.util.get_node_ip_address()
        self._server = await serve(self._serve_channel, self._token, unix=unix, host=host)
        return self._server.address

    async def run(self, ops: list[Op]):
        """Ray-call transport (no channel): yields result lists as they finish (a Ray streaming generator)."""
        queue: asyncio.Queue[list[Result]] = asyncio.Queue()
        self.submit(ops, queue.put_nowait)
        left = len(ops)
        while left:
            results = [*await queue.get()]
            while not queue.empty():
                results.extend(queue.get_nowait())
            left -= len(results)
            yield [_sendable(r) for r in results]  # an unpicklable result must fail its op, not the whole stream

    async def stats(self) -> dict[str, Any]:
        return {
            **self.counters,
            "envs": len(self.host.envs),
            "running": len(self._running),
            "chunks": len(self._chunks),
            "stuck_threads": self._stuck,
        }

    async def discard(self, slot: int) -> None:
        self._closer.submit(close_quietly, self.host.detach(slot))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._watchdog is not None:
            self._watchdog.cancel()
        envs_left = [self.host.detach(s) for s in list(self.host.envs)]
        closing = threading.Thread(target=lambda: [close_quietly(e) for e in envs_left], name="env-close-all", daemon=True)
        closing.start()
        await asyncio.get_running_loop().run_in_executor(None, closing.join, 60)  # a hung close must not hang us
        self._pool.shutdown()
        self._closer.shutdown()

    # ----- the data path -----
    async def _serve_channel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        outbox: list[Result] = []
        loop = asyncio.get_running_loop()

        def flush() -> None:
            if outbox and not writer.is_closing():
                try:
                    frame = encode_frame(outbox)
                except Exception:  # an env returned something unpicklable: that op fails, the others go through
                    frame = encode_frame([_sendable(r) for r in outbox])
                writer.write(frame)
            outbox.clear()

        def deliver(results: list[Result]) -> None:  # coalesce everything finished in one loop tick into one frame
            if not outbox:
                loop.call_soon(flush)
            outbox.extend(results)

        try:
            while True:
                self.submit(await read_frame(reader), deliver)
        except ChannelClosed:
            log.info("farm channel closed by the driver")
        finally:
            writer.close()

    def submit(self, ops: list[Op], deliver: Deliver) -> None:
        """Start `ops`; `deliver(results)` is called on this loop as they finish (in any order)."""
        self._loop = asyncio.get_running_loop()
        self.counters["ops"] += len(ops)
        fast: list[Op] = []
        for op in ops:
            ema = self._ema.get((op[1], op[2]))
            if ema is not None and ema < self.fast_op_s:
                fast.append(op)
            else:
                self._start_single(op, deliver, time.monotonic())
        if fast:
            chunk = _Chunk(fast, deliver, time.monotonic())
            self._chunks.add(chunk)
            self._pool.submit(self._run_chunk, chunk, done=lambda _r, _e, c=chunk: self._post(self._chunk_done, c))
        if self._watchdog is None:
            self._watchdog = self._loop.create_task(self._watch())

    def _execute(self, op: Op) -> tuple[Result, float]:
        op_id, slot, method, args, _ = op
        t0 = time.perf_counter()
        if method == "step":
            kind, payload = self.host.step(slot, *args)
        elif method == "reset":
            kind, payload = self.host.reset(slot, *args)
        else:
            kind, payload = "error", f"unknown farm op {method!r}"
        return (op_id, kind, payload), time.perf_counter() - t0

    def _start_single(self, op: Op, deliver: Deliver, start: float) -> None:
        run = _Running(op, deliver, start)
        self._running[op[0]] = run
        self._pool.submit(self._execute, op, done=lambda r, e: self._post(self._single_done, run, r, e))

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Hand a pool thread's completion to the event loop.

        Completions queue in an inbox and the loop is woken once per drain, not once per op: when 64 envs finish their
        I/O together that is one wake-up instead of 64. Dropped if the loop is gone (the worker is closing).
        """
        with self._inbox_lock:
            self._inbox.append((fn, args))
            if self._inbox_armed:
                return
            self._inbox_armed = True
        try:
            self._loop.call_soon_threadsafe(self._drain_inbox)
        except RuntimeError:
            log.debug("an env op finished after its worker's event loop closed; result dropped")

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            items, self._inbox = self._inbox, []
            self._inbox_armed = False
        for fn, args in items:
            fn(*args)

    def _single_done(self, run: _Running, outcome: tuple[Result, float] | None, exc: BaseException | None) -> None:
        if self._running.pop(run.op[0], None) is None:
            return  # it timed out earlier; that answer was already sent
        if exc is not None:  # _execute catches env errors; this is a bug in the farm itself
            run.deliver([(run.op[0], "error", "".join(traceback.format_exception(exc)))])
            return
        result, seconds = outcome
        self._learn(run.op, result, seconds)
        run.deliver([result])

    def _run_chunk(self, chunk: _Chunk) -> None:
        while True:
            with chunk.lock:
                if chunk.detached or chunk.next >= len(chunk.ops):
                    chunk.current = None
                    return
                op = chunk.ops[chunk.next]
                chunk.next += 1
                chunk.current, chunk.current_start = op, time.monotonic()
            result, seconds = self._execute(op)
            with chunk.lock:
                chunk.current = None
                chunk.done.append((result, seconds, op))

    def _chunk_done(self, chunk: _Chunk) -> None:
        self._chunks.discard(chunk)
        with chunk.lock:
            done, chunk.done = chunk.done, []
        out: list[Result] = []
        for result, seconds, op in done:
            if op[0] == chunk.orphan and self._running.pop(op[0], None) is None:
                continue  # the stalled op timed out while we waited
            self._learn(op, result, seconds)
            out.append(result)
        if out:
            chunk.deliver(out)

    def _learn(self, op: Op, result: Result, seconds: float) -> None:
        if result[1] == "error":
            self.counters["errors"] += 1
        key = (op[1], op[2])
        prev = self._ema.get(key)
        self._ema[key] = seconds if prev is None else 0.7 * prev + 0.3 * seconds

    # ----- the watchdog: stalls and timeouts -----
    async def _watch(self) -> None:
        try:
            while self._running or self._chunks:
                await asyncio.sleep(self._tick)
                now = time.monotonic()
                for chunk in list(self._chunks):
                    self._check_stall(chunk, now)
                for run in [r for r in self._running.values() if now >= r.deadline]:
                    self._time_out(run)
        finally:
            self._watchdog = None

    def _check_stall(self, chunk: _Chunk, now: float) -> None:
        """Move the ops of a chunk that stopped making progress onto their own threads."""
        with chunk.lock:
            op = chunk.current
            if chunk.detached:
                return
            if op is None:  # between two ops, or not started yet because every pool thread is busy
                if chunk.next or now - chunk.submitted < self.stall_s:
                    return
            elif now - chunk.current_start < min(self.stall_s, op[4]):
                return
            chunk.detached = True
            waiting, chunk.next = chunk.ops[chunk.next :], len(chunk.ops)
            done, chunk.done = chunk.done, []
            start = chunk.current_start
            if op is not None:
                chunk.orphan = op[0]
        self.counters["stalls"] += 1
        if op is not None:  # the stalled op keeps its thread; from now on it is watched like a single op
            self._ema[(op[1], op[2])] = max(self._ema.get((op[1], op[2]), 0.0), now - start)
            self._running[op[0]] = _Running(op, chunk.deliver, start)
        out = []
        for result, seconds, finished in done:
            self._learn(finished, result, seconds)
            out.append(result)
        if out:
            chunk.deliver(out)
        for w in waiting:  # their timeouts count from when they were submitted
            self._start_single(w, chunk.deliver, chunk.submitted)

    def _time_out(self, run: _Running) -> None:
        op_id, slot, method, _, timeout = run.op
        del self._running[op_id]
        self.counters["timeouts"] += 1
        log.warning("env %s on slot %d timed out after %.1f s; closing it", method, slot, timeout)
        self._closer.submit(close_quietly, self.host.detach(slot))  # a hung env's close may hang too: off the loop
        run.deliver([(op_id, "timeout", timeout)])
        self._stuck += 1
        if self._stuck >= self.threads // 2:  # too many threads blocked in hung envs: new work gets a fresh pool
            log.warning("%d pool threads are stuck in hung envs; starting a fresh pool", self._stuck)
            old, self._pool = self._pool, DaemonPool(self.threads, "env")
            for fn, args, done in old.take_queued():  # work queued behind the stuck threads moves to the new pool
                self._pool.submit(fn, *args, done=done)
            old.shutdown()
            self._stuck = 0
            self.counters["pool_replacements"] += 1
