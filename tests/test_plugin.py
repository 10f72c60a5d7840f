"""The example plugin distribution (examples/nextstate-echo-env), installed by scripts/install.sh."""

import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envs

ROOT = Path(__file__).resolve().parents[1]
INSTALL_HINT = (
    "the example plugin is not installed: pip install -e examples/nextstate-echo-env (scripts/install.sh does)"
)


def _echo_entry_point():
    found = [ep for ep in md.entry_points(group="nextstate.envs") if ep.name == "echo"]
    assert found, INSTALL_HINT
    return found[0]


def test_entry_point_is_declared_and_installed():
    text = (ROOT / "examples/nextstate-echo-env/pyproject.toml").read_text()
    assert '[project.entry-points."nextstate.envs"]\necho = "nextstate_echo.env:EchoEnv"' in text
    ep = _echo_entry_point()
    assert ep.value == "nextstate_echo.env:EchoEnv" and ep.dist.name == "nextstate-echo-env"


def test_make_and_gymnasium_make_and_check_env():
    _echo_entry_point()
    env = envs.make("echo")
    assert type(env).__name__ == "EchoEnv" and isinstance(env, envs.AgentEnv)
    check_env(env, skip_render_check=True)
    g = gymnasium.make("nextstate/echo", max_steps=5)
    obs, info = g.reset(seed=1)
    assert obs["content"].startswith("Type the word: ") and info["system_prompt"]
    check_env(g.unwrapped, skip_render_check=True)


def test_entry_point_found_in_a_fresh_subprocess():
    _echo_entry_point()
    code = (
        "import envs, gymnasium\n"
        "print(envs.spec('echo').origin)\n"
        "env = gymnasium.make('nextstate/echo')\n"
        "print(type(env.unwrapped).__module__, len(env.unwrapped.tasks('eval')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    origin, module = r.stdout.splitlines()
    assert origin.startswith("entry point 'echo = nextstate_echo.env:EchoEnv' of nextstate-echo-env")
    assert module == "nextstate_echo.env 100"


def test_tasks_are_deterministic_and_disjoint():
    cls = envs.env_class("echo")
    train, evals = cls.tasks("train"), cls.tasks("eval")
    assert (len(train), len(evals)) == (500, 100)
    assert not {t["word"] for t in train} & {t["word"] for t in evals}
    assert train == cls.tasks("train")
    with pytest.raises(ValueError, match="unknown split"):
        cls.tasks("dev")


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_demonstration_replays_to_success(split):
    env = envs.make("echo", split=split)
    for task in env.tasks(split):
        demo = env.demonstration(task)
        obs, info = env.reset(options={"task": task["id"]})
        assert info["system_prompt"] == demo[0]["content"] and obs["content"] == demo[1]["content"]
        turns = demo[2:]
        for i in range(0, len(turns), 2):
            obs, reward, terminated, truncated, info = env.step(turns[i]["content"])
            assert info["signals"]["progress"] is True
            if i + 1 < len(turns):
                assert obs == {"role": "user", "content": turns[i + 1]["content"]}
        assert (terminated, reward) == (True, 1.0)


def test_signals_and_outcomes():
    env = envs.make("echo")
    env.reset(options={"task": {"id": "w", "word": "cat"}})
    _, reward, terminated, _, info = env.step("ca")
    assert info["signals"]["parse_error"] is True and not terminated and reward == 0.0
    assert env.step("c")[4]["signals"]["progress"] is True
    obs, reward, terminated, _, info = env.step("x")
    assert (terminated, reward, info["signals"]["error"]) == (True, 0.0, True)
    short = envs.make("echo", max_steps=2)
    short.reset(options={"task": {"id": "w", "word": "cat"}})
    short.step("c")
    assert short.step("a")[1:4] == (0.0, False, True)  # truncated before the word is complete
    with pytest.raises(ValueError, match="'word' must be"):
        env.reset(options={"task": {"id": "w", "word": "c4t"}})
