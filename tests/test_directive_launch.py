"""`python -m rollout.launch env=<family> reward=<directive mode>` as a user runs it, on both trainers: every mode on the
tool-call env (opd and gated with trainer=torch, combined and multiplicative with trainer=megatron), and each other
family with one mode. One iteration each, a few tasks. Then the records are checked: the token advantages of every step are recomputed from what the run wrote
(the recorded log-probs, hints and step scores), and on the tool-call runs the teacher's log-probs themselves are
recomputed from the recorded enhanced contexts with the run's own starting weights (its warm-start cache); with
`reward.teacher=reference` also those of steps sampled after an update."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_opd_rewards import reference

from prm.hints import HINT_LABEL
from rollout.records import finished_episodes, read_jsonl
from train.opd import OPD_MODES
from train.rewards import step_index_normalize

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # the experiment tier: whole launches, every mode

REPO = Path(__file__).resolve().parent.parent
ONE_ITERATION = ["loop.iterations=1", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=0",
                 "loop.record_token_ids=true", "sampling.max_new_tokens=32"]
TOOLCALL = ["env=toolcall", "env.task_set=chain", "env.tools=[calculator]", "policy.warm_start.max_conversations=48",
            "policy.warm_start.sft.epochs=1"]
# the other families start from an untrained tiny model (their demonstrations replay whole episodes: slow here)
OTHER = ["policy.warm_start.enabled=false", "env.max_steps=2", "loop.tasks_per_iteration=1"]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("warmstart")  # one SFT start shared by the tool-call runs


def launch(out: Path, cache: Path, *overrides: str) -> list[str]:
    args = [f"run.out_dir={out}", f"policy.warm_start.cache_dir={cache}", *ONE_ITERATION, *overrides]
    proc = subprocess.run([sys.executable, "-m", "rollout.launch", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return args


def check_token_advantages(out: Path, mode: str) -> list[dict]:
    """Recompute every step's token advantages from the records alone; return the steps that had a teacher."""
    groups = finished_episodes(read_jsonl(out / "trajectories.jsonl"))
    assert groups, "no finished episode"
    taught = []
    for g, eps in groups.items():
        a_step = step_index_normalize({g: [[s["reward"] for s in ep] for ep in eps]})[g]  # R_t recorded per step
        for ep, adv in zip(eps, a_step):
            for s in ep:
                assert s["judge"]["hint_votes"], "the judge gave no hint votes (hints should be on)"
                if s["judge"]["hint"] is not None:
                    assert len(s["judge"]["hint"]) >= 10
                if s["teacher_logprobs"] is not None:
                    assert s["judge"]["hint"] is not None and s["output_tokens"] > 0
                    taught.append(s)
            gaps = [None if s["teacher_logprobs"] is None
                    else list(np.subtract(s["teacher_logprobs"], s["output_logprobs"])) for s in ep]
            want = reference(mode, [s["judge"]["score"] for s in ep], adv, gaps, [s["output_tokens"] for s in ep])
            for s, w, gap in zip(ep, want, gaps):
                assert (s["token_advantages"] is None) == (w is None), (s["advantage_mode"], w)
                assert (s["advantage"] is None) == (w is None)
                if w is not None:
                    np.testing.assert_allclose(s["token_advantages"], w, atol=1e-9)
                    assert s["advantage"] == pytest.approx(float(np.mean(w)), abs=1e-9)
                if gap:
                    assert s["teacher_gap"]["mean"] == pytest.approx(float(np.mean(gap)))
                    assert s["teacher_gap"]["min"] == pytest.approx(min(gap))
                    assert s["teacher_gap"]["max"] == pytest.approx(max(gap))
                assert s["advantage_mode"] is not None
    train = [m for m in read_jsonl(out / "metrics.jsonl") if m["kind"] == "train"]
    assert len(train) == 1 and "directive/hint_rate" in train[0] and "directive/dropped_steps" in train[0]
    assert train[0]["directive/teacher_steps"] == len(taught)
    return taught


