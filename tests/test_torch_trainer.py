"""The torch Trainer backend: loss = train/loss.py on the whole batch, exact gradient accumulation, learning, resume."""

import asyncio
import random

import pytest
import torch

from rollout.policy.base import SamplingParams, WeightUpdate
from rollout.policy.local import LocalPolicy
from rollout.policy.sampler import RowSampling, sample
from train.backends import Trainer
from train.backends.microbatch import pack_by_token_budget
from train.backends.torch_backend import TorchTrainer
from train.config import LossConfig, TorchTrainerConfig
from train.loss import policy_loss
from train.records import TrainSample
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from toy_conversations import addition_conversations

VOCAB = 200


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


def model(seed=0):
    cfg = tiny_qwen3_config(VOCAB)
    cfg.initializer_range = 0.1  # logprobs spread enough that ratios and clipping are exercised
    return build_model(cfg, seed=seed)


def hand_batch(seed=0, n=5):
    """Samples of different lengths: a prompt (no loss), then output tokens with advantages and rollout logprobs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, o = rng.randint(2, 12), rng.randint(1, 10)
        tokens = [rng.randrange(3, VOCAB) for _ in range(p + o)]
        adv = rng.choice([1.5, -0.7, 0.3, -2.0])
        out.append(
            TrainSample(
                tokens=tokens,
                loss_mask=[0] * p + [1] * o,
                advantages=[0.0] * p + [adv] * o,
                # far from the current logprobs (~ -5.3): ratios well away from 1, both clip sides hit
                rollout_logprobs=[0.0] * p + [rng.uniform(-6.0, -4.6) for _ in range(o)],
                group_id=f"g{i % 2}",
                step_index=i,
            )
        )
    return out


def direct_loss(m, ref, batch, cfg):
    """The batch's loss computed in one piece, straight from train/loss.py."""
    width = max(len(s.tokens) for s in batch)

    def pad(rows, v):
        return torch.tensor([r + [v] * (width - len(r)) for r in rows])

    ids = pad([s.tokens for s in batch], 0)
    mask = pad([s.loss_mask for s in batch], 0).float()[:, 1:]
    adv = pad([s.advantages for s in batch], 0.0)[:, 1:]
    old = pad([s.rollout_logprobs for s in batch], 0.0)[:, 1:]

    def logprobs(net):
        logits = net(input_ids=ids).logits[:, :-1].float() / cfg.temperature
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    with torch.no_grad():
        ref_lp = logprobs(ref)
    return policy_loss(logprobs(m), old, adv, mask, ref_lp, LossConfig(cfg.clip_low, cfg.clip_high, cfg.kl_coef))


def grads(m):
    return {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}


def test_implements_the_trainer_protocol():
    assert isinstance(TorchTrainer(model()), Trainer)


def test_loss_and_gradient_equal_a_direct_computation():
    cfg = TorchTrainerConfig(micro_batch_tokens=24, kl_coef=0.05)  # several micro-batches
    trainer = TorchTrainer(model(), cfg)
    with torch.no_grad():  # make the KL reference differ from the policy so the k3 term is not zero
        for p in trainer.ref_model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    batch = hand_batch()
    assert len(pack_by_token_budget([len(s.tokens) for s in batch], 24)) > 1
    got = trainer.accumulate_gradients(batch)

    reference = model()
    loss, m = direct_loss(reference, trainer.ref_model, batch, cfg)
    loss.backward()
    assert got["loss"] == pytest.approx(loss.item(), abs=1e-5)
    assert got["kl"] == pytest.approx(m["kl"], abs=1e-6) and m["kl"] > 1e-4
    assert got["clip_frac"] == pytest.approx(m["clip_frac"]) and 0 < m["clip_frac"] < 1
    g_trainer, g_ref = grads(trainer.model), grads(reference)
    assert g_trainer.keys() == g_ref.keys()
    for k in g_ref:
        assert torch.allclose(g_trainer[k], g_ref[k], atol=1e-5), k


