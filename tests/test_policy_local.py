"""LocalPolicy: the Policy protocol over the tiny model, dynamic batching, stops, truncation, weight updates."""

import asyncio

import numpy as np
import pytest

from rollout.policy.base import Policy, SamplingParams, WeightUpdate
from rollout.policy.local import LocalPolicy, chat_prompt_ids, find_stop, truncate_prompt
from rollout.policy.local_config import LocalPolicyConfig
from rollout.policy.sampler import teacher_forced_logprobs
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from toy_conversations import addition_conversation, addition_conversations

GREEDY = SamplingParams(greedy=True, max_new_tokens=12)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([render_chat(c) for c in addition_conversations(200)], vocab_size=512)


def make_model(tok, seed):
    # a wider init than the default 0.02: a default-init model with tied embeddings just repeats its last token,
    # which would make every comparison below trivially true
    cfg = tiny_qwen3_config(len(tok))
    cfg.initializer_range = 0.2
    return build_model(cfg, seed=seed)


def prompts(n, seed=0):
    return [c[:2] if i % 2 else c[:4] for i, c in enumerate(addition_conversations(n, seed=seed))]


def test_implements_the_policy_protocol(tok):
    assert isinstance(LocalPolicy(make_model(tok, 0), tok), Policy)


def test_concurrent_requests_share_batches_and_match_unbatched_calls(tok):
    async def main():
        batched = LocalPolicy(make_model(tok, 0), tok, LocalPolicyConfig(max_batch=64))
        single = LocalPolicy(make_model(tok, 0), tok, LocalPolicyConfig(max_batch=1))
        msgs = prompts(64)
        together = await asyncio.gather(*[batched.generate(m, GREEDY) for m in msgs])
        alone = [await single.generate(m, GREEDY) for m in msgs]
        await batched.close()
        await single.close()
        return batched, single, together, alone

    batched, single, together, alone = asyncio.run(main())
    assert batched.stats.requests == 64 and batched.stats.batches <= 2  # 64 concurrent calls: one batch, maybe two
    assert sum(batched.stats.batch_sizes) == 64 and max(batched.stats.batch_sizes) >= 32
    assert single.stats.batches == 64
    for a, b in zip(together, alone):
        assert a.prompt_ids == b.prompt_ids
        assert a.output_ids == b.output_ids and a.text == b.text and a.finish_reason == b.finish_reason
        assert np.allclose(a.output_logprobs, b.output_logprobs, atol=1e-4)


def test_completion_fields_are_exact(tok):
    model = make_model(tok, 1)
    conv = addition_conversation(3, 4)

    async def main():
        policy = LocalPolicy(model, tok, LocalPolicyConfig(seed=5))
        out = await policy.generate(conv[:4], SamplingParams(temperature=0.8, max_new_tokens=20))
        await policy.close()
        return out

    out = asyncio.run(main())
    assert out.prompt_ids == chat_prompt_ids(tok, conv[:4])
    assert tok.decode(out.prompt_ids[-3:]) == "<|im_start|>assistant\n"
    ref = teacher_forced_logprobs(model, out.prompt_ids, out.output_ids, temperature=0.8)
    assert np.allclose(ref, out.output_logprobs, atol=1e-4)
    if out.finish_reason == "stop":
        assert out.output_ids[-1] in (tok.eos_token_id, tok.pad_token_id)
    else:
        assert out.finish_reason == "length" and len(out.output_ids) == 20
    assert out.text == tok.decode(out.output_ids, skip_special_tokens=True)
    assert "<|im_end|>" not in out.text and out.weight_version == 0


def test_extra_message_keys_are_ignored(tok):
    conv = addition_conversation(5, 6)[:2]
    with_image = [dict(conv[0]), {**conv[1], "image": np.zeros((4, 4, 3), dtype=np.uint8), "name": None}]
    assert chat_prompt_ids(tok, with_image) == chat_prompt_ids(tok, conv)


def test_stop_strings_cut_the_text(tok):
    conv = addition_conversation(7, 8)[:2]

    async def main():
        policy = LocalPolicy(make_model(tok, 2), tok)
        free = await policy.generate(conv, SamplingParams(greedy=True, max_new_tokens=40))
        stop = free.text[5:8]
        cut = await policy.generate(conv, SamplingParams(greedy=True, max_new_tokens=40, stop=["@@never@@", stop]))
        await policy.close()
        return free, stop, cut

    free, stop, cut = asyncio.run(main())
    assert len(free.text) > 10 and free.finish_reason == "length"
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert (
        cut.output_ids == free.output_ids[: len(cut.output_ids)]
    )  # sampled ids kept up to the one completing the stop
    assert stop in tok.decode(cut.output_ids) and stop not in tok.decode(cut.output_ids[:-1])


