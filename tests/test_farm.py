"""EnvFarm on the local backend (envs in this process): batching, first-finished results, caps, timeouts, errors, metrics.

The Ray backend runs the same scheduler and worker code; tests/test_farm_ray.py covers what only Ray adds.
"""

from __future__ import annotations

import asyncio

import pytest
from doubles import ScriptedPolicy
from farm_envs import Books, register_farm_envs

from prm.judge import RuleJudge
from rollout.episodes.collect import CollectStats, collect
from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
from rollout.farm.core import EnvError, EnvTimeout, FarmConfig, ResetResult, StepResult, make_farm
from rollout.farm.metrics import FarmMetrics, RateMeter
from train.records import EpisodeStatus

register_farm_envs()


def run(coro):
    return asyncio.run(coro)


async def started(env: str = "farm_echo", **cfg):
    farm = make_farm(env, {}, FarmConfig(backend="local", **cfg))
    await farm.start()
    return farm


@pytest.fixture(autouse=True)
def _clear_books():
    Books.clear()
    yield


def test_reset_step_and_result_types():
    async def main():
        farm = await started(num_envs=2)
        try:
            first = await farm.reset(0, None, seed=1)
            assert isinstance(first, ResetResult) and first.obs["content"] == "go"
            res = await farm.step(0, "hi")
            assert isinstance(res, StepResult) and res.obs["content"] == "echo hi" and not res.terminated
        finally:
            await farm.close()

    run(main())


def test_step_many_yields_first_finished_first():
    async def main():
        farm = await started(num_envs=4)
        try:
            async for r in farm.reset_many([(s, None, None) for s in range(4)]):
                assert r.ok
            # warm the speed estimates so that slot 3 is "fast" and shares a thread with nobody slow
            async for r in farm.step_many([(s, "x") for s in range(4)]):
                assert r.ok
            order = [r.slot async for r in farm.step_many([(0, "sleep:0.6"), (1, "sleep:0.3"), (2, "x"), (3, "x")])]
            assert order[:2] in ([2, 3], [3, 2]) and order[2:] == [1, 0]
        finally:
            await farm.close()

    run(main())


def test_a_stalled_fast_env_does_not_hold_back_the_others_in_its_batch():
    async def main():
        farm = await started(num_envs=8)
        try:
            async for r in farm.reset_many([(s, None, None) for s in range(8)]):
                assert r.ok
            for _ in range(3):  # every slot is now measured fast: the next batch runs as one chunk on one thread
                async for r in farm.step_many([(s, "x") for s in range(8)]):
                    assert r.ok
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            finished = {}
            async for r in farm.step_many([(0, "sleep:1.5")] + [(s, "x") for s in range(1, 8)]):
                finished[r.slot] = loop.time() - t0
            assert list(finished)[-1] == 0  # slot 0 (first in the chunk) stalled; the rest moved to other threads
            assert max(finished[s] for s in range(1, 8)) < finished[0]
            assert farm._worker.counters["stalls"] >= 1
        finally:
            await farm.close()

    run(main())


def test_concurrent_single_steps_are_coalesced_into_one_batch():
    async def main():
        farm = await started(num_envs=32)
        sent: list[int] = []
        original = farm._send
        farm._send = lambda link, ops: (sent.append(len(ops)), original(link, ops))[1]
        try:
            async for r in farm.reset_many([(s, None, None) for s in range(32)]):
                assert r.ok
            sent.clear()
            results = await asyncio.gather(*(farm.step(s, f"a{s}") for s in range(32)))
            assert [r.obs["content"] for r in results] == [f"echo a{s}" for s in range(32)]
            assert sent == [32]  # 32 calls made in one loop tick -> one batch to the (single) worker
        finally:
            await farm.close()

    run(main())


def test_hung_step_times_out_and_the_env_is_recycled():
    async def main():
        farm = await started("farm_script", num_envs=1, step_timeout_s=0.3)
        try:
            first = await farm.reset(0, {"id": "h", "hang": True})
            with pytest.raises(EnvTimeout, match="timed out after 0.3 s"):
                await farm.step(0, "go")
            assert first.info["env_id"] in Books.closed  # the hung env was closed
            with pytest.raises(EnvError, match="no live env"):
                await farm.step(0, "go")
            again = await farm.reset(0, {"id": "h2"})
            assert again.info["env_id"] != first.info["env_id"]  # a fresh env
            assert (await farm.step(0, "go")).obs["content"] == "echo go"
            m = farm.metrics()
            assert m.timeouts == 1 and m.envs_alive == 1
        finally:
            await farm.close()

    run(main())


def test_env_exception_aborts_the_episode_with_the_traceback():
    async def main():
        farm = await started("farm_script", num_envs=1)
        try:
            req = EpisodeRequest("e1", "g1", {"id": "t", "fail": "step", "steps": 3})
            traj = await run_episode(farm, ScriptedPolicy(), RuleJudge(), req, RunnerConfig(run_id="r"))
            assert traj.status == EpisodeStatus.ABORTED
            assert "Traceback" in traj.reason and "ValueError: scripted failure in step of task t" in traj.reason
            m = farm.metrics()
            assert m.aborted_episodes == 1 and m.env_errors == 1 and m.in_flight == 0
        finally:
            await farm.close()

    run(main())


