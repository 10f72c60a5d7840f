"""EnvFarm on real Ray: a two-node cluster on this machine (ray.cluster_utils.Cluster), shared by every test here.

Covers what only the Ray backend adds: both transports, worker processes killed by pid (restart + aborted episodes +
retries + balanced books), a frozen worker (hang detection), and placement of workers by a custom node resource.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import pytest
from doubles import ScriptedPolicy
from farm_envs import register_farm_envs, register_more_farm_envs

from prm.judge import RuleJudge
from rollout.episodes.collect import CollectStats, collect
from rollout.episodes.runner import EpisodeRequest, RunnerConfig
from rollout.farm.core import EnvError, EnvTimeout, FarmConfig, init_ray, make_farm
from train.records import EpisodeStatus

pytestmark = pytest.mark.integration
register_farm_envs()
register_more_farm_envs()

NODE_RESOURCE = "farm_test_node"


@pytest.fixture(scope="session")
def ray_cluster():
    """A head node plus a second node that alone has the custom resource `farm_test_node`."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    second = cluster.add_node(num_cpus=1, resources={NODE_RESOURCE: 4})
    cluster.wait_for_nodes()
    init_ray(cluster.address)
    yield cluster, second
    ray.shutdown()
    cluster.shutdown()


def run(coro):
    return asyncio.run(coro)


def test_ray_farm_batches_timeouts_and_env_errors_on_both_transports(ray_cluster):
    async def main(transport: str):
        cfg = FarmConfig(backend="ray", num_envs=8, envs_per_worker=4, step_timeout_s=1.0, transport=transport)
        farm = make_farm("farm_lockinfo", {}, cfg)  # the echo env, plus an unpicklable result on "lock"
        await farm.start()
        try:
            pids = {w.pid for w in farm.workers()}
            assert len(pids) == 2 and os.getpid() not in pids
            async for r in farm.reset_many([(s, None, None) for s in range(8)]):
                assert r.ok and r.result.info["pid"] == farm.worker_of(r.slot).pid
            got = {r.slot: r.unwrap().obs["content"] async for r in farm.step_many([(s, f"a{s}") for s in range(8)])}
            assert got == {s: f"echo a{s}" for s in range(8)}
            with pytest.raises(EnvError, match=r"(?s)Traceback.*ValueError: boom"):
                await farm.step(1, "boom")
            with pytest.raises(EnvError, match="not picklable"):
                await farm.step(3, "lock")  # that op fails; the worker and its other envs carry on
            with pytest.raises(EnvTimeout):
                await farm.step(2, "sleep:30")  # its thread stays stuck; the env is closed and the slot recycled
            with pytest.raises(EnvError, match="no live env"):
                await farm.step(2, "x")
            await farm.reset(2, None)
            assert (await farm.step(2, "x")).obs["content"] == "echo x"
            m = farm.metrics()
            assert (m.env_errors, m.timeouts, m.restarts, m.workers_alive) == (2, 1, 0, 2)
        finally:
            await farm.close()

    for transport in ("channel", "ray"):
        run(main(transport))


def test_killed_worker_is_restarted_and_its_episodes_are_aborted_then_retried(ray_cluster):
    async def main():
        cfg = FarmConfig(backend="ray", num_envs=8, envs_per_worker=4, max_worker_restarts=2)
        farm = make_farm("farm_script", {}, cfg)
        await farm.start()
        try:
            victim = farm.workers()[0]
            reqs = [EpisodeRequest(f"e{i}", f"g{i % 4}", {"id": f"t{i}", "steps": 8, "step_s": 0.05}) for i in range(16)]
            stats = CollectStats()
            written = []
            job = asyncio.ensure_future(
                collect(farm, ScriptedPolicy(delay_s=0.01), RuleJudge(), reqs, RunnerConfig(run_id="r"),
                        on_episode=written.append, stats=stats)
            )
            while farm.metrics().steps < 12:  # episodes are running on both workers
                await asyncio.sleep(0.02)
            os.kill(victim.pid, signal.SIGKILL)
            trajs = await job
            m = farm.metrics()
            assert stats.started == stats.finished + stats.aborted == len(trajs) == len(written)
            assert stats.aborted >= 1 and stats.retried == stats.aborted and stats.gave_up == 0
            aborted = [t for t in trajs if t.status == EpisodeStatus.ABORTED]
            assert all(f"worker 0 (pid {victim.pid}" in t.reason and "died" in t.reason for t in aborted)
            ok = Counter(t.episode_id.split("#")[0] for t in trajs if t.status == EpisodeStatus.OK)
            assert ok == Counter(r.episode_id for r in reqs)  # every request finished exactly once; none lost
            assert m.restarts == 1 and m.workers_alive == 2 and m.last_recovery_s is not None
            assert m.aborted_episodes == stats.aborted
            assert farm.workers()[0].pid != victim.pid
        finally:
            await farm.close()

    run(main())


