"""The teacher's top-k (reward.opd_signal=teacher_topk) from the trainer and from an SGLang-shaped server, and one
torch update with the distillation term: the student's distribution at a hinted step moves toward the teacher's."""

from __future__ import annotations

import asyncio
import copy
import math

import httpx
import pytest
import torch

from prm.hints import with_hint
from prm.judge import Judgement
from rollout.build import build_trainer, compose_launch_config, plan_trainer
from rollout.loop import put_scores
from rollout.metrics import directive_metrics
from rollout.policy.base import SamplingParams
from rollout.policy.local import LocalPolicy
from rollout.policy.local_config import LocalPolicyConfig
from rollout.policy.sglang import parse_input_topk
from rollout.teacher import TeacherBatch
from train.batch import RewardConfig, score_trajectories
from train.records import DistillTarget, EpisodeStatus, Step, TeacherTopK, TrainSample, Trajectory
from train.sample_layout import build_samples
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from train.topk_distill import topk_divergence
from toy_conversations import addition_conversations

HINT = "The sum is 12: answer \\boxed{12}."
K = 5


@pytest.fixture(scope="module")
def tiny():
    convs = addition_conversations(40, seed=5)
    tok = build_tokenizer([render_chat(c) for c in convs], vocab_size=400)
    cfg = tiny_qwen3_config(len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    cfg.initializer_range = 0.1  # logits spread enough that contexts change the distributions visibly
    return tok, build_model(cfg, seed=7), convs


@pytest.fixture(scope="module")
def sampled(tiny):
    """Real completions of the local policy on the first turns of a few conversations, and their hinted contexts."""
    tok, model, convs = tiny
    policy = LocalPolicy(copy.deepcopy(model), tok, LocalPolicyConfig(seed=3))
    contexts = [c[:2] for c in convs[:4]]

    async def run():
        try:
            return await asyncio.gather(*(policy.generate(m, SamplingParams(max_new_tokens=8)) for m in contexts))
        finally:
            await policy.close()

    completions = asyncio.run(run())
    hinted = [(policy.prompt_ids(with_hint(m, HINT)), c.output_ids) for m, c in zip(contexts, completions)]
    return completions, hinted


def _trainer(model, *overrides: str, temperature: float = 1.0):
    plan = plan_trainer(compose_launch_config(["trainer=torch", *overrides]).trainer, temperature=temperature)
    return build_trainer(plan, copy.deepcopy(model), None)


def test_trainer_topk_is_the_top_k_of_the_logits_at_the_sampling_temperature(tiny, sampled):
    _, model, _ = tiny
    _, hinted = sampled
    for temperature in (1.0, 0.7):
        trainer = _trainer(model, temperature=temperature)
        tops = trainer.action_topk(hinted, K)
        sampled_lp = trainer.action_logprobs(hinted)
        for (context, action), top, lp in zip(hinted, tops, sampled_lp):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([[*context, *action]])).logits[0].float()
            full = torch.log_softmax(logits[len(context) - 1: len(context) - 1 + len(action)] / temperature, -1)
            vals, ids = torch.topk(full, K, -1)
            assert top.token_ids == ids.tolist()
            assert torch.allclose(torch.tensor(top.logprobs), vals, atol=1e-5)
            assert top.sampled == pytest.approx(lp, abs=1e-5)  # the sampled tokens' own log-probs, as for the gap
    assert trainer.action_topk([], K) == []
    with pytest.raises(ValueError, match="non-empty context"):
        trainer.action_topk([([], [1])], K)


def _kl_and_mass(trainer, completion, top: TeacherTopK, kind: str = "forward") -> tuple[float, float]:
    """The divergence (KL(teacher || student) by default) over the top-k + tail at the step's tokens, and the
    student's mass on the top-k."""
    full = trainer.action_topk([(completion.prompt_ids, completion.output_ids)], 400)[0]  # the whole vocabulary
    student = []
    for ids_row, full_ids, full_lps in zip(top.token_ids, full.token_ids, full.logprobs):
        where = {t: lp for t, lp in zip(full_ids, full_lps)}
        student.append([where[t] for t in ids_row])
    s = torch.tensor(student)
    kl = topk_divergence(torch.tensor(top.logprobs), s, kind)
    return float(kl.mean()), float(s.exp().sum(-1).mean())


