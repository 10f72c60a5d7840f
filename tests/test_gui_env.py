"""GUIEnv as an env: gymnasium's checker, the registry, observations, signals for the judge, truncation,
demonstrations that replay to success."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.base import ERROR, PARSE_ERROR, PROGRESS
from envs.gui.env import GUIEnv
from tests.gui_support import require_desktop_tools

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env():
    require_desktop_tools()
    e = GUIEnv(split="all", screen_width=640, screen_height=480, max_steps=8)
    yield e
    e.close()


def test_check_env_passes():
    require_desktop_tools()
    e = GUIEnv(screen_width=640, screen_height=480)
    try:
        check_env(e, skip_render_check=True)
    finally:
        e.close()


def test_registry_and_gymnasium_make():
    assert envs.env_class("gui") is GUIEnv
    assert {t["id"] for t in envs.task_set("gui", "eval")} == {t["id"] for t in GUIEnv.tasks("eval")}
    e = gymnasium.make("nextstate/gui", screen_width=640, screen_height=480)
    try:
        assert isinstance(e.unwrapped, GUIEnv)
    finally:
        e.close()
    with pytest.raises(TypeError, match="unknown GUIEnv option.*did you mean screen_width"):
        GUIEnv(screen_wdth=3)
    with pytest.raises(ValueError, match="osworld_url"):
        GUIEnv(backend="osworld")


def test_observation_has_text_and_image(env):
    obs, info = env.reset(options={"task": "ns-settings-dark-mode"})
    assert env.observation_space.contains(obs)
    assert obs["role"] == "user" and obs["image"].shape == (480, 640, 3) and obs["image"].dtype == np.uint8
    assert obs["content"].startswith("Task: Turn on Dark mode")
    assert 'check box "Dark mode" [unchecked] @' in obs["content"]
    assert info["system_prompt"] and info["family"] == "gui" and info["milestones"] == "0/2"
    assert np.array_equal(env.render(), obs["image"])


def test_signals_for_the_judge(env):
    obs, _ = env.reset(options={"task": "ns-settings-dark-mode"})
    el = {e.name: e for e in env.current_elements()[0]}
    _, r, term, trunc, info = env.step("pyautogui.clik(1, 2)")
    assert info["signals"][PARSE_ERROR] and not info["signals"]["screen_changed"] and r == 0 and not term
    assert "could not parse the action" in info["next_state"]["content"]
    _, _, _, _, info = env.step("pyautogui.write(5)")
    assert info["signals"][ERROR] and "TypeError" in info["next_state"]["content"]
    x, y = el["Dark mode"].center
    obs, _, _, _, info = env.step(f"pyautogui.click({x}, {y})")
    s = info["signals"]
    assert s[PROGRESS] and s["screen_changed"] and s["milestones"] == "1/2" and not s.get(ERROR)
    assert 'check box "Dark mode" [checked]' in obs["content"]
    _, _, _, _, info = env.step(f"pyautogui.click({x}, {y})")  # unticking undoes the milestone: no progress
    assert not info["signals"][PROGRESS] and info["signals"]["milestones"] == "0/2"
    _, _, _, _, info = env.step(f"pyautogui.click({x}, {y})")  # re-reaching a milestone already reached is not new
    assert not info["signals"][PROGRESS]
    ax, ay = el["Apply"].center
    _, _, _, _, info = env.step(f"pyautogui.click({ax}, {ay})")
    assert info["signals"][PROGRESS] and info["signals"]["milestones"] == "2/2"
    _, r, term, trunc, info = env.step("DONE")
    assert term and not trunc and r == 1.0 and info["outcome"] == 1.0 and info["evaluation"]["score"] == 1.0


def test_truncation_evaluates_the_state(env):
    env.reset(options={"task": "ns-calc-add"})
    for _ in range(7):
        _, _, term, trunc, _ = env.step("pyautogui.moveTo(1, 1)")
        assert not term and not trunc
    _, r, term, trunc, info = env.step("pyautogui.moveTo(2, 2)")
    assert trunc and not term and r == 0.0 and info["outcome"] == 0.0
    assert "step limit" in info["next_state"]["content"]


def test_fail_ends_the_episode(env):
    env.reset(options={"task": "ns-infeasible-resolution"})
    _, r, term, _, info = env.step("FAIL")
    assert term and r == 1.0
    env.reset(options={"task": "ns-form-name-alice"})
    _, r, term, _, _ = env.step("FAIL")
    assert term and r == 0.0


def test_demonstration_replays_to_success(tmp_path, monkeypatch):
    require_desktop_tools()
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path))
    task = GUIEnv.tasks("train")[0]
    demo = GUIEnv.demonstration(task)  # on the class: a temporary env records it, then it is cached
    roles = [m["role"] for m in demo]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant" and demo[-1]["content"] == "DONE"
    assert all(a == "assistant" and b == "user" for a, b in zip(roles[2:-1:2], roles[3:-1:2]))
    assert list(tmp_path.glob("gui-demos/*.json"))
    assert GUIEnv.demonstration(task) == demo  # from the cache
    e = GUIEnv()
    try:
        obs, _ = e.reset(options={"task": task})
        assert obs["content"] == demo[1]["content"]  # the demonstration shows real observations
        for m in demo[2:]:
            if m["role"] != "assistant":
                continue
            obs, r, term, trunc, info = e.step(m["content"])
        assert term and r == 1.0
    finally:
        e.close()


def test_a_demonstration_longer_than_the_step_limit_plays_whole(tmp_path, monkeypatch):
    """Demonstrations are not bound by `max_steps` (a rollout budget): a 7-action solution records whole on an env
    limited to 3 steps, and the limit is back in force afterwards."""
    require_desktop_tools()
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path))
    task = next(t for t in GUIEnv.tasks("train") if t["id"] == "ns-form-pro-plan")
    assert len(task["nextstate"]["solution"]) > 3
    e = GUIEnv(max_steps=3)
    try:
        demo = e.demonstration(task)
        assert demo[-1]["content"] == "DONE"
        assert sum(m["role"] == "assistant" for m in demo) == len(task["nextstate"]["solution"])
        assert e.max_steps == 3
        e.reset(options={"task": task})
        for _ in range(2):
            e.step("WAIT")
        _, _, term, trunc, _ = e.step("WAIT")
        assert trunc and not term
    finally:
        e.close()


def test_a_wait_window_step_waits_for_a_window_that_opens_late(env):
    """`{"wait_window": title}` in a script plays WAIT until that window is on screen and focused (an app's dialog opens
    a moment after the keys asking for it), then the script goes on; a window that never comes fails the script."""
    from envs.gui.solution import SolutionError

    base = next(t for t in GUIEnv.tasks("train") if t["id"] == "ns-form-name-alice")
    late = {**base, "config": [{"type": "launch", "parameters": {"shell": True, "command":
                                 "sleep 2; exec ns-form --out ~/Documents/signup.json"}}],
            "nextstate": {**base["nextstate"], "ready": {}}}
    # no window manager here, so nothing focuses the late window: wait for it to be listed only
    steps = [{"wait_window": "Sign-up form", "focused": False}, *base["nextstate"]["solution"]]
    messages, outcome = env.play(late, steps=steps)
    actions = [m["content"] for m in messages if m["role"] == "assistant"]
    assert outcome == 1.0 and actions[0] == "WAIT" and 1 <= actions.count("WAIT") <= 6, actions
    assert len(actions) == actions.count("WAIT") + len(base["nextstate"]["solution"])
    with pytest.raises(SolutionError, match="no focused window 'Nowhere' after 2 WAITs"):
        env.play(base, steps=[{"wait_window": "Nowhere", "max_waits": 2}, "DONE"])
    # an element that never comes fails the script too, naming what holds the focus instead
    with pytest.raises(SolutionError, match=r"no element 'Nowhere' \(push button\) after 1 WAITs; .*focused elements"):
        env.play(base, steps=[{"wait_element": "Nowhere", "role": "push button", "max_waits": 1}, "DONE"])
