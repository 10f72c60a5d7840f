"""The distribution-level directive loss (reward.opd_signal=teacher_topk): the top-k + tail extraction, the clamped
forward KL, the masked mean (hand-computed examples and properties), the modes' rule for which steps are distilled,
the config's refusals, and how the targets reach a micro-batch."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from train.backends.microbatch import make_micro_batches
from train.batch import RewardConfig
from train.opd import distill_advantages, topk_summary
from train.records import DistillTarget, TeacherTopK, TrainSample
from train.topk_distill import DIVERGENCES, distill_loss, tail_prob, topk_divergence, topk_forward_kl, topk_of_logits

L = math.log


def test_forward_kl_by_hand():
    # teacher: 0.5, 0.3 on its top-2 and 0.2 in the tail; student: 0.25, 0.25 there and 0.5 in the tail
    teacher = torch.tensor([[L(0.5), L(0.3)]])
    student = torch.tensor([[L(0.25), L(0.25)]])
    want = 0.5 * L(0.5 / 0.25) + 0.3 * L(0.3 / 0.25) + 0.2 * L(0.2 / 0.5)
    assert topk_forward_kl(teacher, student).item() == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx(0.218012, abs=1e-6)
    assert tail_prob(teacher).item() == pytest.approx(0.2, abs=1e-6)
    # forward, not reverse: the reverse KL over the same bins is another number
    reverse = 0.25 * L(0.25 / 0.5) + 0.25 * L(0.25 / 0.3) + 0.5 * L(0.5 / 0.2)
    assert reverse == pytest.approx(0.239278, abs=1e-6) and abs(want - reverse) > 0.02
    # the clamp: min(KL, c), and a clamped token gets no gradient
    s = student.clone().requires_grad_(True)
    clamped = topk_forward_kl(teacher, s, clamp=0.1)
    assert clamped.item() == pytest.approx(0.1)
    clamped.sum().backward()
    assert torch.all(s.grad == 0)
    # an unclamped token's gradient pulls the student's log-prob of the teacher's likeliest token up
    s = student.clone().requires_grad_(True)
    topk_forward_kl(teacher, s).sum().backward()
    assert s.grad[0, 0] < 0  # gradient descent raises s_0


def test_a_teacher_with_no_tail_and_per_token_clamps():
    teacher = torch.tensor([[L(0.75), L(0.25)], [L(0.75), L(0.25)]])  # all the mass inside: p_T = 0
    student = torch.tensor([[L(0.5), L(0.25)], [L(0.75), L(0.25)]])
    kl = topk_forward_kl(teacher, student)
    assert torch.isfinite(kl).all()
    assert kl[0].item() == pytest.approx(0.75 * L(0.75 / 0.5), abs=1e-5)  # float32: a tail of ~1e-7 is left
    assert kl[1].item() == pytest.approx(0.0, abs=1e-5)
    per_token = topk_forward_kl(teacher, student, clamp=torch.tensor([0.1, float("inf")]))
    assert per_token.tolist() == pytest.approx([0.1, 0.0], abs=1e-5)
    with pytest.raises(ValueError, match="clamp must be > 0"):
        topk_forward_kl(teacher, student, clamp=0.0)
    with pytest.raises(ValueError, match="differ"):
        topk_forward_kl(teacher, student[:, :1])


def test_topk_of_logits_at_the_rollout_temperature():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0]])
    ids, lps = topk_of_logits(logits, 2, temperature=0.5)
    assert ids.tolist() == [[0, 2]]
    full = torch.log_softmax(logits / 0.5, dim=-1)
    assert lps[0].tolist() == pytest.approx(full[0, [0, 2]].tolist())
    assert topk_of_logits(logits, 10).token_ids.shape == (1, 4)  # k capped at the vocabulary
    with pytest.raises(ValueError, match="k >= 1"):
        topk_of_logits(logits, 0)


def test_masked_mean_by_hand():
    kl = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    # sample 0: (1 + 2) / 2; sample 1 has no target and is not counted; sample 2: (8 + 9) / 2
    assert distill_loss(kl, mask).item() == pytest.approx((1.5 + 8.5) / 2)
    scale = torch.full_like(kl, 0.5)
    assert distill_loss(kl, mask, scale).item() == pytest.approx((1.5 + 8.5) / 4)
    assert distill_loss(kl, torch.zeros_like(mask)).item() == 0.0


@st.composite
def distributions(draw):
    v = draw(st.integers(2, 12))
    k = draw(st.integers(1, v))
    floats = st.floats(-6.0, 6.0, allow_nan=False, width=32)
    t = torch.tensor(draw(st.lists(floats, min_size=v, max_size=v)))
    s = torch.tensor(draw(st.lists(floats, min_size=v, max_size=v)))
    return t, s, k


@given(distributions())
def test_kl_is_never_negative(case):
    t, s, k = case
    ids, teacher = topk_of_logits(t[None], k)
    student = torch.log_softmax(s[None], -1).gather(-1, ids)
    assert topk_forward_kl(teacher, student).item() >= -1e-5


@given(distributions(), st.randoms(use_true_random=False))
def test_kl_is_zero_when_the_student_matches_on_the_bins(case, rnd):
    """Equal on the k tokens and so on the tail: KL 0, however the student spreads its tail inside."""
    t, _, k = case
    full = torch.log_softmax(t, -1)
    ids, teacher = topk_of_logits(t[None], k)
    rest = [i for i in range(len(t)) if i not in ids[0].tolist()]
    shuffled = rest[:]
    rnd.shuffle(shuffled)
    student_full = full.clone()
    student_full[rest] = full[shuffled]  # the tail's mass moved around between tokens outside the top-k
    student = student_full[None].gather(-1, ids)
    assert topk_forward_kl(teacher, student).item() == pytest.approx(0.0, abs=1e-5)


def test_reverse_kl_and_jsd_by_hand():
    p = [0.6, 0.3]  # teacher: two tokens and a tail of 0.1
    q = [0.2, 0.5]  # student on the same ids: tail 0.3
    teacher, student = torch.tensor([[math.log(x) for x in p]]), torch.tensor([[math.log(x) for x in q]])
    pb, qb = [*p, 0.1], [*q, 0.3]
    reverse = sum(b * math.log(b / a) for a, b in zip(pb, qb))
    m = [(a + b) / 2 for a, b in zip(pb, qb)]
    jsd = 0.5 * sum(a * math.log(a / c) for a, c in zip(pb, m)) + 0.5 * sum(b * math.log(b / c) for b, c in zip(qb, m))
    assert topk_divergence(teacher, student, "reverse").item() == pytest.approx(reverse, rel=1e-5)
    assert topk_divergence(teacher, student, "jsd").item() == pytest.approx(jsd, rel=1e-5)
    assert topk_divergence(teacher, student, "forward").item() == pytest.approx(topk_forward_kl(teacher, student).item())
    assert topk_divergence(teacher, student, "reverse", clamp=0.01).item() == pytest.approx(0.01)
    with pytest.raises(ValueError, match="reward.topk_divergence='tv'"):
        topk_divergence(teacher, student, "tv")


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_every_divergence_is_finite_on_a_teacher_bin_of_probability_zero(kind):
    """A teacher top-k token at log-prob -inf (a bin of probability 0): the value and the student's gradient are
    finite for every divergence, and the gradient pushes the student's mass off that token."""
    teacher = torch.tensor([[math.log(0.7), math.log(0.2), float("-inf")]])  # tail 0.1
    student = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.1)]], requires_grad=True)  # tail 0.2
    value = topk_divergence(teacher, student, kind)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(student.grad).all()
    assert value.item() > 0
    assert student.grad[0, 2].item() > 0  # lowering the student's log-prob there lowers the divergence
    clamped = topk_divergence(teacher, student.detach(), kind, clamp=1e-3)
    assert clamped.item() == pytest.approx(min(value.item(), 1e-3))


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_a_zero_bin_in_both_adds_nothing(kind):
    """Teacher and student both give a top-k token no mass (student underflowed to -inf too): the divergence is that
    of the other bins, with no nan in the value or the gradient."""
    teacher = torch.tensor([[math.log(0.6), math.log(0.3), float("-inf")]])
    student = torch.tensor([[math.log(0.2), math.log(0.5), float("-inf")]], requires_grad=True)
    value = topk_divergence(teacher, student, kind)
    value.sum().backward()
    assert torch.isfinite(student.grad).all()
    without = topk_divergence(teacher[:, :2], student.detach()[:, :2], kind)
    assert value.item() == pytest.approx(without.item(), rel=1e-5)


