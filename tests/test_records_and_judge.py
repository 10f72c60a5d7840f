import asyncio
import json

import pytest

from prm.judge import RuleJudge, StepContext
from prm.voting import aggregate, parse_vote, strip_reasoning
from rollout.records import EpisodeStatus, JsonlWriter, Step, Trajectory, read_jsonl


def test_reasoning_is_stripped_before_the_vote_is_parsed():
    assert parse_vote("<think>\\boxed{1}?</think> so \\boxed{-1}") == -1
    assert parse_vote("reasoning \\boxed{-1} </think>\\boxed{1}") == 1  # the block opened in the prompt
    assert parse_vote("<think>\\boxed{1} and then the answer was cut") is None
    assert parse_vote("<think>\\boxed{1}</think> no box after it") is None
    assert parse_vote("<think>\\boxed{1}</think>", strip_think=False) == 1
    assert strip_reasoning("a</think>b</think>c") == "c" and strip_reasoning("plain \\boxed{1}") == "plain \\boxed{1}"


def test_parse_vote_takes_the_first_boxed_and_rejects_anything_else():
    assert parse_vote("reasoning... \\boxed{1} then \\boxed{-1}") == 1
    assert parse_vote("\\boxed{ -1 }") == -1
    assert parse_vote("\\boxed{+1}") == 1
    for bad in ["no box", "\\boxed{0}", "\\boxed{2}", "\\boxed{yes}", "\\boxed{1.0}", "", None]:
        assert parse_vote(bad) is None, bad
    assert parse_vote("\\boxed{0}", allowed=(1, 0, -1)) == 0


def test_aggregate_mean_and_majority():
    assert aggregate([1, -1, 1]) == pytest.approx(1 / 3)
    assert aggregate([1, None, None]) == 1.0
    assert aggregate([None, None]) == 0.0  # all invalid -> 0
    assert aggregate([1, -1], "majority") == 0.0  # tie -> 0
    assert aggregate([1, 1, -1], "majority") == 1.0
    assert aggregate([None], "majority") == 0.0
    with pytest.raises(ValueError, match="mean.*majority"):
        aggregate([1], "median")


def _ctx(signals):
    return StepContext("generic", "t", "do it", [], "a", {"role": "tool", "content": "x"}, signals)


def test_rule_judge_maps_signals_and_records_votes_like_an_llm_judge():
    j = RuleJudge()
    cases = [({"parse_error": True, "progress": True}, -1), ({"error": True}, -1), ({"progress": True}, 1), ({}, 0)]
    for signals, vote in cases:
        out = asyncio.run(j.score(_ctx(signals)))
        assert out.votes == [vote] and out.score == vote and f"\\boxed{{{vote}}}" in out.raw[0]


def test_episode_status_machine():
    t = Trajectory("r", "e", "g", "t")
    t.move(EpisodeStatus.RUNNING)
    t.move(EpisodeStatus.ABORTED, "worker died")
    assert t.reason == "worker died"
    with pytest.raises(ValueError, match="illegal status change aborted -> ok"):
        t.move(EpisodeStatus.OK)


def test_jsonl_writer_round_trip_and_token_fields(tmp_path):
    path = tmp_path / "x.jsonl"
    s = Step("r", "e", "g", "t", 0, "act", {"role": "tool", "content": "é"}, {"exit_code": 0},
             prompt_ids=[1, 2], output_ids=[3], output_logprobs=[-0.1])
    with JsonlWriter(path) as w:
        w.write(s.to_json())
        w.write(s.to_json(token_ids=True))
        w.flush()
        assert len(path.read_text().splitlines()) == 2
    rows = read_jsonl(path)
    assert "prompt_ids" not in rows[0] and rows[1]["output_ids"] == [3]
    assert rows[0]["next_state"]["content"] == "é" and rows[0]["judge"] is None
    json.dumps(rows)
