"""trainer=megatron against trainer=torch: same weights, same batch -> same logprobs, loss, gradient norm and update.

Both trainers are built the way `python -m rollout.launch` builds them (rollout.build.build_trainer on the composed
Hydra config of trainer=torch / trainer=megatron), from the same tiny Qwen3 model the local policy samples with. The
batch is real chat-template token ids (prompt masked, assistant replies scored) with rollout logprobs off the current
policy, so PPO ratios are away from 1 and both clip sides are hit.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)

from rollout.build import build_trainer, compose_launch_config, plan_trainer  # noqa: E402
from rollout.policy.local import chat_prompt_ids  # noqa: E402
from train.backends import Trainer  # noqa: E402
from train.records import TrainSample  # noqa: E402
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config  # noqa: E402
from toy_conversations import addition_conversations  # noqa: E402

TEMPERATURE = 0.8


def launch_cfg(*overrides: str):
    return compose_launch_config(list(overrides))


@pytest.fixture(scope="module")
def tokenizer_and_model():
    convs = addition_conversations(60, seed=3)
    tok = build_tokenizer([render_chat(c) for c in convs], vocab_size=420)
    cfg = tiny_qwen3_config(len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    cfg.initializer_range = 0.1  # logits spread enough that the ratios and clipping are exercised
    model = build_model(cfg, seed=4)
    with torch.no_grad():  # norms start at 1.0: randomize them so a mis-mapped norm would change the outputs
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    return tok, model, convs


def chat_batch(tok, convs, n: int = 10, seed: int = 0) -> list[TrainSample]:
    """Prompt = the chat up to the last assistant turn; output = its ids + <|im_end|>; advantages of both signs."""
    rng = random.Random(seed)
    out = []
    for i, conv in enumerate(convs[:n]):
        prompt = chat_prompt_ids(tok, conv[:-1])
        output = tok.encode(conv[-1]["content"], add_special_tokens=False) + [tok.eos_token_id]
        adv = rng.choice([1.3, -0.8, 0.4, -1.7])
        out.append(
            TrainSample(
                tokens=prompt + output,
                loss_mask=[0] * len(prompt) + [1] * len(output),
                advantages=[0.0] * len(prompt) + [adv] * len(output),
                rollout_logprobs=[0.0] * (len(prompt) + len(output)),  # filled from the policy below
                group_id=f"g{i % 3}",
                step_index=i,
            )
        )
    return out


def with_rollout_logprobs(batch: list[TrainSample], logprobs: list[list[float]], noise: float, seed: int):
    """Rollout logprobs = the policy's own, shifted by noise (a slightly different sampler): ratios around 1 +- 0.3."""
    g = random.Random(seed)
    for s, lp in zip(batch, logprobs):
        s.rollout_logprobs = [(x + g.uniform(-noise, noise)) if m else 0.0 for x, m in zip(lp, s.loss_mask)]
    return batch


