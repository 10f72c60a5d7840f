"""The terminal family: action parsing, observations, outcomes, the bundled tasks (each solved by its reference solution
and not by doing nothing), on the local sandbox and on docker."""

from __future__ import annotations

import json

import pytest
from gymnasium.utils.env_checker import check_env

from envs.runtime import ExecResult
from envs.terminal.actions import SUBMIT_COMMAND, is_submission, parse_shell_action, render_result
from envs.terminal.env import TerminalEnv, outcome_from_tests
from envs.terminal.tasks import bundled_tasks, validate_terminal_task
from tests.sandbox_support import bwrap_or_skip, docker_host  # noqa: F401 (fixture)

ALL_TASKS = bundled_tasks("all")


# ----- unit: parsing, rendering, outcome math, task format -----
def test_parse_one_bash_block():
    a = parse_shell_action("Let me look.\n```bash\nls -la\n```\n")
    assert a.command == "ls -la" and a.via == "bash_block" and not a.error


def test_parse_ignores_blocks_inside_think():
    a = parse_shell_action("<think>maybe ```bash\nrm -rf x\n```</think>\n```sh\necho ok\n```")
    assert a.command == "echo ok"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("just prose", "found no command"),
        ("```bash\nls\n```\n```bash\npwd\n```", "found 2 ```bash blocks"),
        ("```python\nprint(1)\n```", "marked python"),
        ("```bash\n\n```", "empty"),
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "unknown tool 'python'"),
        ('<tool_call>{"name": "shell_exec", "arguments": {"cmd": "ls"}}</tool_call>', 'argument "command"'),
    ],
)
def test_parse_errors_say_what_to_do(text, fragment):
    a = parse_shell_action(text)
    assert a.command is None and fragment in a.error