def test_long_prompts_are_left_truncated_keeping_the_system_turn(tok):
    conv = addition_conversation(1, 2)
    long = conv[:2] + [{"role": "user", "content": "x " * 400}]
    system_ids = tok.apply_chat_template(conv[:1], tokenize=True, return_dict=False)
    full = chat_prompt_ids(tok, long)

    async def main(cfg):
        policy = LocalPolicy(make_model(tok, 0), tok, cfg)
        try:
            return await policy.generate(long, GREEDY), policy.stats
        finally:
            await policy.close()

    out, stats = asyncio.run(main(LocalPolicyConfig(max_prompt_tokens=128)))
    assert len(out.prompt_ids) == 128 and stats.truncated_prompts == 1
    assert out.prompt_ids[: len(system_ids)] == system_ids
    assert out.prompt_ids[len(system_ids) :] == full[-(128 - len(system_ids)) :]
    with pytest.raises(ValueError, match="above max_prompt_tokens=128"):
        asyncio.run(main(LocalPolicyConfig(max_prompt_tokens=128, truncate_prompts=False)))
    assert truncate_prompt([9, 9, 1, 2, 3, 4, 5], [9, 9], 4) == [9, 9, 4, 5]
    assert truncate_prompt([9, 9, 9, 1, 2, 3], [9, 9, 9], 4) == [9, 1, 2, 3]  # system turn too long to keep
    assert find_stop("abc</x>def", ["def", "</x>"]) == 3 and find_stop("abc", ["z"]) == -1


def test_weight_updates_apply_between_batches_with_exact_versions(tok, tmp_path):
    model_a = make_model(tok, 10)
    msgs = prompts(8, seed=3)

    async def greedy_of(model):
        policy = LocalPolicy(model, tok)
        outs = [await policy.generate(m, GREEDY) for m in msgs]
        await policy.close()
        return [o.output_ids for o in outs]

    async def main():
        want_a, want_b = await greedy_of(make_model(tok, 10)), await greedy_of(make_model(tok, 11))
        policy = LocalPolicy(model_a, tok, LocalPolicyConfig(max_batch=4))
        first = [asyncio.create_task(policy.generate(m, GREEDY)) for m in msgs]
        while (
            policy._lock is None or not policy._lock.locked()
        ):  # wait until the first batch runs: the update must wait for it
            await asyncio.sleep(0)
        await policy.update_weights(WeightUpdate(version=1, state_dict=make_model(tok, 11).state_dict()))
        second = [await policy.generate(m, GREEDY) for m in msgs]
        first = [await t for t in first]
        make_model(tok, 10).save_pretrained(tmp_path / "v2")
        await policy.update_weights(WeightUpdate(version=2, path=str(tmp_path / "v2")))
        third = [await policy.generate(m, GREEDY) for m in msgs]
        await policy.close()
        return want_a, want_b, first, second, third

    want_a, want_b, first, second, third = asyncio.run(main())
    assert want_a != want_b
    for i, c in enumerate(first):  # each completion came from the weights its version names
        assert c.output_ids == (want_a if c.weight_version == 0 else want_b)[i]
    assert [c.weight_version for c in first][:4] == [0] * 4  # the batch that was running when the update came
    assert [c.weight_version for c in second] == [1] * 8 and [c.output_ids for c in second] == want_b
    assert [c.weight_version for c in third] == [2] * 8 and [c.output_ids for c in third] == want_a


def test_a_failed_batch_fails_its_requests_only(tok, monkeypatch):
    async def main():
        policy = LocalPolicy(make_model(tok, 0), tok)
        real = policy._run_batch
        calls = []

        def flaky(batch):
            calls.append(len(batch))
            if len(calls) == 1:
                raise RuntimeError("boom")
            return real(batch)

        monkeypatch.setattr(policy, "_run_batch", flaky)
        with pytest.raises(RuntimeError, match="boom"):
            await policy.generate(prompts(1)[0], GREEDY)
        ok = await policy.generate(prompts(1)[0], GREEDY)
        await policy.close()
        with pytest.raises(RuntimeError, match="after close"):
            await policy.generate(prompts(1)[0], GREEDY)
        return ok

    assert len(asyncio.run(main()).output_ids) >= 1


def test_the_policy_survives_successive_event_loops(tok):
    policy = LocalPolicy(make_model(tok, 0), tok)
    a = asyncio.run(policy.generate(prompts(1)[0], GREEDY))
    b = asyncio.run(policy.generate(prompts(1)[0], GREEDY))
    asyncio.run(policy.close())
    assert a.output_ids == b.output_ids


def test_from_pretrained_round_trip(tok, tmp_path):
    model = make_model(tok, 4)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)

    async def main():
        p1, p2 = LocalPolicy(model, tok), LocalPolicy.from_pretrained(tmp_path)
        outs = [await p.generate(prompts(1)[0], GREEDY) for p in (p1, p2)]
        await p1.close()
        await p2.close()
        return outs

    a, b = asyncio.run(main())
    assert a.prompt_ids == b.prompt_ids and a.output_ids == b.output_ids


def test_close_fails_running_and_queued_requests(tok):
    async def main():
        policy = LocalPolicy(make_model(tok, 0), tok, LocalPolicyConfig(max_batch=2))
        long = SamplingParams(max_new_tokens=400)
        tasks = [asyncio.create_task(policy.generate(m, long)) for m in prompts(6)]
        while policy._lock is None or not policy._lock.locked():  # the first batch is in the sampler
            await asyncio.sleep(0)
        await policy.close()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(main())
    assert len(results) == 6  # nobody is left waiting, and the running batch stopped early
    assert all(isinstance(r, RuntimeError) and "closed" in str(r) for r in results)
