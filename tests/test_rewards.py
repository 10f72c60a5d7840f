"""The reward math pinned to worked examples (docs/architecture.md, "The reward math")."""

import math

import pytest

from envs.toolcall.parsing import parse_action
from prm.judge import Judgement
from train.batch import RewardConfig, score_trajectories
from train.records import EpisodeStatus, Step, Trajectory
from train.rewards import (
    broadcast_outcome_advantages,
    grpo_outcome_advantages,
    integrate,
    never_reinforce,
    step_index_normalize,
    step_index_normalize_with_stats,
)

EPS = 1e-6


def test_integrate_adds_outcome_to_each_step_score():
    assert integrate(1.0, [0.5, -1.0, 0.0]) == [1.5, 0.0, 1.0]
    assert integrate(-1.0, [1.0], coef=0.5) == [-0.5]
    assert integrate(1.0, []) == []


def test_population_sigma_not_sample_sigma():
    # bucket {1, 3}: mu = 2, population sigma = 1 (the sample sigma would be sqrt(2))
    out = step_index_normalize({"g": [[1.0], [3.0]]})
    assert out["g"][0][0] == pytest.approx(-1 / (1 + EPS), abs=1e-12)
    assert out["g"][1][0] == pytest.approx(1 / (1 + EPS), abs=1e-12)


def test_three_member_bucket_by_hand():
    # {0, 1, 2}: mu = 1, var = (1 + 0 + 1) / 3 = 2/3
    out = step_index_normalize({"g": [[0.0], [1.0], [2.0]]})["g"]
    s = math.sqrt(2 / 3)
    assert [row[0] for row in out] == pytest.approx([-1 / (s + EPS), 0.0, 1 / (s + EPS)], abs=1e-12)


def test_singleton_bucket_keeps_raw_reward_by_default():
    # trajectory 0 has 2 steps, trajectory 1 has 1: the step-1 bucket has one member
    out = step_index_normalize({"g": [[1.0, 0.7], [0.0]]})["g"]
    assert out[0][1] == 0.7
    assert step_index_normalize({"g": [[1.0, 0.7], [0.0]]}, singleton="zero")["g"][0][1] == 0.0
    assert step_index_normalize({"g": [[1.0, 0.7], [0.0]]}, singleton="drop")["g"][0][1] is None


def test_constant_bucket_is_dropped_by_default():
    out, stats = step_index_normalize_with_stats({"g": [[2.0, 1.0], [2.0, 3.0]]})
    assert out["g"][0][0] is None and out["g"][1][0] is None  # step 0: both 2.0
    assert out["g"][0][1] == pytest.approx(-1 / (1 + EPS))
    assert stats.constant == 1 and stats.dropped_steps == 2 and stats.total_steps == 4
    zero = step_index_normalize({"g": [[2.0], [2.0]]}, constant="zero")
    assert zero["g"] == [[0.0], [0.0]]


def test_trajectory_with_no_step_left_is_fully_masked():
    out = step_index_normalize({"g": [[1.0], [1.0]]})
    assert all(a is None for row in out["g"] for a in row)


def test_outcome_added_before_normalization_changes_the_result():
    # the same step scores with different outcomes: adding o first makes step 0 differ across trajectories
    scores = [[1.0, 1.0], [1.0, -1.0]]
    outcomes = [1.0, -1.0]
    r = [integrate(o, s) for o, s in zip(outcomes, scores)]  # [[2, 2], [0, -2]]
    out = step_index_normalize({"g": r})["g"]
    # step 0: {2, 0}: mu 1, sigma 1; step 1: {2, -2}: mu 0, sigma 2
    assert out[0] == pytest.approx([1 / (1 + EPS), 2 / (2 + EPS)])
    assert out[1] == pytest.approx([-1 / (1 + EPS), -2 / (2 + EPS)])
    # normalizing the step scores alone would drop step 0 (constant) instead
    assert step_index_normalize({"g": scores})["g"][0][0] is None


def test_groups_are_independent():
    out = step_index_normalize({"a": [[0.0], [2.0]], "b": [[10.0], [10.0]]})
    assert out["a"][0][0] == pytest.approx(-1 / (1 + EPS))
    assert out["b"] == [[None], [None]]


def test_options_are_validated():
    with pytest.raises(ValueError, match="singleton"):
        step_index_normalize({"g": [[1.0]]}, singleton="bogus")
    with pytest.raises(ValueError, match="constant"):
        step_index_normalize({"g": [[1.0]]}, constant="bogus")
    with pytest.raises(ValueError, match="non-finite"):
        step_index_normalize({"g": [[float("nan")], [1.0]]})


def test_grpo_outcome_baseline():
    out = grpo_outcome_advantages({"g": [1.0, -1.0, 1.0, -1.0], "c": [1.0, 1.0], "one": [1.0]})
    assert out["g"] == pytest.approx([1 / (1 + EPS), -1 / (1 + EPS)] * 2)
    assert out["c"] == [None, None] and out["one"] == [None]
    assert grpo_outcome_advantages({"c": [0.0, 0.0]}, constant="zero")["c"] == [0.0, 0.0]
    b = broadcast_outcome_advantages({"g": [0.5, None]}, {"g": [3, 1]})
    assert b == {"g": [[0.5, 0.5, 0.5], [None]]}


def test_never_reinforce_caps_only_the_marked_steps():
    assert never_reinforce([1.5, -0.5, None, 2.0], [True, True, True, False]) == [0.0, -0.5, None, 2.0]


def one_step_group(outcomes_and_finish: list[tuple[float, float, str]]) -> list[Trajectory]:
    """A group of one-step episodes: (outcome, judge score, finish_reason) each."""
    trajs = []
    for i, (outcome, score, finish) in enumerate(outcomes_and_finish):
        step = Step("r", f"e{i}", "g", "t", 0, "a", {}, {}, status="ok", judge=Judgement(score, [], []),
                    outcome=outcome, finish_reason=finish)
        trajs.append(Trajectory("r", f"e{i}", "g", "t", EpisodeStatus.OK, [step], outcome=outcome))
    return trajs


def test_a_runaway_output_is_judged_by_its_prefix():
    # why the rule is needed: an output cut off at the token limit still parses when its prefix is a whole answer
    parsed = parse_action("\\boxed{12} the answer is 12 the answer is 12 the answ", {})
    assert parsed.kind == "answer" and parsed.answer == "12"


@pytest.mark.parametrize("mode", ["integrated", "outcome_only"])
def test_truncated_fail_never_reinforces_an_output_cut_off_at_the_token_limit(mode):
    # a group: a right answer that ran on to max_new_tokens, a right answer that stopped, a wrong answer
    group = [(1.0, 1.0, "length"), (1.0, 1.0, "stop"), (-1.0, -1.0, "stop")]
    as_judged = score_trajectories(one_step_group(group), RewardConfig(mode=mode))
    assert as_judged.advantages[0][0] > 0  # the reference: the runaway output is pushed up like the clean one
    rule = score_trajectories(one_step_group(group), RewardConfig(mode=mode, truncated="fail"))
    assert rule.advantages[0][0] <= 0 < rule.advantages[1][0]
    if mode == "integrated":  # its step score is the worst vote, whatever the judge said
        assert rule.rewards[0][0] == integrate(1.0, [-1.0], 1.0)[0]
    with pytest.raises(ValueError, match="reward.truncated"):
        RewardConfig(truncated="drop")
