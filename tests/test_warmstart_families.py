"""A mix's SFT start with per-family shares (policy.warm_start.families and each stage's `families`): each family's
own number of demonstrations, offset, demonstration options and repeats in one shared SFT (rollout.policy.build)."""

import pytest

from rollout.build import plan_env
from rollout.policy.build import DemoShare, family_demonstrations, stage_demonstrations, stage_shares

CHAIN = {"name": "toolcall", "weight": 1.0, "task_set": "chain", "tools": ["calculator"]}


@pytest.fixture(scope="module")
def families():
    """Two families of one env (the chained calculator), so the test needs no desktop."""
    return plan_env({"name": "mix", "families": {"a": dict(CHAIN), "b": dict(CHAIN)}}).families


def test_a_family_entry_overrides_the_stage_values_and_merges_its_demonstration_options(families):
    stage = {"max_conversations": 4, "offset": 1, "demonstrations": {"noise": {"rates": [0.5] * 4}, "hints": None},
             "families": {"b": {"max_conversations": 2, "offset": 10, "repeat": 3,
                                "demonstrations": {"noise": {"rates": [1.0] * 4, "seed": 7}}}}}
    shares = stage_shares(families, stage, "w")
    assert shares["a"] == DemoShare(4, 1, {"noise": {"rates": [0.5] * 4}, "hints": None}, 1)
    assert shares["b"] == DemoShare(2, 10, {"noise": {"rates": [1.0] * 4, "seed": 7}, "hints": None}, 3)


@pytest.mark.parametrize("families_map, message", [
    ({"c": {"max_conversations": 1}}, r"w.families names \['c'\], which are not families of this run"),
    ({"a": {"epochs": 2}}, r"w.families.a: unknown keys \['epochs'\]"),
    ({"a": {"repeat": 0}}, r"repeat >= 1"),
])
def test_a_wrong_family_entry_is_one_clear_error(families, families_map, message):
    with pytest.raises(ValueError, match=message):
        stage_shares(families, {"max_conversations": 2, "families": families_map}, "w")


def test_each_family_gives_its_own_share_repeated_and_labelled(families):
    stage = {"max_conversations": 3,
             "families": {"b": {"offset": 5, "max_conversations": 2, "repeat": 2,
                                "demonstrations": {"noise": {"rates": [1.0] * 4}}}}}
    convs, counts, labels = stage_demonstrations(families, stage, "w")
    assert counts == {"a": 3, "b": 4} and len(convs) == 7
    a_tasks, b_tasks = families[0].train_tasks[:3], families[1].train_tasks[5:7]
    # a: its first 3 tasks, clean; b: tasks 5-6 with every step's mistake injected, each twice, in order
    assert [c[1]["content"] for c in convs[:3]] == [t["prompt"] for t in a_tasks]
    assert [c[1]["content"] for c in convs[3:]] == [t["prompt"] for t in b_tasks] * 2
    assert convs[3] == convs[5] and convs[3] != convs[4]
    clean, _, _ = family_demonstrations(families, {"a": DemoShare(0), "b": DemoShare(2, 5)})
    assert clean[0] != convs[3]  # the noise reached family b's conversations
    # the step labels: the clean family's "ok" and the noisy family's mistakes, both counted
    assert set(labels[0]) == {"ok", "flipped_op"} and labels[0]["flipped_op"] == pytest.approx(4 / 7)


def test_a_family_left_out_of_a_stage_gives_nothing(families):
    stage = {"max_conversations": 2, "families": {"a": {"max_conversations": 0}}}
    convs, counts, _ = stage_demonstrations(families, stage, "w")
    assert counts == {"a": 0, "b": 2} and len(convs) == 2
