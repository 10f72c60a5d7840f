"""The example plugin's own tests: the env against NextState's env contract (envs.check_agent_env), and its rules."""

import pytest

import envs
from nextstate_echo.env import EchoEnv


def test_the_env_keeps_the_nextstate_env_contract():
    envs.check_agent_env(EchoEnv())  # spaces, info keys, signals, outcome at the end, parse errors, the demonstration


def test_a_wrong_letter_ends_the_episode_with_the_failure_reward():
    env = EchoEnv(failure_reward=-1.0)
    task = EchoEnv.tasks("eval")[0]
    env.reset(options={"task": task})
    wrong = "z" if task["word"][0] != "z" else "b"
    _, reward, terminated, _, info = env.step(wrong)
    assert terminated and reward == -1.0 and info["signals"]["error"] is True


def test_tasks_are_validated():
    with pytest.raises(ValueError, match="letters"):
        EchoEnv.validate_task({"id": "x", "word": "a1"})
