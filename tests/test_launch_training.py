"""`python -m rollout.launch` as a user runs it, for the training side: trainer=megatron at TP=2 on this CPU (two rank
actors, gloo), the trajectory sample layout with overlapped rollouts, a trainer that fails (exit code, message, what is
left on disk), data-parallel megatron ranks exporting for SGLang-API servers, and a GUI run whose vision-language
policy sees the screenshots."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from test_launch_e2e import REPO, SMALL, check_run_dir

from rollout.records import read_jsonl

pytestmark = pytest.mark.slow  # the experiment tier: whole launches with each trainer


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
def test_trainer_megatron_at_tp2_runs_on_cpu_with_overlapped_rollouts_and_trajectory_samples(tmp_path, warm_cache):
    import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)
    out = tmp_path / "run"
    proc = launch(
        out,
        warm_cache,
        "env=toolcall",
        "trainer=megatron",
        "trainer.tp_size=2",  # two rank actors in a placement group; the tiny vocabulary is padded to split
        "loop.max_staleness=1",
        "loop.sample_layout=trajectory",
        "loop.record_token_ids=true",
    )
    assert proc.returncode == 0, f"launch failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert yaml.safe_load((out / "config.yaml").read_text())["trainer"]["backend"] == "megatron"
    steps = check_run_dir(out)
    rows = train_rows(out)
    for r in rows:
        assert r["produced"] == r["trained"] + r["dropped_stale"]
        assert r["layout/trajectory_samples"] + r["layout/fallback_trajectories"] == r["layout/trajectories"]
        if r["trained"]:  # (a batch whose buckets are all constant has no gradient and no update)
            assert r["train/loss_tokens"] > 0 and r["train/version"] == r["weight_version"]
    assert rows[0]["trained"] > 0 and rows[0]["weight_version"] == 1 and rows[0]["train/ranks"] == 2
    assert rows[-1]["policy_version"] == rows[-1]["weight_version"]  # synced after each update
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


@pytest.mark.integration
def test_sglang_servers_load_megatron_exports_by_version_while_rollouts_overlap(tmp_path):
    """policy=sglang over two dev servers (SGLang's HTTP API over a tiny model), trainer=megatron with two
    data-parallel ranks (each loads policy.model_path), max_staleness=1: each new version is exported by rank 0 as an
    HF directory and loaded by every server through /update_weights_from_disk with its weight_version; the servers then
    compute the exported model's logprobs exactly."""
    import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)
    import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)
    import httpx
    import torch
    from tiny_hf import tiny_model, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    from rollout.server.app import ServerProcess

    tiny_model().save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    out = tmp_path / "run"
    with (
        ServerProcess(["--model", str(tmp_path / "model")]) as a,
        ServerProcess(["--model", str(tmp_path / "model")]) as b,
    ):
        cmd = [sys.executable, "-m", "rollout.launch", f"run.out_dir={out}", "env=toolcall", "env.max_steps=2",
               "policy=sglang", f"policy.urls=[{a.url},{b.url}]", f"policy.model_path={tmp_path / 'model'}",
               "trainer=megatron", "trainer.device=cpu", "trainer.dp_size=2", "trainer.lr=1e-3", "loop.max_staleness=1",
               "loop.iterations=3", "loop.tasks_per_iteration=2", "loop.samples_per_task=3", "loop.eval_tasks=0",
               "sampling.max_new_tokens=8", "reward.constant=zero"]  # every batch trains: a new version each time
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, f"launch failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        rows = train_rows(out)
        last = rows[-1]["weight_version"]
        assert last == 3 and [r["weight_sync"] for r in rows] == ["disk"] * 3
        assert all(r["train/ranks"] == 2 for r in rows)
        assert [httpx.get(f"{s.url}/get_model_info").json()["weight_version"] for s in (a, b)] == [str(last)] * 2
        assert [httpx.get(f"{s.url}/stats").json()["weight_updates"] for s in (a, b)] == [3, 3]
        exported = sorted(p.name for p in (out / "weights").iterdir())
        assert exported == ["v2", "v3"]  # keep_weight_versions=2
        prompt = tiny_tokenizer().encode("What is 2+2?", add_special_tokens=False)
        answer = httpx.post(f"{a.url}/generate", json={"input_ids": prompt, "return_logprob": True,
                                                        "sampling_params": {"max_new_tokens": 6, "temperature": 1.0}},
                            timeout=60).json()
    ids = answer["output_ids"]
    got = torch.tensor([e[0] for e in answer["meta_info"]["output_token_logprobs"]])
    assert answer["meta_info"]["weight_version"] == str(last)

    def logprobs(model):
        seq = torch.tensor([prompt + ids])
        with torch.no_grad():
            lp = model(input_ids=seq).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
        return lp.gather(-1, torch.tensor(ids)[:, None])[:, 0]

    exported_model = AutoModelForCausalLM.from_pretrained(out / "weights" / f"v{last}", dtype=torch.float32).eval()
    assert (logprobs(exported_model) - got).abs().max() < 1e-4  # the server runs the megatron export
    assert (logprobs(tiny_model()) - got).abs().max() > 1e-3  # ... not the initial weights
    steps = read_jsonl(out / "trajectories.jsonl")
    by_iteration = defaultdict(set)
    for s in steps:
        by_iteration[s["episode_id"].split("-")[0]].add(s["weight_version"])
    assert by_iteration["it0"] == {0} and all(max(0, k - 1) <= v <= k for k in range(3) for v in by_iteration[f"it{k}"])


@pytest.mark.integration
def test_a_gui_run_with_the_vision_language_policy_trains_on_screenshots(tmp_path):
    """env=gui policy.vision.enabled=true: the tiny Qwen3-VL sees each observation's screenshot; the training samples
    carry the images, and the trainer's recomputed logprobs are the sampler's (on-policy: max_staleness=0)."""
    for tool in ("Xvfb", "dbus-run-session", "xdotool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: GUI runs need local desktops")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollout.launch", f"run.out_dir={out}", f"policy.warm_start.cache_dir={tmp_path}",
           "env=gui", "policy.vision.enabled=true", "env.max_steps=3", "farm.num_envs=6", "loop.iterations=2",
           "loop.tasks_per_iteration=2", "loop.samples_per_task=3", "loop.eval_tasks=0", "loop.max_staleness=0",
           "sampling.max_new_tokens=16", "policy.tokenizer.digits=runs", "policy.warm_start.max_conversations=12",
           "policy.warm_start.sft.epochs=20", "policy.warm_start.sft.lr=3e-3",
           "reward.constant=zero"]  # every step trains, whatever the rollouts score
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"launch failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    rows = train_rows(out)
    assert len(rows) == 2 and all(r["trained"] > 0 for r in rows)
    for r in rows:
        assert r["train/images"] == r["trained"]  # one screenshot per sample (vision.max_images=1)
        assert r["train/rollout_logprob_diff_max"] < 1e-4  # the trainer saw what the sampler saw
    assert "tiny Qwen3-VL" in proc.stdout
