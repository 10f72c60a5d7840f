"""`python -m rollout.launch` as a user runs it, for the training side: trainer=megatron on this CPU, the trajectory
sample layout with overlapped rollouts, and a trainer that fails (exit code, message, what is left on disk)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from test_launch_e2e import REPO, SMALL, check_run_dir

from rollout.records import read_jsonl


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("warmstart")  # one SFT warm start shared by the runs below


def launch(out: Path, cache: Path, *overrides: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        *(prefix or ["-m", "rollout.launch"]),
        f"run.out_dir={out}",
        f"policy.warm_start.cache_dir={cache}",
        *SMALL,
        *overrides,
    ]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)


def train_rows(out: Path) -> list[dict]:
    return [m for m in read_jsonl(out / "metrics.jsonl") if m["kind"] == "train"]


@pytest.mark.integration
def test_trainer_megatron_runs_on_cpu_with_overlapped_rollouts_and_trajectory_samples(tmp_path, warm_cache):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[megatron]')")
    out = tmp_path / "run"
    proc = launch(
        out,
        warm_cache,
        "env=toolcall",
        "trainer=megatron",
        "loop.max_staleness=1",
        "loop.sample_layout=trajectory",
        "loop.record_token_ids=true",
    )
    assert proc.returncode == 0, f"launch failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert yaml.safe_load((out / "config.yaml").read_text())["trainer"]["backend"] == "megatron"
    steps = check_run_dir(out)
    rows = train_rows(out)
    for r in rows:
        assert r["produced"] == r["trained"] + r["dropped_stale"] and r["trained"] > 0
        assert r["train/loss_tokens"] > 0 and r["train/version"] == r["weight_version"]
        assert r["layout/trajectory_samples"] + r["layout/fallback_trajectories"] == r["layout/trajectories"]
    assert rows[-1]["weight_version"] == 2 and rows[-1]["policy_version"] == 2  # synced after each update
    # the megatron trainer's logprobs of the policy's own samples: what the PPO ratio starts from (on-policy: ~0)
    assert rows[0]["train/rollout_logprob_diff"] < 1e-3
    versions = defaultdict(set)
    for s in steps:
        versions[s["episode_id"].split("-")[0]].add(s["weight_version"])
    assert versions["it0"] == {0} and versions["it1"] <= {0, 1}
    assert "samples trained / produced" in proc.stdout


@pytest.mark.integration
def test_a_failing_trainer_exits_non_zero_with_a_clear_message_and_keeps_what_was_collected(tmp_path, warm_cache):
    out = tmp_path / "run"
    driver = (
        "import sys; from train.backends.torch_backend import TorchTrainer; real = TorchTrainer.train_step\n"
        "def failing(self, batch):\n"
        "    if self.version >= 1: raise RuntimeError('simulated CUDA out of memory')\n"
        "    return real(self, batch)\n"
        "TorchTrainer.train_step = failing\n"
        "from rollout.launch import main; sys.argv[1:] = sys.argv[2:]; main()\n"
    )
    proc = launch(
        out, warm_cache, "env=toolcall", "loop.max_staleness=0", "loop.iterations=3", prefix=["-c", driver, "launch"]
    )
    assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert "training stopped: trainer failed at iteration 1" in proc.stderr
    assert "simulated CUDA out of memory" in proc.stderr and "checkpoint:" in proc.stderr
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[-1]["kind"] == "error" and metrics[-1]["stage"] == "trainer"
    steps = read_jsonl(out / "trajectories.jsonl")
    assert {s["episode_id"].split("-")[0] for s in steps} == {"it0", "it1"}  # the failed batch is on disk too
    episodes = {e["episode_id"] for e in read_jsonl(out / "episodes.jsonl") if e["split"] == "train"}
    assert {s["episode_id"] for s in steps} == episodes
    assert (out / "checkpoints" / "failed-v1" / "trainer_state.pt").exists()
