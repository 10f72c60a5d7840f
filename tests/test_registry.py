"""The env registry: names, errors that say what to do next, plugin entry points resolved lazily."""

import subprocess
import sys
import textwrap

import gymnasium
import pytest

import envs
from envs import registry
from envs.registry import PluginLoadError, UnknownEnvError


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Each test registers into a copy of the registry and leaves gymnasium's registry as it found it."""
    monkeypatch.setattr(registry, "_specs", dict(registry._specs))
    before = set(gymnasium.registry)
    yield
    for env_id in set(gymnasium.registry) - before:
        del gymnasium.registry[env_id]


class Incomplete:
    """Has reset and step but no close or tasks."""

    def reset(self, **kw):
        return {}, {}

    def step(self, action):
        return {}, 0.0, True, False, {}


def test_builtin_names_are_known():
    assert {"toolcall", "terminal", "swe", "gui"} <= set(envs.names())
    assert envs.spec("toolcall").origin == "built-in"


def test_unknown_name_lists_known_ones_and_suggests():
    with pytest.raises(UnknownEnvError) as err:
        envs.make("toolcal")
    msg = str(err.value)
    assert "no env 'toolcal'" in msg and "known: " in msg and "gui" in msg and "terminal" in msg
    assert "Did you mean 'toolcall'?" in msg and "nextstate.envs" in msg
    with pytest.raises(UnknownEnvError, match="no env 'zzzz'; known:"):
        envs.spec("zzzz")


def test_class_lacking_methods_is_a_plugin_load_error():
    envs.register("incomplete", Incomplete)
    with pytest.raises(
        PluginLoadError, match=r"lacks close, tasks: an env must implement reset, step, close and tasks"
    ):
        envs.make("incomplete")


def test_unimportable_entry_point_is_a_plugin_load_error():
    envs.register("ghost", "no_such_module_xyz.env:GhostEnv")
    with pytest.raises(
        PluginLoadError,
        match=r"could not be loaded from 'no_such_module_xyz.env:GhostEnv': "
        r"ModuleNotFoundError",
    ):
        envs.make("ghost")
    envs.register("ghost2", "envs.toolcall.env:NoSuchClass")
    with pytest.raises(PluginLoadError, match="AttributeError"):
        envs.env_class("ghost2")
    envs.register("notcallable", "envs.toolcall.env:ERROR")
    with pytest.raises(PluginLoadError, match="not a class or factory"):
        envs.env_class("notcallable")


def test_register_rules_and_default_kwargs():
    from envs.toolcall.env import ToolCallEnv

    envs.register("short_toolcall", ToolCallEnv, max_steps=2)
    assert envs.make("short_toolcall").max_steps == 2
    assert envs.make("short_toolcall", max_steps=4).max_steps == 4
    with pytest.raises(ValueError, match="already registered"):
        envs.register("short_toolcall", ToolCallEnv)
    envs.register("short_toolcall", ToolCallEnv, overwrite=True, max_steps=3)
    assert envs.make("short_toolcall").max_steps == 3
    with pytest.raises(ValueError, match="invalid env name"):
        envs.register("a/b", ToolCallEnv)
    env = gymnasium.make("nextstate/short_toolcall")
    assert env.unwrapped.max_steps == 3


def test_task_set_without_building_an_env():
    assert len(envs.task_set("toolcall", "eval")) == 200


def _write_plugin(root, dist: str, name: str, target: str, module_source: str) -> None:
    """A minimal installed distribution: a module plus a .dist-info with one nextstate.envs entry point."""
    pkg = root / target.split(".")[0]
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "env.py").write_text(textwrap.dedent(module_source))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[nextstate.envs]\n{name} = {target}\n")


def _fresh_python(code: str, path) -> subprocess.CompletedProcess:
    env_path = f"{path}:{registry.__file__.rsplit('/envs/', 1)[0]}"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )


def test_entry_point_plugins_resolve_lazily_in_a_fresh_process(tmp_path):
    _write_plugin(
        tmp_path,
        "good-plugin",
        "goodenv",
        "goodpkg.env:GoodEnv",
        """
        from envs import AgentEnv, Transition
        class GoodEnv(AgentEnv):
            @classmethod
            def tasks(cls, split="train"):
                return [{"id": "only"}]
            def begin(self, task):
                return Transition("go", role="user")
            def act(self, action):
                return Transition("done", role="user", outcome=1.0)
        """,
    )
    _write_plugin(
        tmp_path,
        "bad-plugin",
        "badenv",
        "badpkg.env:BadEnv",
        """
        import sys
        sys.modules["badpkg_was_imported"] = sys
        class BadEnv:
            def reset(self): ...
        """,
    )
    r = _fresh_python(
        """
        import sys, envs, gymnasium
        assert {"goodenv", "badenv"} <= set(envs.names()), envs.names()
        assert "badpkg_was_imported" not in sys.modules  # names only: plugin code loads at make()
        print(envs.spec("goodenv").origin)
        env = gymnasium.make("nextstate/goodenv")
        print(env.reset(seed=0)[0]["content"], env.step("x")[1])
        try:
            envs.make("badenv")
        except envs.PluginLoadError as exc:
            print("PluginLoadError:", exc)
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "entry point 'goodenv = goodpkg.env:GoodEnv' of good-plugin 0.1"
    assert out[1] == "go 1.0"
    assert out[2].startswith(
        "PluginLoadError: env 'badenv' (entry point 'badenv = badpkg.env:BadEnv' of bad-plugin 0.1)"
    )
    assert "lacks step, close, tasks" in out[2]
