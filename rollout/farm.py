"""EnvFarm: hosts many envs and steps them asynchronously, behind one interface with two backends.

- `local`: envs live in this process; calls run in a thread pool (for debugging and tiny runs).
- `ray`: a few worker actors, each hosting many envs (`envs_per_worker`), so hundreds of envs cost a few processes.

Episodes lease an env slot, reset it with a task, step it, and give it back. Env failures never raise out of the farm as
arbitrary exceptions: they arrive as `EnvError` (with the traceback text) or `EnvTimeout`, and the slot gets a fresh env.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class FarmConfig:
    backend: str = "local"  # "local" | "ray"
    num_envs: int = 16  # env slots = the cap on episodes in flight
    envs_per_worker: int = 16  # ray: envs hosted by one worker actor
    step_timeout_s: float = 120.0
    reset_timeout_s: float = 300.0
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or an address: join a cluster
    worker_num_cpus: float = 0.0  # ray: CPUs reserved per worker actor (0 lets many workers share a small machine)
    worker_resources: dict[str, float] = field(default_factory=dict)  # ray: e.g. {"desktop": 1} to place by resource
    max_worker_restarts: int = 3

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise ValueError(f"farm.backend={self.backend!r}: use 'local' or 'ray'")
        if self.num_envs < 1 or self.envs_per_worker < 1:
            raise ValueError("farm.num_envs and farm.envs_per_worker must be >= 1")


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


class EnvError(RuntimeError):
    """The env raised (or its worker died). `reason` holds the traceback text."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class EnvTimeout(EnvError):
    """A reset or step ran past its timeout; the env was discarded."""


class EnvHost:
    """Owns the envs of one process, by slot id. Used in-process by LocalFarm and inside each Ray worker."""

    def __init__(self, env_name: str, env_kwargs: Mapping[str, Any], registration: Any = None):
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs)
        self.envs: dict[int, Any] = {}
        if registration is not None:  # an env registered with envs.register() in the driver: repeat it here
            import envs

            envs.register(registration.name, registration.entry_point, overwrite=True, **registration.kwargs)

    def _env(self, slot: int):
        if slot not in self.envs:
            import envs  # resolved here, inside the hosting process (plugins included)

            self.envs[slot] = envs.make(self.env_name, **self.env_kwargs)
        return self.envs[slot]

    def reset(self, slot: int, task: Any, seed: int | None) -> tuple[str, Any]:
        try:
            obs, info = self._env(slot).reset(seed=seed, options={"task": task} if task is not None else None)
            return "ok", ResetResult(obs, info)
        except Exception:
            self.discard(slot)
            return "error", traceback.format_exc()

    def step(self, slot: int, action: str) -> tuple[str, Any]:
        try:
            obs, reward, terminated, truncated, info = self._env(slot).step(action)
            return "ok", StepResult(obs, float(reward), bool(terminated), bool(truncated), info)
        except Exception:
            self.discard(slot)
            return "error", traceback.format_exc()

    def discard(self, slot: int) -> None:
        env = self.envs.pop(slot, None)
        if env is not None:
            try:
                env.close()
            except Exception:
                log.warning("closing env slot %d failed:\n%s", slot, traceback.format_exc())

    def close(self) -> None:
        for slot in list(self.envs):
            self.discard(slot)

    def pid(self) -> int:
        return os.getpid()


def _unwrap(result: tuple[str, Any], what: str) -> Any:
    kind, payload = result
    if kind == "ok":
        return payload
    raise EnvError(f"{what} raised:\n{payload}")


