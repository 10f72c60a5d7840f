"""train/memory_plan.py (a trainer config + the model's config -> one rank's modelled memory) and the dry run's
"trainer memory" check: the estimate is printed per rank, a config that cannot fit is refused (exit status 2, one
message with the per-part figures), the budget is trainer.gpu_memory_gb, else the visible GPU's."""

from __future__ import annotations

import json
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import pytest

from rollout import dry_run
from rollout.build import compose_launch_config, plan_trainer
from train.config import MegatronTrainerConfig, TorchTrainerConfig
from train.memory_model import GIB, ModelShape, rank_memory
from train.memory_plan import plan_memory, trainer_memory, vision_params

REPO = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "data" / "model_configs"


def real_config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_megatron_maps_onto_the_memory_model():
    cfg = MegatronTrainerConfig(bf16=True, tp_size=2, dp_size=4, micro_batch_tokens=16384, max_sample_tokens=16384,
                                attention="fused", recompute_granularity="selective", use_distributed_optimizer=True)
    memory, layout = trainer_memory("megatron", cfg, real_config("qwen3_4b"))
    expected = rank_memory(ModelShape.from_hf_config(real_config("qwen3_4b")), tp=2, dp=4, micro_batch_tokens=16384,
                           max_sample_tokens=16384, attention="fused", recompute="selective",
                           distributed_optimizer=True, reference_model=True, param_dtype="bf16")
    assert memory == expected and layout.startswith("tp2 x dp4 x pp1")
    # te keeps what fused keeps; local adds the s x s terms; no reference without the KL term
    te, _ = trainer_memory("megatron", MegatronTrainerConfig(**{**cfg.__dict__, "attention": "te"}), real_config("qwen3_4b"))
    assert te.total == memory.total
    no_kl, _ = trainer_memory("megatron", MegatronTrainerConfig(**{**cfg.__dict__, "kl_coef": 0.0}),
                              real_config("qwen3_4b"))
    assert no_kl.reference == 0 and memory.reference > 0


def test_torch_fsdp_shards_the_static_state_and_checkpointing_drops_activations():
    vl = real_config("qwen3_vl_8b")
    ddp, _ = trainer_memory("torch", TorchTrainerConfig(bf16=True, max_sample_tokens=8192), vl)
    fsdp, layout = trainer_memory("torch", TorchTrainerConfig(bf16=True, dp_size=4, dp_mode="fsdp",
                                                             max_sample_tokens=8192), vl)
    ckpt, _ = trainer_memory("torch", TorchTrainerConfig(bf16=True, dp_size=4, dp_mode="fsdp", max_sample_tokens=8192,
                                                        gradient_checkpointing=True), vl)
    params = ModelShape.from_hf_config(vl).params + vision_params(vl)
    assert 8.0e9 < params < 9.2e9  # Qwen3-VL-8B: ~8.8B parameters with its vision tower
    assert ddp.weights == 4 * params and ddp.optimizer == 8 * params and ddp.reference == 4 * params
    assert fsdp.weights == 4 * params // 4 and fsdp.static < ddp.static / 3.9
    assert ckpt.activations < fsdp.activations / 5 and "fsdp" in layout


def test_budget_comes_from_the_config_else_the_visible_gpu_else_none():
    cfg = MegatronTrainerConfig(model_config=None)
    shape = real_config("qwen3_4b")
    assert plan_memory("megatron", cfg, shape).gpu_source == "none" and plan_memory("megatron", cfg, shape).fits
    seen = plan_memory("megatron", cfg, shape, visible_gpu_gb=0.5)
    assert seen.gpu_source == "the visible GPU" and seen.gpu_memory_gb == 0.5 and not seen.fits
    stated = plan_memory("megatron", MegatronTrainerConfig(gpu_memory_gb=141), shape, visible_gpu_gb=0.5)
    assert stated.gpu_source == "trainer.gpu_memory_gb" and stated.gpu_memory_gb == 141
    with pytest.raises(ValueError, match="gpu_memory_gb must be > 0"):
        MegatronTrainerConfig(gpu_memory_gb=0)


