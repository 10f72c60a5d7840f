"""Teacher log-probs of directive signals: the same weights on an action's exact tokens under another context, forced,
batched, no generation, computed by the trainer (trainer=torch and trainer=megatron) or by the policy's servers
(SGLang's /generate with max_new_tokens 0 and logprob_start_len, here the project's own dev server)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from prm.hints import with_hint
from rollout.build import build_trainer, compose_launch_config, plan_trainer
from rollout.policy.base import SamplingParams
from rollout.policy.local import LocalPolicy
from rollout.policy.local_config import LocalPolicyConfig
from rollout.policy.sglang import parse_input_logprobs
from train.records import TrainSample
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from toy_conversations import addition_conversations

HINT = "The sum is 12: answer \\boxed{12}."


@pytest.fixture(scope="module")
def tiny():
    convs = addition_conversations(40, seed=5)
    tok = build_tokenizer([render_chat(c) for c in convs], vocab_size=400)
    cfg = tiny_qwen3_config(len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    cfg.initializer_range = 0.1  # logits spread enough that contexts change the log-probs visibly
    return tok, build_model(cfg, seed=7), convs


@pytest.fixture(scope="module")
def sampled(tiny):
    """Real completions of the local policy (temperature 1) on the first turns of a few conversations."""
    tok, model, convs = tiny
    policy = LocalPolicy(copy.deepcopy(model), tok, LocalPolicyConfig(seed=3))
    contexts = [c[:2] for c in convs[:6]]

    async def run():
        try:
            return await asyncio.gather(*(policy.generate(m, SamplingParams(max_new_tokens=12)) for m in contexts))
        finally:
            await policy.close()

    completions = asyncio.run(run())
    return policy, contexts, completions


def _trainer(backend: str, model, *overrides: str):
    plan = plan_trainer(compose_launch_config([f"trainer={backend}", *overrides]).trainer, temperature=1.0)
    return build_trainer(plan, copy.deepcopy(model), None)


def test_trainer_teacher_under_the_same_context_is_the_rollout_policy(tiny, sampled):
    tok, model, _ = tiny
    policy, contexts, completions = sampled
    trainer = _trainer("torch", model)
    same = trainer.action_logprobs([(c.prompt_ids, c.output_ids) for c in completions])
    for lp, c in zip(same, completions):
        assert len(lp) == len(c.output_ids)
        assert lp == pytest.approx(c.output_logprobs, abs=1e-4)  # aligned token for token with pi_old
    hinted = [(policy.prompt_ids(with_hint(m, HINT)), c.output_ids) for m, c in zip(contexts, completions)]
    for (ids, _), c in zip(hinted, completions):
        assert len(ids) > len(c.prompt_ids) and "Hint (hindsight): The sum is 12" in tok.decode(ids)
    teacher = trainer.action_logprobs(hinted)
    assert any(abs(a - b) > 1e-3 for t, c in zip(teacher, completions) for a, b in zip(t, c.output_logprobs))
    assert trainer.action_logprobs([]) == []
    with pytest.raises(ValueError, match="non-empty context"):
        trainer.action_logprobs([([], [1, 2])])


def _one_update(trainer, completions) -> None:
    """One PPO step that raises every sampled action token: the current weights move away from the initial ones."""
    batch = []
    for c in completions:
        n_c, n_a = len(c.prompt_ids), len(c.output_ids)
        batch.append(TrainSample(tokens=[*c.prompt_ids, *c.output_ids], loss_mask=[0] * n_c + [1] * n_a,
                                 advantages=[0.0] * n_c + [1.0] * n_a,
                                 rollout_logprobs=[0.0] * n_c + list(c.output_logprobs)))
    trainer.train_step(batch)


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_reference_teacher_keeps_the_initial_weights_after_an_update(tiny, sampled, backend):
    """reward.teacher=reference: the frozen initial weights (the KL anchor's), so the teacher stays where the run
    started while the current weights move."""
    if backend == "megatron":
        import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)
    _, model, _ = tiny
    policy, contexts, completions = sampled
    seqs = [(policy.prompt_ids(with_hint(m, HINT)), c.output_ids) for m, c in zip(contexts, completions)]
    trainer = _trainer(backend, model, "trainer.lr=0.05")
    try:
        before = trainer.action_logprobs(seqs)
        _one_update(trainer, completions)
        current = trainer.action_logprobs(seqs)
        reference = trainer.action_logprobs(seqs, reference=True)
    finally:
        trainer.close()
    assert any(abs(a - b) > 1e-3 for x, y in zip(current, before) for a, b in zip(x, y))  # the update moved them
    for r, b in zip(reference, before):
        assert r == pytest.approx(b, abs=1e-5)
    no_anchor = _trainer(backend, model, "trainer.kl_coef=0")
    try:
        with pytest.raises(ValueError, match="trainer.kl_coef=0 keeps none"):
            no_anchor.action_logprobs(seqs, reference=True)
    finally:
        no_anchor.close()


def test_megatron_teacher_matches_torch(tiny, sampled):
    import megatron.core  # noqa: F401 (the megatron extra, always installed: a broken one fails)
    _, model, _ = tiny
    policy, contexts, completions = sampled
    seqs = [(policy.prompt_ids(with_hint(m, HINT)), c.output_ids) for m, c in zip(contexts, completions)]
    torch_lp = _trainer("torch", model).action_logprobs(seqs)
    mega = _trainer("megatron", model)
    try:
        mega_lp = mega.action_logprobs(seqs)
    finally:
        mega.close()
    for a, b in zip(torch_lp, mega_lp):
        assert a == pytest.approx(b, abs=1e-5)


@pytest.mark.integration
def test_sglang_scoring_on_the_dev_server_matches_the_trainer(tiny, sampled):
    import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)
    import httpx

    from prm.client.retry import RetryPolicy
    from rollout.policy.sglang import SGLangConfig, SGLangPolicy
    from rollout.server.app import ServerThread, create_app
    from rollout.server.backends import HFBackend

    tok, model, _ = tiny
    local, contexts, completions = sampled
    with ServerThread(create_app(HFBackend(copy.deepcopy(model), tok))) as srv:
        # the raw endpoint as SGLang answers it: no generation, the input's log-probs from logprob_start_len on
        ids = completions[0].prompt_ids + completions[0].output_ids
        k = len(completions[0].prompt_ids)
        r = httpx.post(f"{srv.url}/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 0},
                                                     "return_logprob": True, "logprob_start_len": k}).json()
        assert r["output_ids"] == [] and r["meta_info"]["completion_tokens"] == 0
        entries = r["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in entries] == completions[0].output_ids
        r0 = httpx.post(f"{srv.url}/generate", json={"input_ids": ids[:5], "sampling_params": {"max_new_tokens": 0},
                                                      "return_logprob": True, "logprob_start_len": 0}).json()
        assert r0["meta_info"]["input_token_logprobs"][0][0] is None and len(r0["meta_info"]["input_token_logprobs"]) == 5
        bad = httpx.post(f"{srv.url}/generate", json={"input_ids": [ids, ids], "return_logprob": True,
                                                       "logprob_start_len": [1], "sampling_params": {"max_new_tokens": 0}})
        assert bad.status_code == 400
        # the policy's batched scoring (2 sequences per request here) = the trainer's, on the same weights
        policy = SGLangPolicy(SGLangConfig(urls=[srv.url], score_batch=2, retry=RetryPolicy(attempts=1)),
                              tokenizer=tok)
        seqs = [(policy.prompt_ids(with_hint(m, HINT)), c.output_ids) for m, c in zip(contexts, completions)]
        assert [s for s, _ in seqs] == [local.prompt_ids(with_hint(m, HINT)) for m in contexts]

        async def score():
            try:
                return await policy.score_tokens(seqs)
            finally:
                await policy.close()

        served = asyncio.run(score())
        assert srv.app.state.stats["scored_inputs"] == 2 + 6  # the two raw calls above, then the 6 sequences
    trained = _trainer("torch", model).action_logprobs(seqs)
    for a, b in zip(served, trained):
        assert a == pytest.approx(b, abs=1e-4)


def test_malformed_scoring_answers_are_clear_errors():
    good = {"meta_info": {"input_token_logprobs": [[-0.5, 4, None], [-1.5, 9, None]]}}
    assert parse_input_logprobs(good, [4, 9]) == [-0.5, -1.5]
    with pytest.raises(ValueError, match="no meta_info.input_token_logprobs"):
        parse_input_logprobs({"meta_info": {}}, [4])
    with pytest.raises(ValueError, match="2 input token log-probs for the 3 tokens"):
        parse_input_logprobs(good, [4, 9, 1])
    with pytest.raises(ValueError, match="other token ids"):
        parse_input_logprobs(good, [4, 8])
    with pytest.raises(ValueError, match="null"):
        parse_input_logprobs({"meta_info": {"input_token_logprobs": [[None, 4, None]]}}, [4])
    assert torch.isfinite(torch.tensor(parse_input_logprobs(good, [4, 9]))).all()
