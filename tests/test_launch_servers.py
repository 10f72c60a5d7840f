"""`python -m rollout.launch` with HTTP servers on loopback: judge=llm (m votes recorded per step), loop.eval_judge,
policy=openai; the servers are real processes (a tiny real model, and recorded judge answers)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)

from tiny_hf import tiny_model, tiny_tokenizer

from rollout.server.app import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("servers")
    tiny_model().save_pretrained(d / "model")
    tiny_tokenizer().save_pretrained(d / "model")
    # recorded answers in turn, one without a verdict (an invalid vote)
    (d / "votes.json").write_text(json.dumps(["Progress. \\boxed{1}", "No progress. \\boxed{-1}", "\\boxed{1}",
                                              "I cannot tell."]))
    with (
        ServerProcess(["--model", str(d / "model")], log_path=str(d / "policy.log")) as policy,
        ServerProcess(["--replay", str(d / "votes.json")], log_path=str(d / "judge.log")) as judge,
    ):
        yield policy.url, judge.url


def _launch(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The launcher with small defaults; `overrides` replace them key by key (Hydra keeps the first of duplicates)."""
    defaults = {
        "env": "toolcall",
        "run.name": "t",
        "loop.iterations": "0",
        "loop.eval_tasks": "2",
        "sampling.max_new_tokens": "8",
        "env.max_steps": "2",
    }
    given = dict(o.split("=", 1) for o in overrides)
    args = [f"{k}={v}" for k, v in {**defaults, **given}.items()]
    cmd = [sys.executable, "-m", "rollout.launch", f"run.out_dir={out}", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_judge_observability(steps: list[dict], metrics: list[dict], progress: str) -> None:
    """The eval row's judge/* keys are those of its step records, counted here from the records themselves, and the
    progress line shows them."""
    row = next(m for m in metrics if m["kind"] == "eval")
    votes = [v for s in steps for v in s["judge"]["votes"]]
    assert row["judge/steps"] == len(steps) and row["judge/votes"] == len(votes)
    assert votes.count(None) > 0  # every 4th recorded answer has no verdict
    assert row["judge/invalid_vote_rate"] == pytest.approx(votes.count(None) / len(votes))
    multi = [s["judge"]["votes"] for s in steps if sum(v is not None for v in s["judge"]["votes"]) >= 2]
    unanimous = sum(len({v for v in vs if v is not None}) == 1 for vs in multi)
    assert row["judge/multi_vote_steps"] == len(multi)
    assert row["judge/unanimous_fraction"] == (pytest.approx(unanimous / len(multi)) if multi else None)
    assert row["judge/toolcall/unanimous_fraction"] == row["judge/unanimous_fraction"]
    latencies = [s["judge"]["latency_s"] for s in steps if not s["judge"]["cached"]]
    assert row["judge/latency_p50_s"] == pytest.approx(float(np.percentile(latencies, 50)))
    assert row["judge/latency_p95_s"] == pytest.approx(float(np.percentile(latencies, 95)))
    assert row["judge/prompt_tokens"] == sum(s["judge"]["prompt_tokens"] for s in steps) > 0
    assert row["judge/completion_tokens"] == sum(s["judge"]["completion_tokens"] for s in steps) > 0
    # the env's verifiable signals (a parse error or failed tool call: -1, a correct step: +1) against the judge
    settled = [(-1 if s["signals"].get("parse_error") or s["signals"].get("error") or s["signals"].get("wrong")
                else 1, s["judge"]["score"]) for s in steps
               if any(s["signals"].get(k) for k in ("parse_error", "error", "wrong", "progress"))]
    assert row["judge/verifiable_steps"] == len(settled)
    expected = sum(sign * score > 0 for sign, score in settled) / len(settled) if settled else None
    assert row["judge/verifiable_agreement"] == (pytest.approx(expected) if settled else None)
    line = " ".join(progress.split())  # rich wraps long lines
    assert f"invalid {row['judge/invalid_vote_rate']:.0%}" in line and "tokens " in line and "| judge " in line


def test_llm_judge_records_every_vote_when_asked_to_judge_evaluation(servers, tmp_path):
    policy_url, judge_url = servers
    r = _launch(
        tmp_path / "run",
        "policy=openai",
        f"policy.url={policy_url}/v1",
        "judge=llm",
        f"judge.url={judge_url}/v1",
        "judge.m=3",
        "loop.eval_judge=true",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    steps = _rows(tmp_path / "run" / "eval_trajectories.jsonl")
    assert len(steps) == 4  # 2 tasks x 2 steps
    for s in steps:
        j = s["judge"]
        assert len(j["votes"]) == len(j["raw"]) == 3 and set(j["votes"]) <= {1, -1, None}
        valid = [v for v in j["votes"] if v is not None]
        assert j["score"] == pytest.approx(sum(valid) / len(valid) if valid else 0.0)
        assert all(("\\boxed{" in raw) == (v is not None) for raw, v in zip(j["raw"], j["votes"]))
        if not j["cached"]:  # what this verdict cost, from the judge server's answers
            assert j["latency_s"] > 0 and j["prompt_tokens"] > 0 and j["completion_tokens"] > 0
        assert s["prompt_tokens"] > 0 and s["output_tokens"] > 0  # exact ids came back from the server
    check_judge_observability(steps, _rows(tmp_path / "run" / "metrics.jsonl"), r.stderr)
    cfg = (tmp_path / "run" / "config.yaml").read_text()
    assert "type: llm" in cfg and "eval_judge: true" in cfg


def test_evaluation_is_not_judged_unless_asked(servers, tmp_path):
    policy_url, judge_url = servers
    r = _launch(
        tmp_path / "run", "policy=openai", f"policy.url={policy_url}/v1", "judge=ensemble", f"judge.url={judge_url}/v1"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    steps = _rows(tmp_path / "run" / "eval_trajectories.jsonl")
    assert steps and all(s["judge"] is None for s in steps)


def test_llm_judge_without_a_url_fails_with_a_clear_message(tmp_path):
    r = _launch(tmp_path / "run", "judge=llm", "policy=openai", "policy.url=http://127.0.0.1:9/v1")
    assert r.returncode != 0 and "judge.url" in r.stderr


@pytest.mark.parametrize("runners", [1, 2])
def test_sglang_policy_trains_and_syncs_weights_to_every_server(tmp_path, runners):
    """policy=sglang over two servers: exact ids across turns, a torch trainer on policy.model_path, and new weights
    loaded by both servers through /update_weights_from_disk after each iteration; with loop.runners=2 the episodes
    run in two Ray runner actors, with the same records and weight-version books."""
    import httpx

    tiny_model().save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    # period 3, not 2: two runners' requests can arrive strictly interleaved, and then a period-2 list gives one
    # task every +1 and the other every -1 (no bucket with a gradient: it happened in CI)
    (tmp_path / "votes.json").write_text(json.dumps(["\\boxed{1}", "\\boxed{1}", "\\boxed{-1}"]))
    with (
        ServerProcess(["--model", str(tmp_path / "model")]) as a,
        ServerProcess(["--model", str(tmp_path / "model")]) as b,
        ServerProcess(["--replay", str(tmp_path / "votes.json")]) as judge,
    ):
        r = _launch(
            tmp_path / "run",
            "policy=sglang",
            f"policy.urls=[{a.url},{b.url}]",
            f"policy.model_path={tmp_path / 'model'}",
            "judge=llm",
            f"judge.url={judge.url}/v1",
            "loop.iterations=2",
            "loop.tasks_per_iteration=2",
            # 4 samples per task: a (task, step) bucket whose judge votes all agree has no gradient; with replayed votes
            # in arrival order, 4 buckets of 4 all agreeing (so iteration 0 makes no update) has odds ~1/4096
            "loop.samples_per_task=4",
            "loop.eval_tasks=0",
            "loop.record_token_ids=true",
            "loop.max_staleness=0",  # on-policy: iteration k is sampled by the weights of update k
            f"loop.runners={runners}",
        )
        assert r.returncode == 0, r.stderr[-3000:]
        infos = [httpx.get(f"{s.url}/get_model_info").json() for s in (a, b)]
        served = [httpx.get(f"{s.url}/stats").json() for s in (a, b)]
    trained = [m for m in _rows(tmp_path / "run" / "metrics.jsonl") if m["kind"] == "train"]
    assert trained[0]["weight_version"] == 1  # the first iteration trained (later ones may have no gradient)
    assert [i["weight_version"] for i in infos] == [str(trained[-1]["weight_version"])] * 2
    # one update per new version (an iteration without a gradient has nothing new to send)
    n_updates = trained[-1]["weight_version"]
    assert [s["weight_updates"] for s in served] == [n_updates] * 2 and all(s["requests:/generate"] > 0 for s in served)
    steps = _rows(tmp_path / "run" / "trajectories.jsonl")
    versions = {(s["episode_id"].split("-")[0], s["weight_version"]) for s in steps}
    assert versions == {("it0", 0), ("it1", 1)}  # iteration 2 was sampled by the weights iteration 1 trained
    by_episode: dict[str, list[dict]] = {}
    for s in steps:
        by_episode.setdefault(s["episode_id"], []).append(s)
        votes = s["judge"]["votes"]
        assert len(s["output_ids"]) == len(s["output_logprobs"]) > 0 and votes and set(votes) <= {1, -1}
    pairs = 0
    for turns in by_episode.values():
        turns.sort(key=lambda s: s["step_index"])
        for prev, nxt in zip(turns, turns[1:]):
            n = len(prev["prompt_ids"]) + len(prev["output_ids"])
            assert nxt["prompt_ids"][:n] == prev["prompt_ids"] + prev["output_ids"]  # never re-tokenized
            pairs += 1
    assert pairs > 0
    episodes = _rows(tmp_path / "run" / "episodes.jsonl")
    assert len(episodes) == 2 * 2 * 4 and all(e["status"] == "ok" for e in episodes)  # iterations x tasks x samples
    assert {e["episode_id"] for e in episodes} == set(by_episode)
    assert all(m["produced"] == m["trained"] + m["dropped_stale"] + m["dropped_future"] for m in trained)
    assert all(m["farm/env_slots"] == 32 for m in trained)  # the runners' farms add up to farm.num_envs
