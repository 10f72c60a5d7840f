"""benchmarks/megatron_gpu.py in its reduced CPU form: TP=1 vs TP=2 (two gloo ranks it spawns, and two rank actors of
a Ray placement group as the launcher starts them) and vs HF; every run's export loads as an HF model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_script_passes_in_cpu_form(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "megatron_gpu.py"), "--cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.exists(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    failed = {k: v for k, v in report["checks"].items() if not v["ok"]}
    assert proc.returncode == 0 and report["ok"], failed or proc.stderr[-3000:]
    assert set(report["runs"]) == {"tp1", "tp2", "tp2_group"}
    assert set(report["exports"]) == {"tp1", "tp2", "tp2_group"}
    assert all(e["architectures"] == ["Qwen3ForCausalLM"] for e in report["exports"].values())
    assert report["checks"]["logprobs tp2 Ray group vs tp1 after step"]["ok"]
    assert report["checks"]["tp2 replicated params identical on both ranks after the step"]["value"] == 0.0
    assert report["runs"]["tp1"]["micro_batches"] > 1


@pytest.mark.slow
def test_memory_mode_in_cpu_form_never_under_predicts(tmp_path):
    """`--memory --cpu` at 512 tokens: every case's modelled peak is at or above the profiled one (within 2%) and
    within the script's over-prediction tolerance; the JSON names the model's parts."""
    out = tmp_path / "memory.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "megatron_gpu.py"), "--memory", "--cpu", "--max-len", "512",
         "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
    )
    assert out.exists(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert proc.returncode == 0 and report["ok"], proc.stderr[-3000:]
    assert {(c["attention"], c["recompute"]) for c in report["cases"]} >= {("fused", "none"), ("local", "full")}
    assert all(c["measured_peak_bytes"] > 0 and c["relative_error"] >= -0.02 for c in report["cases"])
    assert set(report["cases"][0]["predicted_gib"]) >= {"weights", "grads", "optimizer", "reference", "activations"}
