"""Judge observability from step records (rollout/judge_metrics.py): agreement between votes (unanimous fraction,
per family), invalid votes, latency percentiles, tokens, and agreement with the env's verifiable signals."""

import pytest

from prm.judge import Judgement
from rollout.judge_metrics import JudgeTally, verifiable_verdict
from train.records import Step, Trajectory


def _step(i, votes, signals, *, latency=0.0, tokens=(0, 0), cached=False):
    valid = [v for v in votes if v is not None]
    score = sum(valid) / len(valid) if valid else 0.0
    return Step(run_id="r", episode_id="e", group_id="g", task_id="t", step_index=i, action="a",
                next_state={"role": "tool", "content": ""}, signals=signals,
                judge=Judgement(score, votes, [""] * len(votes), latency_s=latency, prompt_tokens=tokens[0],
                                completion_tokens=tokens[1], cached=cached))


def test_verifiable_verdict_follows_the_rule_judges_order():
    assert verifiable_verdict({"parse_error": True, "progress": True}) == ("parse_error", -1)
    assert verifiable_verdict({"error": True}) == ("error", -1)
    assert verifiable_verdict({"progress": True}) == ("progress", 1)
    assert verifiable_verdict({"exit_code": 0}) is None


def test_tally_over_two_families():
    term = Trajectory("r", "e1", "g", "t", family="terminal", steps=[
        _step(0, [1, 1, 1], {"progress": True}, latency=1.0, tokens=(100, 10)),  # unanimous, agrees with the env
        _step(1, [1, -1, None], {"error": True}, latency=3.0, tokens=(100, 10)),  # split, one invalid, score 0
        _step(2, [-1, -1, -1], {"error": True}, cached=True),  # unanimous, agrees, cached
    ])
    gui = Trajectory("r", "e2", "g", "t", family="gui", steps=[
        _step(0, [1, -1, 1], {"exit_code": 0}, latency=2.0, tokens=(50, 5)),  # nothing verifiable
    ])
    unjudged = Trajectory("r", "e3", "g", "t", family="gui", steps=[
        Step("r", "e3", "g", "t", 0, "a", {"role": "tool", "content": ""}, {})])
    m = JudgeTally().add_trajectories([term, gui, unjudged]).as_metrics()
    assert m["judge/steps"] == 4 and m["judge/votes"] == 12
    assert m["judge/invalid_vote_rate"] == pytest.approx(1 / 12)
    assert m["judge/multi_vote_steps"] == 4 and m["judge/unanimous_fraction"] == pytest.approx(2 / 4)
    assert m["judge/terminal/unanimous_fraction"] == pytest.approx(2 / 3) and m["judge/gui/unanimous_fraction"] == 0
    assert m["judge/terminal/invalid_vote_rate"] == pytest.approx(1 / 9) and m["judge/gui/invalid_vote_rate"] == 0
    assert m["judge/cached_steps"] == 1
    assert m["judge/latency_p50_s"] == pytest.approx(2.0) and m["judge/latency_p95_s"] == pytest.approx(2.9)
    assert (m["judge/prompt_tokens"], m["judge/completion_tokens"]) == (250, 25)
    assert m["judge/verifiable_steps"] == 3 and m["judge/verifiable_agreement"] == pytest.approx(2 / 3)
    assert m["judge/agreement/error"] == pytest.approx(1 / 2) and m["judge/agreement/progress"] == 1.0
    assert JudgeTally().as_metrics() == {}
    line = JudgeTally().add_trajectories([term, gui]).brief()
    assert line == "judge unanimous 50% invalid 8% p50 2.00s p95 2.90s tokens 250/25 env-agree 67%"


def test_single_vote_judges_report_no_unanimity():
    tr = Trajectory("r", "e", "g", "t", family="toolcall", steps=[_step(0, [1], {"progress": True})])
    m = JudgeTally().add_trajectories([tr]).as_metrics()
    assert m["judge/unanimous_fraction"] is None and m["judge/verifiable_agreement"] == 1.0
    assert JudgeTally().add_trajectories([tr]).brief() == "judge invalid 0% env-agree 100%"
