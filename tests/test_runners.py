"""Rollout runners on real Ray (`loop.runners=N`, rollout/episodes/pool.py): each runner's share of the farm, the loop's
books over the runners, and a runner process killed by pid mid-iteration (its episodes aborted, counted, retried;
nothing lost; every attempt recorded; the runner restarted)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import pytest
from doubles import ScriptedPolicy
from farm_envs import register_farm_envs

from prm.judge import RuleJudge
from rollout.build import compose_launch_config, plan_run
from rollout.episodes.collect import CollectStats, collect
from rollout.episodes.pool import RunnerPool, RunnerSpec, runner_farm_config
from rollout.episodes.runner import EpisodeRequest, RunnerConfig
from rollout.farm.core import FarmConfig, init_ray, make_farm
from train.records import EpisodeStatus

register_farm_envs()


def test_each_runner_gets_its_share_of_the_slots_and_the_start_cap():
    cfg = FarmConfig(num_envs=10, max_starting=5, envs_per_worker=16)
    shares = [runner_farm_config(cfg, i, 3) for i in range(3)]
    assert [s.num_envs for s in shares] == [4, 3, 3] and sum(s.num_envs for s in shares) == 10
    assert [s.max_starting for s in shares] == [2, 2, 1]
    assert all(s.envs_per_worker <= s.num_envs for s in shares)
    assert runner_farm_config(FarmConfig(num_envs=4, max_starting=0), 1, 2).max_starting == 0  # no cap stays no cap
    with pytest.raises(ValueError, match="fewer than loop.runners"):
        runner_farm_config(FarmConfig(num_envs=2), 0, 3)


def test_runners_need_a_server_policy_and_one_is_the_default():
    assert plan_run(compose_launch_config([])).loop.runners == 1
    with pytest.raises(ValueError, match="loop.runners=2 runs episodes in Ray actors.*server policy"):
        plan_run(compose_launch_config(["loop.runners=2"]))  # policy=local lives in the driver
    with pytest.raises(ValueError, match="loop.runners must be an integer >= 1"):
        plan_run(compose_launch_config(["loop.runners=0"]))


def script_farm(index: int, runners: int):
    """A runner's farm (built in the runner actor, which registers the test envs itself)."""
    register_farm_envs()
    return make_farm("farm_script", {}, runner_farm_config(FarmConfig(num_envs=8), index, runners))


def scripted_policy():
    return ScriptedPolicy(delay_s=0.01)


@pytest.fixture(scope="module")
def ray_local():
    import ray
    if ray.is_initialized():
        ray.shutdown()
    init_ray(None, num_cpus=2)
    yield
    ray.shutdown()



@pytest.mark.integration
def test_a_killed_runner_aborts_its_episodes_which_are_counted_retried_and_recorded(ray_local):
    reqs = [EpisodeRequest(f"e{i}", f"g{i % 4}", {"id": f"t{i}", "steps": 6, "step_s": 0.05}, seed=i) for i in range(16)]
    cfg = RunnerConfig(run_id="r")

    async def main():
        pool = RunnerPool(RunnerSpec(farm=script_farm, policy=scripted_policy, judge=RuleJudge, max_restarts=2), 2)
        await pool.start()
        try:
            victim = pool.pids()[0]
            assert len(set(pool.pids())) == 2 and os.getpid() not in pool.pids() and pool.capacity == 8
            stats, written = CollectStats(), []
            job = asyncio.ensure_future(pool.collect(reqs, cfg, on_episode=written.append, stats=stats))
            while not written:  # episodes are running on both runners
                await asyncio.sleep(0.02)
            os.kill(victim, signal.SIGKILL)
            trajs = await job
            assert stats.started == stats.finished + stats.aborted == len(trajs) == len(written)  # every attempt
            assert stats.aborted >= 1 and stats.retried == stats.aborted and stats.gave_up == 0
            aborted = [t for t in trajs if t.status == EpisodeStatus.ABORTED]
            assert all(f"rollout runner 0 (pid {victim}) died" in t.reason for t in aborted)
            ok = [t for t in trajs if t.status == EpisodeStatus.OK]
            assert Counter(t.episode_id.split("#")[0] for t in ok) == Counter(r.episode_id for r in reqs)  # none lost
            assert all(len(t.steps) == 6 and t.outcome == 1.0 and all(s.judge is not None for s in t.steps) for t in ok)
            # in request order, each request's attempts in turn, as collect() returns them
            order = [(int(t.episode_id.split("#")[0][1:]), t.attempt) for t in trajs]
            assert order == sorted(order)
            # the runner came back (a new process, its farm built anew) and runs episodes again
            await pool.wait_up()
            assert pool.pids()[0] not in (None, victim)
            again = await pool.collect(reqs[:4], cfg)
            assert all(t.status == EpisodeStatus.OK for t in again)
            assert pool.metrics().env_slots == 8 and pool.metrics().restarts == 1 == pool.runner_restarts
        finally:
            await pool.close()

    asyncio.run(main())


@pytest.mark.integration
def test_runners_return_what_the_in_driver_path_returns(ray_local):
    """The same requests through 2 runners and through collect() in the driver: the same episodes, steps, actions
    and outcomes, in the same order."""
    reqs = [EpisodeRequest(f"e{i}", f"g{i % 3}", {"id": f"t{i}", "steps": 3}, seed=i) for i in range(9)]
    cfg = RunnerConfig(run_id="r")

    async def main():
        pool = RunnerPool(RunnerSpec(farm=script_farm, policy=scripted_policy, judge=RuleJudge), 2)
        await pool.start()
        try:
            far = await pool.collect(reqs, cfg)
        finally:
            await pool.close()
        farm = make_farm("farm_script", {}, FarmConfig(num_envs=8))
        async with farm:
            near = await collect(farm, scripted_policy(), RuleJudge(), reqs, cfg)
        return far, near

    far, near = asyncio.run(main())

    def view(trajs):
        return [(t.episode_id, t.status, t.outcome, [(s.action, s.next_state["content"], s.judge.score)
                                                     for s in t.steps]) for t in trajs]

    assert view(far) == view(near)