def _entropies(trainer, completion) -> list[float]:
    """The student's entropy at each of the step's action tokens (its whole vocabulary)."""
    full = trainer.action_topk([(completion.prompt_ids, completion.output_ids)], 400)[0]
    return [float(-sum(math.exp(lp) * lp for lp in row)) for row in full.logprobs]


def test_one_update_moves_the_student_toward_the_teachers_top_k(tiny, sampled):
    """A hinted step (context without the hint, the teacher's top-k from the hinted context) and a step without a
    hint in the same batch: after one update with only the distillation term (advantages 0, no KL anchor), the
    student's distribution at the hinted step is closer to the teacher's, and its mass on the teacher's top-k closer to
    the teacher's own (a small step: Adam's first step moves every weight by ~lr, and the tiny model is sensitive)."""
    _, model, _ = tiny
    completions, hinted = sampled
    trainer = _trainer(model, "trainer.lr=5e-4", "trainer.kl_coef=0")
    target, other = completions[0], completions[1]
    top = trainer.action_topk([hinted[0]], K)[0]
    kl0, mass0 = _kl_and_mass(trainer, target, top)
    hinted_entropy, other_entropy = _entropies(trainer, target), _entropies(trainer, other)
    n_c, n_a = len(target.prompt_ids), len(target.output_ids)
    distilled = TrainSample(tokens=[*target.prompt_ids, *target.output_ids], loss_mask=[0] * n_c + [1] * n_a,
                            advantages=[0.0] * (n_c + n_a), rollout_logprobs=[0.0] * n_c + list(target.output_logprobs),
                            distill=[DistillTarget(n_c, n_c + n_a, top, 1.0, divergence="forward")])
    o_c, o_a = len(other.prompt_ids), len(other.output_ids)
    masked = TrainSample(tokens=[*other.prompt_ids, *other.output_ids], loss_mask=[0] * o_c + [1] * o_a,
                         advantages=[0.0] * (o_c + o_a), rollout_logprobs=[0.0] * o_c + list(other.output_logprobs))
    metrics = trainer.train_step([distilled, masked])
    kl1, mass1 = _kl_and_mass(trainer, target, top)
    teacher_mass = sum(sum(math.exp(x) for x in row) for row in top.logprobs) / len(top.logprobs)
    assert kl0 > 0.01
    assert kl1 < 0.8 * kl0, (kl0, kl1)
    assert abs(mass1 - teacher_mass) < abs(mass0 - teacher_mass), (mass0, mass1, teacher_mass)
    assert metrics["distill/tokens"] == n_a
    assert metrics["distill/kl_mean"] == pytest.approx(kl0, rel=1e-3)  # measured before the update
    assert metrics["distill/loss"] == pytest.approx(kl0, rel=1e-3)  # one sample with targets: its token mean
    assert 0 < metrics["distill/student_topk_mass"] <= 1
    # the student's entropy over the distilled (hinted) tokens only, before the update; not the batch's action tokens
    assert metrics["distill/entropy"] == pytest.approx(sum(hinted_entropy) / n_a, rel=1e-3)
    every = (sum(hinted_entropy) + sum(other_entropy)) / (len(hinted_entropy) + len(other_entropy))
    assert metrics["distill/entropy"] != pytest.approx(every, rel=1e-3)
    assert metrics["distill/clamped_frac"] == 0.0
    # the same batch with the step masked out of the term: no distillation, and nothing moves (advantages are 0)
    still = _trainer(model, "trainer.lr=5e-4", "trainer.kl_coef=0", "trainer.weight_decay=0")  # no decay either
    plain = dict(vars(distilled))
    plain["distill"] = []
    out = still.train_step([TrainSample(**plain), masked])
    assert "distill/loss" not in out
    assert _kl_and_mass(still, target, top)[0] == pytest.approx(kl0, abs=1e-6)


