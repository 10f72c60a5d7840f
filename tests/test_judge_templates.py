"""Judge prompt templates: parsing, per-family rendering, bounded context, images, errors that name the file."""

import numpy as np
import pytest

from prm.judge import StepContext
from prm.prompt import TEMPLATES_DIR, ContextLimits, JudgeTemplate, TemplateError, TemplateSet, format_history, render

FAMILIES = ("terminal", "gui", "swe", "toolcall", "generic")


def _ctx(family="terminal", **kw):
    base = dict(
        family=family,
        task_id="t1",
        instruction="Count the lines of data.csv",
        history=[
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Count the lines of data.csv"},
        ],
        action="```bash\nwc -l data.csv\n```",
        next_state={"role": "tool", "content": "42 data.csv"},
        signals={"exit_code": 0},
        step_index=0,
    )
    base.update(kw)
    return StepContext(**base)


def _text(content):
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_bundled_template_renders_the_step(family):
    t = TemplateSet().for_family(family)
    assert t.source == str(TEMPLATES_DIR / f"{family}.txt")
    p = render(t, _ctx(family), ContextLimits())
    text = "".join(_text(m["content"]) for m in p.messages)
    assert [m["role"] for m in p.messages] == ["system", "user"]
    for needle in ("Count the lines of data.csv", "wc -l data.csv", "42 data.csv", "\\boxed{1}", "\\boxed{-1}"):
        assert needle in text
    if family in ("terminal", "swe"):
        assert "code: 0" in text  # exit / return code shown as such


def test_gui_template_puts_before_and_after_screenshots_in_order():
    before, after = np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    p = render(TemplateSet().for_family("gui"), _ctx("gui", image_before=before, image_after=after), ContextLimits())
    parts = p.messages[1]["content"]
    kinds = [x["type"] for x in parts]
    assert kinds == ["text", "image", "text", "image", "text"] and p.images == 2
    assert parts[1]["image"] is before and parts[3]["image"] is after
    assert "Screen before the action" in parts[0]["text"] and "screen after the action" in parts[2]["text"]
    no_images = render(TemplateSet().for_family("gui"), _ctx("gui", image_before=before), ContextLimits(), images=False)
    assert isinstance(no_images.messages[1]["content"], str) and "(no screenshot)" in no_images.messages[1]["content"]


def test_cache_key_depends_on_inputs_and_images():
    t = TemplateSet().for_family("gui")
    a = render(t, _ctx("gui", image_after=np.zeros((4, 4, 3), np.uint8)), ContextLimits()).key
    same = render(t, _ctx("gui", image_after=np.zeros((4, 4, 3), np.uint8)), ContextLimits()).key
    other_img = render(t, _ctx("gui", image_after=np.ones((4, 4, 3), np.uint8)), ContextLimits()).key
    other_text = render(t, _ctx("gui", action="click", image_after=np.zeros((4, 4, 3), np.uint8)), ContextLimits()).key
    assert a == same and len({a, other_img, other_text}) == 3


def test_history_keeps_head_and_tail_with_markers():
    hist = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for i in range(1, 11):
        hist += [{"role": "assistant", "content": f"cmd {i} " + "x" * 500}, {"role": "tool", "content": f"out {i}"}]
    text = format_history(hist, ContextLimits(history_head=2, history_tail=2, message_chars=100))
    assert "[agent, step 1]\ncmd 1" in text and "out 1" in text
    assert "[... 16 earlier messages omitted ...]" in text
    assert "[agent, step 10]\ncmd 10" in text and "out 10" in text and "cmd 5 " not in text
    assert "characters truncated" in text  # each long message is cut in the middle
    assert "sys" not in text and "task" not in text  # system prompt and instruction are not repeated
    assert format_history(hist[:2], ContextLimits()).startswith("(none")


def test_long_action_and_output_are_truncated_with_markers():
    t = TemplateSet().for_family("terminal")
    p = render(
        t,
        _ctx(action="a" * 10_000, next_state={"role": "tool", "content": "o" * 10_000}),
        ContextLimits(action_chars=500, next_state_chars=500),
    )
    user = p.messages[1]["content"]
    assert user.count("characters truncated") == 2 and len(user) < 5000


def test_unknown_family_falls_back_to_generic_and_override_wins(tmp_path):
    assert TemplateSet().for_family("my_plugin_env").name == "generic"
    own = tmp_path / "tpl"
    own.mkdir()
    (own / "my_plugin_env.txt").write_text(
        "[user]\nTask: $instruction\nDid: $action\nGot: $next_state\n\\boxed{1} or \\boxed{-1}?\n"
    )
    assert TemplateSet(templates_dir=own).for_family("my_plugin_env").source == str(own / "my_plugin_env.txt")
    assert TemplateSet(templates_dir=own).for_family("terminal").name == "terminal"  # bundled ones still found
    forced = TemplateSet(override=own / "my_plugin_env.txt")
    p = render(forced.for_family("swe"), _ctx("swe"), ContextLimits())
    assert p.messages == [
        {
            "role": "user",
            "content": "Task: Count the lines of data.csv\nDid: ```bash\nwc -l data.csv\n```\n"
            "Got: 42 data.csv\n\\boxed{1} or \\boxed{-1}?",
        }
    ]


def test_values_with_dollar_signs_are_not_interpreted():
    p = render(TemplateSet().for_family("terminal"), _ctx(action="echo $HOME ${PATH}"), ContextLimits())
    assert "echo $HOME ${PATH}" in p.messages[1]["content"]


@pytest.mark.parametrize(
    "text, match",
    [
        ("[user]\nHi $instrucion\n", "unknown placeholder"),
        ("[system]\nonly system\n", "non-empty \\[user\\]"),
        ("stray\n[user]\nx\n", "before the first"),
        ("[user]\na\n[user]\nb\n", "more than one"),
        ("[user]\ncost: 5$\n", "unknown placeholder"),
    ],
)
def test_bad_templates_fail_with_the_file_named(tmp_path, text, match):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(TemplateError, match=match) as info:
        JudgeTemplate.load(f)
    assert str(f) in str(info.value)


def test_missing_template_file_is_a_clear_error(tmp_path):
    with pytest.raises(TemplateError, match="does not exist"):
        TemplateSet(override=tmp_path / "nope.txt")