@given(distributions(), st.sampled_from(DIVERGENCES))
def test_every_divergence_is_never_negative_and_zero_at_the_teacher(case, kind):
    t, s, k = case
    ids, teacher = topk_of_logits(t[None], k)
    student = torch.log_softmax(s[None], -1).gather(-1, ids)
    value = topk_divergence(teacher, student, kind).item()
    assert value >= -1e-5
    if kind == "jsd":
        assert value <= math.log(2) + 1e-5
    assert topk_divergence(teacher, teacher.clone(), kind).item() == pytest.approx(0.0, abs=1e-5)


@given(st.integers(1, 4), st.integers(1, 6), st.data())
def test_masked_steps_do_not_change_the_loss(b, t, data):
    kl = torch.tensor(data.draw(st.lists(st.floats(0, 5, width=32), min_size=b * t, max_size=b * t))).view(b, t)
    mask = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=b * t, max_size=b * t))).view(b, t)
    base = distill_loss(kl, mask)
    changed = torch.where(mask > 0, kl, torch.full_like(kl, float("nan")))  # anything where masked, even nan
    assert torch.equal(distill_loss(changed, mask), base) or (base == 0 and distill_loss(changed, mask) == 0)
    # a sample with no target at all (a trajectory without a hint) is not in the denominator
    more = distill_loss(torch.cat([kl, torch.full((1, t), 3.0)]), torch.cat([mask, torch.zeros(1, t)]))
    assert more.item() == pytest.approx(base.item())