def test_caps_bound_episodes_in_flight_and_envs_starting():
    async def main():
        farm = await started("farm_script", num_envs=4, max_starting=2)
        try:
            reqs = [EpisodeRequest(f"e{i}", "g", {"id": f"t{i}", "reset_s": 0.05, "steps": 10}) for i in range(12)]
            stats = CollectStats()
            trajs = await collect(farm, ScriptedPolicy(delay_s=0.02), None, reqs, RunnerConfig(run_id="r"), stats=stats)
            assert [t.status for t in trajs] == [EpisodeStatus.OK] * 12
            assert Books.peak_running == 4  # the env side saw at most 4 episodes at once (and reached 4)
            assert Books.peak_resetting == 2  # and at most 2 envs starting at once
            m = farm.metrics()
            assert m.peak_in_flight == 4 and m.peak_starting == 2 and m.in_flight == 0
        finally:
            await farm.close()

    run(main())


def test_collect_retries_aborted_episodes_and_the_books_balance():
    async def main():
        farm = await started("farm_script", num_envs=3)
        seen = []
        try:
            reqs = [
                EpisodeRequest(f"e{i}", f"g{i % 2}", {"id": f"t{i}", "fail": "step" if i % 2 else None, "fail_first": True})
                for i in range(6)
            ]
            stats = CollectStats()
            trajs = await collect(
                farm, ScriptedPolicy(), RuleJudge(), reqs, RunnerConfig(run_id="r"), on_episode=seen.append, stats=stats
            )
            assert stats.started == stats.finished + stats.aborted == len(trajs) == len(seen) == 9
            assert stats.aborted == 3 and stats.retried == 3 and stats.gave_up == 0
            ok = {t.episode_id: t for t in trajs if t.status == EpisodeStatus.OK}
            assert set(ok) == {"e0", "e2", "e4", "e1#retry1", "e3#retry1", "e5#retry1"}
            assert all(ok[f"e{i}#retry1"].attempt == 1 for i in (1, 3, 5))
            aborted = [t for t in trajs if t.status == EpisodeStatus.ABORTED]
            assert sorted(t.episode_id for t in aborted) == ["e1", "e3", "e5"]
            assert all("scripted failure in step" in t.reason for t in aborted)
            assert farm.metrics().aborted_episodes == 3
        finally:
            await farm.close()

    run(main())


def test_collect_gives_up_after_max_retries():
    async def main():
        farm = await started("farm_script", num_envs=2)
        try:
            reqs = [EpisodeRequest(f"e{i}", "g", {"id": f"t{i}", "fail": "reset"}) for i in range(2)]
            stats = CollectStats()
            trajs = await collect(farm, ScriptedPolicy(), None, reqs, RunnerConfig(run_id="r"), max_retries=2, stats=stats)
            assert len(trajs) == stats.started == stats.aborted == 6 and stats.finished == 0
            assert stats.gave_up == 2
            assert sorted(t.episode_id for t in trajs) == sorted(
                f"e{i}{s}" for i in range(2) for s in ("", "#retry1", "#retry2")
            )
        finally:
            await farm.close()

    run(main())


def test_metrics_snapshot():
    async def main():
        farm = await started(num_envs=3)
        try:
            async for r in farm.reset_many([(s, None, None) for s in range(3)]):
                assert r.ok
            for _ in range(5):
                async for r in farm.step_many([(s, "x") for s in range(3)]):
                    assert r.ok
            m = farm.metrics()
            assert isinstance(m, FarmMetrics)
            assert (m.steps, m.resets, m.envs_alive, m.workers_alive, m.env_slots) == (15, 3, 3, 1, 3)
            assert m.steps_per_s > 0 and m.resets_per_s > 0
            d = m.as_dict()
            assert d["farm/steps"] == 15 and "farm/restarts" in d and "farm/aborted_episodes" in d
            assert "st/s" in m.brief()
        finally:
            await farm.close()

    run(main())


def test_rate_meter_counts_only_its_window():
    now = [100.0]
    meter = RateMeter(window_s=5, clock=lambda: now[0])
    now[0] = 110.0
    meter.add(50)
    assert meter.rate() == pytest.approx(10.0)  # 50 events over a full 5 s window
    now[0] = 116.0
    assert meter.rate() == 0.0 and meter.total == 50


def test_misuse_gets_clear_errors():
    async def main():
        farm = await started(num_envs=2)
        try:
            with pytest.raises(ValueError, match="no env slot 7"):
                await farm.step(7, "x")
            with pytest.raises(EnvError, match="no live env"):
                await farm.step(1, "x")
            await farm.reset(0, None)
            slow = asyncio.ensure_future(farm.step(0, "sleep:0.2"))
            await asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="already has an op in flight"):
                await farm.step(0, "x")
            await slow
        finally:
            await farm.close()
        with pytest.raises(RuntimeError, match="not running"):
            await farm.step(0, "x")

    run(main())
    with pytest.raises(Exception, match="no env 'nope'"):
        run(make_farm("nope", {}, FarmConfig(backend="ray")).start())
    with pytest.raises(ValueError, match="transport"):
        FarmConfig(transport="zmq")


def test_a_worker_with_many_stuck_threads_gets_a_fresh_pool_and_keeps_serving():
    async def main():
        farm = await started("farm_script", num_envs=4, worker_threads=4, step_timeout_s=0.2)
        try:
            for s in range(4):
                await farm.reset(s, {"id": f"h{s}", "hang": True})
            for s in (0, 1):  # two threads stuck in hung envs: half the pool
                with pytest.raises(EnvTimeout):
                    await farm.step(s, "go")
            assert farm._worker.counters["pool_replacements"] == 1
            got = [r.unwrap().obs["content"] async for r in farm.step_many([(2, "nohang"), (3, "nohang")])]
            assert got == ["echo nohang", "echo nohang"]
        finally:
            await farm.close()

    run(main())
