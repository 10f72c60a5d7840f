"""SGLang-specific response fields, replayed: answers in the shape SGLang's /generate returns
(meta_info.finish_reason as {"type": ...} dicts, output_token_logprobs as [logprob, token_id, text-or-null],
weight_version as a string, "default" until a versioned update). The shapes are taken from SGLang's source
(FINISH_* .to_json, the tokenizer manager's meta_info), not recorded from a live SGLang server, which cannot run on this
machine (it needs a CUDA torch)."""

import asyncio

import pytest

import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)
from fastapi import FastAPI, Request
from tiny_hf import tiny_tokenizer

from rollout.policy.base import SamplingParams
from prm.client.retry import RequestFailed, RetryPolicy
from rollout.policy.sglang import SGLangConfig, SGLangPolicy, finish_reason, parse_generate_response
from rollout.server.app import ServerThread

STOP = {
    "text": "ls",
    "output_ids": [108, 115, 258],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "stop", "matched": 258},
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "cached_tokens": 8,
        "weight_version": "default",
        "output_token_logprobs": [[-0.5, 108, "l"], [-0.25, 115, "s"], [-0.01, 258, "<|im_end|>"]],
    },
}
LENGTH = {
    "text": "abc",
    "output_ids": [97, 98, 99],
    "meta_info": {
        "finish_reason": {"type": "length", "length": 3},
        "weight_version": "7",
        "output_token_logprobs": [[-1.0, 97, None], [-1.0, 98, None], [-1.0, 99, None]],
    },
}
ABORT = {
    "text": "",
    "output_ids": [],
    "meta_info": {
        "finish_reason": {
            "type": "abort",
            "message": "aborted by the scheduler",
            "status_code": None,
            "err_type": None,
        },
        "output_token_logprobs": [],
    },
}


def test_parse_sglang_generate_answers():
    assert parse_generate_response(STOP, fallback_version=3) == ([108, 115, 258], [-0.5, -0.25, -0.01], "stop", "ls", 3)
    assert parse_generate_response([LENGTH], fallback_version=0)[2:] == ("length", "abc", 7)
    assert parse_generate_response(ABORT, fallback_version=0)[:3] == ([], [], "abort")
    no_ids = {**STOP, "output_ids": None}  # older SGLang: ids only inside output_token_logprobs
    assert parse_generate_response(no_ids, fallback_version=0)[0] == [108, 115, 258]
    with pytest.raises(ValueError, match="disagree"):
        parse_generate_response({**STOP, "output_ids": [1, 2]}, fallback_version=0)
    with pytest.raises(ValueError, match="return_logprob"):
        parse_generate_response({"text": "x", "meta_info": {}}, fallback_version=0)
    assert finish_reason({"finish_reason": "length"}) == "length" and finish_reason({}) == "stop"


def _replay_app(answers):
    app = FastAPI()
    seen = []

    @app.post("/generate")
    async def generate(req: Request):
        seen.append(await req.json())
        return answers[(len(seen) - 1) % len(answers)]

    @app.get("/health")
    async def health():
        return {}

    app.state.seen = seen
    return app


@pytest.mark.integration
def test_sglang_policy_over_replayed_sglang_answers():
    with ServerThread(_replay_app([STOP, LENGTH, {"oops": 1}])) as srv:

        async def run():
            pol = SGLangPolicy(SGLangConfig(urls=[srv.url], retry=RetryPolicy(attempts=1)), tokenizer=tiny_tokenizer())
            msgs = [{"role": "user", "content": "list"}]
            c = await pol.generate(msgs, SamplingParams(max_new_tokens=5, temperature=0.7, stop=["\n\n"]), session="e")
            assert (c.output_ids, c.finish_reason, c.weight_version) == ([108, 115, 258], "stop", 0)
            msgs += [{"role": "assistant", "content": c.text}, {"role": "tool", "content": "a b"}]
            c2 = await pol.generate(msgs, SamplingParams(greedy=True), session="e")
            assert c2.weight_version == 7 and c2.finish_reason == "length"
            assert c2.prompt_ids[: len(c.prompt_ids) + 3] == c.prompt_ids + [108, 115, 258]
            with pytest.raises(RequestFailed, match="malformed"):
                await pol.generate([{"role": "user", "content": "x"}], SamplingParams())
            await pol.close()

        asyncio.run(run())
        first, second = srv.app.state.seen[:2]
        assert first["return_logprob"] is True and isinstance(first["input_ids"], list)
        assert first["sampling_params"] == {
            "max_new_tokens": 5,
            "temperature": 0.7,
            "top_p": 1.0,
            "top_k": -1,
            "stop": ["\n\n"],
        }
        assert second["sampling_params"]["temperature"] == 0.0  # greedy
        assert first["rid"].startswith("e:1:") and second["rid"].startswith("e:3:")


@pytest.mark.integration
def test_a_turns_seed_reaches_sglang_as_sampling_seed_and_fixes_the_sample():
    """The runner's per-turn seed travels as `sampling_params.sampling_seed`; a server that honours it (ours does, as
    SGLang does under --enable-deterministic-inference) gives the same sample for it whatever it served before."""
    from serving_helpers import model_server

    with model_server() as srv:

        async def run():
            pol = SGLangPolicy(SGLangConfig(urls=[srv.url], retry=RetryPolicy(attempts=1)), tokenizer=tiny_tokenizer())
            msgs = [{"role": "user", "content": "list the files"}]
            seeded = SamplingParams(max_new_tokens=16, temperature=1.0, seed=1234)
            a = await pol.generate(msgs, seeded)
            unseeded = [await pol.generate(msgs, SamplingParams(max_new_tokens=16, temperature=1.0)) for _ in range(3)]
            b = await pol.generate(msgs, seeded)
            await pol.close()
            return a, unseeded, b

        a, unseeded, b = asyncio.run(run())
    assert a.output_ids == b.output_ids and a.output_logprobs == b.output_logprobs
    assert len({tuple(c.output_ids) for c in unseeded + [a]}) > 1  # the model does sample: the seed is what fixed it
