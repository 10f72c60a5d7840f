"""The multistep GUI tasks (envs/gui/multistep.py): disjoint value pools per split, noisy demonstrations, and rendered
demonstrations (envs/gui/app_models.py) that equal live recordings on a real desktop byte for byte, with the per-step
`progress` / `wrong` signals telling each scripted step's label."""

from __future__ import annotations

import re

import pytest

from envs.base import PROGRESS, WRONG
from envs.gui.env import GUIEnv
from envs.gui.multistep import CODES, MISTAKES, GUINoise, multistep_tasks, scripted_steps
from envs.gui.solution import resolve_step
from envs.gui.tasks import validate_task
from tests.gui_support import require_desktop_tools


def test_splits_are_large_distinct_and_draw_from_disjoint_pools():
    train, held = multistep_tasks("train"), multistep_tasks("eval")
    assert (len(train), len(held)) == (4000, 64)
    forms = [t["instruction"] for t in train if "Sign up" in t["instruction"]]
    assert len(set(forms)) == len(forms) == 2000  # settings tasks share instructions (216 of them), not starting states
    for t in train[:50] + held:
        validate_task(t)
        ns = t["nextstate"]
        assert ns["progress"] and ns["violations"] and ns["solution"][-1] == "DONE"
    codes = lambda ts: {t["nextstate"]["multistep"]["params"].get("code") for t in ts} - {None}  # noqa: E731
    sizes = lambda ts: {t["nextstate"]["multistep"]["params"].get("size") for t in ts} - {None}  # noqa: E731
    assert not (codes(train) & codes(held)) and not (sizes(train) & sizes(held))
    assert len(codes(train)) > 1500  # too many to memorize
    # ... written with the same number tokens (2-digit groups): copying is what carries over
    groups = lambda cs: {g for c in cs for g in c.split("-")}  # noqa: E731
    assert groups(codes(held)) <= groups(codes(train)) and not set(CODES[0]) & set(CODES[1])
    with pytest.raises(ValueError, match="train and eval"):
        multistep_tasks("osworld")


def test_noise_is_per_task_deterministic_and_labels_each_step():
    task = multistep_tasks("train")[0]
    kinds = task["nextstate"]["multistep"]["kinds"]
    assert scripted_steps(task) == (task["nextstate"]["solution"], ["ok"] * len(kinds))
    noisy = GUINoise(rate=0.5, seed=3)
    assert scripted_steps(task, noisy) == scripted_steps(task, GUINoise(rate=0.5, seed=3))
    _, labels = scripted_steps(task, GUINoise(rate=1.0))
    assert labels == [MISTAKES[k] for k in kinds if k not in ("done", "subscribe")] + ["ok"]  # a skipped box: no step
    with pytest.raises(ValueError, match="unknown step kinds"):
        GUINoise(rates={"nmae": 0.5})
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        GUINoise(rate=1.5)


@pytest.fixture(scope="module")
def env():
    require_desktop_tools()
    e = GUIEnv(task_set="multistep", compact_observation=True)  # as experiment=table4_gui
    yield e
    e.close()


def _sample():
    train, held = multistep_tasks("train"), multistep_tasks("eval")
    # both families and splits, with and without the newsletter step, clean / every mistake / a seeded mix
    return [(train[0], None), (train[1], GUINoise(rate=1.0)), (train[2], GUINoise(rate=1.0)),
            (held[2], GUINoise(rate=0.5, seed=0)), (held[3], GUINoise(rate=0.5, seed=2))]


@pytest.mark.integration
@pytest.mark.parametrize("case", range(5))
def test_rendered_demonstration_equals_a_live_recording(env, case):
    task, noise = _sample()[case]
    steps, labels = scripted_steps(task, noise)
    rendered = env.rendered_demonstration(task, noise)
    obs, info = env.reset(options={"task": task})
    live = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": obs["content"]}]
    signals = []
    for step in steps:
        action = resolve_step(step, *env.current_elements())
        obs, _, terminated, _, info = env.step(action)
        live.append({"role": "assistant", "content": action})
        signals.append(info["signals"])
        if terminated:
            break
        live.append({"role": "user", "content": obs["content"]})
    assert live == rendered  # byte for byte: every observation text and action
    # the demonstration's step labels (the SFT report's) are what the live env's `mistake` signal said of each step
    assert GUIEnv.demonstration_labels(task, rendered) == [sig["mistake"] for sig in signals]
    solved = steps == task["nextstate"]["solution"]
    assert info["outcome"] == (1.0 if solved else 0.0)
    assert signals[-1][PROGRESS] == solved and signals[-1][WRONG] == (not solved)  # DONE: the evaluator's verdict
    # the rule judge's per-step signal: a mistake is `wrong`, a right step after right ones is `progress`
    clean_so_far = True
    for label, sig in zip(labels[:-1], signals[:-1]):
        if label != "ok":
            assert sig[WRONG] and not sig[PROGRESS], (label, sig)
            assert sig["mistake"] not in ("ok", "no_progress"), sig  # which violation (or "undone")
            clean_so_far = False
        elif clean_so_far:
            assert sig[PROGRESS] and not sig[WRONG] and sig["mistake"] == "ok", (label, sig)