def build_both(model, tok, *extra: str):
    common = [
        f"sampling.temperature={TEMPERATURE}",
        "trainer.lr=2e-4",
        "trainer.kl_coef=0.05",
        "trainer.micro_batch_tokens=256",
        *extra,
    ]
    torch_tr = build_trainer(plan_trainer(launch_cfg("trainer=torch", *common).trainer, TEMPERATURE),
                             copy.deepcopy(model), tok)
    meg_tr = build_trainer(plan_trainer(launch_cfg("trainer=megatron", "trainer.device=cpu", *common).trainer, TEMPERATURE),
                           model, tok)
    return torch_tr, meg_tr


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_launcher_builds_both_backends_and_they_agree_on_logprobs_loss_and_updates(tokenizer_and_model):
    tok, model, convs = tokenizer_and_model
    torch_tr, meg_tr = build_both(model, tok)
    try:
        assert type(torch_tr).__name__ == "TorchTrainer" and type(meg_tr).__name__ == "MegatronTrainer"
        assert isinstance(torch_tr, Trainer) and isinstance(meg_tr, Trainer)
        assert meg_tr.cfg.temperature == torch_tr.cfg.temperature == TEMPERATURE
        assert meg_tr.pad_id == tok.pad_token_id == torch_tr.pad_id  # the model config's pad id, on both backends
        batch = chat_batch(tok, convs)
        lp_torch, lp_meg = torch_tr.compute_logprobs(batch), meg_tr.compute_logprobs(batch)
        assert [len(r) for r in lp_meg] == [len(s.tokens) for s in batch]
        assert max_diff(lp_torch, lp_meg) < 1e-4
        with_rollout_logprobs(batch, lp_torch, noise=0.3, seed=1)

        for step in (1, 2):  # step 1: pi == pi_ref (KL 0); step 2: the KL term is live on both
            mt, mm = torch_tr.train_step(batch), meg_tr.train_step(batch)
            assert torch_tr.version == meg_tr.version == step
            assert mm["loss"] == pytest.approx(mt["loss"], abs=1e-5)
            assert mm["pg_loss"] == pytest.approx(mt["pg_loss"], abs=1e-5)
            assert mm["kl"] == pytest.approx(mt["kl"], rel=1e-4, abs=1e-7)
            assert mm["clip_frac"] == pytest.approx(mt["clip_frac"], abs=1e-6)
            assert mm["loss_tokens"] == mt["loss_tokens"] > 0
            assert mm["grad_norm"] == pytest.approx(mt["grad_norm"], rel=1e-4)
            assert mm["rollout_logprob_diff"] == pytest.approx(mt["rollout_logprob_diff"], abs=1e-5)
            if step == 1:
                assert mt["kl"] == 0.0 and 0 < mt["clip_frac"] < 1 and mt["grad_norm"] > 1.0  # clipping is active
            else:
                assert mt["kl"] > 1e-5
        # after two AdamW steps (lr 2e-4) the policies still agree token by token, and their HF weights too
        assert max_diff(torch_tr.compute_logprobs(batch), meg_tr.compute_logprobs(batch)) < 1e-4
        st, sm = torch_tr.state_dict(), meg_tr.state_dict()
        moved = max(float((st[k] - v).abs().max()) for k, v in model.state_dict().items() if k in st)
        assert moved > 2e-4  # the steps really changed the weights (model itself is megatron's source, unchanged)
        # Adam turns rounding-level gradient differences into ~lr-sized moves where |g| ~ eps, so a few elements may
        # differ by up to ~lr; a wrong gradient (sign, clip, decay) would move most elements of a tensor by ~lr
        for k, v in st.items():
            if k == "lm_head.weight" and k not in sm:
                continue  # tied embeddings
            d = (v - sm[k]).abs()
            assert float(d.max()) < 2e-4 and float((d > 2e-6).float().mean()) < 1e-3, k
    finally:
        meg_tr.close()


def test_minibatches_and_epochs_match_too(tokenizer_and_model):
    tok, model, convs = tokenizer_and_model
    torch_tr, meg_tr = build_both(model, tok, "trainer.ppo_epochs=2", "trainer.minibatches=2", "trainer.kl_coef=0.0")
    try:
        batch = chat_batch(tok, convs, n=8, seed=5)
        with_rollout_logprobs(batch, torch_tr.compute_logprobs(batch), noise=0.2, seed=2)
        mt, mm = torch_tr.train_step(batch), meg_tr.train_step(batch)
        assert mt["optimizer_steps"] == mm["optimizer_steps"] == 4 and torch_tr.version == meg_tr.version == 1
        assert mm["loss"] == pytest.approx(mt["loss"], abs=1e-5)
        assert max_diff(torch_tr.compute_logprobs(batch), meg_tr.compute_logprobs(batch)) < 1e-4
    finally:
        meg_tr.close()


def test_unknown_backend_is_a_clear_error(tokenizer_and_model):
    tok, model, _ = tokenizer_and_model
    with pytest.raises(ValueError, match="trainer.backend='jax' is not available; known: torch, megatron"):
        plan_trainer({"backend": "jax"}, 1.0)
