"""MegatronTrainer on the CPU (gloo, world size 1) against a plain-torch reference: HF Qwen3ForCausalLM + train/loss.py.

The reference is written here on purpose (independent of the backend's packing and micro-batching): one padded batch,
HF attention mask, log_softmax, the same policy_loss, torch.optim.AdamW.
"""

from __future__ import annotations

import copy

import pytest
import torch

import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from train.backends import Trainer  # noqa: E402
from train.backends.megatron_backend import MegatronTrainer  # noqa: E402
from train.backends.megatron_convert import hf_to_megatron, megatron_to_hf  # noqa: E402
from train.loss import policy_loss  # noqa: E402
from train.config import LossConfig, MegatronTrainerConfig  # noqa: E402
from train.records import TrainSample  # noqa: E402

from tiny_hf import QWEN3_TINY, random_norms_qwen3  # noqa: E402

TINY = QWEN3_TINY


def tiny_hf(tied: bool, seed: int = 0) -> Qwen3ForCausalLM:
    return random_norms_qwen3(tied, seed).float()


def make_samples(seed: int = 1, lengths=(12, 23, 7, 16, 30)) -> list[TrainSample]:
    """Prompt tokens masked, output tokens with an advantage of either sign and rollout logprobs near the model's."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        tokens = torch.randint(0, TINY["vocab_size"], (n,), generator=g).tolist()
        prompt = max(1, n // 3)
        mask = [0] * prompt + [1] * (n - prompt)
        adv = 1.0 if i % 2 == 0 else -0.7
        old = [0.0] * prompt + (-6.9 + 0.3 * torch.randn(n - prompt, generator=g)).tolist()
        out.append(TrainSample(tokens, mask, [0.0] * prompt + [adv] * (n - prompt), old, group_id=f"g{i % 2}", step_index=i))
    return out


def trainer_for(hf: Qwen3ForCausalLM, **kw) -> MegatronTrainer:
    return MegatronTrainer.from_hf_model(hf, MegatronTrainerConfig(**{"micro_batch_tokens": 64, "device": "cpu", **kw}))


def padded(samples: list[TrainSample]):
    t = max(len(s.tokens) for s in samples)
    b = len(samples)
    tokens = torch.zeros(b, t, dtype=torch.long)
    attn = torch.zeros(b, t, dtype=torch.long)
    mask, adv, old = (torch.zeros(b, t - 1) for _ in range(3))
    for i, s in enumerate(samples):
        n = len(s.tokens)
        tokens[i, :n] = torch.tensor(s.tokens)
        attn[i, :n] = 1
        mask[i, : n - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        adv[i, : n - 1] = torch.tensor(s.advantages[1:])
        old[i, : n - 1] = torch.tensor(s.rollout_logprobs[1:])
    return tokens, attn, mask, adv, old


def hf_logprobs(model: Qwen3ForCausalLM, tokens: torch.Tensor, attn: torch.Tensor, temperature: float = 1.0):
    logits = model(input_ids=tokens, attention_mask=attn).logits.float() / temperature
    return logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]


def reference_loss(model, ref_model, samples, loss_cfg: LossConfig):
    tokens, attn, mask, adv, old = padded(samples)
    lp = hf_logprobs(model, tokens, attn)
    ref = None
    if loss_cfg.kl_coef:
        with torch.no_grad():
            ref = hf_logprobs(ref_model, tokens, attn)
    return policy_loss(lp, old, adv, mask, ref, loss_cfg)


def reference_clip(model, max_norm: float) -> float:
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))


def megatron_grads_as_hf(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    grads = {k: p.grad.detach().clone() for k, p in trainer.model.named_parameters()}
    return megatron_to_hf([grads], trainer.shape)


# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True])
def test_logprobs_match_hf_model_within_1e4(tied: bool):
    hf = tiny_hf(tied)
    samples = make_samples()
    with trainer_for(hf, kl_coef=0.0) as tr:
        assert isinstance(tr, Trainer)
        got = tr.compute_logprobs(samples)
        # the model accepts exactly the converted state dict (strict) and converts back bit for bit
        keys = set(tr.model.state_dict())
        assert keys == set(hf_to_megatron(hf.state_dict(), tr.shape)[0])
        back = tr.state_dict()
        assert all(torch.equal(back[k], v) for k, v in hf.state_dict().items())
    tokens, attn, *_ = padded(samples)
    with torch.no_grad():
        want = hf_logprobs(hf, tokens, attn)
    worst = 0.0
    for i, s in enumerate(samples):
        n = len(s.tokens)
        assert len(got[i]) == n and got[i][0] == 0.0
        worst = max(worst, (torch.tensor(got[i][1:]) - want[i, : n - 1]).abs().max().item())
    assert worst < 1e-4, worst


def test_logprobs_at_the_sampling_temperature():
    hf = tiny_hf(False)
    samples = make_samples(seed=2)
    with trainer_for(hf, kl_coef=0.0, temperature=0.6) as tr:
        got = tr.compute_logprobs(samples)
    tokens, attn, *_ = padded(samples)
    with torch.no_grad():
        want = hf_logprobs(hf, tokens, attn, temperature=0.6)
        plain = hf_logprobs(hf, tokens, attn)
    for i, s in enumerate(samples):
        n = len(s.tokens)
        assert torch.allclose(torch.tensor(got[i][1:]), want[i, : n - 1], atol=1e-4)
        assert not torch.allclose(torch.tensor(got[i][1:]), plain[i, : n - 1], atol=1e-2)


def test_train_step_loss_grads_and_update_match_torch_reference():
    """Loss, metrics, clipped gradients and the AdamW update of one step vs HF + train/loss.py + torch.optim.AdamW.

    Tolerances: logprobs/loss/grad-norm agree to fp32 rounding of two different kernels (~1e-6 relative), so 1e-5.
    The AdamW update: lr = 1e-3 so that the update (~lr) is far above fp32 weight resolution (~1e-9 at |w|~0.05);
    the first Adam step moves w by lr*g/(|g|+eps) + lr*wd*w, which is insensitive to relative gradient errors
    except where |g| ~ eps (1e-8), so the updates must agree to 1e-3*lr = 1e-6 (a wrong gradient sign, a missing
    decay or a skipped clip moves elements by ~lr, 1000x more). Elements with |g| < 100*eps are left out of that check:
    there lr*g/(|g|+eps) turns a 1e-10 gradient difference (measured: ~1e-8 of the largest gradient) into ~1e-5.
    """
    hf = tiny_hf(False)
    samples = make_samples()
    kw = dict(lr=1e-3, grad_clip=0.5, kl_coef=0.0, micro_batch_tokens=64)
    with trainer_for(hf, **kw) as tr:
        before = copy.deepcopy(hf.state_dict())
        metrics = tr.train_step(samples)
        assert metrics["micro_batches"] >= 2  # the budget of 64 padded tokens forces several micro-batches
        assert tr.version == 1 and metrics["version"] == 1.0
        m_grads = megatron_grads_as_hf(tr)
        after = tr.state_dict()

    ref_model = hf
    opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    loss, ref_m = reference_loss(ref_model, None, samples, tr.cfg.loss)
    loss.backward()
    norm = reference_clip(ref_model, 0.5)
    assert norm > 0.5  # clipping is active in this test
    opt.step()

    assert metrics["loss"] == pytest.approx(ref_m["loss"], abs=1e-5)
    assert metrics["loss_tokens"] == ref_m["loss_tokens"]
    assert metrics["clip_frac"] == pytest.approx(ref_m["clip_frac"], abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(ref_m["ratio_mean"], rel=1e-5)
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)
    checked = total = 0
    for k, p in ref_model.named_parameters():
        g_ref = p.grad
        assert (m_grads[k] - g_ref).abs().max() <= 1e-5 * g_ref.abs().max() + 1e-9, k
        d_meg = after[k] - before[k]
        d_ref = p.detach() - before[k]
        # |g| >= 100x Adam's eps: the step no longer amplifies gradient rounding; g == 0 (unused embedding rows): decay only
        well_posed = (g_ref.abs() >= 1e-6) | ((g_ref == 0) & (m_grads[k] == 0))
        checked += int(well_posed.sum())
        total += well_posed.numel()
        assert (d_meg - d_ref)[well_posed].abs().max() <= 1e-6, k
        assert d_ref.abs().max() > 1e-4, k  # the step really moved this tensor
    assert checked / total > 0.99


def test_kl_uses_the_frozen_initial_model_over_two_steps():
    """Step 1: pi == pi_ref so KL = 0. Step 2: the KL term and the loss match the reference with a frozen HF copy."""
    hf = tiny_hf(True)
    ref_hf = copy.deepcopy(hf).requires_grad_(False)
    samples = make_samples(seed=3)
    kw = dict(lr=1e-3, grad_clip=1.0, kl_coef=0.5, micro_batch_tokens=48)
    with trainer_for(hf, **kw) as tr:
        m1 = tr.train_step(samples)
        m2 = tr.train_step(samples)
        assert tr.version == 2
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    seen = []
    for _ in range(2):
        opt.zero_grad()
        loss, m = reference_loss(hf, ref_hf, samples, tr.cfg.loss)
        loss.backward()
        reference_clip(hf, 1.0)
        opt.step()
        seen.append(m)
    assert m1["kl"] == 0.0 and seen[0]["kl"] == 0.0
    assert m2["kl"] > 1e-6
    assert m2["kl"] == pytest.approx(seen[1]["kl"], rel=1e-3)
    assert m2["loss"] == pytest.approx(seen[1]["loss"], abs=1e-5)


def test_micro_batch_split_does_not_change_the_loss_or_the_gradient():
    hf = tiny_hf(False)
    samples = make_samples(seed=5)
    results = []
    for budget in (4096, 2):  # one micro-batch vs one per sample
        with trainer_for(hf, kl_coef=0.0, lr=1e-3, micro_batch_tokens=budget) as tr:
            m = tr.train_step(samples)
            results.append((m, megatron_grads_as_hf(tr)))
    (m_one, g_one), (m_many, g_many) = results
    assert m_one["micro_batches"] == 1 and m_many["micro_batches"] == len(samples)
    assert m_many["loss"] == pytest.approx(m_one["loss"], abs=1e-6)
    for k in g_one:
        assert torch.allclose(g_many[k], g_one[k], rtol=1e-4, atol=1e-7), k


def test_export_weights_is_a_loadable_hf_model(tmp_path):
    hf = tiny_hf(True)
    samples = make_samples(seed=7)
    with trainer_for(hf, kl_coef=0.0, lr=1e-3) as tr:
        tr.train_step(samples)
        path = tr.export_weights(str(tmp_path / "v1"))
        want = tr.compute_logprobs(samples)
        state = tr.state_dict()
    loaded = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert loaded.config.tie_word_embeddings and loaded.config.architectures == ["Qwen3ForCausalLM"]
    assert sorted(p.name for p in tmp_path.joinpath("v1").iterdir()) == ["config.json", "model.safetensors"]
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, state[k]), k
    tokens, attn, *_ = padded(samples)
    with torch.no_grad():
        got = hf_logprobs(loaded, tokens, attn)
    for i, s in enumerate(samples):
        assert torch.allclose(got[i, : len(s.tokens) - 1], torch.tensor(want[i][1:]), atol=1e-4)


def test_from_config_builds_the_same_initial_weights_as_hf_with_the_seed():
    cfg = MegatronTrainerConfig(model_config=dict(TINY), seed=11, kl_coef=0.0, device="cpu")
    with MegatronTrainer(cfg) as tr:
        got = tr.state_dict()
    torch.manual_seed(11)
    want = Qwen3ForCausalLM(Qwen3Config(**TINY)).state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())


def test_bad_input_gives_clear_errors_and_no_update():
    hf = tiny_hf(False)
    with trainer_for(hf, kl_coef=0.0) as tr:
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 1000\)"):
            tr.train_step([TrainSample([1, 2, 5000], [0, 1, 1], [0, 1, 1], [0, -1, -1])])
        assert tr.version == 0
        masked = TrainSample([1, 2, 3], [1, 0, 0], [1.0, 0, 0], [0.0, 0, 0])  # only token 0 is marked: no target
        m = tr.train_step([masked])
        assert m["skipped"] == 1.0 and tr.version == 0
        assert tr.train_step([])["skipped"] == 1.0
    from train.backends import megatron_cpu

    assert not megatron_cpu.shims_applied()  # close() leaves torch.cuda as it found it
    with pytest.raises(ValueError, match="pp_size > 1"):
        MegatronTrainerConfig(pp_size=2)
    with pytest.raises(ValueError, match="needs a GPU"):
        trainer_for(hf, optimizer="megatron")


def test_trainer_config_group_maps_onto_the_dataclass():
    from omegaconf import OmegaConf

    from rollout.build import compose_launch_config

    group = OmegaConf.to_container(compose_launch_config(["trainer=megatron"]).trainer)
    cfg = MegatronTrainerConfig.from_mapping(group)
    assert cfg.betas == (0.9, 0.98) and cfg.lr == 2e-4 and cfg.kl_coef == 0.01 and cfg.tp_size == 1
    with pytest.raises(ValueError, match=r"unknown megatron trainer option\(s\) tp \(did you mean tp_size\?\); known: .*bf16"):
        MegatronTrainerConfig.from_mapping({**group, "tp": 2})


def test_checkpoint_resume_is_exact(tmp_path):
    """save_checkpoint -> a trainer built from other weights -> load_checkpoint: same weights, version, reference
    model and optimizer state (the next step matches the trainer that never stopped)."""
    samples = make_samples(seed=11)
    with trainer_for(tiny_hf(True, seed=0), kl_coef=0.05, lr=1e-3) as a:
        a.train_step(samples)
        a.save_checkpoint(tmp_path / "ckpt")
        next_a = a.train_step(samples)
        want = a.state_dict()
    with trainer_for(tiny_hf(True, seed=5), kl_coef=0.05, lr=1e-3) as b:
        with pytest.raises(FileNotFoundError, match="not a complete megatron trainer checkpoint"):
            b.load_checkpoint(tmp_path / "nothing")
        b.load_checkpoint(tmp_path / "ckpt")
        assert b.version == 1
        next_b = b.train_step(samples)
        got = b.state_dict()
    assert next_b["loss"] == pytest.approx(next_a["loss"], abs=1e-6)
    assert next_b["kl"] == pytest.approx(next_a["kl"], rel=1e-5) and next_a["kl"] > 0  # the reference came back too
    assert all(torch.allclose(v, got[k], atol=1e-6) for k, v in want.items())
