"""The package layers (docs/architecture.md, "Layers"): envs <- prm <- train <- rollout, rollout's own layers (its
subpackages and modules, "The rollout package"), no import cycles, and an env package that costs no torch, Ray or
transformers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ray", "transformers")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return [m for m in r.stdout.strip().split(",") if m]


def test_import_envs_loads_neither_torch_nor_ray():
    assert _loaded_after("import envs") == []


def test_a_plugin_that_subclasses_agent_env_pulls_in_none_of_them():
    code = (
        "import envs\n"
        "class Mine(envs.AgentEnv):\n"
        "    @classmethod\n"
        "    def tasks(cls, split='train'): return [{'id': 'a'}]\n"
        "    def begin(self, task): return envs.Transition('go', role='user')\n"
        "    def act(self, action):\n"
        "        if action != 'x': return envs.Transition('say x', signals={envs.PARSE_ERROR: True})\n"
        "        return envs.Transition('ok', outcome=1.0)\n"
        "    def verify(self): return 0.0\n"
        "envs.register('mine', Mine)\n"
        "env = envs.make('mine'); env.reset(seed=0); env.step('x'); env.close()\n"
        "envs.check_agent_env(envs.make('mine'))\n"
    )
    assert _loaded_after(code) == []


def test_the_launcher_module_loads_neither_torch_nor_ray():
    """The launcher (and so its dry run of a server config) imports the heavy parts only when it builds them."""
    assert _loaded_after("import rollout.launch") == []


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter is not installed (the dev extra)")
def test_lint_imports_keeps_every_contract():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["lint-imports", "--no-cache"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "4 kept, 0 broken" in r.stdout
