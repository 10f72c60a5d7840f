"""train/loss.py pinned to a hand computation (numbers worked out on paper, not with the same formula)."""

import math

import pytest
import torch

from train.loss import k3_kl, masked_sample_mean, policy_loss

# One sample, three tokens:

from train.config import LossConfig
#   token 1: logp -1.0, old -1.5 -> ratio e^0.5 = 1.648721 > 1.28, A = +1 -> clipped high: pg = -1.28
#   token 2: logp -0.5, old -0.5 -> ratio 1, A = -1                       -> pg = +1.0
#   token 3: logp -2.0, old -1.0 -> ratio e^-1 = 0.367879 < 0.8, A = -2   -> clipped low: min(-0.735759, -1.6), pg = +1.6
# ref -1.2, -0.5, -2.5 -> d = 0.2, 0, 0.5 -> k3 = e^-d - 1 + d = 0.0187308, 0, 0.1065307
# loss = mean(-1.28 + 0.01 * 0.0187308, 1.0, 1.6 + 0.01 * 0.1065307) = (1.32 + 0.00125262) / 3 = 0.4404175
LOGP = [-1.0, -0.5, -2.0]
OLD = [-1.5, -0.5, -1.0]
ADV = [1.0, -1.0, -2.0]
REF = [-1.2, -0.5, -2.5]


def t(x):
    return torch.tensor([x], dtype=torch.float64)


def test_hand_computed_loss_with_both_clips_and_k3():
    logp = t(LOGP).requires_grad_(True)
    loss, m = policy_loss(logp, t(OLD), t(ADV), t([1, 1, 1]), t(REF), LossConfig(0.2, 0.28, 0.01))
    assert loss.item() == pytest.approx(0.4404175, abs=1e-6)
    assert m["pg_loss"] == pytest.approx((-1.28 + 1.0 + 1.6) / 3, abs=1e-6)
    assert m["kl"] == pytest.approx((0.0187308 + 0.0 + 0.1065307) / 3, abs=1e-6)
    assert m["clip_frac"] == pytest.approx(2 / 3)  # tokens 1 and 3 sit on a clip bound
    assert m["ratio_mean"] == pytest.approx((1.648721 + 1.0 + 0.367879) / 3, abs=1e-6)
    assert m["loss_tokens"] == 3
    loss.backward()
    # clipped tokens get no policy-gradient, only the KL term: d/dlogp 0.01 * k3 / 3 = 0.01 * (1 - e^-d) / 3
    # token 2: d/dlogp (-ratio * A) / 3 = -(1 * -1) / 3 = +1/3; its k3 gradient is 0 (d = 0)
    expected = [0.01 * (1 - 0.8187308) / 3, 1 / 3, 0.01 * (1 - 0.6065307) / 3]
    assert logp.grad[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_without_reference_or_with_zero_kl_the_kl_term_is_absent():
    loss_a, m_a = policy_loss(t(LOGP), t(OLD), t(ADV), t([1, 1, 1]), None, LossConfig())
    loss_b, _ = policy_loss(t(LOGP), t(OLD), t(ADV), t([1, 1, 1]), t(REF), LossConfig(kl_coef=0.0))
    assert float(loss_a) == pytest.approx((-1.28 + 1.0 + 1.6) / 3, abs=1e-6)
    assert float(loss_b) == pytest.approx(float(loss_a))
    assert m_a["kl"] == 0.0


def test_mask_and_token_mean_per_sample_then_mean_over_samples():
    # sample 1 keeps only token 2 (pg = 1.0); sample 2: one token ratio 1, A = 3 -> pg = -3; sample 3 has no tokens
    logp = torch.tensor([LOGP, [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([OLD, [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([ADV, [0.0, 3.0, 0.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.float64)
    loss, m = policy_loss(logp, old, adv, mask, None, LossConfig())
    assert float(loss) == pytest.approx((1.0 + -3.0) / 2)
    assert m["loss_tokens"] == 2


def test_k3_is_nonnegative_and_zero_at_equality():
    d = torch.linspace(-3, 3, 13, dtype=torch.float64)
    k = k3_kl(d, torch.zeros_like(d))
    assert bool((k >= 0).all())
    assert float(k[6]) == 0.0
    assert float(k[-1]) == pytest.approx(math.exp(-3) - 1 + 3)


def test_all_masked_batch_gives_zero_loss_with_a_graph():
    x = torch.zeros(2, 3, requires_grad=True)
    out = masked_sample_mean(x, torch.zeros(2, 3))
    assert out.item() == 0.0
    out.backward()
    assert x.grad is not None
