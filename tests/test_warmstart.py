"""Warm start: tokenizer + tiny model + SFT, cached by a hash of the config and the conversations."""

import dataclasses
import json

import pytest
import torch

from rollout.policy.local import chat_prompt_ids
from train.config import SFTConfig
from toy_conversations import addition_conversations
from train.warmstart import INFO_FILE, cache_key, warm_start
from train.config import WarmStartConfig


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


def small_cfg(**sft):
    return WarmStartConfig(
        vocab_size=400,
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        sft=SFTConfig(epochs=1, batch_tokens=2048, progress=False, **sft),
    )


def test_second_call_loads_the_cached_result(tmp_path):
    convs = addition_conversations(40)
    cfg = small_cfg()
    m1, t1, info1 = warm_start(convs, cfg, tmp_path)
    assert not info1.cache_hit and info1.sft["steps"] > 0 and info1.vocab_size == len(t1) <= 400
    assert m1.config.vocab_size == len(t1) and info1.params == sum(p.numel() for p in m1.parameters())
    m2, t2, info2 = warm_start(convs, cfg, tmp_path)
    assert info2.cache_hit and info2.path == info1.path and info2.key == info1.key
    assert info2.sft == info1.sft  # the metrics of the run that made the weights
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert chat_prompt_ids(t1, convs[0][:4]) == chat_prompt_ids(t2, convs[0][:4])
    stored = json.loads((tmp_path / f"warmstart-{info1.key}" / INFO_FILE).read_text())
    assert stored["conversations"] == 40
    entries = [p.name for p in tmp_path.iterdir() if p.name != ".locks"]  # .locks: the builders' lock files
    assert entries == [f"warmstart-{info1.key}"]  # no temporary leftovers


def test_the_key_follows_what_shapes_the_result():
    convs = addition_conversations(10)
    base = cache_key(convs, small_cfg())
    assert cache_key(convs, small_cfg()) == base
    assert cache_key(convs[:9], small_cfg()) != base
    assert cache_key(addition_conversations(10, seed=1), small_cfg()) != base
    assert cache_key(convs, small_cfg(lr=1e-3)) != base
    assert cache_key(convs, dataclasses.replace(small_cfg(), seed=1)) != base
    no_bar = small_cfg()
    no_bar.sft.progress = True  # display only
    assert cache_key(convs, no_bar) == base
    with_image = [[{**m, "image": object()} for m in c] for c in convs]  # keys the template ignores
    assert cache_key(with_image, small_cfg()) == base


def test_config_from_a_mapping_and_empty_input():
    cfg = WarmStartConfig(sft={"epochs": 2, "lr": 1e-3})
    assert isinstance(cfg.sft, SFTConfig) and cfg.sft.epochs == 2
    with pytest.raises(ValueError, match="at least one conversation"):
        warm_start([], cfg, "/nonexistent")


def test_stages_continue_from_the_previous_weights_and_share_cached_prefixes(tmp_path):
    from train.warmstart import SFTStage

    clean, noisy, other = addition_conversations(40), addition_conversations(30, seed=5), addition_conversations(30, seed=6)
    cfg = small_cfg()
    _, _, first = warm_start(clean, cfg, tmp_path)
    m1, _, staged = warm_start(clean, cfg, tmp_path, [SFTStage(noisy, SFTConfig(epochs=1, progress=False), "noisy")])
    assert not staged.cache_hit and staged.key != first.key
    assert [s["name"] for s in staged.stages] == ["sft", "noisy"] and staged.stages[0]["key"] == first.key
    assert staged.conversations == 30 and staged.sft == staged.stages[1]["sft"]
    # the first entry was reused (not retrained): its weights differ from the staged ones
    m0, _, again = warm_start(clean, cfg, tmp_path)
    assert again.cache_hit and any(not torch.equal(a, b) for a, b in zip(m0.parameters(), m1.parameters()))
    _, _, hit = warm_start(clean, cfg, tmp_path, [SFTStage(noisy, SFTConfig(epochs=1, progress=False), "noisy")])
    assert hit.cache_hit and hit.key == staged.key and hit.stages == staged.stages
    _, _, branch = warm_start(clean, cfg, tmp_path, [SFTStage(other, SFTConfig(epochs=1, progress=False), "other")])
    assert branch.key not in (staged.key, first.key) and branch.stages[0]["key"] == first.key
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("warmstart-")]) == 3


def test_digit_runs_tokenizer_is_part_of_the_key(tmp_path):
    convs = addition_conversations(20)
    single, runs = small_cfg(), dataclasses.replace(small_cfg(), digits="runs")
    assert cache_key(convs, single) != cache_key(convs, runs)
    assert "digits" not in single.cache_fields()  # the default keeps the keys made before the option existed
    _, tok, _ = warm_start(convs, runs, tmp_path)
    assert len(tok("12 + 7")["input_ids"]) < len(tok("1 2 + 7")["input_ids"])
