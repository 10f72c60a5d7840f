"""DAPO-Math-17k (parquet, slime JSONL) and AIME 2024 (JSONL) loaders on tiny sample files in tests/data."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envs import TaskFileError
from envs.toolcall.datasets import load_aime, load_dapo_math, strip_dapo_instructions
from envs.toolcall.env import ToolCallEnv
from rollout.build import plan_env

DATA = Path(__file__).parent / "data"


def test_dapo_parquet_is_deduplicated_and_unwrapped():
    tasks = load_dapo_math(DATA / "dapo_math_sample.parquet")
    assert [t["id"] for t in tasks] == ["dapo-a1", "dapo-a2", "dapo-a3"]  # 9 rows, 3 problems
    assert tasks[0]["prompt"] == "What is the sum of the first 12 positive odd integers?"
    assert [t["answer"] for t in tasks] == ["144", "54", "24"]
    raw = load_dapo_math(DATA / "dapo_math_sample.parquet", strip_instructions=False)
    assert raw[0]["prompt"].startswith("Solve the following math problem") and "Answer:" in raw[0]["prompt"]
    assert len(load_dapo_math(DATA / "dapo_math_sample.parquet", limit=2)) == 2
    slime = load_dapo_math(DATA / "dapo_math_sample_slime.jsonl")
    assert [t["prompt"] for t in slime] == [t["prompt"] for t in tasks] and slime[2]["answer"] == "24"


def test_aime_jsonl_in_both_shapes():
    tasks = load_aime(DATA / "aime2024_sample.jsonl")
    assert [(t["id"], t["answer"]) for t in tasks] == [("aime2024-2024-I-1", "1"), ("aime2024-2024-I-2", "32")]
    slime = load_aime(DATA / "aime2024_sample_slime.jsonl")
    assert slime == [{"id": "aime2024-0", "prompt": "Compute 2^10 - 1000.", "answer": "24", "source": "aime2024"}]


def test_bad_files_say_what_is_wrong(tmp_path):
    with pytest.raises(TaskFileError, match="does not exist"):
        load_dapo_math(tmp_path / "missing.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_text": "x"}) + "\n")
    with pytest.raises(TaskFileError, match="line 1: an AIME row needs a problem and an answer"):
        load_aime(bad)
    with pytest.raises(TaskFileError, match="needs a user prompt and a ground truth"):
        load_dapo_math(bad)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(TaskFileError, match=".parquet or .jsonl"):
        load_aime(tmp_path / "x.csv")
    assert strip_dapo_instructions("no wrapper here") == "no wrapper here"


def test_the_launcher_reads_them_by_format():
    cfg = OmegaConf.create({
        "name": "toolcall", "tasks": str(DATA / "dapo_math_sample.parquet"), "tasks_format": "dapo_math",
        "eval_tasks": str(DATA / "aime2024_sample.jsonl"), "eval_tasks_format": "aime", "tools": ["python"],
    })
    setup = plan_env(cfg)
    assert "tasks_format" not in setup.kwargs and len(setup.train_tasks) == 3 and setup.eval_tasks[1]["answer"] == "32"
    with pytest.raises(ValueError, match="unknown toolcall task format"):
        ToolCallEnv.load_task_file(DATA / "aime2024_sample.jsonl", "gsm8k")
