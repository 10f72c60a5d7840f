"""LLMJudge, EnsembleJudge and make_judge against real loopback servers (recorded answers, and a real tiny model)."""

import asyncio
import logging

import numpy as np
import pytest

import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)

from serving_helpers import backend, model_server, replay_server, stats

from prm.ensemble import EnsembleJudge
from prm.factory import make_judge
from prm.judge import RuleJudge, StepContext
from prm.llm_judge import LLMJudge, LLMJudgeConfig
from prm.client.retry import RetryPolicy
from rollout.server.app import FaultConfig

pytestmark = pytest.mark.integration

FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, jitter=0.0, timeout_s=30)


def _ctx(i=0, family="terminal", **kw):
    base = dict(
        family=family,
        task_id=f"task-{i}",
        instruction=f"do thing {i}",
        history=[{"role": "user", "content": f"do thing {i}"}],
        action=f"```bash\necho {i}\n```",
        next_state={"role": "tool", "content": f"{i}"},
        signals={"exit_code": 0},
        step_index=0,
    )
    base.update(kw)
    return StepContext(**base)


def _judge(urls, **kw):
    kw.setdefault("retry", FAST_RETRY)
    return LLMJudge(LLMJudgeConfig(urls=[u + "/v1" for u in urls], **kw))


def _score(judge, *ctxs):
    async def run():
        try:
            return await asyncio.gather(*(judge.score(c) for c in ctxs))
        finally:
            await judge.close()

    return asyncio.run(run())


def test_votes_are_parsed_from_the_first_boxed_and_aggregated():
    answers = ["The step is fine. \\boxed{1}", "Bad: \\boxed{-1} (not \\boxed{1})", "ok \\boxed{1}"]
    with replay_server(answers) as srv:
        (j,) = _score(_judge([srv.url], m=3, aggregate="mean"), _ctx())
        assert sorted(j.votes) == [-1, 1, 1] and j.score == pytest.approx(1 / 3)
        assert sorted(j.raw) == sorted(answers)  # every vote's raw text is kept
    with replay_server(answers) as srv:
        (j,) = _score(_judge([srv.url], m=3, aggregate="majority"), _ctx())
        assert j.score == 1.0
    assert stats(srv)["requests:/v1/chat/completions"] == 3


def test_a_box_inside_the_reasoning_never_casts_the_vote():
    thinking = [
        "<think>Maybe the answer is \\boxed{1}... no: the command failed with exit code 2.</think>\nVerdict: \\boxed{-1}",
        # Qwen3-Thinking's template opens <think> in the prompt: the completion holds only the closing tag
        "The output could be \\boxed{-1}, but it shows the file was written.</think> \\boxed{1}",
        "<think>it looks right \\boxed{1}, let me check the",  # cut off inside its reasoning: no vote
    ]
    with replay_server(thinking) as srv:
        (j,) = _score(_judge([srv.url], m=3), _ctx())
    assert sorted(j.votes, key=str) == sorted([-1, 1, None], key=str) and j.score == 0.0
    with replay_server(thinking) as srv:  # strip_think=false: the old rule, the first box anywhere
        (j,) = _score(_judge([srv.url], m=3, strip_think=False), _ctx())
    assert sorted(j.votes) == [-1, 1, 1]


def test_tie_votes_under_majority_score_zero():
    with replay_server(["\\boxed{1}", "\\boxed{-1}"]) as srv:
        (j,) = _score(_judge([srv.url], m=2, aggregate="majority"), _ctx())
    assert sorted(j.votes) == [-1, 1] and j.score == 0.0


def test_all_invalid_votes_score_zero_and_are_logged_with_the_raw_text(caplog):
    garbage = ["I think it is good", "\\boxed{yes}", "\\boxed{2}"]
    with replay_server(garbage) as srv, caplog.at_level(logging.WARNING, logger="prm.llm_judge"):
        judge = _judge([srv.url], m=3)
        (j,) = _score(judge, _ctx())
    assert j.score == 0.0 and j.votes == [None, None, None] and sorted(j.raw) == sorted(garbage)
    assert "no valid vote" in caplog.text and "\\\\boxed{yes}" in caplog.text
    assert judge.stats.neutral == 1 and judge.stats.invalid_votes == 3


