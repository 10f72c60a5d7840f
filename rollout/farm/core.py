"""EnvFarm: hosts many envs and steps them asynchronously, behind one interface with two backends.

- `local`: one in-process worker (envs on a thread pool); for debugging and small runs.
- `ray`: worker actors each hosting `envs_per_worker` envs, placed by resources; hundreds of envs cost a few processes.

Episodes lease an env slot (the cap on episodes in flight), reset it with a task (the cap on envs starting at once applies),
step it, and give it back. Calls made in the same event-loop tick are coalesced into one batch per worker, so the runner's
per-episode `await farm.step(slot, action)` takes the batched path; `step_many` / `reset_many` submit batches explicitly and
yield results as they finish. On Ray, batches travel over a direct channel per worker (see rollout.farm.channel) while
Ray places, restarts and stops the workers.

Failures never escape as arbitrary exceptions: an env that raises or hangs gives `EnvError` (with the traceback text) or
`EnvTimeout` and is closed (the next reset builds a fresh one). A worker that dies or hangs is restarted by Ray
(`max_restarts`; never `max_task_retries`, which would replay the call that killed it); every episode it was running gets
`EnvError` naming the worker, which the runner records as `aborted`. `metrics()` snapshots the farm (FarmMetrics).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from envs import registry
from rollout.farm.channel import ChannelClosed, connect, encode_frame, read_frame
from rollout.farm.metrics import FarmMetrics, RateMeter
from rollout.farm.worker import EnvHost, EnvWorker, ResetResult, StepResult, WorkerInfo

log = logging.getLogger(__name__)

__all__ = [
    "FarmConfig",
    "EnvFarm",
    "LocalFarm",
    "MixFarm",
    "RayFarm",
    "make_farm",
    "init_ray",
    "EnvError",
    "EnvTimeout",
    "ResetResult",
    "StepResult",
    "SlotResult",
    "FarmMetrics",
    "WorkerInfo",
    "EnvHost",
    "EnvWorker",
]


@dataclass
class FarmConfig:
    backend: str = "local"  # "local" | "ray"
    num_envs: int = 32  # env slots = the cap on episodes in flight
    envs_per_worker: int = 16  # ray: envs hosted by one worker actor (1 for heavy envs on a cluster)
    step_timeout_s: float = 120.0
    reset_timeout_s: float = 300.0
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or an address: join a cluster
    worker_num_cpus: float = 0.0  # ray: CPUs reserved per worker actor (0 lets many workers share a small machine)
    worker_resources: dict[str, float] = field(default_factory=dict)  # ray: e.g. {"desktop": 1} to place by resource
    max_worker_restarts: int = 3
    max_starting: int = 16  # envs starting (resets in flight) at once, farm-wide; 0 = no cap
    transport: str = "channel"  # ray: "channel" (direct socket per worker, Ray for control) | "ray" (a Ray call per batch)
    worker_strategy: str = "DEFAULT"  # ray scheduling strategy for workers: "DEFAULT" | "SPREAD"
    worker_threads: int = 0  # pool threads per worker; 0 = envs hosted + 8
    fast_op_s: float = 0.001  # ops measured faster than this run back to back on one thread
    hang_grace_s: float = 10.0  # ray: a worker silent this long past an op's timeout counts as hung and is restarted
    start_timeout_s: float = 300.0  # ray: workers not placed and answering by then -> start() fails (resources?)
    recovery_timeout_s: float = 120.0  # ray: a worker not back by then is given up (its slots retire)
    metrics_window_s: float = 10.0  # steps/s and resets/s are averaged over this window
    # env=mix: family -> overrides of these options for that family's own farm (its slots, start cap, workers), e.g.
    # {gui: {num_envs: 8, max_starting: 4, envs_per_worker: 1}}; a family not named gets num_envs split by weight
    families: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise ValueError(f"farm.backend={self.backend!r}: use 'local' or 'ray'")
        if self.num_envs < 1 or self.envs_per_worker < 1:
            raise ValueError("farm.num_envs and farm.envs_per_worker must be >= 1")
        if self.transport not in ("channel", "ray"):
            raise ValueError(f"farm.transport={self.transport!r}: use 'channel' or 'ray'")
        if self.worker_strategy not in ("DEFAULT", "SPREAD"):
            raise ValueError(f"farm.worker_strategy={self.worker_strategy!r}: use 'DEFAULT' or 'SPREAD'")
        if self.step_timeout_s <= 0 or self.reset_timeout_s <= 0:
            raise ValueError("farm.step_timeout_s and farm.reset_timeout_s must be > 0")
        if self.max_starting < 0 or self.max_worker_restarts < 0:
            raise ValueError("farm.max_starting and farm.max_worker_restarts must be >= 0")

    @property
    def num_workers(self) -> int:
        return 1 if self.backend == "local" else math.ceil(self.num_envs / self.envs_per_worker)


class EnvError(RuntimeError):
    """The env raised (or its worker died). `reason` holds the traceback text."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class EnvTimeout(EnvError):
    """A reset or step ran past its timeout; the env was discarded."""