@pytest.mark.parametrize("backend", ["megatron", "torch"])
def test_the_dry_run_prints_the_estimate_and_refuses_what_does_not_fit(backend, monkeypatch):
    monkeypatch.setattr(dry_run, "visible_gpu_gib", lambda: None)
    checks = {c.name: c for c in dry_run.check_config(compose_launch_config(
        [f"trainer={backend}", "trainer.gpu_memory_gb=80"]))}
    ok = checks["trainer memory"]
    assert ok.ok and "per rank" in ok.detail and "fits 72.0 GiB usable of 80 GiB (trainer.gpu_memory_gb" in ok.detail
    for part in ("weights", "grads", "optimizer", "reference", "activations"):
        assert part in ok.detail
    bad = {c.name: c for c in dry_run.check_config(compose_launch_config(
        [f"trainer={backend}", "trainer.gpu_memory_gb=0.01"]))}["trainer memory"]
    assert not bad.ok and "exceeds 0.0 GiB usable (0.01 GiB GPU, 10% headroom)" in bad.detail
    assert "total" in bad.detail and "attention_scores" in bad.detail and f"trainer={backend}:" in bad.detail


def test_a_server_policy_without_a_model_shape_is_named():
    from train.memory_plan import model_shape

    with pytest.raises(ValueError, match="config.json has no 'num_attention_heads'.*policy.model_path"):
        model_shape({"architectures": ["Qwen3ForCausalLM"]})


def test_a_refused_config_exits_non_zero_with_the_figures(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rollout.launch", "run.dry_run=true", "trainer=megatron",
                           "trainer.gpu_memory_gb=1", f"run.out_dir={tmp_path / 'dry-run'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "COLUMNS": "250",
                               "CUDA_VISIBLE_DEVICES": ""})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "trainer memory" in out and "MemoryError" in out and "modelled peak 1.7 GiB per rank exceeds 0.9 GiB" in out
    assert GIB == 1024**3


def experiment_trainer(experiment: str):
    """The trainer plan of `experiment=<experiment>` as the launcher composes it."""
    cfg = compose_launch_config([f"experiment={experiment}"])
    return plan_trainer(cfg.trainer, cfg.sampling.temperature)


# docs/training/trainers.md's table "What the GPU configs need": each config's per-rank figure and what it would be
# without its memory options (or on another GPU's layout), from its composed trainer config and the model's published
# config.json, with only the named options changed
_LOCAL = {"tp_size": 1, "dp_size": 4, "attention": "local", "recompute_granularity": "none",
          "use_distributed_optimizer": False}
DOCUMENTED_MEMORY = [
    ("table4_toolcall_qwen3_4b", "qwen3_4b", {}, 45.0),
    ("directive_toolcall_qwen3_4b", "qwen3_4b", {}, 45.0),
    ("table4_toolcall_qwen3_4b", "qwen3_4b", _LOCAL, 2037.7),  # tp 1 x dp 4, local attention, no memory option
    ("table4_toolcall_qwen3_4b", "qwen3_4b", {**_LOCAL, "attention": "fused"}, 195.3),  # fused attention alone
    ("table4_toolcall_qwen3_4b", "qwen3_4b", {"tp_size": 1, "dp_size": 4}, 75.0),  # every option, at tp 1 x dp 4
    ("table4_gui_qwen3vl_8b", "qwen3_vl_8b", {}, 77.8),
    ("mix_vs_single_qwen3vl_8b", "qwen3_vl_8b", {}, 77.8),
    ("table4_gui_qwen3vl_8b", "qwen3_vl_8b", {"gradient_checkpointing": False}, 183.0),
    ("table4_gui_qwen3vl_8b", "qwen3_vl_8b", {"dp_size": 8}, 57.4),  # on H100 80GB
    ("swe_qwen3_32b", "qwen3_32b", {}, 92.2),
    ("swe_qwen3_32b", "qwen3_32b", {"dp_size": 2}, 69.3),  # on H100 80GB
]


@pytest.mark.parametrize(("experiment", "model", "changed", "gib"), DOCUMENTED_MEMORY,
                         ids=[f"{e}-{'-'.join(f'{k}={v}' for k, v in c.items()) or 'as-configured'}"
                              for e, _, c, _ in DOCUMENTED_MEMORY])
def test_the_documented_per_rank_figures(experiment, model, changed, gib):
    plan = experiment_trainer(experiment)
    memory, _ = trainer_memory(plan.backend, replace(plan.config, **changed), real_config(model))
    assert round(memory.total / GIB, 1) == gib


def test_the_documented_logits_share():
    """'the fp32 logits over 151,936 vocabulary columns are 28 GiB of it' (Qwen3-4B, tp 1 x dp 4, one 16k sample)."""
    plan = experiment_trainer("table4_toolcall_qwen3_4b")
    memory, _ = trainer_memory("megatron", replace(plan.config, tp_size=1, dp_size=4), real_config("qwen3_4b"))
    assert real_config("qwen3_4b")["vocab_size"] == 151936 and round(memory.logits / GIB) == 28