def test_server_500s_are_retried_then_give_a_neutral_score_not_a_crash(caplog):
    with replay_server(["\\boxed{1}"], faults=FaultConfig(fail_all=True)) as srv, caplog.at_level(logging.WARNING):
        judge = _judge([srv.url], m=2)
        (j,) = _score(judge, _ctx())
    assert j.score == 0.0 and j.votes == [None, None]
    assert all(r.startswith("<judge request failed") and "HTTP 500" in r for r in j.raw)
    assert stats(srv)["requests:/v1/chat/completions"] == 2 * FAST_RETRY.attempts  # every vote retried
    assert judge.stats.failed_requests == 2 and "no valid vote" in caplog.text


def test_transient_500s_are_retried_to_a_valid_vote():
    with replay_server(["\\boxed{1}"], faults=FaultConfig(fail_first=2)) as srv:
        (j,) = _score(_judge([srv.url], m=1), _ctx())
    assert j.votes == [1] and j.score == 1.0 and stats(srv)["requests:/v1/chat/completions"] == 3


def test_a_judge_slower_than_its_timeout_gives_neutral():
    with replay_server(["\\boxed{1}"], faults=FaultConfig(latency_s=1.0)) as srv:
        judge = _judge([srv.url], m=1, retry=RetryPolicy(attempts=2, backoff_s=0.01, timeout_s=0.2))
        (j,) = _score(judge, _ctx())
    assert j.score == 0.0 and j.votes == [None] and "ReadTimeout" in j.raw[0]


def test_one_judge_server_down_votes_go_to_the_others():
    with replay_server(["\\boxed{1}"]) as a, replay_server(["\\boxed{-1}"]) as b:
        down = replay_server(["x"]).__enter__()
        down_url = down.url
        down.__exit__(None, None, None)
        judge = _judge([down_url, a.url, b.url], m=3)
        results = _score(judge, *[_ctx(i) for i in range(6)])
    assert all(v is not None for j in results for v in j.votes)  # no vote lost to the dead server
    assert stats(a)["requests:/v1/chat/completions"] + stats(b)["requests:/v1/chat/completions"] == 18
    assert stats(a)["requests:/v1/chat/completions"] > 0 and stats(b)["requests:/v1/chat/completions"] > 0


def test_repeated_steps_are_judged_once():
    with replay_server(["\\boxed{1}"]) as srv:
        judge = _judge([srv.url], m=2)

        async def run():
            # two identical steps in flight at once share one judgement; after it finished, the cache answers
            first = await asyncio.gather(judge.score(_ctx(1)), judge.score(_ctx(1)), judge.score(_ctx(2)))
            later = await judge.score(_ctx(1))
            await judge.close()
            return first, later

        first, later = asyncio.run(run())
    assert [j.score for j in first] == [1.0, 1.0, 1.0] and later.votes == [1, 1]
    assert stats(srv)["requests:/v1/chat/completions"] == 4  # 2 distinct steps x m=2
    assert judge.stats.cache_hits == 2 and judge.stats.judged == 2


def test_failed_judgements_are_not_cached():
    with replay_server(["\\boxed{-1}"], faults=FaultConfig(fail_first=FAST_RETRY.attempts)) as srv:
        judge = _judge([srv.url], m=1)

        async def run():
            a = await judge.score(_ctx())
            b = await judge.score(_ctx())
            await judge.close()
            return a, b

        a, b = asyncio.run(run())
    assert a.votes == [None] and b.votes == [-1]


