"""Every `env=<family> reward=<directive mode> trainer=<backend>` combination composes and plans as a run would (the
launcher's own Hydra composition and `plan_run`, in-process): the judge is asked for hints, the mode and the trainer
are the ones given. The real runs of each mode on each trainer, and of each family, are in test_directive_launch.py."""

from __future__ import annotations

import itertools

import pytest

from rollout import dry_run
from rollout.build import compose_launch_config, plan_run
from train.opd import OPD_MODES

FAMILIES = ("toolcall", "terminal", "swe", "gui")
TRAINERS = ("torch", "megatron")


@pytest.mark.parametrize(("family", "trainer"), list(itertools.product(FAMILIES, TRAINERS)))
def test_every_directive_mode_plans_for_every_family_and_trainer(family, trainer):
    for mode in OPD_MODES:
        plan = plan_run(compose_launch_config([f"env={family}", f"reward={mode}", f"trainer={trainer}"]))
        assert plan.env.name == family
        assert plan.reward.mode == mode and plan.reward.directive
        assert plan.judge.type != "none" and plan.judge.hints is True, (family, mode)
        assert plan.trainer.backend == trainer


def test_a_directive_mode_without_a_judge_is_refused():
    with pytest.raises(ValueError, match="judge=none gives none"):
        plan_run(compose_launch_config(["env=toolcall", "reward=opd", "judge=none"]))


def test_a_reference_teacher_without_the_kl_anchor_is_refused_by_the_run_and_the_dry_run():
    """reward.teacher=reference scores with the KL anchor's frozen weights; trainer.kl_coef=0 builds none."""
    args = ["env=toolcall", "reward=opd", "reward.teacher=reference", "run.name=x"]
    assert plan_run(compose_launch_config(args)).reward.teacher == "reference"
    with pytest.raises(ValueError, match="trainer.kl_coef=0 keeps none"):
        plan_run(compose_launch_config([*args, "trainer.kl_coef=0"]))
    checks = dry_run.check_config(compose_launch_config([*args, "trainer.kl_coef=0"]))
    assert any(not c.ok and "trainer.kl_coef=0 keeps none" in c.detail for c in checks), [c.detail for c in checks]
