"""Weight sync (memory / disk) into a real LocalPolicy, version pruning, the timeline's interval math, and the
simulated-latency policy wrapper."""

from __future__ import annotations

import asyncio

import pytest
import torch
from doubles import ScriptedPolicy
from loop_support import tiny_policy_and_model

from rollout.policy.base import SamplingParams
from rollout.policy.latency import SimulatedLatencyPolicy
from train.backends.torch_backend import TorchTrainer
from train.config import TorchTrainerConfig
from train.records import TrainSample
from train.timeline import Timeline, intersection, merge, total
from rollout.weight_sync import WeightSync, WeightSyncConfig, prune_versions, resolve_mode

GREEDY = SamplingParams(greedy=True, max_new_tokens=8)
MESSAGES = [{"role": "user", "content": "What is 3+4?"}]


def batch() -> list[TrainSample]:
    return [TrainSample([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], [0, 0, 1.0, 1.0, 1.0], [0, 0, -5.0, -5.0, -5.0])]


def same_weights(policy, trainer) -> bool:
    ps = policy.model.state_dict()
    return all(torch.equal(v, ps[k]) for k, v in trainer.state_dict().items())


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_the_policy_serves_the_trainers_new_weights_with_their_version(tmp_path, mode):
    policy, model, tok = tiny_policy_and_model(seed=2)
    trainer = TorchTrainer(model, TorchTrainerConfig(lr=1e-2, kl_coef=0.0), tok)
    sync = WeightSync(policy, trainer, WeightSyncConfig(mode, str(tmp_path / "weights"), keep_versions=2))

    async def main():
        before = await policy.generate(MESSAGES, GREEDY)
        results = []
        for _ in range(3):
            trainer.train_step(batch())
            results.append(await sync.push())
        after = await policy.generate(MESSAGES, GREEDY)
        await policy.close()
        return before, results, after

    before, results, after = asyncio.run(main())
    assert [r.version for r in results] == [1, 2, 3] and {r.mode for r in results} == {mode}
    assert before.weight_version == 0 and after.weight_version == 3 == policy.weight_version
    assert same_weights(policy, trainer)
    if mode == "disk":
        assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]  # older exports pruned
        assert results[-1].path == str(tmp_path / "weights" / "v3") and (tmp_path / "weights/v3/config.json").exists()
    else:
        assert not (tmp_path / "weights").exists() and results[-1].path is None


def test_mode_resolution_and_configuration_errors(tmp_path):
    policy, model, _ = tiny_policy_and_model()
    assert resolve_mode(policy, "auto") == "memory"  # LocalPolicy is in process
    assert resolve_mode(ScriptedPolicy(), "auto") == "disk" and resolve_mode(policy, "disk") == "disk"
    assert resolve_mode(SimulatedLatencyPolicy(policy), "auto") == "memory"  # the wrapper keeps the inner's kind
    with pytest.raises(ValueError, match="weight_sync='rdma'"):
        WeightSyncConfig("rdma")
    with pytest.raises(ValueError, match="needs a weights_dir"):
        WeightSync(ScriptedPolicy(), TorchTrainer(model), WeightSyncConfig("disk"))
    for name in ("v1", "v10", "v2", "v9", "latest", "v3x"):
        (tmp_path / name).mkdir()
    gone = prune_versions(tmp_path, keep=2)
    assert sorted(p.name for p in gone) == ["v1", "v2"]  # numeric order, not lexicographic; other names untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "v10", "v3x", "v9"]


def test_interval_math():
    assert merge([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert total([(0, 1), (0.5, 2), (3, 4)]) == 3
    assert intersection([(0, 2), (3, 6)], [(1, 4), (5, 7)]) == [(1, 2), (3, 4), (5, 6)]
    assert intersection([(0, 1)], [(1, 2)]) == []


def test_timeline_lanes_count_concurrent_spans_once():
    now = [0.0]
    tl = Timeline(clock=lambda: now[0])
    tl.begin("generate")  # two requests in flight from t=0..3 and t=1..5: busy 0..5
    now[0] = 1.0
    tl.begin("generate")
    now[0] = 2.0
    with tl.span("train"):
        now[0] = 3.0
        tl.end("generate")
        now[0] = 4.0
    now[0] = 5.0
    tl.end("generate")
    assert tl.busy("generate") == 5.0 and tl.busy("train") == 2.0
    assert tl.overlap("generate", "train") == 2.0 and tl.overlap("generate", "train", since=3.0) == 1.0
    tl.begin("train")  # still open: counted up to now
    now[0] = 7.0
    assert tl.busy("train") == 4.0
    with pytest.raises(RuntimeError, match="ended more often than it began"):
        tl.end("other")


def test_simulated_latency_policy_holds_each_answer_back_and_records_it():
    policy, _, _ = tiny_policy_and_model()
    tl = Timeline()
    slow = SimulatedLatencyPolicy(policy, per_token_s=0.01, per_request_s=0.02, timeline=tl)

    async def main():
        outs = await asyncio.gather(*(slow.generate(MESSAGES, GREEDY, session=f"e{i}") for i in range(3)))
        slow.end_session("e0")
        await slow.close()
        return outs

    outs = asyncio.run(main())
    assert all(o.weight_version == 0 and len(o.output_ids) == 8 for o in outs)
    assert tl.busy("generate") >= 0.02 + 0.01 * 8  # the sleep is part of the generate lane
    assert len(tl.intervals["generate"]) == 1  # the three requests overlapped: one busy interval
    with pytest.raises(ValueError, match="must be >= 0"):
        SimulatedLatencyPolicy(policy, per_token_s=-1)