def test_gradient_accumulation_equals_one_big_batch():
    batch = hand_batch(seed=1, n=7)
    small = TorchTrainer(model(), TorchTrainerConfig(micro_batch_tokens=1, lr=1e-3))  # one sample per micro-batch
    big = TorchTrainer(model(), TorchTrainerConfig(micro_batch_tokens=10**6, lr=1e-3))
    ms, mb = small.accumulate_gradients(batch), big.accumulate_gradients(batch)
    assert ms["loss"] == pytest.approx(mb["loss"], abs=1e-6)
    gs, gb = grads(small.model), grads(big.model)
    assert max(float((gs[k] - gb[k]).abs().max()) for k in gb) < 1e-5
    for t in (small, big):
        t.optimizer.zero_grad(set_to_none=True)
    # the full step reports the same loss and clips the same global gradient norm
    rs, rb = small.train_step(batch), big.train_step(batch)
    assert rs["loss"] == pytest.approx(rb["loss"], abs=1e-6)
    assert rs["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-5)
    assert rs["tokens"] == rb["tokens"] == sum(len(s.tokens) for s in batch)


def test_a_step_moves_logprobs_in_the_direction_of_the_advantage():
    m = model()
    trainer = TorchTrainer(m, TorchTrainerConfig(lr=1e-2, kl_coef=0.0))
    tokens = [5, 6, 7, 8, 9, 10]

    def logprob_of_last(net):
        with torch.no_grad():
            logits = net(input_ids=torch.tensor([tokens])).logits[0, -2]
        return float(torch.log_softmax(logits, -1)[tokens[-1]])

    before = logprob_of_last(m)
    up = TrainSample(tokens, [0, 0, 0, 0, 0, 1], [0.0] * 5 + [1.0], [0.0] * 5 + [before])
    metrics = trainer.train_step([up])
    after = logprob_of_last(m)
    assert after > before + 0.05
    assert metrics["rollout_logprob_diff"] < 1e-5  # on-policy: the recomputed logprob is the rollout one
    down = TrainSample(tokens, [0, 0, 0, 0, 0, 1], [0.0] * 5 + [-1.0], [0.0] * 5 + [after])
    trainer.train_step([down])
    assert logprob_of_last(m) < after - 0.05
    assert trainer.version == 2


def test_sampler_logprobs_are_on_policy_for_the_trainer():
    m = model(seed=3)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [20]]
    outs = sample(
        m, prompts, RowSampling(temperature=0.9, max_new_tokens=16), generator=torch.Generator().manual_seed(0)
    )
    batch = [
        TrainSample(
            p + o.output_ids,
            [0] * len(p) + [1] * len(o.output_ids),
            [0.0] * len(p) + [1.0] * len(o.output_ids),
            [0.0] * len(p) + o.logprobs,
        )
        for p, o in zip(prompts, outs)
    ]
    trainer = TorchTrainer(m, TorchTrainerConfig(temperature=0.9, micro_batch_tokens=16))
    metrics = trainer.train_step(batch)
    assert metrics["rollout_logprob_diff"] < 1e-4 and metrics["rollout_logprob_diff_max"] < 1e-4
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["clip_frac"] == 0.0


def test_minibatches_and_epochs_count_optimizer_steps_but_one_version():
    trainer = TorchTrainer(model(), TorchTrainerConfig(ppo_epochs=2, minibatches=3, lr=1e-4))
    metrics = trainer.train_step(hand_batch(n=6))
    assert metrics["optimizer_steps"] == 6 and trainer.version == 1 and metrics["version"] == 1
    assert metrics["samples_used"] == 6 and metrics["grad_norm"] > 0


def test_recomputed_old_logprobs_make_the_update_independent_of_the_rollout_logprobs():
    # trainer.old_logprobs=recompute: the sampler's logprobs (which vary in their last bits with its batching) play no
    # part; the update equals one whose rollout logprobs were the trainer's own
    batch = hand_batch(seed=2)
    trainer = TorchTrainer(model(), TorchTrainerConfig(lr=1e-3))
    exact = [TrainSample(s.tokens, s.loss_mask, s.advantages, [0.0] + lp[1:], s.group_id, s.step_index)
             for s, lp in zip(batch, trainer.compute_logprobs(batch))]
    cfg = TorchTrainerConfig(lr=1e-3, old_logprobs="recompute")
    a, b = TorchTrainer(model(), cfg), TorchTrainer(model(), TorchTrainerConfig(lr=1e-3))
    ma, mb = a.train_step(batch), b.train_step(exact)
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-6)
    wa, wb = a.state_dict(), b.state_dict()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wb) < 1e-6
    assert ma["rollout_logprob_diff"] > 0.1  # hand_batch's rollout logprobs are far from the model's
    with pytest.raises(ValueError, match="old_logprobs"):
        TorchTrainerConfig(old_logprobs="sampler")


