"""The rollout <-> train loop's schedules on real parts (local farm, tiny LocalPolicy, TorchTrainer): synchronous vs
overlapped, the staleness books, weight-sync failures, trainer failures. No timing thresholds: the assertions are about
versions, counts and the order of events."""

from __future__ import annotations

import pytest
from doubles import FlakyUpdatesPolicy, RecordingTrainer
from loop_support import run_loop

from rollout.policy.latency import SimulatedLatencyPolicy
from rollout.loop import LoopConfig, TrainingFailed
from train.records import TrainSample
from train.staleness import filter_stale
from train.timeline import Timeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


def train_rows(metrics):
    return [m for m in metrics if m["kind"] == "train"]


def check_books(rows, summary, spy: RecordingTrainer, bound: int) -> None:
    """produced = trained + dropped_stale per iteration and in total; every trained sample within the bound."""
    for r in rows:
        assert r["produced"] == r["trained"] + r["dropped_stale"] + r["dropped_future"]
        assert r["dropped_future"] == 0 and r["trained"] == r["samples"]
        if r["trained"]:
            v = r["trainer_version_before"]
            assert v - bound <= r["trained_version_min"] <= r["trained_version_max"] <= v
    assert summary.produced == sum(r["produced"] for r in rows) == summary.trained + summary.dropped_stale
    assert summary.dropped_stale == sum(r["dropped_stale"] for r in rows)
    for version_before, sample_versions in spy.calls:  # what the trainer really received
        assert all(version_before - bound <= v <= version_before for v in sample_versions)
    assert sum(len(vs) for _, vs in spy.calls) == summary.trained


def test_synchronous_mode_is_on_policy(tmp_path):
    summary, metrics, steps, spy = run_loop(tmp_path, max_staleness=0)
    rows = train_rows(metrics)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    check_books(rows, summary, spy, bound=0)
    for k, r in enumerate(rows):
        assert r["rollout_policy_version"] == k and r["staleness_max"] == 0 and r["dropped_stale"] == 0
        assert r["rollout_train_overlap_s"] == 0.0  # nothing is collected while the trainer trains
    # every recorded step of iteration k was produced by weights v_k
    assert {(s["episode_id"].split("-")[0], s["weight_version"]) for s in steps} == {("it0", 0), ("it1", 1), ("it2", 2)}
    assert summary.overlap_s == 0.0 and summary.trained > 0 and spy.version == 3


def test_overlapped_mode_collects_the_next_batch_while_training_and_stays_within_the_bound(tmp_path):
    timeline = Timeline()
    summary, metrics, steps, spy = run_loop(
        tmp_path,
        max_staleness=1,
        iterations=4,
        timeline=timeline,
        policy=lambda p: SimulatedLatencyPolicy(p, per_token_s=0.002, timeline=timeline),
    )
    rows = train_rows(metrics)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    check_books(rows, summary, spy, bound=1)
    # batch k+1 started before batch k was trained: it began with the weights batch k was sampled with (or older)
    assert [r["rollout_policy_version"] for r in rows][:2] == [0, 0]
    assert all(r["rollout_policy_version"] >= r["iteration"] - 1 for r in rows)  # the gate: at most 1 version behind
    # batch 1 was being collected while batch 0 trained (rollout and train lanes overlap, and the policy generated)
    assert rows[0]["rollout_train_overlap_s"] > 0 and summary.overlap_s > 0
    assert timeline.overlap("generate", "train") > 0
    assert max(r["staleness_max"] for r in rows) == 1  # some samples really were one version behind
    # steps of one batch may mix versions (weights synced mid-collection), never older than the gate allows
    for s in steps:
        k = int(s["episode_id"].split("-")[0][2:])
        assert max(0, k - 1) <= s["weight_version"] <= k


def test_samples_from_a_policy_that_missed_an_update_are_dropped_and_counted(tmp_path):
    # the first push of v1 fails: the policy keeps v0, so batch 1 (sampled by v0) is 1 version behind a v1 trainer
    summary, metrics, steps, spy = run_loop(
        tmp_path, max_staleness=0, iterations=3, policy=lambda p: FlakyUpdatesPolicy(p, {1})
    )
    rows = train_rows(metrics)
    check_books(rows, summary, spy, bound=0)
    assert rows[0]["weight_sync"] == "failed" and rows[1]["weight_sync"] == "memory"
    assert rows[1]["rollout_policy_version"] == 0 and rows[1]["produced"] > 0
    assert rows[1]["dropped_stale"] == rows[1]["produced"] and rows[1]["trained"] == 0  # nothing on-policy left
    assert rows[1]["weight_version"] == 1  # no update from an empty batch; v1 is pushed again and lands
    assert rows[2]["rollout_policy_version"] == 1 and rows[2]["dropped_stale"] == 0 and rows[2]["trained"] > 0
    assert summary.dropped_stale == rows[1]["produced"] > 0