@dataclass
class SlotResult:
    """One finished op of `step_many` / `reset_many`: `result` or `error`, never both."""

    slot: int
    result: StepResult | ResetResult | None = None
    error: EnvError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> StepResult | ResetResult:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class _Op:
    """One reset/step on its way. Its outcome goes to `future` (single calls) or to `sink` (step_many batches)."""

    __slots__ = ("op_id", "slot", "method", "args", "timeout", "future", "sink", "deadline")

    def __init__(self, op_id: int, slot: int, method: str, args: tuple, timeout: float):
        self.op_id, self.slot, self.method, self.args, self.timeout = op_id, slot, method, args, timeout
        self.future: asyncio.Future | None = None
        self.sink: Callable[[SlotResult], None] | None = None
        self.deadline = math.inf

    def wire(self) -> tuple:
        return (self.op_id, self.slot, self.method, self.args, self.timeout)


class _Slot:
    __slots__ = ("index", "worker", "alive", "lost", "leased", "lease_error", "busy", "retired")

    def __init__(self, index: int, worker: int):
        self.index, self.worker = index, worker
        self.alive = False  # an env exists and its last reset succeeded
        self.lost: str | None = None  # the worker died since the last reset: steps fail with this reason
        self.leased = False
        self.lease_error = False  # an EnvError reached the current lease holder
        self.busy = False  # an op is in flight (one at a time per slot)
        self.retired = False  # its worker is gone for good


UP, RECOVERING, DEAD = "up", "recovering", "dead"


class _Link:
    """The driver's view of one worker: its handle, state, and the ops queued for it or in flight on it."""

    def __init__(self, index: int, handle: Any, slots: list[int]):
        self.index = index
        self.handle = handle
        self.slots = slots
        self.info: WorkerInfo | None = None
        self.state = UP
        self.generation = 0  # bumped at every restart, so late errors of an old incarnation are ignored
        self.pending: list[_Op] = []
        self.flush_scheduled = False
        self.inflight: dict[int, _Op] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task | None = None
        self.recovery: asyncio.Task | None = None
        self.down_since = 0.0

    def describe(self) -> str:
        if self.info is None:
            return f"worker {self.index}"
        return f"worker {self.index} (pid {self.info.pid} on node {self.info.node_id[:12]})"


