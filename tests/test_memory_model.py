"""train.memory_model: hand-computed tiny cases, monotonicity properties, and what the formulas say of Qwen3-4B."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from train.memory_model import (
    GIB,
    MemoryBudgetError,
    ModelShape,
    check_fits,
    fits,
    layer_activation_bytes,
    rank_memory,
    refusal,
    saved_tensor_bytes,
)

TINY = ModelShape(layers=2, hidden=8, ffn_hidden=16, heads=4, kv_heads=2, head_dim=2, vocab=10, tied_embeddings=True)
QWEN3_4B = ModelShape(
    layers=36, hidden=2560, ffn_hidden=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936, tied_embeddings=True
)
# configs/experiment/table4_toolcall_qwen3_4b.yaml before it stated its GPU: micro_batch_tokens 16384, dp_size 4, tp 1, bf16, kl 0.01 (a
# reference model), megatron's optimizer without the distributed optimizer; 16384 is the max context (one sample)
TABLE4 = dict(tp=1, dp=4, micro_batch_tokens=16384, max_sample_tokens=16384, attention="local", recompute="none",
              distributed_optimizer=False, reference_model=True)


def test_params_by_hand():
    # per layer: qkv 8*(4+4)*2=128, proj 4*2*8=64, fc1 8*32=256, fc2 16*8=128, norms 2*8 + 2*2=20 -> 596
    # tied embedding 10*8=80, final norm 8
    assert TINY.params == 2 * 596 + 80 + 8
    untied = dataclasses.replace(TINY, tied_embeddings=False)
    assert untied.params == TINY.params + 80
    # tp=2: split weights halve, norms stay; vocab 10 splits evenly
    assert TINY.params_per_rank(2) == 2 * (64 + 32 + 128 + 64 + 20) + 40 + 8


def test_static_state_by_hand():
    p = TINY.params
    m = rank_memory(TINY, micro_batch_tokens=4, max_sample_tokens=4)
    assert (m.weights, m.grads, m.main_weights, m.optimizer, m.reference) == (2 * p, 4 * p, 4 * p, 8 * p, 2 * p)
    m = rank_memory(TINY, dp=4, micro_batch_tokens=4, max_sample_tokens=4, distributed_optimizer=True,
                    reference_model=False, param_dtype="fp32")
    assert (m.weights, m.grads, m.main_weights, m.optimizer, m.reference) == (4 * p, 4 * p, 0, 2 * p, 0)


def test_layer_activations_by_hand():
    # bf16, fused norm, local attention, seq 3 (a_t=4, g_t=2, d=2, h=8, f=16):
    # norms 2*(2*8+4)=40, linear inputs 2*2*8=32, q-norm 2*2*4+4*4=32, k-norm 2*2*2+4*2=16, rest of qkv kept by the
    # k view 2*(4+4)*2 - 2*2*2 = 24, proj input 2*8=16, SwiGLU 5*2*16=160, q/k/v repeated 3*2*8=48 -> 368;
    # scores 4 heads * 3 positions * (4 + 2) = 72
    per = layer_activation_bytes(TINY, tp=1, act=2, norm="fused", attention="local", seq=3)
    assert per == {"linear": 368, "scores": 72, "rope_per_position": 16}
    fused = layer_activation_bytes(TINY, tp=1, act=2, norm="fused", attention="fused", seq=3)
    # fused attention: q, k, v at g heads, output: 2*(8+4)*2=48 ... minus the repeated 48, plus logsumexp 4*4=16
    assert fused == {"linear": 368 - 48 + 48 + 16, "scores": 0, "rope_per_position": 16}
    # saved tensors: 2 layers of (3 tokens * (368 + 72) + 3 * 16) + edges 3 * (2*8+4 + 2*8 + 8) + mask 9 + softmax
    # 3 * 10 * 4
    assert saved_tensor_bytes(TINY, rows=1, seq=3) == 2 * (3 * 440 + 48) + 3 * 44 + 9 + 120


def test_micro_batch_geometry_and_logits():
    # 4 rows of 4 tokens in a 16-token budget; logits: 16 tokens * 10 columns * 4 bytes * 3 (policy softmax, the
    # reference's fp32 logits and softmax)
    m = rank_memory(TINY, micro_batch_tokens=16, max_sample_tokens=4)
    assert m.logits == 16 * 10 * 4 * 3
    assert rank_memory(TINY, micro_batch_tokens=16, max_sample_tokens=4, reference_model=False).logits == 16 * 10 * 8
    # a sample longer than the budget is a micro-batch of its own
    assert rank_memory(TINY, micro_batch_tokens=2, max_sample_tokens=4).logits == 4 * 10 * 4 * 3


shapes = st.builds(
    lambda layers, kv, group, d, f, h, v, tied: ModelShape(layers, h, 8 * f, kv * group * 8, kv * 8, d, v, tied),
    st.integers(1, 48), st.integers(1, 4), st.integers(1, 4), st.sampled_from([16, 64, 128]), st.integers(1, 512),
    st.sampled_from([256, 1024, 4096]), st.integers(1000, 200000), st.booleans(),
)
knobs = st.fixed_dictionaries({
    "micro_batch_tokens": st.integers(1, 32768),
    "max_sample_tokens": st.integers(1, 32768),
    "attention": st.sampled_from(["local", "fused"]),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "reference_model": st.booleans(),
    "norm": st.sampled_from(["fused", "composite"]),
})


@settings(max_examples=60, deadline=None)
@given(shapes, knobs, st.sampled_from([1, 2, 4, 8]))
def test_more_tp_less_per_rank(shape, kw, tp):
    a = rank_memory(shape, tp=1, **kw)
    b = rank_memory(shape, tp=tp, **kw)
    assert b.weights <= a.weights and b.activations <= a.activations and b.attention_scores <= a.attention_scores
    if tp > 1:
        assert b.weights < a.weights and b.total < a.total


@settings(max_examples=60, deadline=None)
@given(shapes, knobs, st.sampled_from([2, 4, 8, 16]))
def test_distributed_optimizer_shards_by_dp(shape, kw, dp):
    a = rank_memory(shape, dp=dp, distributed_optimizer=False, **kw)
    b = rank_memory(shape, dp=dp, distributed_optimizer=True, **kw)
    assert abs(b.optimizer * dp - a.optimizer) < dp and abs(b.main_weights * dp - a.main_weights) < dp
    assert (b.weights, b.grads, b.reference, b.dynamic) == (a.weights, a.grads, a.reference, a.dynamic)


@settings(max_examples=60, deadline=None)
@given(shapes, knobs)
def test_fused_attention_has_no_quadratic_term(shape, kw):
    kw = {**kw, "attention": "fused"}
    a = rank_memory(shape, **kw)
    assert a.attention_scores == 0
    # doubling the sample length (and the budget) at most doubles the activations: nothing grows as s^2
    b = rank_memory(shape, **{**kw, "micro_batch_tokens": 2 * kw["micro_batch_tokens"],
                              "max_sample_tokens": 2 * kw["max_sample_tokens"]})
    assert b.activations <= 2 * a.activations + 1
    local = rank_memory(shape, **{**kw, "attention": "local"})
    assert local.attention_scores > 0 and local.total > a.total - a.activations + local.activations - 1


@settings(max_examples=60, deadline=None)
@given(shapes.filter(lambda s: s.layers >= 2), knobs.filter(lambda k: k["max_sample_tokens"] >= 128))
def test_recompute_reduces_activations(shape, kw):
    # (a 1-layer model, or samples shorter than a head, can lose by recompute: the checkpointed inputs cost more
    # than what they let go)
    none, sel, full = (rank_memory(shape, **{**kw, "recompute": r}) for r in ("none", "selective", "full"))
    assert sel.activations + sel.attention_scores <= none.activations + none.attention_scores
    assert full.activations + full.attention_scores <= sel.activations + sel.attention_scores
    if kw["attention"] == "local":
        assert sel.attention_scores < none.attention_scores
    assert none.static == sel.static == full.static and none.logits == full.logits


def test_from_hf_config(tmp_path):
    qwen3 = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
             "tie_word_embeddings": True}
    assert ModelShape.from_hf_config(qwen3) == QWEN3_4B
    (tmp_path / "config.json").write_text(json.dumps(qwen3))
    assert ModelShape.from_hf_config(tmp_path) == QWEN3_4B
    vl = {"model_type": "qwen3_vl", "tie_word_embeddings": False,
          "text_config": {**qwen3, "model_type": "qwen3_vl_text", "tie_word_embeddings": True}}
    assert ModelShape.from_hf_config(vl) == dataclasses.replace(QWEN3_4B, tied_embeddings=False)
    no_head_dim = {k: v for k, v in qwen3.items() if k != "head_dim"}
    assert ModelShape.from_hf_config(no_head_dim).head_dim == 2560 // 32


def test_qwen3_4b_table4_settings_do_not_fit_one_gpu():
    assert 3.9e9 < QWEN3_4B.params < 4.1e9  # "Qwen3-4B": the shape is the one meant
    m = rank_memory(QWEN3_4B, **TABLE4)
    assert not fits(m, 141, headroom=0.0) and m.total > 141 * GIB  # more than even an H200 with no headroom
    # the s x s softmax outputs alone outweigh the GPU: 36 layers x 32 heads x 16384^2 x (4 + 2) bytes
    assert m.attention_scores >= 36 * 32 * 16384**2 * 6
    # static state without the distributed optimizer: 2 + 4 + 4 + 8 (+ 2 reference) bytes per parameter
    assert m.static == 20 * QWEN3_4B.params
    with pytest.raises(MemoryBudgetError, match="exceeds"):
        check_fits(m, 141)
    message = refusal(m, 80)
    assert "attention_scores" in message and f"{m.gib('total'):.1f} GiB" in message


def test_qwen3_4b_what_fits_an_h100():
    fitting = {**TABLE4, "dp": 8, "attention": "fused", "recompute": "full", "distributed_optimizer": True}
    m = rank_memory(QWEN3_4B, **fitting)
    assert fits(m, 80)
    check_fits(m, 80)
    # each lever is needed: undo any one and it no longer fits 80 GiB
    for undo in ({"attention": "local"}, {"recompute": "selective"}, {"recompute": "none"}):
        assert not fits(rank_memory(QWEN3_4B, **{**fitting, **undo}), 80)
    # fused + selective keeps every layer's linear activations: a 16k-token micro-batch does not fit, a smaller one
    # does (the formulas' own crossing point, found here rather than asserted from elsewhere)
    sel = {**fitting, "recompute": "selective"}
    assert not fits(rank_memory(QWEN3_4B, **sel), 80)
    budgets = [b for b in (1024, 2048, 4096, 8192, 16384) if fits(rank_memory(
        QWEN3_4B, **{**sel, "micro_batch_tokens": b, "max_sample_tokens": b}), 80)]
    assert budgets and max(budgets) < 16384


def test_bad_arguments():
    with pytest.raises(ValueError):
        rank_memory(TINY, micro_batch_tokens=4, max_sample_tokens=4, attention="flash")
    with pytest.raises(ValueError):
        rank_memory(TINY, tp=4, micro_batch_tokens=4, max_sample_tokens=4)  # 4 does not divide kv_heads=2
    with pytest.raises(ValueError):
        ModelShape(layers=1, hidden=8, ffn_hidden=8, heads=3, kv_heads=2, head_dim=2, vocab=4, tied_embeddings=True)
    with pytest.raises(ValueError):
        fits(rank_memory(TINY, micro_batch_tokens=4, max_sample_tokens=4), 80, headroom=1.0)