def test_a_frozen_worker_is_detected_as_hung_and_restarted(ray_cluster):
    async def main():
        cfg = FarmConfig(backend="ray", num_envs=2, envs_per_worker=1, step_timeout_s=0.5, hang_grace_s=1.0)
        farm = make_farm("farm_echo", {}, cfg)
        await farm.start()
        try:
            frozen = farm.workers()[0].pid
            await farm.reset(0, None)
            await farm.reset(1, None)
            os.kill(frozen, signal.SIGSTOP)  # a frozen process: no answers, and no EOF on its channel either
            with pytest.raises(EnvError, match=f"worker 0 \\(pid {frozen}.*hung"):
                await farm.step(0, "x")
            assert (await farm.step(1, "x")).obs["content"] == "echo x"  # the other worker is unaffected
            await farm.reset(0, None)  # waits for the restarted worker
            assert (await farm.step(0, "x")).obs["content"] == "echo x"
            assert farm.workers()[0].pid != frozen and farm.metrics().restarts == 1
        finally:
            await farm.close()

    run(main())


def test_workers_are_placed_by_node_resource(ray_cluster):
    import ray

    _, second = ray_cluster

    async def main():
        cfg = FarmConfig(backend="ray", num_envs=4, envs_per_worker=2, worker_resources={NODE_RESOURCE: 1})
        farm = make_farm("farm_echo", {}, cfg)
        await farm.start()
        try:
            nodes = {w.node_id for w in farm.workers()}
            assert nodes == {second.node_id} != {ray.get_runtime_context().get_node_id()}
            async for r in farm.reset_many([(s, None, None) for s in range(4)]):
                assert r.ok
            got = [r.unwrap().obs["content"] async for r in farm.step_many([(s, "x") for s in range(4)])]
            assert got == ["echo x"] * 4  # the cross-node (TCP) channel carries the batches
        finally:
            await farm.close()

    run(main())


def test_a_mixed_ray_farm_gives_each_family_its_own_workers_slots_and_failures(ray_cluster):
    """env=mix on Ray: one farm per family (its own worker processes and slot quota); a family whose every reset raises
    aborts only its own episodes, counted in its own farm's metrics."""
    from rollout.farm.core import MixFarm

    async def main():
        cfg = FarmConfig(backend="ray", num_envs=2, envs_per_worker=2, max_starting=1)
        farm = MixFarm({"ok": ("farm_script", {}, cfg), "bad": ("farm_script", {}, cfg)})
        await farm.start()
        try:
            pids = {f: {w.pid for w in sub.workers()} for f, sub in farm.farms.items()}
            assert len(pids["ok"]) == len(pids["bad"]) == 1 and not pids["ok"] & pids["bad"]
            tasks = {"ok": {"id": "ok", "steps": 2}, "bad": {"id": "bad", "fail": "reset"}}
            reqs = [EpisodeRequest(f"{f}-{i}", f"{f}-{i}", tasks[f], seed=i, family=f) for f in tasks for i in range(4)]
            trajs = await collect(farm, ScriptedPolicy(default="go"), None, reqs,
                                  RunnerConfig(run_id="mix", judge_enabled=False), max_retries=1)
            by = Counter((t.family, t.status) for t in trajs)
            assert by == {("ok", EpisodeStatus.OK): 4, ("bad", EpisodeStatus.ABORTED): 8}  # 4 x (1 + 1 retry)
            m = farm.family_metrics()
            assert m["ok"].env_errors == 0 and m["bad"].env_errors == 8 and m["bad"].aborted_episodes == 8
            assert m["ok"].peak_in_flight <= 2 and m["ok"].peak_starting <= 1 and m["ok"].steps == 8
            assert farm.metrics().env_errors == 8 and farm.metrics().workers == 2
        finally:
            await farm.close()

    run(main())
