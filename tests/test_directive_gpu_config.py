"""The GPU directive-signals config (configs/experiment/directive_toolcall_qwen3_4b.yaml) loads and validates on a CPU
machine: `run.dry_run=true` checks every arm as for the Table 4 GPU configs, with the judge's hint requests (the
toolcall hint template, 8192 new tokens) and the teacher's log-probs on the policy's SGLang servers."""

import shutil

import pytest

from test_table4_gpu_configs import dry_run, flat, toolcall_paths  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # the experiment tier: the paper-scale experiment configs, dry-run


def test_directive_toolcall_qwen3_4b_dry_run_passes(toolcall_paths):  # noqa: F811
    models, data = toolcall_paths
    proc = dry_run("directive_toolcall_qwen3_4b", models, data)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "all checks pass" in out and "FAILED" not in out
    for arm in ("integrated", "outcome_only", "opd", "combined", "gated"):
        assert f"arm {arm}" in out
    text = flat(out)
    # the directive arms: the LLM judge's hints from the toolcall hint template at 8192 new tokens, the teacher on the
    # policy's servers; the paper's settings otherwise (as table4_toolcall_qwen3_4b)
    assert text.count("prm/templates/hints/toolcall.txt,max_new_tokens=8192)") == 3
    assert text.count("rewardopd(teacheronthepolicy)") == 1 and text.count("rewardgated(teacheronthepolicy)") == 1
    assert "rewardintegrated;" in text and "rewardoutcome_only;" in text  # no hints, no teacher for these two
    assert "megatron: lr 1e-06" in out and "m=1, T=0.6" in out and "max_new_tokens=8192" in out


def test_directive_toolcall_qwen3_4b_dry_run_names_missing_paths(toolcall_paths):  # noqa: F811
    models, data = toolcall_paths
    shutil.rmtree(models / "Qwen3-4B-Instruct-2507-ReTool-SFT")
    proc = dry_run("directive_toolcall_qwen3_4b", models, data)
    assert proc.returncode == 2 and "Qwen3-4B-Instruct-2507-ReTool-SFT" in flat(proc.stdout + proc.stderr)