def test_repeated_weight_sync_failures_stop_the_run(tmp_path):
    result, metrics, _, _ = run_loop(
        tmp_path, max_staleness=1, iterations=4, max_sync_failures=1, policy=lambda p: FlakyUpdatesPolicy(p, {1, 2})
    )
    assert isinstance(result, TrainingFailed) and result.stage == "weight sync"
    assert "weight sync failed at iteration 1" in str(result)
    assert metrics[-1]["kind"] == "error" and metrics[-1]["stage"] == "weight sync"


@pytest.mark.parametrize("bound", [0, 1])
def test_a_trainer_exception_checkpoints_and_stops_with_everything_collected_on_disk(tmp_path, bound):
    result, metrics, steps, spy = run_loop(
        tmp_path, max_staleness=bound, iterations=4, trainer=lambda t: RecordingTrainer(t, fail_on_call=2)
    )
    assert isinstance(result, TrainingFailed) and result.stage == "trainer" and result.iteration == 1
    assert "injected trainer failure" in str(result) and result.version == 1
    error = metrics[-1]
    assert error["kind"] == "error" and error["iteration"] == 1 and "RuntimeError" in error["error"]
    assert [m["iteration"] for m in train_rows(metrics)] == [0]
    # the failing batch's steps were written before training; with overlap, later batches may be on disk too
    iterations = {s["episode_id"].split("-")[0] for s in steps}
    assert {"it0", "it1"} <= iterations and (bound == 1 or iterations == {"it0", "it1"})
    ckpt = tmp_path / "checkpoints" / "failed-v1"
    assert result.checkpoint == str(ckpt) and (ckpt / "trainer_state.pt").exists()
    from train.backends.torch_backend import TorchTrainer

    restored = TorchTrainer(spy.inner.model.__class__(spy.inner.model.config))
    restored.load_checkpoint(ckpt)  # a complete checkpoint at the version that was trained
    assert restored.version == 1


def test_trajectory_layout_in_the_loop_counts_every_trajectory_once(tmp_path):
    summary, metrics, steps, spy = run_loop(tmp_path, max_staleness=0, iterations=2, sample_layout="trajectory")
    for r in train_rows(metrics):
        assert r["sample_layout"] == "trajectory"
        assert r["layout/trajectory_samples"] + r["layout/fallback_trajectories"] == r["layout/trajectories"] > 0
    # the per-step fallback is exactly the set of trajectories whose recorded prompts do not extend their history
    from collections import defaultdict

    by_ep = defaultdict(list)
    for s in steps:
        by_ep[s["episode_id"]].append(s)
    broken = 0
    scored_eps = 0
    for ep in by_ep.values():
        ep.sort(key=lambda s: s["step_index"])
        scored = [i for i, s in enumerate(ep) if s["advantage"] is not None and s["output_ids"]]
        if not scored:
            continue
        scored_eps += 1
        ep = ep[: scored[-1] + 1]
        for a, b in zip(ep, ep[1:]):
            prev = a["prompt_ids"] + a["output_ids"]
            if b["prompt_ids"][: len(prev)] != prev:
                broken += 1
                break
    rows = train_rows(metrics)
    assert sum(r["layout/fallback_trajectories"] for r in rows) == broken
    assert sum(r["layout/trajectories"] for r in rows) == scored_eps


def test_filter_stale_books():
    def s(v):
        return TrainSample([1, 2], [0, 1], [0.0, 1.0], [0.0, -1.0], weight_version=v)

    kept, rep = filter_stale([s(5), s(4), s(3), s(6), s(5)], trainer_version=5, bound=1)
    assert [x.weight_version for x in kept] == [5, 4, 5]
    assert (rep.produced, rep.trained, rep.dropped_stale, rep.dropped_future) == (5, 3, 1, 1) and rep.balanced
    m = rep.as_metrics()
    assert m["staleness_max"] == 1 and m["trained_version_min"] == 4 and m["trained_version_max"] == 5
    assert filter_stale([s(0)], 3, 3)[1].trained == 1 and filter_stale([s(0)], 3, 2)[1].dropped_stale == 1
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        filter_stale([], 0, -1)
    with pytest.raises(ValueError, match="loop.max_staleness must be >= 0"):
        LoopConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="loop.sample_layout='turns'"):
        LoopConfig(sample_layout="turns")