def check_teacher_logprobs(args: list[str], taught: list[dict], any_version: bool = False) -> None:
    """The recorded teacher log-probs are the run's starting weights on the recorded enhanced context + action (steps
    sampled by the starting weights, or by any version with `any_version`: a reference teacher)."""
    from rollout.build import compose_launch_config, plan_run
    from rollout.policy.build import build_local_policy
    from train.backends.torch_backend import TorchTrainer
    from train.config import TorchTrainerConfig

    plan = plan_run(compose_launch_config([a for a in args if not a.startswith("run.out_dir")]))
    _, model, tokenizer, info = build_local_policy(plan.policy.config, plan.env.families, plan.run.seed)
    assert info["cache"] == "hit"  # the very weights the run started from
    trainer = TorchTrainer(model, TorchTrainerConfig(kl_coef=0.0))
    recomputed = trainer.action_logprobs([(s["teacher_prompt_ids"], s["output_ids"]) for s in taught])
    for s, lp in zip(taught, recomputed):
        assert any_version or s["weight_version"] == 0
        assert lp == pytest.approx(s["teacher_logprobs"], abs=1e-4)
        context = tokenizer.decode(s["teacher_prompt_ids"])
        assert f"{HINT_LABEL} {s['judge']['hint']}" in context  # the hint is in the teacher's context ...
        assert HINT_LABEL not in tokenizer.decode(s["prompt_ids"])  # ... and never in the policy's


# each mode once and each trainer twice (the advantage math does not depend on the trainer; the teacher's log-probs
# do, and both backends compute them here): four launches instead of eight keep the suite inside CI's budget
MODE_TRAINERS = list(zip(OPD_MODES, ["torch", "megatron"] * len(OPD_MODES)))


@pytest.mark.parametrize(("mode", "trainer"), MODE_TRAINERS)
def test_every_directive_mode_on_toolcall(tmp_path, warm_cache, mode, trainer):
    if trainer == "megatron":
        import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)
    out = tmp_path / "run"
    args = launch(out, warm_cache, *TOOLCALL, f"reward={mode}", f"trainer={trainer}")
    taught = check_token_advantages(out, mode)
    assert taught, "no step had a hint"
    check_teacher_logprobs(args, taught)


def test_a_reference_teacher_scores_every_iteration_with_the_starting_weights(tmp_path, warm_cache):
    """reward.teacher=reference: the second iteration's steps (sampled after an update) still get the starting
    weights' log-probs under the hint; with the current weights as teacher they would not."""
    out = tmp_path / "run"
    args = launch(out, warm_cache, *TOOLCALL, "reward=opd", "reward.teacher=reference", "loop.iterations=2", "loop.max_staleness=0",
                  "trainer.lr=0.01")
    steps = [s for s in read_jsonl(out / "trajectories.jsonl") if s.get("teacher_logprobs") is not None]
    later = [s for s in steps if s["weight_version"] >= 1]
    assert later, "no hinted step was sampled after the first update"
    check_teacher_logprobs(args, steps, any_version=True)
    train = [m for m in read_jsonl(out / "metrics.jsonl") if m["kind"] == "train"]
    assert [m["iteration"] for m in train] == [0, 1] and train[0]["train/grad_norm"] > 0


@pytest.mark.parametrize(("family", "mode", "trainer"), [("terminal", "gated", "torch"),
                                                         ("swe", "multiplicative", "megatron"),
                                                         ("gui", "combined", "torch")])
def test_each_family_with_one_mode(tmp_path, warm_cache, family, mode, trainer):
    from sandbox_support import bwrap_or_skip

    bwrap_or_skip()
    if family == "swe":
        import swebench  # noqa: F401 (the swe extra, always installed: a broken one fails)
    if family == "gui":
        from gui_support import require_desktop_tools

        require_desktop_tools()
    if trainer == "megatron":
        import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)
    out = tmp_path / "run"
    launch(out, warm_cache, f"env={family}", f"reward={mode}", f"trainer={trainer}", *OTHER)
    taught = check_token_advantages(out, mode)
    steps = [s for eps in finished_episodes(read_jsonl(out / "trajectories.jsonl")).values() for ep in eps for s in ep]
    assert all(s["signals"] for s in steps)
    assert any(s["judge"]["hint"] for s in steps), "no step of the family got a hint"
    assert all(len(s["teacher_logprobs"]) == s["output_tokens"] for s in taught)
