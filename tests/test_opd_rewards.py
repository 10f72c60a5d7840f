"""The directive (per-token) advantage modes (train/opd.py, train/batch.py) against an independent reference written
differently: numpy over one flat array of a trajectory's action tokens, where NaN marks "no gradient", instead of the
step-by-step Python of the implementation. Worked examples first, then hypothesis over random trajectories."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prm.judge import Judgement
from train.batch import RewardConfig, score_trajectories
from train.opd import OPD_MODES, gap_summary, teacher_gap, token_advantages
from train.records import EpisodeStatus, Step, Trajectory
from train.sample_layout import build_samples


def reference(mode, scores, step_adv, gaps, lengths, w_step=1.0, w_opd=1.0, penalty=1.0, clip=None):
    """Per step: a float array over its tokens, or None. Flat-token numpy formulation."""
    n_steps = len(lengths)
    step_of = np.repeat(np.arange(n_steps), lengths)  # the step each action token belongs to
    has_gap = np.array([g is not None for g in gaps], dtype=bool)
    gap = np.concatenate([np.asarray(g if g is not None else [0.0] * n, float) for g, n in zip(gaps, lengths)]
                         or [np.zeros(0)])
    if clip is not None:
        gap = np.clip(gap, -clip, clip)
    a_step = np.array([np.nan if a is None else a for a in step_adv], float)
    score = np.asarray(scores, float)
    if mode == "opd":
        tok = np.where(has_gap[step_of], gap, np.nan)
    elif mode == "combined":
        both_missing = np.isnan(a_step) & ~has_gap
        tok = w_step * np.nan_to_num(a_step)[step_of] + w_opd * np.where(has_gap[step_of], gap, 0.0)
        tok = np.where(both_missing[step_of], np.nan, tok)
    elif mode == "gated":
        negative = np.flatnonzero(score < 0)
        first = negative[0] if negative.size else n_steps
        idx = np.arange(n_steps)
        passes = (idx < first) & (score > 0) & has_gap
        tok = np.full(gap.shape, np.nan)
        tok = np.where(passes[step_of], gap, tok)
        tok = np.where((idx == first)[step_of], -penalty, tok)
    elif mode == "multiplicative":
        tok = np.where(has_gap[step_of], score[step_of] * gap, np.nan)
    else:
        raise AssertionError(mode)
    out = []
    for t in range(n_steps):
        part = tok[step_of == t]
        # a step with no tokens, or whose tokens are all NaN, gets no gradient
        out.append(None if part.size == 0 or np.isnan(part).all() else part)
    return out


def run_impl(mode, scores, step_adv, gaps, lengths, **kw):
    res = token_advantages(mode, step_advantages=step_adv, step_scores=scores, gaps=gaps, lengths=lengths, **kw)
    return [None if (r.values is None or not r.values) else np.asarray(r.values) for r in res], [r.mode for r in res]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None), (a, b)
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-12)


# ----- worked examples -----
SCORES = [1.0, -1.0, 1.0]
STEP_ADV = [0.5, None, -0.25]
GAPS = [[0.2, -0.1], None, [0.4]]
LENGTHS = [2, 3, 1]


def test_opd_only_hinted_steps():
    values, modes = run_impl("opd", SCORES, STEP_ADV, GAPS, LENGTHS)
    assert modes == ["opd", "no_hint", "opd"]
    same(values, [np.array([0.2, -0.1]), None, np.array([0.4])])


def test_combined_adds_the_parts_and_a_missing_part_counts_zero():
    values, modes = run_impl("combined", SCORES, STEP_ADV, GAPS, LENGTHS, w_step=2.0, w_opd=0.5)
    assert modes == ["step+opd", "no_signal", "step+opd"]
    same(values, [np.array([1.1, 0.95]), None, np.array([-0.3])])
    values, modes = run_impl("combined", SCORES, [0.5, 0.3, None], [None, None, [0.4]], LENGTHS)
    assert modes == ["step", "step", "opd"]
    same(values, [np.array([0.5, 0.5]), np.array([0.3, 0.3, 0.3]), np.array([0.4])])


def test_gated_cuts_after_the_first_negative_step():
    values, modes = run_impl("gated", SCORES, STEP_ADV, GAPS, LENGTHS, gate_penalty=0.7)
    assert modes == ["opd", "gate_negative", "gate_cut"]
    same(values, [np.array([0.2, -0.1]), np.array([-0.7] * 3), None])
    values, modes = run_impl("gated", [0.0, 1.0, 1.0], STEP_ADV, [[0.1, 0.1], None, [0.3]], LENGTHS)
    assert modes == ["gate_closed", "no_hint", "opd"]


def test_multiplicative_scales_by_the_step_score():
    values, modes = run_impl("multiplicative", [0.5, -1.0, -1.0], STEP_ADV, GAPS, LENGTHS)
    assert modes == ["multiplicative", "no_hint", "multiplicative"]
    same(values, [np.array([0.1, -0.05]), None, np.array([-0.4])])


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="unknown directive mode"):
        run_impl("nope", SCORES, STEP_ADV, GAPS, LENGTHS)
    with pytest.raises(ValueError, match="gap has 2 entries for its 3 tokens"):
        run_impl("opd", SCORES, STEP_ADV, [[0.0, 0.0], [1.0, 1.0], None], LENGTHS)
    with pytest.raises(ValueError, match="teacher log-probs for 2 action tokens"):
        teacher_gap([0.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="non-finite"):
        teacher_gap([-math.inf], [0.0])
    with pytest.raises(ValueError, match="reward.mode"):
        RewardConfig(mode="distill")


def test_gap_clip_bounds_each_token_before_the_mode():
    values, _ = run_impl("multiplicative", [0.5, -1.0, -1.0], STEP_ADV, [[3.0, -7.0], None, [0.4]], LENGTHS,
                         gap_clip=2.0)
    same(values, [np.array([1.0, -1.0]), None, np.array([-0.4])])
    with pytest.raises(ValueError, match="positive bound"):
        run_impl("opd", SCORES, STEP_ADV, GAPS, LENGTHS, gap_clip=0.0)
    with pytest.raises(ValueError, match="reward.gap_clip"):
        RewardConfig(mode="opd", gap_clip=-1.0)


def test_gap_summary():
    assert gap_summary([0.5, -1.0, 0.2]) == {"mean": pytest.approx(-0.1), "min": -1.0, "max": 0.5,
                                             "sq": pytest.approx((0.25 + 1.0 + 0.04) / 3), "tokens": 3}
    assert gap_summary(None) is None and gap_summary([]) is None


# ----- random trajectories -----
@st.composite
def trajectories(draw):
    n = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    scores = draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]), min_size=n, max_size=n))
    step_adv = draw(st.lists(st.one_of(st.none(), st.floats(-3, 3)), min_size=n, max_size=n))
    gaps = [draw(st.one_of(st.none(), st.lists(st.floats(-5, 5), min_size=k, max_size=k))) for k in lengths]
    return scores, step_adv, gaps, lengths


@settings(max_examples=300, deadline=None)
@given(trajectories(), st.sampled_from(OPD_MODES), st.floats(0, 2), st.floats(0, 2), st.floats(0.1, 2),
       st.one_of(st.none(), st.floats(0.1, 4)))
def test_every_mode_matches_the_reference(traj, mode, w_step, w_opd, penalty, clip):
    scores, step_adv, gaps, lengths = traj
    got, modes = run_impl(mode, scores, step_adv, gaps, lengths, w_step=w_step, w_opd=w_opd, gate_penalty=penalty,
                          gap_clip=clip)
    want = reference(mode, scores, step_adv, gaps, lengths, w_step, w_opd, penalty, clip)
    same(got, want)
    from train.opd import APPLIED, NO_GRADIENT

    for g, m, n in zip(got, modes, lengths):  # the mode says whether the step has a gradient
        assert m in APPLIED + NO_GRADIENT
        if n and m in NO_GRADIENT:
            assert g is None


# ----- the batch: token advantages from teacher log-probs, and the samples the trainer sees -----
def _traj(i, group, outcome, steps):
    tr = Trajectory("r", f"e{i}", group, "t", status=EpisodeStatus.OK, outcome=outcome, family="toolcall")
    for t, (score, old, n_prompt) in enumerate(steps):
        tr.steps.append(Step("r", f"e{i}", group, "t", t, "a", {}, {}, judge=Judgement(score, [int(score)], [""]),
                             prompt_ids=list(range(1, n_prompt + 1)), output_ids=list(range(50, 50 + len(old))),
                             output_logprobs=list(old)))
    return tr


def test_score_trajectories_uses_the_teacher_and_the_layout_carries_token_advantages():
    trajs = [_traj(0, "g", 1.0, [(1.0, [-1.0, -2.0], 3), (-1.0, [-0.5], 4)]),
             _traj(1, "g", -1.0, [(-1.0, [-1.5, -0.2, -0.3], 3)])]
    teacher = {(0, 0): [-0.5, -2.5], (1, 0): [-1.0, -1.0, -1.0]}
    for mode in OPD_MODES:
        cfg = RewardConfig(mode=mode)
        scores = score_trajectories(trajs, cfg, teacher)
        integrated = score_trajectories(trajs, RewardConfig(mode="integrated"))
        for i, tr in enumerate(trajs):
            gaps = [np.subtract(teacher[(i, t)], s.output_logprobs) if (i, t) in teacher else None
                    for t, s in enumerate(tr.steps)]
            want = reference(mode, [s.judge.score for s in tr.steps], integrated.advantages[i],
                             [None if g is None else list(g) for g in gaps], [len(s.output_ids) for s in tr.steps])
            same([None if v is None else np.asarray(v) for v in scores.token_advantages[i]], want)
            for a, w in zip(scores.advantages[i], want):  # the step's scalar: the mean of its token advantages
                assert (a is None) == (w is None) and (a is None or a == pytest.approx(float(np.mean(w))))
        # the trainer's samples carry exactly those per-token advantages on the action tokens
        for tr, tok, adv in zip(trajs, scores.token_advantages, scores.advantages):
            for s, v, a in zip(tr.steps, tok, adv):
                s.token_advantages, s.advantage = v, a
        samples, _ = build_samples(trajs, "step")
        got = [[a for a, m in zip(x.advantages, x.loss_mask) if m] for x in samples]
        assert got == [v for tok in scores.token_advantages for v in tok if v is not None]
    with pytest.raises(ValueError, match="not in the batch"):
        score_trajectories(trajs, RewardConfig(mode="opd"), {(5, 0): [0.0]})


def test_truncated_fail_caps_the_token_advantages_of_a_cut_off_output():
    # a hinted step whose teacher likes every token (gap > 0) but whose output ran to max_new_tokens
    trajs = [_traj(0, "g", 1.0, [(1.0, [-1.0, -2.0], 3)]), _traj(1, "g", -1.0, [(-1.0, [-1.5], 3)])]
    trajs[0].steps[0].finish_reason = "length"
    teacher = {(0, 0): [-0.5, -0.5], (1, 0): [-0.5]}
    for mode in OPD_MODES:
        judged = score_trajectories(trajs, RewardConfig(mode=mode), teacher)
        capped = score_trajectories(trajs, RewardConfig(mode=mode, truncated="fail"), teacher)
        assert min(judged.token_advantages[0][0]) > 0, mode  # as judged, every token of it is pushed up
        assert max(capped.token_advantages[0][0]) <= 0, mode
        if mode != "combined":  # (combined's step part is normalized over the group, whose scores changed)
            assert capped.token_advantages[1][0] == judged.token_advantages[1][0], mode  # a stopped step: as it was


def test_the_gap_spread_is_over_every_hinted_token_of_the_batch():
    from types import SimpleNamespace

    from rollout.metrics import directive_metrics
    from train.records import EpisodeStatus

    gaps = [[0.5, -1.0, 0.2], [2.0]]
    steps = [SimpleNamespace(judge=None, teacher_gap=gap_summary(g), advantage=0.1, advantage_mode="opd",
                             distill_weight=None, teacher_topk_summary=None) for g in gaps]
    m = directive_metrics([SimpleNamespace(status=EpisodeStatus.OK, family="toolcall", steps=steps)])
    tokens = [x for g in gaps for x in g]
    mean = sum(tokens) / len(tokens)
    std = (sum((x - mean) ** 2 for x in tokens) / len(tokens)) ** 0.5
    assert m["directive/gap_mean"] == pytest.approx(mean) and m["directive/toolcall/gap_std"] == pytest.approx(std)
