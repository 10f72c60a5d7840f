"""The SWE GPU config (configs/experiment/swe_qwen3_32b.yaml: Qwen3-32B, megatron with TP) dry-runs on a CPU machine:
SWE-bench rows and their repos directory, the model directory (Qwen3-32B's real config.json), the placement of its
8 TP ranks and the modelled memory per rank within the H200 it names; on an H100 the same layout is refused."""

import shutil

import pytest

from test_table4_gpu_configs import DATA, dry_run, fake_model_dir, flat

pytestmark = pytest.mark.slow  # the experiment tier: the paper-scale experiment configs, dry-run


@pytest.fixture
def swe_paths(tmp_path):
    models, data = tmp_path / "models", tmp_path / "data"
    fake_model_dir(models / "Qwen3-32B", "qwen3_32b")
    (data / "swe-bench-verified" / "repos").mkdir(parents=True)
    shutil.copy(DATA.parent.parent / "envs" / "swe" / "bundled" / "instances.jsonl",
                data / "swe-bench-verified" / "instances.jsonl")
    return models, data


def test_swe_qwen3_32b_dry_run_fits_its_gpus(swe_paths):
    models, data = swe_paths
    proc = dry_run("swe_qwen3_32b", models, data)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    text = flat(out)
    assert "all checks pass" in out and "arm integrated" in out and "arm outcome_only" in out
    assert "8ranks(tp8xdp1xpp1)asRayactorsinoneplacementgroup,STRICT_PACK:1GPU+1CPUperrank,NCCL" in text
    assert "kvheads8,intermediate25600dividebytp8" in text
    assert text.count("perrank,tp8xdp1xpp1(megatron,attentionfused):92.2GiBmodelled") == 2
    assert "fits126.0GiBusableof140GiB(trainer.gpu_memory_gb" in text
    # H100 80GB: tp8 alone is refused; with the optimizer sharded over dp 2 it fits (the config's comment)
    proc = dry_run("swe_qwen3_32b", models, data, "trainer.gpu_memory_gb=80")
    assert proc.returncode == 2 and "modelledpeak92.2GiBperrankexceeds72.0GiBusable" in flat(proc.stdout + proc.stderr)
    proc = dry_run("swe_qwen3_32b", models, data, "trainer.gpu_memory_gb=80", "trainer.dp_size=2")
    assert proc.returncode == 0 and "69.3GiBmodelled" in flat(proc.stdout + proc.stderr)


def test_swe_qwen3_32b_local_attention_is_refused_with_the_figures(swe_paths):
    models, data = swe_paths
    proc = dry_run("swe_qwen3_32b", models, data, "trainer.attention=local", "trainer.recompute_granularity=none")
    out = flat(proc.stdout + proc.stderr)
    assert proc.returncode == 2 and "PROBLEMSFOUND" in out and "attention_scores" in out
    assert "trainer.attention=fused|te" in out
