"""HF Qwen3 <-> megatron-core state dict conversion: exact round trips, the fused layouts, TP sharding, clear errors.

Pure tensor tests (no process group). That megatron *computes* the same function with these weights is checked in
test_megatron_backend.py (logprobs equal to the HF model's).
"""

from __future__ import annotations

import pytest
import torch

from transformers import Qwen3Config  # noqa: E402

from train.backends.megatron_convert import (  # noqa: E402
    ConversionError,
    Qwen3Shape,
    fuse_gate_up,
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
)

from tiny_hf import QWEN3_TINY, random_norms_qwen3  # noqa: E402

TINY = QWEN3_TINY


def tiny_hf(tied: bool, seed: int = 0, **over) -> tuple[Qwen3Config, dict[str, torch.Tensor]]:
    model = random_norms_qwen3(tied, seed, **over)
    return model.config, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_round_trip_hf_megatron_hf_is_bitwise(tied: bool, tp: int):
    cfg, hf = tiny_hf(tied, num_key_value_heads=4 if tp == 4 else 2)
    s = Qwen3Shape.from_hf_config(cfg)
    shards = hf_to_megatron(hf, s, tp)
    assert len(shards) == tp
    back = megatron_to_hf(shards, s)
    assert set(back) == set(hf)
    for k in hf:
        assert back[k].dtype == hf[k].dtype and torch.equal(back[k], hf[k]), k
    if tied:
        assert back["lm_head.weight"] is back["model.embed_tokens.weight"]
        assert all("output_layer.weight" not in sd for sd in shards)


@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_megatron_hf_megatron_is_bitwise(tp: int):
    cfg, hf = tiny_hf(False)
    s = Qwen3Shape.from_hf_config(cfg)
    shards = hf_to_megatron(hf, s, tp)
    again = hf_to_megatron(megatron_to_hf(shards, s), s, tp)
    for a, b in zip(shards, again):
        assert set(a) == set(b)
        for k in a:
            assert (a[k] is None and b[k] is None) or torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("tied", [False, True])
def test_a_vocabulary_that_does_not_divide_by_tp_is_padded_with_zero_rows_and_cut_off_again(tied: bool):
    cfg, hf = tiny_hf(tied, num_key_value_heads=4, vocab_size=1002)
    s = Qwen3Shape.from_hf_config(cfg)
    assert s.padded_vocab_size(4) == 1004 and s.padded_vocab_size(2) == 1002
    shards = hf_to_megatron(hf, s, 4)
    emb = [sd["embedding.word_embeddings.weight"] for sd in shards]
    assert [e.shape[0] for e in emb] == [251] * 4
    assert torch.equal(torch.cat(emb)[:1002], hf["model.embed_tokens.weight"])
    assert torch.count_nonzero(emb[-1][-2:]) == 0  # the two padded rows
    if not tied:
        assert torch.count_nonzero(shards[-1]["output_layer.weight"][-2:]) == 0
    back = megatron_to_hf(shards, s)
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_bf16_round_trip_keeps_dtype_and_bits():
    cfg, hf = tiny_hf(False)
    hf = {k: v.to(torch.bfloat16) for k, v in hf.items()}
    s = Qwen3Shape.from_hf_config(cfg)
    back = megatron_to_hf(hf_to_megatron(hf, s, 2), s)
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], hf[k]) for k in hf)


def test_qkv_rows_are_grouped_per_kv_head_and_sharded_by_group():
    # heads 4, kv 2 -> 2 query heads per group; head_dim 2, hidden 3. Row values name their origin.
    s = Qwen3Shape(1, 3, 4, num_heads=4, num_kv_heads=2, head_dim=2, vocab_size=8, tied_embeddings=True)
    q = torch.arange(8).float()[:, None].expand(8, 3)  # q rows 0..7 (head h = rows 2h, 2h+1)
    k = 100 + torch.arange(4).float()[:, None].expand(4, 3)
    v = 200 + torch.arange(4).float()[:, None].expand(4, 3)
    (full,) = fuse_qkv(q, k, v, s, tp=1)
    expected = [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]  # [q_g0 heads, k_g0, v_g0, q_g1 ...]
    assert full[:, 0].tolist() == expected
    r0, r1 = fuse_qkv(q, k, v, s, tp=2)  # TP rank r owns KV group r with its query heads
    assert r0[:, 0].tolist() == expected[:8] and r1[:, 0].tolist() == expected[8:]


def test_fc1_shards_are_gate_then_up_on_every_rank():
    gate = torch.arange(4).float()[:, None]
    up = 10 + torch.arange(4).float()[:, None]
    r0, r1 = fuse_gate_up(gate, up, tp=2)
    assert r0[:, 0].tolist() == [0, 1, 10, 11] and r1[:, 0].tolist() == [2, 3, 12, 13]


def test_row_and_column_parallel_split_dims():
    cfg, hf = tiny_hf(False)
    s = Qwen3Shape.from_hf_config(cfg)
    r0, r1 = hf_to_megatron(hf, s, 2)
    assert r0["decoder.layers.0.self_attention.linear_proj.weight"].shape == (128, 64)  # row parallel: input dim
    assert r0["decoder.layers.0.mlp.linear_fc2.weight"].shape == (128, 128)
    assert r0["embedding.word_embeddings.weight"].shape == (500, 128)  # vocab split
    assert r0["output_layer.weight"].shape == (500, 128)
    assert torch.equal(r0["output_layer.weight"], hf["lm_head.weight"][:500])
    assert torch.equal(r1["decoder.layers.1.input_layernorm.weight"], hf["model.layers.1.input_layernorm.weight"])
    assert r0["decoder.layers.0.self_attention.linear_qkv._extra_state"] is None


def test_errors_name_the_problem():
    cfg, hf = tiny_hf(False)
    s = Qwen3Shape.from_hf_config(cfg)
    with pytest.raises(ConversionError, match="num_key_value_heads=2 is not divisible by tensor-parallel size 4"):
        hf_to_megatron(hf, s, 4)
    broken = dict(hf)
    del broken["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ConversionError, match="model.layers.1.mlp.up_proj.weight"):
        hf_to_megatron(broken, s)
    broken = dict(hf)
    broken["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 128)
    with pytest.raises(ConversionError, match=r"k_proj.weight: shape \(32, 128\), expected \(64, 128\)"):
        hf_to_megatron(broken, s)
    with pytest.raises(ConversionError, match="model_type='llama'"):
        from transformers import LlamaConfig

        Qwen3Shape.from_hf_config(LlamaConfig())
    with pytest.raises(ConversionError, match="attention_bias"):
        Qwen3Shape.from_hf_config(Qwen3Config(**TINY, attention_bias=True))
