"""The GPU config of the mix experiment (experiment=mix_vs_single_qwen3vl_8b: the paper's four families with one
Qwen3-VL-8B policy on SGLang, trained with torch FSDP) loads and validates on a CPU machine with a real tiny
Qwen3-VL model directory: `run.dry_run=true` reads every family's task files through
its loader (DAPO / AIME, a terminal task file, an OSWorld tree, SWE-bench rows), builds each family's env, the
clients and the trainer settings for every arm, and names what is missing."""

import json
import shutil

import pytest

from test_table4_gpu_configs import DATA, dry_run, flat, tiny_vl_model_dir, with_real_vl_shape

pytestmark = pytest.mark.slow  # the experiment tier: the paper-scale experiment configs, dry-run


def mix_paths(tmp_path):
    from envs.terminal.env import TerminalEnv

    models, data = tmp_path / "models", tmp_path / "data"
    tiny_vl_model_dir(models / "Qwen3-VL-8B-Thinking")  # a real (tiny) Qwen3-VL directory
    (data / "dapo-math-17k").mkdir(parents=True)
    shutil.copy(DATA / "dapo_math_sample.parquet", data / "dapo-math-17k" / "dapo-math-17k.parquet")
    (data / "aime-2024").mkdir(parents=True)
    shutil.copy(DATA / "aime2024_sample.jsonl", data / "aime-2024" / "aime-2024.jsonl")
    shutil.copytree(DATA / "osworld_sample", data / "OSWorld" / "evaluation_examples")
    (data / "terminal").mkdir(parents=True)
    for split in ("train", "eval"):
        rows = TerminalEnv.tasks(split)[:4]
        (data / "terminal" / f"{split}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in rows))
    (data / "swe-bench-verified" / "repos").mkdir(parents=True)
    shutil.copy(DATA.parent.parent / "envs" / "swe" / "bundled" / "instances.jsonl",
                data / "swe-bench-verified" / "instances.jsonl")
    return models, data


def test_mix_vs_single_qwen3vl_8b_dry_run_passes_for_every_arm(tmp_path):
    models, data = mix_paths(tmp_path)
    proc = dry_run("mix_vs_single_qwen3vl_8b", models, data)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "all checks pass" in out and "FAILED" not in out
    for arm in ("mix", "single_toolcall", "single_terminal", "single_gui", "single_swe"):
        assert f"arm {arm} " in out
    text = flat(out)
    assert "mixof4:toolcall:" in text and "eachofthe4families'envsconstructedandclosed" in text
    assert "weight32" in text and "weight16" in text and "weight8" in text
    # the paper's settings reach the checks: one VL policy on SGLang, torch FSDP at lr 1e-6, the judge's m=3, 8 samples
    assert "torch: lr 1e-06" in out and "m=3, T=0.6" in out and "64 tasks x 8 samples" in out
    assert "sglangclientfor['http://127.0.0.1:30000']" in text and "Qwen3VLForConditionalGeneration" in text
    assert "4ranks(dp4)asRayactorsinoneplacementgroup,PACK:1GPU+1CPUperrank,NCCL" in text
    assert text.count("perrank,dp4(fsdp,torch,gradientcheckpointing)") == 5  # every arm's memory, tiny: it fits
    assert "32tasksx8samples" in text and "16tasksx8samples" in text  # the single arms' own groups per step
    # each family's farm and staleness bound: desktops and repos on-policy, in their own slots
    assert "gui64slots" in text and "swe64slots(startcap16)" in text
    assert "gui64slots(startcap16),staleness0" in text and "toolcall" in text and "staleness2" in text
    assert "'max_new_tokens':1024" in text and "'max_new_tokens':8192" in text


def test_mix_vs_single_qwen3vl_8b_dry_run_names_missing_paths(tmp_path):
    models, data = mix_paths(tmp_path)
    shutil.rmtree(models / "Qwen3-VL-8B-Thinking")
    (data / "terminal" / "eval.jsonl").unlink()
    proc = dry_run("mix_vs_single_qwen3vl_8b", models, data)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "PROBLEMS FOUND" in out
    assert "models/Qwen3-VL-8B-Thinking" in flat(out) and "terminal/eval.jsonl" in flat(out)


def test_mix_vs_single_qwen3vl_8b_fits_its_h200s_at_the_real_shape(tmp_path):
    """The same dry run with Qwen3-VL-8B's published config.json in the tiny directory: the memory estimate is the
    8B's (77.8 GiB per FSDP rank of 4, 126 usable on an H200), and an H100's 80 GB is refused with the figures."""
    models, data = mix_paths(tmp_path)
    with_real_vl_shape(models / "Qwen3-VL-8B-Thinking")
    proc = dry_run("mix_vs_single_qwen3vl_8b", models, data, "experiment.arms={mix: []}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    text = flat(out)
    assert "perrank,dp4(fsdp,torch,gradientcheckpointing):77.8GiBmodelled" in text
    assert "fits126.0GiBusableof140GiB(trainer.gpu_memory_gb" in text
    proc = dry_run("mix_vs_single_qwen3vl_8b", models, data, "experiment.arms={mix: []}", "trainer.gpu_memory_gb=80")
    assert proc.returncode == 2 and "exceeds72.0GiBusable(80GiBGPU" in flat(proc.stdout + proc.stderr)