def test_parse_tool_call_with_string_arguments():
    call = {"name": "shell_exec", "arguments": json.dumps({"command": "echo hi"})}
    a = parse_shell_action(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert a.command == "echo hi" and a.via == "tool_call"


def test_submission_needs_the_marker_as_first_line():
    assert is_submission(ExecResult(0, "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", ""))
    assert not is_submission(ExecResult(0, "hello COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", ""))
    assert not is_submission(ExecResult(1, "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", ""))


def test_render_truncates_with_a_marker_and_notes_timeouts():
    text, cut = render_result(ExecResult(137, "x" * 50_000, "boom", timed_out=True), 5, 2_000)
    assert cut and "characters truncated" in text and "timed out after 5 s" in text
    assert text.startswith("exit code: 137") and "stderr:\nboom" in text and len(text) <= 2_000
    text, cut = render_result(ExecResult(0, "", ""), 5, 2_000)
    assert not cut and "(no output)" in text


def test_outcome_mapping():
    assert outcome_from_tests(3, 4) == pytest.approx(0.5)
    assert outcome_from_tests(0, 2) == -1.0 and outcome_from_tests(2, 2) == 1.0
    assert outcome_from_tests(3, 4, "binary") == -1.0 and outcome_from_tests(4, 4, "binary") == 1.0
    with pytest.raises(ValueError):
        outcome_from_tests(1, 1, "sigmoid")


def test_task_validation_errors_name_the_problem():
    with pytest.raises(ValueError, match="'tests'"):
        validate_terminal_task({"id": "t", "instruction": "x", "tests": []})
    with pytest.raises(ValueError, match="'instruction'"):
        validate_terminal_task({"id": "t", "tests": ["true"]})
    t = validate_terminal_task({"id": "t", "instruction": "x", "tests": "test -f a"})
    assert t["tests"] == ["test -f a"] and t["setup"] == [] and t["timeout"] == 30.0


def test_bundled_set_size_and_splits():
    assert len(ALL_TASKS) >= 30
    assert len({t["id"] for t in ALL_TASKS}) == len(ALL_TASKS)
    train, ev = bundled_tasks("train"), bundled_tasks("eval")
    assert len(train) + len(ev) == len(ALL_TASKS) and ev and train
    assert all(t["solution"] for t in ALL_TASKS)
    assert len({t["category"] for t in ALL_TASKS}) >= 6


# ----- integration: the real sandbox -----
@pytest.fixture
def env():
    bwrap_or_skip()
    e = TerminalEnv()
    yield e
    e.close()


@pytest.mark.integration
def test_check_env_passes(env):
    check_env(env, skip_render_check=True)


@pytest.mark.integration
def test_episode_observations_signals_and_outcome(env):
    obs, info = env.reset(options={"task": "text-count-errors"})
    assert obs["role"] == "user" and "ERROR" in obs["content"]
    assert "```bash" in info["system_prompt"] and SUBMIT_COMMAND in info["system_prompt"]

    obs, r, term, trunc, info = env.step("no command here")
    assert info["signals"]["parse_error"] and "could not parse" in obs["content"] and not (term or trunc)

    obs, r, term, trunc, info = env.step("```bash\ncat missing.txt\n```")
    assert info["signals"]["exit_code"] == 1 and info["signals"]["error"] and "No such file" in obs["content"]

    obs, r, term, trunc, info = env.step("```bash\ngrep -c ERROR logs/app.log > answer.txt\n```")
    assert info["signals"]["progress"] and info["signals"]["tests_passed"] == 1

    obs, r, term, trunc, info = env.step(f"```bash\n{SUBMIT_COMMAND}\n```")
    assert term and r == 1.0 and info["outcome"] == 1.0 and "1 of 1 hidden tests passed" in obs["content"]


@pytest.mark.integration
def test_timeouts_and_huge_output_are_signalled():
    bwrap_or_skip()
    env = TerminalEnv(command_timeout=1, max_observation_chars=2_000)
    try:
        env.reset(options={"task": "files-project-skeleton"})
        obs, _, _, _, info = env.step("```bash\nsleep 30\n```")
        assert info["signals"]["timed_out"] and info["signals"]["error"] and "timed out" in obs["content"]
        obs, _, _, _, info = env.step("```bash\nseq 1 100000\n```")
        assert info["signals"]["output_truncated"] and "characters truncated" in obs["content"]
        assert len(obs["content"]) <= 2_000
    finally:
        env.close()


@pytest.mark.integration
def test_step_limit_grades_the_state_as_it_is():
    bwrap_or_skip()
    env = TerminalEnv(max_steps=2)
    try:
        env.reset(options={"task": "files-project-skeleton"})
        env.step("```bash\nmkdir -p project/src project/tests\n```")
        obs, r, term, trunc, info = env.step("```bash\nmkdir -p project/docs\n```")
        assert trunc and not term and "step limit" in obs["content"]
        assert r == pytest.approx(outcome_from_tests(3, 4)) == info["outcome"]
    finally:
        env.close()


@pytest.mark.integration
def test_binary_outcome_and_tool_call_actions():
    bwrap_or_skip()
    env = TerminalEnv(outcome="binary")
    try:
        env.reset(options={"task": "files-project-skeleton"})
        call = {"name": "shell_exec", "arguments": {"command": "mkdir -p project/src"}}
        obs, *_ = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
        assert obs["role"] == "tool" and obs["content"].startswith("exit code: 0")
        _, r, term, _, _ = env.step(f"```bash\n{SUBMIT_COMMAND}\n```")
        assert term and r == -1.0
    finally:
        env.close()


def _check_task(env: TerminalEnv, task: dict) -> None:
    env.reset(options={"task": task})
    assert env.verify() < 1.0, f"{task['id']}: the hidden tests pass before the agent did anything"
    messages = env.demonstration(task)  # raises unless the reference solution passes every test
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    assert (
        messages[-2]["content"] == f"```bash\n{SUBMIT_COMMAND}\n```"
        and "hidden tests passed" in messages[-1]["content"]
    )
    assert sum(m["role"] == "assistant" for m in messages) == len(task["solution"]) + 1


@pytest.mark.integration
@pytest.mark.parametrize("task", ALL_TASKS, ids=[t["id"] for t in ALL_TASKS])
def test_bundled_task_is_solvable_and_not_trivial_local(task):
    bwrap_or_skip()
    env = TerminalEnv(progress_from_tests=False)
    try:
        _check_task(env, task)
    finally:
        env.close()


# one task per category on docker (all of them take ~2 min there; the local test above covers every task)
DOCKER_SAMPLE = list({t["category"]: t for t in ALL_TASKS}.values())


@pytest.mark.integration
def test_bundled_tasks_are_solvable_on_docker(docker_host):
    env = TerminalEnv(runtime="docker", runtime_options={"docker_host": docker_host}, progress_from_tests=False)
    failures = []
    try:
        for task in DOCKER_SAMPLE:
            try:
                _check_task(env, task)
            except (AssertionError, ValueError) as exc:
                failures.append(f"{task['id']}: {exc}")
    finally:
        env.close()
    assert not failures, "\n".join(failures)


@pytest.mark.integration
def test_git_demonstrations_are_the_same_every_time_they_are_recorded():
    """A demonstration is part of the warm-start cache key: one that prints a new commit's hash or date would give
    every run its own key (and its own SFT start). The git tasks' solutions are the ones that commit."""
    bwrap_or_skip()
    tasks = [t for t in bundled_tasks("train") if any("git" in s for s in t["solution"])]
    assert tasks
    env = TerminalEnv(progress_from_tests=False)
    try:
        first = [env.demonstration(t) for t in tasks]
        assert [env.demonstration(t) for t in tasks] == first
    finally:
        env.close()