def test_which_steps_are_distilled_per_mode():
    args = dict(step_advantages=[0.5, None, -1.0], step_scores=[1.0, -1.0, 1.0], hinted=[True, True, False],
                lengths=[2, 1, 3])
    opd = distill_advantages("opd", **args)
    assert [(x.advantage.values, x.advantage.mode, x.distill) for x in opd] == [
        ([0.0, 0.0], "distill", 1.0), ([0.0], "distill", 1.0), (None, "no_hint", None)]
    combined = distill_advantages("combined", **args, w_step=2.0, w_opd=0.5)
    assert [(x.advantage.values, x.advantage.mode, x.distill) for x in combined] == [
        ([1.0, 1.0], "step+distill", 0.5), ([0.0], "distill", 0.5), ([-2.0] * 3, "step", None)]
    gated = distill_advantages("gated", **args, gate_penalty=3.0)
    assert [(x.advantage.values, x.advantage.mode, x.distill) for x in gated] == [
        ([0.0, 0.0], "distill", 1.0), ([-3.0], "gate_negative", None), (None, "gate_cut", None)]
    with pytest.raises(ValueError, match="supports the modes"):
        distill_advantages("multiplicative", **args)


def test_topk_summary_of_the_sampled_tokens():
    ids = [[5, 7], [1, 2]]
    lps = [[L(0.6), L(0.3)], [L(0.5), L(0.25)]]
    out = topk_summary(ids, lps, [7, 9])  # 7 is in the top-k (0.3), 9 is not
    assert out == pytest.approx({"sampled_mass": 0.15, "sampled_in_topk": 0.5, "tail": (0.1 + 0.25) / 2,
                                 "tokens": 2})
    assert topk_summary([], [], []) is None


@pytest.mark.parametrize(("override", "message"), [
    ({"opd_signal": "full"}, "reward.opd_signal='full'"),
    ({"topk": 0}, "reward.topk=0"),
    ({"topk": 2.5}, "reward.topk=2.5"),
    ({"topk_clamp": 0.0}, "reward.topk_clamp=0.0"),
    ({"topk_clamp": -1.0}, "reward.topk_clamp=-1.0"),
    ({"mode": "multiplicative", "opd_signal": "teacher_topk"}, "works with reward=opd | combined | gated"),
    ({"topk_divergence": "kl"}, "reward.topk_divergence='kl'"),
])
def test_bad_options_are_clear_errors(override, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|").replace("(", r"\(")):
        RewardConfig(**override)


def test_the_options_declared_once():
    cfg = RewardConfig(mode="combined", opd_signal="teacher_topk")
    assert cfg.topk_signal and cfg.topk == 20 and cfg.topk_clamp is None and cfg.topk_divergence == "reverse"
    assert not RewardConfig(opd_signal="teacher_topk").topk_signal  # integrated: no directive signal at all
    from rollout.build import compose_launch_config, plan_reward

    cfg = compose_launch_config(["reward=combined", "reward.opd_signal=teacher_topk", "reward.topk=5",
                                 "reward.topk_clamp=2.0"])
    assert plan_reward(cfg.reward) == RewardConfig(mode="combined", opd_signal="teacher_topk", topk=5, topk_clamp=2.0)


def test_targets_reach_the_micro_batch_at_their_positions():
    top = TeacherTopK([[3, 1], [2, 0]], [[-0.1, -2.5], [-0.2, -1.9]], [-0.1, -3.0])
    with_target = TrainSample(tokens=[9, 9, 9, 3, 4], loss_mask=[0, 0, 0, 1, 1], advantages=[0.0] * 5,
                              rollout_logprobs=[0.0] * 5, distill=[DistillTarget(3, 5, top, 0.5, 1.5)])
    without = TrainSample(tokens=[9, 9, 4], loss_mask=[0, 0, 1], advantages=[0.0, 0.0, 1.0],
                          rollout_logprobs=[0.0] * 3)
    (mb,) = make_micro_batches([with_target, without], 100)
    d = mb.distill
    r = mb.indices.index(0)
    assert d is not None and d.weight == 1.0  # the one sample with targets: all of the term's denominator
    assert d.mask[r].tolist() == [0, 0, 1, 1]  # position t predicts token t+1: tokens 3 and 4
    assert d.token_ids[r, 2].tolist() == [3, 1] and d.logprobs[r, 3].tolist() == pytest.approx([-0.2, -1.9])
    assert d.scale[r, 2].item() == 0.5 and d.clamp[r, 3].item() == 1.5 and math.isinf(d.clamp[r, 0].item())
    assert d.mask[1 - r].sum() == 0
    (plain,) = make_micro_batches([without], 100)
    assert plain.distill is None
    with pytest.raises(ValueError, match="does not fit"):
        TrainSample(tokens=[9, 3], loss_mask=[0, 1], advantages=[0.0, 0.0], rollout_logprobs=[0.0, 0.0],
                    distill=[DistillTarget(1, 3, top)])
