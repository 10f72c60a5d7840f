"""End to end, as a user runs it: `python -m rollout.launch ...` in a subprocess, then the files it wrote.

Small settings keep it CI-sized; the defaults are exercised by the README's run command (timed in the issue notes).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.records import finished_episodes, read_jsonl
from train.rewards import integrate, step_index_normalize

pytestmark = pytest.mark.slow  # the experiment tier: whole launches as a user runs them

REPO = Path(__file__).resolve().parent.parent
STEP_FIELDS = {
    "run_id", "episode_id", "group_id", "task_id", "step_index", "status", "action", "next_state", "signals", "judge",
    "outcome", "reward", "advantage", "weight_version", "prompt_tokens", "output_tokens",
}
SMALL = [
    "loop.iterations=2", "loop.tasks_per_iteration=3", "loop.samples_per_task=3", "loop.eval_tasks=6",
    "policy.warm_start.max_conversations=96", "policy.warm_start.sft.epochs=1",
]


def launch(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollout.launch", f"run.out_dir={out}",
           f"policy.warm_start.cache_dir={tmp_path / 'cache'}", *SMALL, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc, out


def check_run_dir(out: Path, reward_coef: float = 1.0) -> list[dict]:
    import torch
    import yaml

    stack = yaml.safe_load((out / "config.yaml").read_text())["stack"]  # what produced these numbers
    assert stack["packages"]["torch"] == torch.__version__ and stack["cpu_capability"] not in ("", "unknown")
    steps = read_jsonl(out / "trajectories.jsonl")
    assert steps, "no steps recorded"
    for s in steps:
        missing = STEP_FIELDS - set(s)
        assert not missing, f"step record lacks {missing}"
        assert {"score", "votes", "raw", "hint", "hint_votes", "hint_raw", "latency_s", "prompt_tokens",
                "completion_tokens"} <= set(s["judge"])
        assert s["next_state"]["role"] in ("user", "tool")
    # advantages equal what train.rewards computes from the recorded R_t and outcomes / judge scores
    groups = finished_episodes(steps)
    for g, eps in groups.items():
        for ep in eps:
            outcome = ep[-1]["outcome"]
            assert outcome is not None and all(s["outcome"] is None for s in ep[:-1])
            assert [s["reward"] for s in ep] == pytest.approx(
                integrate(outcome, [s["judge"]["score"] for s in ep], reward_coef))
        adv = step_index_normalize({g: [[s["reward"] for s in ep] for ep in eps]})[g]
        for ep, row in zip(eps, adv):
            for s, a in zip(ep, row):
                assert (s["advantage"] is None) == (a is None)
                if a is not None:
                    assert s["advantage"] == pytest.approx(a, abs=1e-9)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["iteration"] for m in metrics if m["kind"] == "train"] == [0, 1]
    assert {m["iteration"] for m in metrics if m["kind"] == "eval"} == {0, 2}
    episodes = read_jsonl(out / "episodes.jsonl")
    assert {e["episode_id"] for e in episodes if e["split"] == "train"} == {s["episode_id"] for s in steps}
    return steps


@pytest.mark.integration
def test_toolcall_local_farm(tmp_path):
    proc, out = launch(tmp_path, "env=toolcall", "farm=local", "loop.max_staleness=0")
    steps = check_run_dir(out)
    assert "eval accuracy" in proc.stdout and "run summary" in proc.stdout
    assert max(s["weight_version"] for s in steps) == 1  # on-policy: iteration 2 was sampled by the weights of update 1
    json.dumps(steps[0])


@pytest.mark.integration
def test_toolcall_ray_farm(tmp_path):
    _, out = launch(tmp_path, "env=toolcall", "farm=ray", "farm.num_envs=8", "farm.envs_per_worker=4")
    check_run_dir(out)


@pytest.mark.integration
def test_plugin_env_through_entry_point_in_ray_workers(tmp_path):
    import importlib.metadata as md

    # scripts/install.sh installs the example plugin: without its entry point the install is broken, not the machine
    assert any(ep.name == "echo" for ep in md.entry_points(group="nextstate.envs")), \
        "the example plugin is not installed (pip install -e examples/nextstate-echo-env)"
    _, out = launch(tmp_path, "env=echo", "farm=ray", "farm.num_envs=4", "farm.envs_per_worker=2")
    check_run_dir(out)


MINIMAL_PLUGIN = '''"""A third-party env written against the documented contract only: reset, step, close and tasks (no AgentEnv base
class, no demonstration)."""


class GuessEnv:
    def __init__(self, **kwargs):
        self.task = None
        self.steps = 0

    @classmethod
    def tasks(cls, split="train"):
        base = 0 if split == "train" else 100
        return [{"id": f"guess-{base + i}", "answer": str((base + i) % 3)} for i in range(12)]

    def reset(self, *, seed=None, options=None):
        task = (options or {}).get("task")
        pool = {t["id"]: t for t in self.tasks("train") + self.tasks("eval")}
        self.task = task if isinstance(task, dict) else pool[str(task)]
        self.steps = 0
        return {"role": "user", "content": "guess a digit from 0 to 2"}, {}

    def step(self, action):
        self.steps += 1
        right = action.strip() == self.task["answer"]
        obs = {"role": "user", "content": "right" if right else "wrong"}
        return obs, float(right), right, not right and self.steps >= 3, {}

    def close(self):
        pass
'''


def install_minimal_plugin(root: Path) -> dict[str, str]:
    """A distribution on PYTHONPATH (module + dist-info with its entry point), as `pip install` would leave it: the
    launcher and every Ray worker find it through the `nextstate.envs` group. Returns the subprocess environment."""
    import os

    (root / "minimal_guess_env.py").write_text(MINIMAL_PLUGIN)
    info = root / "minimal_guess_env-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: minimal-guess-env\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[nextstate.envs]\nguess = minimal_guess_env:GuessEnv\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}


@pytest.mark.integration
@pytest.mark.parametrize("farm", ["local", "ray"])
def test_minimal_plugin_without_demonstration_runs_under_the_default_command(tmp_path, farm):
    env = install_minimal_plugin(tmp_path)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollout.launch", "env=guess", f"farm={farm}", f"run.out_dir={out}",
           "loop.iterations=1", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=2"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "warm start skipped" in proc.stderr + proc.stdout  # the logged warning
    warm = json.loads((out / "warm_start.json").read_text())
    assert warm["cache"] == "off (random init)" and "no demonstration(task) method" in warm["skipped"]
    steps = read_jsonl(out / "trajectories.jsonl")
    assert {s["task_id"] for s in steps} <= {f"guess-{i}" for i in range(12)}
    assert {s["status"] for s in steps} == {"ok"} and len({s["episode_id"] for s in steps}) == 4
    assert [m["iteration"] for m in read_jsonl(out / "metrics.jsonl") if m["kind"] == "train"] == [0]
