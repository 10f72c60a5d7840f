"""NoisyJudge (judge.accuracy < 1): a rule judge whose votes are wrong with a known, seeded probability."""

import asyncio

import pytest

from prm.judge import RuleJudge, StepContext
from prm.noisy import NoisyJudge, corrupt_vote
from prm.factory import make_judge


def ctx(episode: str, step: int, signals: dict) -> StepContext:
    return StepContext("toolcall", "task", "", [], "a", {"role": "tool", "content": "1"}, signals, step_index=step,
                       episode_id=episode)


GOOD, NEUTRAL, BAD = {"progress": True}, {}, {"parse_error": True}


def votes(judge, signals, n=2000):
    return [asyncio.run(judge.score(ctx(f"ep{i}", i % 4, signals))).votes[0] for i in range(n)]


def test_accuracy_one_and_zero():
    assert votes(NoisyJudge(RuleJudge(), 1.0), GOOD, 50) == [1] * 50
    assert votes(NoisyJudge(RuleJudge(), 0.0), GOOD, 50) == [-1] * 50
    assert votes(NoisyJudge(RuleJudge(), 0.0), BAD, 50) == [1] * 50
    assert set(votes(NoisyJudge(RuleJudge(), 0.0), NEUTRAL, 200)) == {1, -1}  # a 0 becomes +1 or -1
    assert corrupt_vote(None, 0.0, "k") == (None, False)
    with pytest.raises(ValueError):
        NoisyJudge(RuleJudge(), 1.5)


def test_eighty_percent_is_eighty_percent_and_reproducible():
    j = NoisyJudge(RuleJudge(), 0.8, seed=3)
    v = votes(j, GOOD)
    assert 0.76 < v.count(1) / len(v) < 0.84 and j.flipped == v.count(-1)
    assert votes(NoisyJudge(RuleJudge(), 0.8, seed=3), GOOD) == v  # same seed, same errors
    assert votes(NoisyJudge(RuleJudge(), 0.8, seed=4), GOOD) != v
    # samples of the same task at the same step get independent errors (the episode id is in the key)
    same_step = [asyncio.run(j.score(ctx(f"e{i}", 0, GOOD))).votes[0] for i in range(400)]
    assert 0.7 < same_step.count(1) / 400 < 0.9
    flipped = asyncio.run(NoisyJudge(RuleJudge(), 0.0).score(ctx("e", 0, GOOD)))
    assert flipped.score == -1 and "noisy judge: vote 1 -> -1" in flipped.raw[0]


def test_the_launcher_builds_it_from_judge_accuracy():
    assert isinstance(make_judge({"type": "rule"}), RuleJudge)
    j = make_judge({"type": "rule", "accuracy": 0.8, "noise_seed": 5})
    assert isinstance(j, NoisyJudge) and j.accuracy == 0.8 and j.seed == 5


def test_exact_on_parse_errors():
    judge = NoisyJudge(RuleJudge(), 0.0, exact_on_parse_errors=True)
    assert votes(judge, BAD, 50) == [-1] * 50  # malformed steps keep their vote
    assert votes(judge, GOOD, 50) == [-1] * 50  # every other vote is still wrong at accuracy 0