class EnvFarm:
    """Common interface; see LocalFarm and RayFarm."""

    def __init__(self, env_name: str, env_kwargs: Mapping[str, Any], cfg: FarmConfig):
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs)
        self.cfg = cfg
        self._free: asyncio.Queue[int] | None = None

    async def start(self) -> None:
        self._free = asyncio.Queue()
        for slot in range(self.cfg.num_envs):
            self._free.put_nowait(slot)

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[int]:
        """Borrow an env slot for one episode (waits while all slots are busy)."""
        assert self._free is not None, "call await farm.start() first"
        slot = await self._free.get()
        try:
            yield slot
        finally:
            self._free.put_nowait(slot)

    async def reset(self, slot: int, task: Any, seed: int | None = None) -> ResetResult:
        return await self._guarded(slot, "reset", self.cfg.reset_timeout_s, task, seed)

    async def step(self, slot: int, action: str) -> StepResult:
        return await self._guarded(slot, "step", self.cfg.step_timeout_s, action)

    async def _guarded(self, slot: int, method: str, timeout: float, *args: Any) -> Any:
        try:
            result = await asyncio.wait_for(self._call(slot, method, *args), timeout)
        except asyncio.TimeoutError:
            await self._discard(slot)
            raise EnvTimeout(f"env {method} on slot {slot} timed out after {timeout:.1f} s; the env was discarded") from None
        return _unwrap(result, f"env {method} on slot {slot}")

    async def _call(self, slot: int, method: str, *args: Any) -> tuple[str, Any]:
        raise NotImplementedError

    async def _discard(self, slot: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class LocalFarm(EnvFarm):
    """Envs in this process; each call runs in a thread so slow envs overlap."""

    async def start(self) -> None:
        await super().start()
        self._host = EnvHost(self.env_name, self.env_kwargs)
        # spare threads: a hung call keeps its thread (threads cannot be killed), the slot's fresh env needs another
        self._pool = ThreadPoolExecutor(max_workers=self.cfg.num_envs + 16, thread_name_prefix="env")

    async def _call(self, slot: int, method: str, *args: Any) -> tuple[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, getattr(self._host, method), slot, *args)

    async def _discard(self, slot: int) -> None:
        # the hung call may still hold the env; drop our reference and close it in the background
        env = self._host.envs.pop(slot, None)
        if env is not None:
            self._pool.submit(_close_quietly, env)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._host.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:
        log.warning("closing a discarded env failed:\n%s", traceback.format_exc())


class RayFarm(EnvFarm):
    """Envs hosted in Ray worker actors, `envs_per_worker` each; slot s lives in worker s // envs_per_worker."""

    async def start(self) -> None:
        await super().start()
        import ray

        init_ray(self.cfg.ray_address)
        worker_cls = ray.remote(EnvWorker)
        n_workers = -(-self.cfg.num_envs // self.cfg.envs_per_worker)
        opts: dict[str, Any] = {
            "num_cpus": self.cfg.worker_num_cpus,
            "max_restarts": self.cfg.max_worker_restarts,
            "max_concurrency": max(self.cfg.envs_per_worker * 2, 16),
        }
        if self.cfg.worker_resources:
            opts["resources"] = dict(self.cfg.worker_resources)
        self._workers = [
            worker_cls.options(**opts).remote(self.env_name, self.env_kwargs, driver_registration(self.env_name))
            for _ in range(n_workers)
        ]
        await asyncio.gather(*(w.ping.remote() for w in self._workers))

    def _worker(self, slot: int):
        return self._workers[slot // self.cfg.envs_per_worker]

    async def _call(self, slot: int, method: str, *args: Any) -> tuple[str, Any]:
        import ray

        try:
            return await getattr(self._worker(slot), method).remote(slot, *args)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            return "error", f"worker hosting slot {slot} died or is restarting: {type(exc).__name__}: {exc}"

    async def _discard(self, slot: int) -> None:
        self._worker(slot).discard.remote(slot)  # fire and forget: the worker may be stuck in that env

    async def close(self) -> None:
        import ray

        if not getattr(self, "_workers", None):
            return
        try:
            await asyncio.wait_for(asyncio.gather(*(w.close.remote() for w in self._workers)), 30)
        except Exception:
            log.warning("closing farm workers failed; killing them", exc_info=True)
        for w in self._workers:
            ray.kill(w, no_restart=True)
        self._workers = []


class EnvWorker:
    """A Ray actor hosting many envs. Async so that one slow env does not block the others in the same worker."""

    def __init__(self, env_name: str, env_kwargs: Mapping[str, Any], registration: Any = None):
        self.host = EnvHost(env_name, env_kwargs, registration)
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="env")

    async def ping(self) -> int:
        return os.getpid()

    async def reset(self, slot: int, task: Any, seed: int | None) -> tuple[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.host.reset, slot, task, seed)

    async def step(self, slot: int, action: str) -> tuple[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.host.step, slot, action)

    async def discard(self, slot: int) -> None:
        env = self.host.envs.pop(slot, None)
        if env is not None:
            self.pool.submit(_close_quietly, env)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self.host.close)


def driver_registration(env_name: str) -> Any:
    """The EnvSpec of an env registered at run time with envs.register() (workers must repeat it), else None.

    Built-ins and entry-point plugins resolve by themselves inside each worker.
    """
    import envs

    s = envs.spec(env_name)
    return s if s.origin == "register()" else None


def init_ray(address: str | None = None) -> None:
    """Start (or join) Ray once; workers see this interpreter's import path so repo-local packages resolve."""
    import ray

    if ray.is_initialized():
        return
    paths = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p) and "-packages" not in p]
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
    kwargs: dict[str, Any] = {"runtime_env": runtime_env, "log_to_driver": True, "include_dashboard": False}
    if address is None:
        kwargs["num_cpus"] = max(os.cpu_count() or 2, 2)
    ray.init(address=address, **kwargs)


def make_farm(env_name: str, env_kwargs: Mapping[str, Any], cfg: FarmConfig) -> EnvFarm:
    return {"local": LocalFarm, "ray": RayFarm}[cfg.backend](env_name, env_kwargs, cfg)