def test_concurrency_is_bounded_across_steps():
    with replay_server(["\\boxed{1}"], faults=FaultConfig(latency_s=0.2)) as srv:
        judge = _judge([srv.url], m=2, max_concurrency=3)
        results = _score(judge, *[_ctx(i) for i in range(6)])
    assert all(j.score == 1.0 for j in results)
    assert stats(srv)["max_in_flight"] == 3


def test_each_family_template_reaches_the_judge_model():
    with replay_server(["\\boxed{1}"]) as srv:
        ctxs = [_ctx(i, family=f) for i, f in enumerate(["terminal", "gui", "swe", "toolcall", "my_plugin"])]
        _score(_judge([srv.url]), *ctxs)
        prompts = backend(srv).prompts
    assert len(prompts) == 5
    for marker in ("Linux terminal", "graphical desktop", "GitHub issue", "calling tools", "acting in an environment"):
        assert sum(marker in p for p in prompts) == 1
    assert all("<|im_start|>system" in p and "echo" in p for p in prompts)


def test_gui_screenshots_reach_the_judge_as_images():
    shot = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    with replay_server(["\\boxed{1}"]) as srv:
        (j,) = _score(_judge([srv.url], m=3), _ctx(family="gui", image_before=shot, image_after=shot[::-1]))
    assert j.votes == [1, 1, 1] and stats(srv)["images_received"] == 6


def test_real_model_judge_answers_garbage_and_scores_neutral():
    with model_server() as srv:
        judge = _judge([srv.url], m=2, max_tokens=12)
        (j,) = _score(judge, _ctx())
    assert j.score == 0.0 and len(j.raw) == 2 and all(isinstance(r, str) and r for r in j.raw)
    assert judge.stats.requests == 2


def test_seeded_votes_repeat_across_runs_and_unseeded_ones_do_not():
    """Each vote's seed comes from (judge.seed, the prompt, the vote's index): two runs judge a step alike, whatever the
    server sampled in between; with seed=None the server's shared stream decides."""
    with model_server() as srv:
        def votes(seed):
            (j,) = _score(_judge([srv.url], m=3, max_tokens=16, temperature=1.0, seed=seed), _ctx())
            return j.raw

        first, unseeded_1, unseeded_2, again = votes(0), votes(None), votes(None), votes(0)
    assert first == again
    assert unseeded_1 != unseeded_2
    assert len(set(first)) > 1  # the three votes are three draws, not one repeated


def test_ensemble_uses_signals_where_certain_and_the_llm_otherwise():
    with replay_server(["\\boxed{-1}"]) as srv:
        llm = _judge([srv.url])
        ens = EnsembleJudge(llm)
        sure_bad = _ctx(1, signals={"parse_error": True})
        sure_good = _ctx(2, signals={"progress": True})
        unsure = _ctx(3, signals={"exit_code": 0})
        a, b, c = _score(ens, sure_bad, sure_good, unsure)
    assert (a.score, b.score, c.score) == (-1.0, 1.0, -1.0)
    assert a.raw[0].startswith("rule:") and c.raw == ["\\boxed{-1}"]
    assert stats(srv)["requests:/v1/chat/completions"] == 1
    assert ens.metrics()["judge/decided_by_rule"] == 2


def test_ensemble_trust_is_configurable():
    with replay_server(["\\boxed{1}"]) as srv:
        ens = EnsembleJudge(_judge([srv.url]), trust=["parse_error"])  # SWE: a non-zero exit may be expected
        (j,) = _score(ens, _ctx(signals={"error": True, "exit_code": 1}))
    assert j.score == 1.0 and stats(srv)["requests:/v1/chat/completions"] == 1
    with pytest.raises(ValueError, match="unknown"):
        EnsembleJudge(RuleJudge(), trust=["vibes"])