def test_a_batch_without_loss_tokens_changes_nothing():
    trainer = TorchTrainer(model())
    before = trainer.state_dict()
    s = TrainSample([1, 2, 3], [1, 0, 0], [1.0, 0.0, 0.0], [0.0] * 3)  # the first token cannot be scored
    metrics = trainer.train_step([s])
    assert metrics["skipped"] == 1.0 and trainer.version == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.state_dict().items())


def test_bf16_autocast_runs():
    trainer = TorchTrainer(model(), TorchTrainerConfig(bf16=True, lr=1e-4))
    metrics = trainer.train_step(hand_batch(n=3))
    assert torch.isfinite(torch.tensor(metrics["loss"])) and trainer.version == 1


def test_checkpoint_resume_is_exact(tmp_path):
    cfg = TorchTrainerConfig(lr=1e-3, kl_coef=0.05)
    a = TorchTrainer(model(seed=0), cfg)
    a.train_step(hand_batch(seed=1))
    a.save_checkpoint(tmp_path / "ckpt")
    b = TorchTrainer(model(seed=9), cfg)  # different weights, fresh optimizer, version 0
    b.load_checkpoint(tmp_path / "ckpt")
    assert b.version == 1
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    ref_a, ref_b = a.ref_model.state_dict(), b.ref_model.state_dict()
    assert all(torch.equal(v, ref_b[k]) for k, v in ref_a.items())  # the KL reference is the run's initial model
    batch = hand_batch(seed=2)
    ma, mb = a.train_step(batch), b.train_step(batch)
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-7)
    assert all(torch.allclose(v, b.state_dict()[k], atol=1e-7) for k, v in a.state_dict().items())
    with pytest.raises(FileNotFoundError, match="not a complete trainer checkpoint"):
        b.load_checkpoint(tmp_path / "nothing")


def test_exported_weights_reach_a_local_policy(tmp_path):
    convs = addition_conversations(50)
    tok = build_tokenizer([render_chat(c) for c in convs], vocab_size=400)
    cfg = tiny_qwen3_config(len(tok))
    cfg.initializer_range = 0.2
    trainer = TorchTrainer(build_model(cfg, seed=1), TorchTrainerConfig(lr=1e-2), tokenizer=tok)
    snapshot = trainer.state_dict()
    trainer.train_step(hand_batch(seed=4))
    assert any(not torch.equal(snapshot[k], v) for k, v in trainer.state_dict().items())  # a copy, not a view
    path = trainer.export_weights(tmp_path / "v1")
    greedy = SamplingParams(greedy=True, max_new_tokens=10)

    async def main():
        from_disk = LocalPolicy.from_pretrained(path)
        live = LocalPolicy(build_model(cfg, seed=1), tok)
        await live.update_weights(WeightUpdate(version=trainer.version, state_dict=trainer.state_dict()))
        outs = [await p.generate(convs[0][:2], greedy) for p in (from_disk, live)]
        for p in (from_disk, live):
            await p.close()
        return outs

    a, b = asyncio.run(main())
    assert a.output_ids == b.output_ids and b.weight_version == 1


def test_gradient_checkpointing_gives_the_same_step():
    """trainer.gradient_checkpointing=true (HF's, non-reentrant: each decoder layer recomputed in backward) changes what
    is kept, not the step: the same loss, gradient norm and updated weights within 1e-6 (fp32)."""
    results = []
    for on in (False, True):
        tr = TorchTrainer(model(), TorchTrainerConfig(device="cpu", gradient_checkpointing=on, micro_batch_tokens=32))
        assert tr.model.is_gradient_checkpointing == on
        metrics = tr.train_step(hand_batch())
        results.append((metrics, {k: v.clone() for k, v in tr.model.state_dict().items()}))
    (m0, w0), (m1, w1) = results
    assert abs(m0["loss"] - m1["loss"]) < 1e-6 and abs(m0["grad_norm"] - m1["grad_norm"]) < 1e-6
    assert m0["grad_norm"] > 0
    for k in w0:
        assert (w0[k] - w1[k]).abs().max() < 1e-6, k