@pytest.mark.parametrize("kind", ["reverse", "jsd"])
def test_one_update_with_the_other_divergences_moves_the_student_toward_the_teacher(tiny, sampled, kind):
    """reward.topk_divergence=reverse | jsd through the trainer: the term measured is that divergence, and one update
    on it alone brings the student closer to the hinted teacher."""
    _, model, _ = tiny
    completions, hinted = sampled
    trainer = _trainer(model, "trainer.lr=5e-4", "trainer.kl_coef=0")
    target = completions[0]
    top = trainer.action_topk([hinted[0]], K)[0]
    d0, _ = _kl_and_mass(trainer, target, top, kind)
    n_c, n_a = len(target.prompt_ids), len(target.output_ids)
    sample = TrainSample(tokens=[*target.prompt_ids, *target.output_ids], loss_mask=[0] * n_c + [1] * n_a,
                         advantages=[0.0] * (n_c + n_a), rollout_logprobs=[0.0] * n_c + list(target.output_logprobs),
                         distill=[DistillTarget(n_c, n_c + n_a, top, 1.0, divergence=kind)])
    metrics = trainer.train_step([sample])
    assert metrics["distill/kl_mean"] == pytest.approx(d0, rel=1e-3)  # this divergence, measured before the update
    assert d0 > 1e-3 and _kl_and_mass(trainer, target, top, kind)[0] < 0.9 * d0


def test_the_clamp_stops_a_token_above_it(tiny, sampled):
    _, model, _ = tiny
    completions, hinted = sampled
    trainer = _trainer(model, "trainer.lr=5e-4", "trainer.kl_coef=0", "trainer.weight_decay=0")
    target = completions[0]
    top = trainer.action_topk([hinted[0]], K)[0]
    kl0, _ = _kl_and_mass(trainer, target, top)
    n_c, n_a = len(target.prompt_ids), len(target.output_ids)
    sample = TrainSample(tokens=[*target.prompt_ids, *target.output_ids], loss_mask=[0] * n_c + [1] * n_a,
                         advantages=[0.0] * (n_c + n_a), rollout_logprobs=[0.0] * n_c + list(target.output_logprobs),
                         distill=[DistillTarget(n_c, n_c + n_a, top, 1.0, clamp=1e-9, divergence="forward")])
    metrics = trainer.train_step([sample])
    assert metrics["distill/clamped_frac"] == 1.0
    assert _kl_and_mass(trainer, target, top)[0] == pytest.approx(kl0, abs=1e-6)  # every token clamped: no gradient


def test_megatron_refuses_distillation_targets():
    from train.backends.megatron_backend import MegatronTrainer

    top = TeacherTopK([[1]], [[-0.1]], [-0.1])
    sample = TrainSample(tokens=[1, 2], loss_mask=[0, 1], advantages=[0.0, 0.0], rollout_logprobs=[0.0, 0.0],
                         distill=[DistillTarget(1, 2, top)])
    trainer = MegatronTrainer.__new__(MegatronTrainer)  # the check comes before anything the trainer holds
    trainer._check_tokens = lambda batch: None
    with pytest.raises(ValueError, match="trainer=megatron has no distribution-level"):
        trainer.train_step([sample])


def test_directive_plans_refuse_what_cannot_give_logits():
    from rollout.build import plan_run

    base = ["env=toolcall", "reward=opd", "reward.opd_signal=teacher_topk"]
    plan = plan_run(compose_launch_config(base))
    assert plan.reward.topk_signal
    with pytest.raises(ValueError, match="trainer=megatron has no distribution-level loss"):
        plan_run(compose_launch_config([*base, "trainer=megatron"]))
    with pytest.raises(ValueError, match="reward.teacher=policy scores tokens on the policy's servers: use policy=sglang or policy=vllm"):
        plan_run(compose_launch_config([*base, "reward.teacher=policy"]))
    with pytest.raises(ValueError, match="works with reward=opd"):
        plan_run(compose_launch_config(["env=toolcall", "reward=multiplicative", "reward.opd_signal=teacher_topk"]))


def _traj(i: int, steps: list[tuple[float, str | None, int]]) -> Trajectory:
    tr = Trajectory("r", f"e{i}", "g", "t", status=EpisodeStatus.OK, outcome=float(i % 2), family="toolcall")
    for t, (score, hint, n) in enumerate(steps):
        tr.steps.append(Step("r", f"e{i}", "g", "t", t, "a", {}, {},
                             judge=Judgement(score, [int(score)], [""], hint=hint),
                             prompt_ids=list(range(1, 4 + 4 * t)), output_ids=list(range(50, 50 + n)),
                             output_logprobs=[-1.0] * n))
    return tr