class EnvFarm:
    """The scheduler shared by both backends; subclasses provide the transport (`_start_workers`, `_send`, ...)."""

    backend = "base"

    def __init__(self, env_name: str, env_kwargs: Mapping[str, Any], cfg: FarmConfig):
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs)
        self.cfg = cfg
        self._started = False
        self._closing = False

    # ----- lifecycle -----
    async def start(self) -> None:
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        cfg = self.cfg
        self._slots = [_Slot(s, self._worker_index(s)) for s in range(cfg.num_envs)]
        self._links: list[_Link] = []
        self._next_op = 0
        self._free: deque[int] = deque(range(cfg.num_envs))
        self._slot_cond = asyncio.Condition()
        self._live_slots = cfg.num_envs
        self._start_sem = asyncio.Semaphore(cfg.max_starting) if cfg.max_starting > 0 else None
        self._steps = RateMeter(cfg.metrics_window_s)
        self._resets = RateMeter(cfg.metrics_window_s)
        self._counts = {"timeouts": 0, "env_errors": 0, "restarts": 0, "aborted": 0}
        self._envs_alive = 0
        self._in_flight = self._peak_in_flight = 0
        self._starting = self._peak_starting = 0
        self._last_recovery: float | None = None
        self._t0 = time.monotonic()
        self._links = await self._start_workers()
        self._watch_task = self._loop.create_task(self._watch())
        self._started = True
        log.info("env farm up: %s, %d env slots on %d workers", self.backend, cfg.num_envs, len(self._links))

    def _worker_index(self, slot: int) -> int:
        return 0 if self.cfg.backend == "local" else slot // self.cfg.envs_per_worker

    async def close(self) -> None:
        if not self._started or self._closing:
            return
        self._closing = True
        self._watch_task.cancel()
        closed = EnvError("the env farm was closed")
        for link in self._links:
            if link.recovery is not None:
                link.recovery.cancel()
            for op in [*link.pending, *link.inflight.values()]:
                self._settle(op, error=closed)
            link.pending.clear()
            link.inflight.clear()
            self._drop_channel(link)
        await self._close_workers()
        log.info("env farm closed")

    async def __aenter__(self) -> EnvFarm:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ----- episodes -----
    @property
    def capacity(self) -> int:
        """Episodes that can be in flight now (env slots not retired)."""
        return self._live_slots if self._started else self.cfg.num_envs

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[int]:
        """Borrow an env slot for one episode (waits while all slots are busy)."""
        self._require_started()
        async with self._slot_cond:
            await self._slot_cond.wait_for(lambda: bool(self._free) or self._live_slots == 0)
            if not self._free:
                raise EnvError("no env slots left: every worker is dead (max_worker_restarts exhausted)")
            slot = self._free.popleft()
        st = self._slots[slot]
        st.leased, st.lease_error = True, False
        self._in_flight += 1
        self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        try:
            yield slot
        finally:
            st.leased = False
            self._in_flight -= 1
            if st.lease_error:
                self._counts["aborted"] += 1
            async with self._slot_cond:
                if not st.retired:
                    self._free.append(slot)
                    self._slot_cond.notify()

    async def reset(self, slot: int, task: Any, seed: int | None = None) -> ResetResult:
        self._require_started()
        if self._start_sem is None:
            return await self._tracked_reset(slot, task, seed)
        async with self._start_sem:
            return await self._tracked_reset(slot, task, seed)

    async def step(self, slot: int, action: str) -> StepResult:
        self._require_started()
        return await self._enqueue(slot, "step", (action,), self.cfg.step_timeout_s, self._loop.create_future()).future

    async def step_many(self, actions: Iterable[tuple[int, str]]) -> AsyncIterator[SlotResult]:
        """Step many slots in one batch per worker; yields each result as it finishes (first finished first)."""
        self._require_started()
        done: deque[SlotResult] = deque()
        waiter: list[asyncio.Future | None] = [None]

        def sink(r: SlotResult) -> None:
            done.append(r)
            if waiter[0] is not None and not waiter[0].done():
                waiter[0].set_result(None)

        n = 0
        for slot, action in actions:
            n += 1
            try:
                self._enqueue(slot, "step", (action,), self.cfg.step_timeout_s, sink)
            except EnvError as exc:
                done.append(SlotResult(slot, error=exc))
        while n:
            if not done:
                waiter[0] = self._loop.create_future()
                await waiter[0]
            while done:
                n -= 1
                yield done.popleft()

    async def reset_many(self, items: Iterable[tuple[int, Any, int | None]]) -> AsyncIterator[SlotResult]:
        """Reset many slots ((slot, task, seed) each), within the cap on envs starting at once; first finished first."""
        self._require_started()
        ready: asyncio.Queue[SlotResult] = asyncio.Queue()
        tasks = []
        for slot, task, seed in items:
            t = self._loop.create_task(self.reset(slot, task, seed))
            t.add_done_callback(lambda f, s=slot: ready.put_nowait(_as_slot_result(s, f)))
            tasks.append(t)
        try:
            for _ in tasks:
                yield await ready.get()
        finally:
            for t in tasks:
                t.cancel()

    def route(self, family: str | None = None) -> EnvFarm:
        """The farm that hosts `family`'s envs: this one (a MixFarm has one per family)."""
        return self

    # ----- introspection -----
    def family_metrics(self) -> dict[str, FarmMetrics]:
        """Per-family snapshots (a MixFarm's families; empty for a one-env farm)."""
        return {}

    def workers(self) -> list[WorkerInfo | None]:
        """Where each worker runs now (pid, node); None while a worker has not answered yet."""
        return [link.info for link in self._links]

    def worker_of(self, slot: int) -> WorkerInfo | None:
        return self._links[self._slots[slot].worker].info

    def metrics(self) -> FarmMetrics:
        """A snapshot of the farm (also valid after close(): the final figures)."""
        if not self._started:
            raise RuntimeError("the env farm has not started: call `await farm.start()` first")
        return FarmMetrics(
            backend=self.backend,
            workers=len(self._links),
            workers_alive=sum(link.state == UP for link in self._links),
            env_slots=self._live_slots,
            envs_alive=self._envs_alive,
            in_flight=self._in_flight,
            peak_in_flight=self._peak_in_flight,
            ops_in_flight=sum(len(link.inflight) + len(link.pending) for link in self._links),
            starting=self._starting,
            peak_starting=self._peak_starting,
            steps_per_s=self._steps.rate(),
            resets_per_s=self._resets.rate(),
            steps=self._steps.total,
            resets=self._resets.total,
            timeouts=self._counts["timeouts"],
            env_errors=self._counts["env_errors"],
            restarts=self._counts["restarts"],
            aborted_episodes=self._counts["aborted"],
            last_recovery_s=self._last_recovery,
            uptime_s=time.monotonic() - self._t0,
        )

    # ----- the op path -----
    def _require_started(self) -> None:
        if not self._started or self._closing:
            raise RuntimeError("the env farm is not running: call `await farm.start()` first (and not after close())")

    async def _tracked_reset(self, slot: int, task: Any, seed: int | None) -> ResetResult:
        self._starting += 1
        self._peak_starting = max(self._peak_starting, self._starting)
        try:
            op = self._enqueue(slot, "reset", (task, seed), self.cfg.reset_timeout_s, self._loop.create_future())
            return await op.future
        finally:
            self._starting -= 1

    def _enqueue(
        self, slot: int, method: str, args: tuple, timeout: float, to: asyncio.Future | Callable[[SlotResult], None]
    ) -> _Op:
        if not 0 <= slot < len(self._slots):
            raise ValueError(f"no env slot {slot}: the farm has slots 0..{len(self._slots) - 1}")
        st = self._slots[slot]
        if st.busy:
            raise RuntimeError(f"slot {slot} already has an op in flight: one reset/step at a time per slot")
        link = self._links[st.worker]
        if link.state == DEAD or (method == "step" and st.lost):
            if st.leased:
                st.lease_error = True
            raise EnvError(st.lost or f"{link.describe()} is dead (max_worker_restarts exhausted)")
        if method == "reset":
            st.lost = None
        elif not st.alive:
            if st.leased:
                st.lease_error = True
            raise EnvError(
                f"slot {slot} has no live env (never reset, or its last reset/step failed or timed out): reset it first"
            )
        self._next_op += 1
        op = _Op(self._next_op, slot, method, args, timeout)
        if isinstance(to, asyncio.Future):
            op.future = to
        else:
            op.sink = to
        st.busy = True
        link.pending.append(op)
        if link.state == UP and not link.flush_scheduled:
            link.flush_scheduled = True
            self._loop.call_soon(self._flush, link)  # every op enqueued in this loop tick goes out in one batch
        return op

    def _flush(self, link: _Link) -> None:
        link.flush_scheduled = False
        if link.state != UP or not link.pending:
            return
        ops, link.pending = link.pending, []
        now = time.monotonic()
        for op in ops:
            op.deadline = now + op.timeout + self.cfg.hang_grace_s
            link.inflight[op.op_id] = op
        self._send(link, ops)

    def _on_results(self, link: _Link, results: list[tuple[int, str, Any]]) -> None:
        inflight = link.inflight
        steps = resets = 0
        for op_id, kind, payload in results:
            op = inflight.pop(op_id, None)
            if op is None:
                continue  # already settled (timed out by the backstop, or its worker was declared dead)
            if kind == "ok":
                if op.method == "step":
                    steps += 1
                    self._settle(op, result=StepResult(*payload))
                else:
                    resets += 1
                    self._settle(op, result=ResetResult(*payload))
            elif kind == "timeout":
                self._counts["timeouts"] += 1
                self._settle(
                    op,
                    error=EnvTimeout(
                        f"env {op.method} on slot {op.slot} timed out after {payload:.1f} s; the env was closed "
                        "and the next reset builds a fresh one"
                    ),
                )
            else:
                self._counts["env_errors"] += 1
                self._settle(op, error=EnvError(f"env {op.method} on slot {op.slot} raised:\n{payload}"))
        if steps:  # counted once per batch: the meter is on the hot path
            self._steps.add(steps)
        if resets:
            self._resets.add(resets)

    def _settle(self, op: _Op, *, result: Any = None, error: EnvError | None = None) -> None:
        st = self._slots[op.slot]
        st.busy = False
        if error is None:
            if op.method == "reset":
                self._set_alive(st, True)
            if op.sink is not None:
                op.sink(SlotResult(op.slot, result=result))
            elif not op.future.done():
                op.future.set_result(result)
            return
        self._set_alive(st, False)
        if st.leased:
            st.lease_error = True
        if op.sink is not None:
            op.sink(SlotResult(op.slot, error=error))
        elif not op.future.done():
            op.future.set_exception(error)

    def _set_alive(self, st: _Slot, alive: bool) -> None:
        if st.alive != alive:
            st.alive = alive
            self._envs_alive += 1 if alive else -1

    async def _watch(self) -> None:
        """Backstop for workers that stop answering (the worker itself enforces per-op timeouts)."""
        tick = min(0.5, self.cfg.step_timeout_s / 4, self.cfg.reset_timeout_s / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for link in self._links:
                if link.state != UP:
                    continue
                late = [op for op in link.inflight.values() if now > op.deadline]
                if late:
                    self._on_late(link, late)

    def _on_late(self, link: _Link, late: list[_Op]) -> None:
        for op in late:
            link.inflight.pop(op.op_id, None)
            self._counts["timeouts"] += 1
            self._settle(op, error=EnvTimeout(f"env {op.method} on slot {op.slot}: no answer from its worker"))

    # ----- worker failure (the Ray backend) -----
    def _worker_failed(self, link: _Link, reason: str, *, kill: bool = False) -> None:
        """Abort everything the worker was running and start bringing it back."""
        if link.state != UP or self._closing:
            return
        link.state = RECOVERING
        link.down_since = time.monotonic()
        why = f"{link.describe()} {reason}; every env it hosted is gone"
        log.warning("%s", why)
        self._drop_channel(link)
        gone = EnvError(why)
        for op in list(link.inflight.values()):
            self._settle(op, error=gone)
        link.inflight.clear()
        keep = []
        for op in link.pending:  # resets wait for the restarted worker; steps had their env on the dead one
            if op.method == "reset":
                keep.append(op)
            else:
                self._settle(op, error=gone)
        link.pending = keep
        for slot in link.slots:
            st = self._slots[slot]
            self._set_alive(st, False)
            if not any(op.slot == slot for op in keep):
                st.lost = why
        link.recovery = self._loop.create_task(self._recover(link, kill))

    async def _recover(self, link: _Link, kill: bool) -> None:
        raise NotImplementedError

    def _retire(self, link: _Link, why: str) -> None:
        link.state = DEAD
        log.error("%s", why)
        err = EnvError(why)
        for op in [*link.pending, *link.inflight.values()]:
            self._settle(op, error=err)
        link.pending.clear()
        link.inflight.clear()
        for slot in link.slots:
            st = self._slots[slot]
            st.retired, st.lost = True, why
            if slot in self._free:
                self._free.remove(slot)
        self._live_slots -= len(link.slots)
        self._loop.create_task(self._wake_lessees())

    async def _wake_lessees(self) -> None:
        async with self._slot_cond:
            self._slot_cond.notify_all()

    def _drop_channel(self, link: _Link) -> None:
        if link.reader_task is not None and link.reader_task is not asyncio.current_task():
            link.reader_task.cancel()
        link.reader_task = None
        if link.writer is not None:
            link.writer.close()
            link.writer = None

    # ----- transport hooks -----
    async def _start_workers(self) -> list[_Link]:
        raise NotImplementedError

    def _send(self, link: _Link, ops: list[_Op]) -> None:
        raise NotImplementedError

    async def _close_workers(self) -> None:
        raise NotImplementedError

    def _threads(self, envs_hosted: int) -> int:
        return self.cfg.worker_threads or envs_hosted + 8

    def _registration(self) -> tuple[Any, dict[str, Any]] | None:
        """An env registered with envs.register() exists only in this process: ship its entry point to the workers.

        Built-ins and entry-point plugins are resolved by name inside each worker (lazily, as the registry does).
        """
        spec = registry.spec(self.env_name)  # an unknown name fails here, in the driver, with the registry's message
        if spec.origin == "register()":
            return spec.entry_point, dict(spec.kwargs)
        return None


def _as_slot_result(slot: int, fut: asyncio.Future) -> SlotResult:
    if fut.cancelled():
        return SlotResult(slot, error=EnvError(f"the op on slot {slot} was cancelled"))
    exc = fut.exception()
    if exc is None:
        return SlotResult(slot, result=fut.result())
    if isinstance(exc, EnvError):
        return SlotResult(slot, error=exc)
    return SlotResult(slot, error=EnvError(f"the op on slot {slot} failed: {type(exc).__name__}: {exc}"))


class LocalFarm(EnvFarm):
    """Envs in this process, on one EnvWorker's thread pool (same batching, timeouts and metrics as the Ray backend)."""

    backend = "local"

    async def _start_workers(self) -> list[_Link]:
        self._registration()  # an unknown env name fails here with the registry's message
        self._worker = EnvWorker(
            self.env_name,
            self.env_kwargs,
            threads=self._threads(self.cfg.num_envs),
            fast_op_s=self.cfg.fast_op_s,
        )
        link = _Link(0, self._worker, list(range(self.cfg.num_envs)))
        link.info = await self._worker.ping()
        return [link]

    def _send(self, link: _Link, ops: list[_Op]) -> None:
        self._worker.submit([op.wire() for op in ops], lambda results: self._on_results(link, results))

    async def _close_workers(self) -> None:
        await self._worker.close()


class RayFarm(EnvFarm):
    """Envs hosted in Ray worker actors, `envs_per_worker` each; slot s lives in worker s // envs_per_worker."""

    backend = "ray"

    async def _start_workers(self) -> list[_Link]:
        import ray

        cfg = self.cfg
        registration = self._registration()  # before starting Ray: an unknown env name fails fast
        init_ray(cfg.ray_address)
        self._token = secrets.token_bytes(32)
        self._driver_node = ray.get_runtime_context().get_node_id()
        worker_cls = ray.remote(EnvWorker)
        opts: dict[str, Any] = {
            "num_cpus": cfg.worker_num_cpus,
            "max_restarts": cfg.max_worker_restarts,
            "max_task_retries": 0,  # never replay a call into a restarted worker: it may be the call that killed it
            "max_concurrency": 1000,
            "scheduling_strategy": cfg.worker_strategy,
        }
        if cfg.worker_resources:
            opts["resources"] = dict(cfg.worker_resources)
        links = []
        for i in range(cfg.num_workers):
            slots = list(range(i * cfg.envs_per_worker, min((i + 1) * cfg.envs_per_worker, cfg.num_envs)))
            handle = worker_cls.options(**opts).remote(
                self.env_name,
                self.env_kwargs,
                index=i,
                registration=registration,
                threads=self._threads(len(slots)),
                fast_op_s=cfg.fast_op_s,
                token=self._token,
            )
            links.append(_Link(i, handle, slots))
        self._links = links
        try:
            infos = await asyncio.wait_for(
                asyncio.gather(*(link.handle.ping.remote() for link in links)), cfg.start_timeout_s
            )
        except asyncio.TimeoutError:
            for link in links:
                ray.kill(link.handle, no_restart=True)
            raise RuntimeError(
                f"{len(links)} farm workers (num_cpus={cfg.worker_num_cpus}, resources={cfg.worker_resources}) were "
                f"not all placed within {cfg.start_timeout_s:.0f} s; the cluster has {ray.available_resources()}"
            ) from None
        for link, info in zip(links, infos):
            link.info = info
        if cfg.transport == "channel":
            await asyncio.gather(*(self._connect(link) for link in links))
        return links

    async def _connect(self, link: _Link) -> None:
        assert link.info is not None
        address = await link.handle.open_channel.remote(link.info.node_id == self._driver_node)
        reader, writer = await connect(address, self._token)
        link.writer = writer
        link.reader_task = self._loop.create_task(self._read_channel(link, reader, writer, link.generation))

    async def _read_channel(self, link: _Link, reader, writer, generation: int) -> None:
        try:
            while True:
                self._on_results(link, await read_frame(reader))
        except ChannelClosed as exc:
            if link.generation == generation and not self._closing:
                self._worker_failed(link, f"died (its channel closed: {exc})")
        except Exception as exc:  # a frame that does not unpickle here (a class the driver cannot import?)
            if link.generation == generation and not self._closing:
                self._worker_failed(link, f"sent results the driver cannot read ({type(exc).__name__}: {exc})", kill=True)

    def _send(self, link: _Link, ops: list[_Op]) -> None:
        wire = [op.wire() for op in ops]
        if self.cfg.transport == "ray":
            self._loop.create_task(self._call(link, wire, link.generation))
            return
        try:
            frame = encode_frame(wire)
        except Exception:  # one op carries something unpicklable: fail that op alone
            frame = b"".join(self._encode_each(link, ops))
        if frame and link.writer is not None:
            link.writer.write(frame)

    def _encode_each(self, link: _Link, ops: list[_Op]) -> Iterable[bytes]:
        for op in ops:
            try:
                yield encode_frame([op.wire()])
            except Exception as exc:
                link.inflight.pop(op.op_id, None)
                self._settle(op, error=EnvError(f"env {op.method} on slot {op.slot}: its arguments cannot be sent: {exc}"))

    async def _call(self, link: _Link, wire: list[tuple], generation: int) -> None:
        import ray

        try:
            async for ref in link.handle.run.remote(wire):
                self._on_results(link, await ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            if link.generation == generation:
                self._worker_failed(link, f"died ({type(exc).__name__}: {exc})")
        except Exception as exc:  # the call itself failed (a bug, or results the driver cannot read): start clean
            if link.generation == generation and not self._closing:
                self._worker_failed(link, f"failed a batch ({type(exc).__name__}: {exc})", kill=True)

    def _on_late(self, link: _Link, late: list[_Op]) -> None:
        op = late[0]
        self._worker_failed(
            link, f"hung: no answer to a {op.method} on slot {op.slot} within its {op.timeout:.1f} s timeout", kill=True
        )

    async def _recover(self, link: _Link, kill: bool) -> None:
        import ray

        old_pid = link.info.pid if link.info else None
        deadline = time.monotonic() + self.cfg.recovery_timeout_s
        died = 0
        try:
            if kill:
                ray.kill(link.handle, no_restart=False)
            while time.monotonic() < deadline:
                try:
                    info = await asyncio.wait_for(link.handle.ping.remote(), max(deadline - time.monotonic(), 0.1))
                except ray.exceptions.ActorDiedError:
                    died += 1  # raised once restarts are exhausted; allow one more look before giving up
                    if died >= 2:
                        break
                    await asyncio.sleep(0.2)
                    continue
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, asyncio.TimeoutError):
                    await asyncio.sleep(0.05)
                    continue
                if info.pid == old_pid:  # same process (a hang, or only the channel broke): restart it for a clean slate
                    ray.kill(link.handle, no_restart=False)
                    await asyncio.sleep(0.05)
                    continue
                link.info = info
                link.generation += 1
                if self.cfg.transport == "channel":
                    try:
                        await self._connect(link)
                    except Exception as exc:
                        log.warning("%s restarted but its channel failed (%s); restarting it again", link.describe(), exc)
                        old_pid = info.pid
                        ray.kill(link.handle, no_restart=False)
                        continue
                link.state = UP
                self._counts["restarts"] += 1
                self._last_recovery = time.monotonic() - link.down_since
                log.warning("%s is back after %.2f s", link.describe(), self._last_recovery)
                if link.pending:
                    self._flush(link)
                return
            self._retire(link, f"{link.describe()} did not come back (max_worker_restarts={self.cfg.max_worker_restarts})")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave a link half-recovered
            self._retire(link, f"{link.describe()} could not be recovered: {type(exc).__name__}: {exc}")

    async def _close_workers(self) -> None:
        import ray

        try:
            await asyncio.wait_for(
                asyncio.gather(*(link.handle.close.remote() for link in self._links if link.state == UP)), 30
            )
        except Exception:
            log.warning("closing farm workers failed; killing them", exc_info=True)
        for link in self._links:
            try:
                ray.kill(link.handle, no_restart=True)
            except Exception:
                log.warning("killing %s failed", link.describe(), exc_info=True)


class MixFarm:
    """Every family of an `env=mix` run served at once: one farm per family (its own env slots = its quota, its own
    cap on envs starting, its own workers), behind the interface the runner and the loop use. Quotas keep slow
    families (desktops, SWE venvs) from holding every slot and fast ones from starving them; a family whose envs fail
    only aborts its own episodes (counted in its own farm's metrics)."""

    def __init__(self, families: Mapping[str, tuple[str, Mapping[str, Any], FarmConfig]]):
        if not families:
            raise ValueError("a mixed farm needs at least one family")
        self.farms: dict[str, EnvFarm] = {f: make_farm(name, kwargs, cfg) for f, (name, kwargs, cfg) in families.items()}
        self.backend = next(iter(self.farms.values())).backend

    async def start(self) -> None:
        started: list[EnvFarm] = []
        try:
            for farm in self.farms.values():  # one after another: Ray is initialized once, by the first
                await farm.start()
                started.append(farm)
        except BaseException:
            for farm in started:
                await farm.close()
            raise

    async def close(self) -> None:
        await asyncio.gather(*(farm.close() for farm in self.farms.values()), return_exceptions=True)

    async def __aenter__(self) -> MixFarm:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def route(self, family: str | None = None) -> EnvFarm:
        try:
            return self.farms[family]  # type: ignore[index]
        except KeyError:
            raise KeyError(f"no family {family!r} in this farm; its families: {', '.join(self.farms)}") from None

    @property
    def capacity(self) -> int:
        return sum(farm.capacity for farm in self.farms.values())

    def family_metrics(self) -> dict[str, FarmMetrics]:
        return {f: farm.metrics() for f, farm in self.farms.items()}

    def metrics(self) -> FarmMetrics:
        """The families' farms added up (peaks and the latest recovery: the largest of them)."""
        return FarmMetrics.total(list(self.family_metrics().values()))


def init_ray(address: str | None = None, **kwargs: Any) -> None:
    """Start (or join) Ray once; workers see this interpreter's import path so repo-local packages resolve."""
    import ray

    if ray.is_initialized():
        return
    paths = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p) and "-packages" not in p]
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}}
    opts: dict[str, Any] = {"runtime_env": runtime_env, "log_to_driver": True, "include_dashboard": False}
    if address is None:
        # "local" always starts a private instance; a bare ray.init() would attach to any cluster that `ray start`
        # (or another test) left on this machine, and then reject num_cpus
        address = "local"
        opts["num_cpus"] = max(os.cpu_count() or 2, 2)
    opts.update(kwargs)
    ray.init(address=address, **opts)


def make_farm(env_name: str, env_kwargs: Mapping[str, Any], cfg: FarmConfig) -> EnvFarm:
    return {"local": LocalFarm, "ray": RayFarm}[cfg.backend](env_name, env_kwargs, cfg)
