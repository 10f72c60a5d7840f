import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.spaces import FreeText, truncate_middle
from fixture_envs import CountEnv


def test_check_env_passes_on_a_base_subclass():
    check_env(CountEnv(), skip_render_check=True)


def test_step_contract_info_keys_and_outcome_on_last_step():
    env = CountEnv()
    obs, info = env.reset(options={"task": {"id": "t", "target": 2}})
    assert obs == {"role": "user", "content": "reach 2"} and info["system_prompt"] and info["family"] == "generic"
    obs, r, term, trunc, info = env.step("inc")
    assert (r, term, trunc, info["outcome"]) == (0.0, False, False, None)
    assert info["next_state"] == {"role": "tool", "content": "value 1"} and info["signals"]["progress"]
    obs, r, term, trunc, info = env.step("inc")
    assert (r, term, info["outcome"]) == (1.0, True, 1.0)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("inc")


def test_malformed_action_is_an_observation_not_an_exception():
    env = CountEnv()
    env.reset(options={"task": "count-0"})
    obs, r, term, trunc, info = env.step("%%%")
    assert info["signals"]["parse_error"] and "could not parse" in obs["content"] and not term
    _, _, _, _, info = env.step(12345)  # not even text
    assert info["signals"]["parse_error"]


def test_truncation_at_step_limit_calls_verify():
    env = CountEnv(max_steps=2)
    env.reset(options={"task": {"id": "t", "target": 3}})
    env.step("inc")
    obs, r, term, trunc, info = env.step("inc")
    assert trunc and not term and r == -1.0 and info["outcome"] == -1.0 and "step limit" in obs["content"]


def test_task_lookup_errors_are_helpful():
    env = CountEnv()
    with pytest.raises(KeyError, match="did you mean"):
        env.reset(options={"task": "count-01"})
    with pytest.raises(RuntimeError, match="before reset"):
        CountEnv().step("inc")


def test_free_text_space_and_truncation():
    space = FreeText(10)
    assert space.contains("héllo wörld"[:10]) and not space.contains("x" * 11) and not space.contains(3)
    text, cut = truncate_middle("a" * 50 + "b" * 50, 60)
    assert cut and len(text) <= 60 and text.startswith("a") and text.endswith("b") and "truncated" in text


def test_registry_and_gymnasium_make():
    assert "test-count" in envs.names() and "toolcall" in envs.names()
    with pytest.raises(envs.UnknownEnvError, match="known: .*toolcall.*Did you mean 'test-count'"):
        envs.make("test-cont")
    env = gymnasium.make("nextstate/test-count", max_steps=3)
    obs, info = env.reset(seed=0)
    assert obs["role"] == "user"
    env.close()


def test_register_rejects_classes_without_the_env_methods():
    class NotAnEnv:
        def reset(self): ...

    envs.register("test-broken", NotAnEnv, overwrite=True)
    with pytest.raises(envs.PluginLoadError, match="lacks step, close, tasks"):
        envs.make("test-broken")
    envs.register("test-missing", "no_such_module.sub:Env", overwrite=True)
    with pytest.raises(envs.PluginLoadError, match="ModuleNotFoundError"):
        envs.make("test-missing")