def test_the_batch_carries_targets_only_for_hinted_steps():
    """score_trajectories -> put_scores -> build_samples, as the loop runs them: the hinted steps' samples carry
    their teacher top-k with the mode's weight; the steps without a hint carry none (masked, not zero)."""
    trajs = [_traj(0, [(1.0, "the next operand is 3", 2), (-1.0, None, 1)]), _traj(1, [(-1.0, "use +", 3)])]
    tops = {(0, 0): TeacherTopK([[50, 7], [51, 7]], [[-0.2, -2.0], [-0.1, -3.0]], [-0.2, -0.1]),
            (1, 0): TeacherTopK([[9, 7], [9, 7], [9, 7]], [[-0.1, -3.0]] * 3, [-3.0, -4.0, -5.0])}
    teacher = TeacherBatch(logprobs={k: v.sampled for k, v in tops.items()}, prompt_ids={k: [1, 2] for k in tops},
                           topk=tops)
    cfg = RewardConfig(mode="combined", opd_signal="teacher_topk", w_opd=0.5, topk_clamp=2.0)
    scores = score_trajectories(trajs, cfg, teacher.logprobs)
    assert scores.distill == [[0.5, None], [0.5]]
    put_scores(trajs, scores, teacher)
    assert [s.advantage_mode for tr in trajs for s in tr.steps] == ["step+distill", "step", "step+distill"]
    assert trajs[0].steps[1].teacher_topk is None and trajs[0].steps[1].distill_weight is None
    assert trajs[0].steps[0].teacher_gap["mean"] == pytest.approx((0.8 + 0.9) / 2)  # still recorded: a diagnostic
    assert "teacher_topk" not in trajs[0].steps[0].to_json()  # the n x k rows stay in memory
    assert trajs[0].steps[0].to_json()["teacher_topk_summary"]["sampled_in_topk"] == 1.0
    samples, _ = build_samples(trajs, "step", distill_clamp=cfg.topk_clamp)
    targets = [(len(s.distill), s.distill[0].weight if s.distill else None) for s in samples]
    assert targets == [(1, 0.5), (0, None), (1, 0.5)]
    assert samples[0].distill[0].start == 3 and samples[0].distill[0].clamp == 2.0
    m = directive_metrics(trajs)
    assert m["directive/distill_steps"] == pytest.approx(2 / 3)
    assert m["directive/topk_sampled_in"] == pytest.approx(2 / 5)  # 2 of the 5 hinted tokens are in the top-k
    assert m["directive/hint_rate_right"] == 1.0 and m["directive/hint_rate_wrong"] == 0.5
    assert m["directive/toolcall/topk_tail"] > 0


def test_malformed_topk_answers_are_clear_errors():
    good = {"meta_info": {"input_token_logprobs": [[None, 3, None], [-0.5, 4, None]],
                          "input_top_logprobs": [None, [[-0.5, 4, None], [-1.5, 9, None]]]}}
    top = parse_input_topk(good, [4], 2)
    assert top.token_ids == [[4, 9]] and top.logprobs == [[-0.5, -1.5]] and top.sampled == [-0.5]
    with pytest.raises(ValueError, match="no meta_info.input_top_logprobs"):
        parse_input_topk({"meta_info": {"input_token_logprobs": [[-0.5, 4, None]]}}, [4], 2)
    with pytest.raises(ValueError, match="3 entries for top_logprobs_num=2"):
        parse_input_topk({"meta_info": {"input_token_logprobs": [[-0.5, 4, None]],
                                        "input_top_logprobs": [[[-0.5, 4, None]] * 3]}}, [4], 2)
    with pytest.raises(ValueError, match="null or empty"):
        parse_input_topk({"meta_info": {"input_token_logprobs": [[-0.5, 4, None]], "input_top_logprobs": [None]}},
                         [4], 2)


