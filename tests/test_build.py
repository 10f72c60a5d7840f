"""One builder: `python -m rollout.launch`, its dry run and experiments build every component through rollout.build,
and a dry run of a config plans exactly what a run of it plans (each group's choice dispatched in one place)."""

from __future__ import annotations

import asyncio

import pytest

from rollout import build, dry_run
from rollout.build import compose_launch_config
from rollout.experiment.core import build_start
from rollout.run import run

PLANNERS = ("plan_run_settings", "plan_env", "plan_policy", "plan_judge", "plan_trainer", "plan_settings")
TINY = ["loop.iterations=1", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=2",
        "policy.warm_start.enabled=false", "farm.num_envs=4", "sampling.max_new_tokens=8"]


def spy(monkeypatch) -> dict[str, list]:
    """Record what each of rollout.build's planners returns, whoever calls it."""
    calls: dict[str, list] = {name: [] for name in PLANNERS}
    for name in PLANNERS:
        real = getattr(build, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            out = _real(*args, **kwargs)
            calls[_name].append(out)
            return out

        monkeypatch.setattr(build, name, wrapper)
    return calls


def test_a_dry_run_and_a_run_of_the_same_config_go_through_the_same_builder(monkeypatch, tmp_path):
    cfg = compose_launch_config([f"run.out_dir={tmp_path / 'run'}", "run.name=same", *TINY])
    calls = spy(monkeypatch)
    checks = dry_run.check_config(cfg)
    assert all(c.ok for c in checks), checks
    planned_by_dry_run = {name: list(v) for name, v in calls.items()}
    for v in calls.values():
        v.clear()
    assert asyncio.run(run(cfg)) == 0
    for name in PLANNERS:
        assert len(planned_by_dry_run[name]) == 1 and len(calls[name]) == 1, name  # each component planned once
        assert planned_by_dry_run[name] == calls[name], f"{name}: the dry run planned another component than the run"


def test_an_experiment_builds_its_sft_start_with_the_same_builder(monkeypatch):
    cfg = compose_launch_config(["policy.warm_start.enabled=false", "run.name=x"])
    calls = spy(monkeypatch)
    built = []
    monkeypatch.setattr("rollout.experiment.core.build_local_policy", lambda *a: built.append(a))
    from omegaconf import OmegaConf

    build_start(OmegaConf.to_container(cfg, resolve=True))
    assert [len(calls[n]) for n in ("plan_env", "plan_policy")] == [1, 1]
    assert built[0][0] == calls["plan_policy"][0].config and built[0][1] == calls["plan_env"][0].families


@pytest.mark.parametrize("overrides,message", [
    (["policy.type=tgi"], "policy.type='tgi' is not available; known: local, sglang, vllm, openai"),
    (["trainer.backend=jax"], "trainer.backend='jax' is not available; known: torch, megatron"),
    (["judge.type=oracle"], "unknown judge 'oracle'"),
])
def test_an_unknown_choice_is_one_clear_error_in_the_dry_run_too(overrides, message):
    checks = dry_run.check_config(compose_launch_config(["run.name=x", *overrides]))
    assert any(not c.ok and message in c.detail for c in checks), [c.detail for c in checks]


def test_the_planned_trainer_is_the_same_whoever_builds_the_policy():
    """trainer=megatron: the dry run once checked another config than the run (only the run set the pad id)."""
    cfg = compose_launch_config(["trainer=megatron", "run.name=x"])
    planned: dict = {}
    dry_run.check_config(cfg, planned)
    assert planned["trainer"] == build.plan_run(cfg).trainer and planned["trainer"].config.pad_token_id is None
