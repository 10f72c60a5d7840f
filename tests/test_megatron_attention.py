"""trainer.attention=fused (torch's scaled_dot_product_attention, causal per sample) against megatron's local spec on
the CPU (gloo, world size 1, fp32): the same logits, per-token logprobs, loss and parameter gradients within 1e-5
(absolute, fp32: the two only differ in the order of the softmax's floating-point sums), rows that never see each
other, and `te` refused with a clear error where transformer_engine is not installed."""

from __future__ import annotations

import pytest
import torch

import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)

from test_megatron_backend import make_samples, tiny_hf, trainer_for

from train.backends.megatron_model import (
    causal_mask, from_te_keys, to_te_keys, token_logprobs, transformer_engine_available,
)
from train.backends.microbatch import make_micro_batches

TOL = 1e-5  # fp32, absolute: logits, logprobs, loss and every gradient element


def forward_and_grads(attention: str, tied: bool, **kw):
    """(logits [B, T-1, V], per-token logprobs, loss, gradients by parameter name) of one micro-batch."""
    samples = make_samples(lengths=(12, 23, 7, 16, 30))
    trainer = trainer_for(tiny_hf(tied), attention=attention, micro_batch_tokens=10_000, kl_coef=0.0, **kw)
    try:
        (mb,) = make_micro_batches(samples, 10_000, pad_id=0)
        model = trainer.model
        model.train()
        t = mb.tokens.shape[1]
        inputs = mb.tokens[:, :-1]
        positions = torch.arange(t - 1).unsqueeze(0).expand(inputs.shape[0], -1)
        mask = causal_mask(t - 1, "cpu") if attention == "local" else None
        with torch.no_grad():
            logits = model(inputs, positions, mask).float()
        loss, _ = trainer._micro_batch_loss(model, mb)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        lp = token_logprobs(model, mb.tokens).detach()
        return logits, lp, float(loss.detach()), grads, mb
    finally:
        trainer.close()


@pytest.mark.parametrize("tied", [False, True])
def test_fused_attention_matches_local_forward_and_gradients(tied: bool):
    logits_l, lp_l, loss_l, grads_l, mb = forward_and_grads("local", tied)
    logits_f, lp_f, loss_f, grads_f, _ = forward_and_grads("fused", tied)
    real = torch.zeros(logits_l.shape[:2], dtype=torch.bool)
    for row, n in enumerate(mb.lengths):
        real[row, : n - 1] = True
    assert (logits_l - logits_f)[real].abs().max() < TOL
    assert (lp_l - lp_f)[real].abs().max() < TOL
    assert abs(loss_l - loss_f) < TOL
    assert grads_l.keys() == grads_f.keys()
    for name in grads_l:
        assert (grads_l[name] - grads_f[name]).abs().max() < TOL, name
    assert max(g.abs().max() for g in grads_l.values()) > 1e-3  # the gradients compared are not all zero


def test_fused_rows_do_not_attend_to_each_other():
    """A sample's logprobs are the same alone and in a micro-batch with longer samples (right padding, causal per
    row: no attention across samples or onto padding)."""
    samples = make_samples(lengths=(9, 30, 17))
    trainer = trainer_for(tiny_hf(False), attention="fused", micro_batch_tokens=10_000)
    try:
        together = trainer.compute_logprobs(samples)
        alone = [trainer.compute_logprobs([s])[0] for s in samples]
    finally:
        trainer.close()
    for a, b in zip(together, alone):
        assert max(abs(x - y) for x, y in zip(a, b)) < TOL


def test_te_attention_needs_transformer_engine_or_keeps_names():
    local = {"decoder.layers.0.input_layernorm.weight": 1, "decoder.layers.0.pre_mlp_layernorm.weight": 2,
             "decoder.layers.0.self_attention.linear_qkv.weight": 3}
    te = to_te_keys(local)
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in te
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in te
    assert from_te_keys({**te, "decoder.layers.0.self_attention.core_attention._extra_state": 0}) == local
    if transformer_engine_available():
        pytest.skip("transformer_engine is installed: the te spec builds (checked by benchmarks/megatron_gpu.py)")
    with pytest.raises(ImportError, match="trainer.attention='te' needs NVIDIA Transformer Engine.*'fused'"):
        trainer_for(tiny_hf(False), attention="te")


def test_attention_option_is_checked():
    from train.config import MegatronTrainerConfig

    with pytest.raises(ValueError, match="attention='flash': use one of local, fused, te"):
        MegatronTrainerConfig(attention="flash")
