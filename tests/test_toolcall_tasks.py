"""The bundled tool-call task set and task-file loading (DAPO / AIME style)."""

import json

import pytest

from envs import TaskFileError, load_tasks
from envs.toolcall.env import ToolCallEnv
from envs.toolcall.tasks import MAX_PROMPT_CHARS, bundled_tasks, generate_tasks, validate_task


def test_generation_is_deterministic_and_seed_dependent():
    a, b = generate_tasks(seed=11, n_train=50, n_eval=10), generate_tasks(seed=11, n_train=50, n_eval=10)
    assert a == b
    assert generate_tasks(seed=12, n_train=50, n_eval=10) != a
    assert bundled_tasks("train") == bundled_tasks("train")


def test_counts_ids_and_disjoint_splits():
    train, evals = bundled_tasks("train"), bundled_tasks("eval")
    assert len(train) >= 1000 and len(evals) >= 200
    ids = [t["id"] for t in train + evals]
    assert len(set(ids)) == len(ids)
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in evals}
    assert len({t["prompt"] for t in train}) == len(train)
    with pytest.raises(ValueError, match="unknown split"):
        bundled_tasks("test")


def test_tasks_are_small_integer_problems_with_consistent_fields():
    kinds = set()
    for t in bundled_tasks("train") + bundled_tasks("eval"):
        kinds.add(t["template"])
        assert len(t["prompt"]) <= MAX_PROMPT_CHARS
        assert 2 <= len(t["intermediates"]) <= 4
        assert t["answer"] == str(t["intermediates"][-1]) and int(t["answer"]) >= 0
        # The solution prints every intermediate, in order, on one line.
        assert t["solution_output"] == " ".join(map(str, t["intermediates"])) + "\n"
        assert validate_task(t)["id"] == t["id"]
    assert kinds == {"chain_ltr", "chain_prec", "shop", "distance", "money", "sharing"}


def test_precedence_chains_say_which_rule_applies():
    for t in bundled_tasks("train"):
        if t["template"] == "chain_ltr":
            assert "left to right" in t["prompt"]
            expr = t["prompt"].removeprefix("Compute ").split(" from")[0].replace("/", "//")
            tokens = expr.split()
            value = int(tokens[0])
            for op, num in zip(tokens[1::2], tokens[2::2]):
                value = eval(f"{value} {op} {num}")
            assert value == int(t["answer"])
        elif t["template"] == "chain_prec":
            assert "usual precedence" in t["prompt"]
            expr = t["prompt"].removeprefix("Compute ").split(" with")[0]
            assert eval(expr) == int(t["answer"])


def test_validate_task_aliases_and_errors():
    assert validate_task({"id": 1, "problem": "2+2?", "answer": 4}) == {
        "id": "1",
        "problem": "2+2?",
        "answer": "4",
        "prompt": "2+2?",
    }
    assert validate_task({"ID": "2024-I-1", "Problem": "p", "Answer": 204})["answer"] == "204"
    verl = {
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 1+1?"}],
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"index": "abc"},
    }
    assert (validate_task(verl)["id"], validate_task(verl)["prompt"], validate_task(verl)["answer"]) == (
        "abc",
        "What is 1+1?",
        "2",
    )
    with pytest.raises(ValueError, match=r"has no prompt \(looked for prompt, problem, question"):
        validate_task({"id": "x", "text": "hi", "answer": "1"})
    with pytest.raises(ValueError, match="has no answer"):
        validate_task({"id": "x", "question": "hi"})
    with pytest.raises(ValueError, match="has no id"):
        validate_task({"question": "hi", "answer": "1"})
    with pytest.raises(ValueError, match="non-empty string"):
        validate_task({"id": "x", "prompt": "  ", "answer": "1"})
    with pytest.raises(ValueError, match="intermediates"):
        validate_task({"id": "x", "prompt": "p", "answer": "1", "intermediates": ["a"]})


def test_dapo_style_jsonl_through_the_env(tmp_path):
    path = tmp_path / "aime.jsonl"
    rows = [
        {"id": "a1", "problem": "What is 3 * 4?", "answer": "12"},
        {"id": "a2", "question": "1/2?", "answer": "0.5"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = ToolCallEnv(tasks=str(path))
    obs, info = env.reset(options={"task": "a2"})
    assert obs == {"role": "user", "content": "1/2?"} and info["task_id"] == "a2"
    obs, reward, terminated, truncated, info = env.step("It is \\boxed{\\frac{1}{2}}")
    assert (reward, terminated, info["signals"]["correct"]) == (1.0, True, True)
    env.close()


def test_json_file_too(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"tasks": [{"id": "q", "prompt": "p", "answer": 3}]}))
    assert ToolCallEnv(tasks=path).task_pool()[0]["answer"] == "3"


def test_broken_task_file_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "1", "prompt": "p", "answer": "1"}\n{"id": "2", "text": "p", "answer": "1"}\n')
    with pytest.raises(TaskFileError, match=r"bad.jsonl line 2: task '2' has no prompt"):
        load_tasks(path, ToolCallEnv.validate_task)
    path.write_text('{"id": "1", "prompt": "p", "answer": "1"}\n{"id": "2", "prompt": \n')
    with pytest.raises(TaskFileError, match=r"line 2: invalid JSON"):
        ToolCallEnv(tasks=path).reset()