def test_make_judge_from_config():
    assert isinstance(make_judge(None), RuleJudge) and make_judge({"type": "none"}) is None
    j = make_judge(
        {
            "type": "llm",
            "url": "http://127.0.0.1:9/v1",
            "m": 3,
            "aggregate": "majority",
            "retry": {"attempts": 2, "retry_exceptions": ["ReadTimeout"]},
            "limits": {"history_tail": 2},
        }
    )
    assert isinstance(j, LLMJudge) and j.cfg.m == 3 and j.cfg.urls == ["http://127.0.0.1:9/v1"]
    assert j.cfg.retry.attempts == 2 and j.cfg.limits.history_tail == 2
    e = make_judge({"type": "ensemble", "urls": ["http://127.0.0.1:9/v1"], "trust": ["parse_error"]})
    assert isinstance(e, EnsembleJudge) and e.trust == {"parse_error"}
    with pytest.raises(ValueError, match="unknown LLM judge option"):
        make_judge({"type": "llm", "url": "http://x/v1", "temprature": 0.1})
    with pytest.raises(ValueError, match="needs a server"):
        make_judge({"type": "llm"})
    with pytest.raises(ValueError, match="unknown judge"):
        make_judge({"type": "oracle"})


def test_env_slots_never_wait_for_the_judge():
    """A judge that has not answered a single vote does not hold back any env step (no timing involved)."""
    import threading

    from doubles import ScriptedPolicy

    from rollout.episodes.collect import collect
    from rollout.episodes.runner import EpisodeRequest, RunnerConfig
    from rollout.farm.core import FarmConfig, make_farm

    hold = threading.Event()
    with replay_server(["\\boxed{1}"], faults=FaultConfig(hold=hold, hold_max_s=300)) as srv:

        async def run():
            farm = make_farm("test-count", {"max_steps": 3}, FarmConfig(backend="local", num_envs=2))
            await farm.start()
            judge, policy = _judge([srv.url]), ScriptedPolicy(["dec"])
            # distinct targets: distinct instructions, so no two steps share a judgement
            reqs = [EpisodeRequest(f"e{i}", "g", {"id": f"t{i}", "target": 3 + i}) for i in range(6)]
            task = asyncio.create_task(collect(farm, policy, judge, reqs, RunnerConfig(run_id="r")))
            while not (policy.calls == 18 and judge.stats.requests == 18) and not task.done():
                await asyncio.sleep(0.01)  # (if env steps waited for the judge, the server's hold_max_s ends this)
            s = stats(srv)
            steps_done, answered = policy.calls, s.get("requests:/v1/chat/completions", 0) - s.get("in_flight", 0)
            hold.set()
            trajs = await task
            await farm.close()
            await judge.close()
            return steps_done, answered, trajs

        steps_done, answered, trajs = asyncio.run(run())
    # 6 episodes x 3 steps went through 2 env slots while not one judgement had been answered
    assert steps_done == 18 and answered == 0
    assert all(t.status.value == "ok" and [s.judge.votes for s in t.steps] == [[1]] * 3 for t in trajs)


def test_gui_episode_judged_with_real_screenshots(tmp_path, monkeypatch):
    """A real GUI episode (Xvfb desktop, demonstration actions) judged by the LLM judge: each vote request carries the
    screenshots before and after its action as images, in the GUI template."""
    from gui_support import require_desktop_tools

    require_desktop_tools()
    from doubles import ScriptedPolicy

    from envs.gui.env import GUIEnv
    from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
    from rollout.farm.core import FarmConfig, make_farm

    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path))
    task = next(t for t in GUIEnv.tasks("train") if t["id"] == "ns-settings-dark-mode")
    demo = GUIEnv.demonstration(task)
    policy = ScriptedPolicy({demo[1]["content"]: [m["content"] for m in demo if m["role"] == "assistant"]}, "DONE")
    with replay_server(["The toggle changed. \\boxed{1}", "Nothing useful. \\boxed{-1}"]) as srv:

        async def run():
            farm = make_farm("gui", {}, FarmConfig(backend="local", num_envs=1))
            await farm.start()
            judge = _judge([srv.url], m=2, image_max_side=320)
            try:
                return await run_episode(farm, policy, judge, EpisodeRequest("g0", "g", task), RunnerConfig(run_id="r"))
            finally:
                await judge.close()
                await farm.close()

        traj = asyncio.run(run())
        prompts = backend(srv).prompts
    assert traj.status.value == "ok" and traj.outcome == 1.0, traj.reason
    steps = len(traj.steps)
    for s in traj.steps:
        assert len(s.judge.votes) == 2 and set(s.judge.votes) <= {1, -1}
        assert s.judge.score == sum(s.judge.votes) / 2 and all("\\boxed{" in r for r in s.judge.raw)
    assert stats(srv)["images_received"] == 2 * 2 * steps  # before + after, for each of m=2 votes of every step
    assert len(prompts) == 2 * steps and all("graphical desktop" in p and "Screen before" in p for p in prompts)


