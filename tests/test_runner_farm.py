"""The runner on both farm backends with a real (small) env: statuses, records, judge calls, failures, retries."""

import asyncio

from doubles import ScriptedPolicy

from prm.judge import RuleJudge
from rollout.episodes.collect import collect
from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
from rollout.farm.core import FarmConfig, make_farm
from train.batch import RewardConfig, score_trajectories
from rollout.loop import put_scores
from train.sample_layout import build_samples
from train.records import EpisodeStatus
from train.rewards import integrate, step_index_normalize


def _run(coro):
    return asyncio.run(coro)


async def _with_farm(backend, fn, num_envs=4, **farm_kw):
    farm = make_farm("test-count", {"max_steps": 4, "hang_s": 5.0},
                     FarmConfig(backend=backend, num_envs=num_envs, envs_per_worker=2, **farm_kw))
    await farm.start()
    try:
        return await fn(farm)
    finally:
        await farm.close()


def test_episode_ok_records_steps_outcome_and_judge():
    async def go(farm):
        req = EpisodeRequest("e0", "g0", {"id": "t", "target": 2})
        return await run_episode(farm, ScriptedPolicy(["dec", "inc", "inc", "inc"]), RuleJudge(), req,
                                 RunnerConfig(run_id="r"))

    tr = _run(_with_farm("local", go))
    # values -1, 0, 1, 2: the target is reached on the 4th (last allowed) step, so it terminates with outcome 1
    assert tr.status == EpisodeStatus.OK and tr.outcome == 1.0 and len(tr.steps) == 4
    assert [s.judge.votes for s in tr.steps] == [[-1], [1], [1], [1]]
    assert all(s.status == "ok" for s in tr.steps) and tr.steps[-1].outcome == tr.outcome
    assert tr.steps[0].prompt_tokens == 3 and tr.steps[0].output_tokens == 3


def test_env_exception_aborts_with_traceback_and_slot_is_reusable():
    async def go(farm):
        bad = await run_episode(farm, ScriptedPolicy(["inc", "raise"]), None,
                                EpisodeRequest("e1", "g", {"id": "t", "target": 3}), RunnerConfig(run_id="r"))
        good = await run_episode(farm, ScriptedPolicy(["inc"]), None,
                                 EpisodeRequest("e2", "g", {"id": "t", "target": 1}), RunnerConfig(run_id="r"))
        return bad, good

    for backend in ("local", "ray"):
        bad, good = _run(_with_farm(backend, go, num_envs=1))
        assert bad.status == EpisodeStatus.ABORTED and "boom: the env failed on purpose" in bad.reason
        assert "Traceback" in bad.reason and len(bad.steps) == 1
        assert good.status == EpisodeStatus.OK and good.outcome == 1.0


def test_hung_step_times_out_and_the_env_is_recycled():
    async def go(farm):
        hung = await run_episode(farm, ScriptedPolicy(["hang"]), None,
                                 EpisodeRequest("e1", "g", {"id": "t", "target": 1}), RunnerConfig(run_id="r"))
        after = await run_episode(farm, ScriptedPolicy(["inc"]), None,
                                  EpisodeRequest("e2", "g", {"id": "t", "target": 1}), RunnerConfig(run_id="r"))
        return hung, after

    hung, after = _run(_with_farm("local", go, num_envs=1, step_timeout_s=0.5))
    assert hung.status == EpisodeStatus.ABORTED and "timed out" in hung.reason
    assert after.status == EpisodeStatus.OK


def test_collect_retries_aborted_episodes_and_accounts_for_every_attempt():
    class FlakyPolicy(ScriptedPolicy):
        async def generate(self, messages, sampling):
            c = await super().generate(messages, sampling)
            self.script = ["inc"]  # the first call of the run raises in the env, later ones succeed
            return c

    async def go(farm):
        reqs = [EpisodeRequest(f"e{i}", f"g{i // 2}", {"id": f"t{i}", "target": 1}) for i in range(4)]
        seen = []
        out = await collect(farm, FlakyPolicy(["raise"]), RuleJudge(), reqs, RunnerConfig(run_id="r"),
                            max_retries=2, on_episode=seen.append)
        return out, seen

    out, seen = _run(_with_farm("local", go, num_envs=1))
    assert len(out) == len(seen) == 5  # 4 episodes + 1 retry
    aborted = [t for t in out if t.status == EpisodeStatus.ABORTED]
    ok = [t for t in out if t.status == EpisodeStatus.OK]
    assert len(aborted) == 1 and len(ok) == 4
    assert any(t.episode_id.endswith("#retry1") and t.attempt == 1 for t in ok)


def test_scores_match_the_reward_functions_and_leave_the_trajectories_alone():
    async def go(farm):
        scripts = [["inc", "inc"], ["dec", "inc", "inc", "inc"], ["inc", "dec", "inc", "inc"], ["x", "inc", "inc"]]
        trajs = []
        for i, s in enumerate(scripts):
            trajs.append(await run_episode(farm, ScriptedPolicy(s), RuleJudge(),
                                           EpisodeRequest(f"e{i}", "g", {"id": "t", "target": 2}),
                                           RunnerConfig(run_id="r")))
        return trajs

    trajs = _run(_with_farm("local", go))
    scores = score_trajectories(trajs, RewardConfig())
    stats = scores.stats
    expected_r = [integrate(t.outcome, [s.judge.score for s in t.steps]) for t in trajs]
    expected_a = step_index_normalize({"g": expected_r})["g"]
    assert scores.rewards == expected_r and scores.advantages == expected_a
    assert all(s.reward is None and s.advantage is None for t in trajs for s in t.steps)  # the records are untouched
    put_scores(trajs, scores)
    samples, _ = build_samples(trajs, "step")
    assert len(samples) == stats.steps_with_gradient
    s0 = samples[0]
    assert sum(s0.loss_mask) == len(trajs[0].steps[0].output_ids) and s0.tokens[:3] == [1, 2, 3]