@pytest.mark.integration
def test_topk_from_the_sglang_shaped_server_matches_the_trainer(tiny, sampled):
    """The project's SGLang-shaped server on the same weights as the trainer: `top_logprobs_num` with
    `logprob_start_len` on /generate, parsed by the policy, gives the trainer's top-k at every action token."""
    import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)

    from prm.client.retry import RetryPolicy
    from rollout.policy.sglang import SGLangConfig, SGLangPolicy
    from rollout.server.app import ServerThread, create_app
    from rollout.server.backends import HFBackend

    tok, model, _ = tiny
    completions, hinted = sampled
    with ServerThread(create_app(HFBackend(copy.deepcopy(model), tok))) as srv:
        ids = [*hinted[0][0], *hinted[0][1]]
        k0 = len(hinted[0][0])
        raw = httpx.post(f"{srv.url}/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 0},
                                                       "return_logprob": True, "logprob_start_len": k0,
                                                       "top_logprobs_num": K}).json()
        top_rows = raw["meta_info"]["input_top_logprobs"]
        assert len(top_rows) == len(ids) - k0 and top_rows[0] is None  # as SGLang: nothing at logprob_start_len
        assert all(len(r) == K and r[0][0] >= r[-1][0] for r in top_rows[1:])
        policy = SGLangPolicy(SGLangConfig(urls=[srv.url], score_batch=3, retry=RetryPolicy(attempts=1)),
                              tokenizer=tok)

        async def score():
            try:
                return await policy.score_topk(hinted, K), await policy.score_tokens(hinted)
            finally:
                await policy.close()

        served, served_lp = asyncio.run(score())
    trainer = _trainer(model)
    trained = trainer.action_topk(hinted, K)
    assert len(served) == len(trained) == len(hinted)
    for s, t, lp, (_, action) in zip(served, trained, served_lp, hinted):
        assert len(s.token_ids) == len(action)
        assert s.token_ids == t.token_ids
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(t.logprobs), atol=1e-4)
        assert s.sampled == pytest.approx(t.sampled, abs=1e-4) and lp == pytest.approx(t.sampled, abs=1e-4)


@pytest.mark.integration
@pytest.mark.slow
def test_a_launch_with_the_distribution_level_signal(tmp_path):
    """`python -m rollout.launch ... reward.opd_signal=teacher_topk` end to end (an untrained tiny policy, two
    iterations): every hinted step is distilled, and the metrics rows carry the diagnostics."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "run"
    args = [f"run.out_dir={out}", "env=toolcall", "env.task_set=chain", "env.tools=[calculator]", "reward=combined",
            "reward.opd_signal=teacher_topk", "reward.topk=8", "reward.topk_clamp=5", "policy.warm_start.enabled=false",
            "loop.iterations=2", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=0",
            "sampling.max_new_tokens=32"]
    proc = subprocess.run([sys.executable, "-m", "rollout.launch", *args], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    assert len(train) == 2
    for r in train:
        assert r["train/distill/tokens"] > 0 and r["train/distill/kl_mean"] >= 0 and r["train/distill/entropy"] > 0
        for key in ("distill_steps", "topk_sampled_mass", "topk_sampled_in", "topk_tail", "hint_rate_right"):
            assert f"directive/toolcall/{key}" in r
    steps = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    for s in steps:
        hinted = s["judge"]["hint"] is not None and s["status"] == "ok"
        assert (s["distill_weight"] is not None) == hinted
        assert (s["teacher_topk_summary"] is not None) == hinted
    _viewer_shows_the_directive_diagnostics(out, steps)


def _viewer_shows_the_directive_diagnostics(run_dir, steps):
    """The run viewer charts the directive metrics by default and shows a hinted step's teacher figures."""
    from tests.test_viewer import require_browser

    require_browser()
    from urllib.parse import quote

    from benchmarks.viewer import headless_browser
    from rollout.view import build_viewer

    built = build_viewer(run_dir)
    hinted = next(s for s in steps if s["teacher_topk_summary"] is not None)
    with headless_browser() as ctx:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((built.out_dir / "index.html").as_uri() + "#metrics")
        for key in ("directive/toolcall/hint_rate_right", "directive/gap_std", "train/distill/entropy"):
            page.wait_for_selector(f".chart[data-metric='{key}']", timeout=60_000)
        page.goto((built.out_dir / "index.html").as_uri() + "#episode=" + quote(hinted["episode_id"]))
        page.wait_for_selector("body[data-ready=episode]", timeout=60_000)
        card = page.locator(f".step[data-step='{hinted['step_index']}']").inner_text()
        assert "teacher top-k" in card and "distill weight" in card and "advantage rule" in card, card
        assert not errors, errors