def test_a_judgement_carries_its_latency_and_the_servers_token_usage():
    """Tokens come from the server's `usage` field (summed over the m votes); a repeat is cached and costs none."""
    with replay_server(["fine \\boxed{1}"] * 4, faults=FaultConfig(latency_s=0.2)) as srv:
        first, again = _score(_judge([srv.url], m=2), _ctx(1), _ctx(1))
        owner, shared = (first, again) if not first.cached else (again, first)
        assert not owner.cached and shared.cached
        assert owner.latency_s >= 0.2 and owner.prompt_tokens > 0 and owner.completion_tokens > 0
        assert shared.prompt_tokens == shared.completion_tokens == 0
        assert stats(srv)["requests:/v1/chat/completions"] == 2


def test_traced_steps_say_where_their_time_went():
    """loop.trace_requests: each step's timing splits its turn (policy, env, runner) and its judgement (the judge's
    slot wait and each request's phases); the episode's has its lease wait, reset and wait for the last judgements."""
    from doubles import ScriptedPolicy

    from rollout.episodes.runner import EpisodeRequest, RunnerConfig, run_episode
    from rollout.farm.core import FarmConfig, make_farm

    with replay_server(["fine \\boxed{1}"] * 8, faults=FaultConfig(latency_s=0.2)) as srv:
        async def run(trace):
            farm = make_farm("test-count", {"max_steps": 2}, FarmConfig(backend="local", num_envs=1))
            await farm.start()
            judge = _judge([srv.url], m=2)
            try:
                return await run_episode(farm, ScriptedPolicy(["inc", "inc"]), judge,
                                         EpisodeRequest("e0", "g", {"id": "t", "target": 2}),
                                         RunnerConfig(run_id="r", trace_requests=trace))
            finally:
                await judge.close()
                await farm.close()

        traced, plain = asyncio.run(run(True)), asyncio.run(run(False))
    for traj in (traced, plain):
        assert traj.status.value == "ok" and len(traj.steps) == 2, traj.reason
        assert set(traj.timing) == {"lease_wait_s", "reset_s", "judge_wait_s"}
        assert traj.summary()["timing"].keys() == traj.timing.keys()
        for s in traj.steps:
            assert s.timing["judge_s"] >= 0.2 and min(s.timing[k] for k in ("policy_s", "env_s", "runner_s")) >= 0
            assert s.to_json(False)["timing"] == s.timing
    for s in traced.steps:
        t = s.timing
        assert t["judge_requests"] == 2 and t["judge_server_s"] >= 2 * 0.2  # two votes, each 0.2 s in the server
        assert t["judge_slot_wait_s"] >= 0 and t["judge_pool_wait_s"] >= 0 and t["judge_read_s"] >= 0
        assert sum(t[f"judge_{p}"] for p in ("slot_wait_s", "pool_wait_s", "connect_s", "send_s", "server_s",
                                             "read_s") if f"judge_{p}" in t) <= 2 * t["judge_s"]  # votes overlap
        assert not any(k.startswith("policy_") and k != "policy_s" for k in t)  # a scripted policy sends nothing
    assert not any(k.startswith("judge_") and k != "judge_s" for s in plain.steps for k in s.timing)
