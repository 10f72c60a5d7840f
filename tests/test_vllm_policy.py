"""policy=vllm's client without the engine: parsing vLLM's answers, the serving layout, the weight sync's request order
and its failures against a stand-in HTTP server, the parity check and the mismatch metrics on worked examples. The
real engine: tests/test_vllm_engine.py (experiment tier)."""

from __future__ import annotations

import asyncio
import json
import math

import fastapi
import pytest
from safetensors.torch import load_file

from tiny_hf import tiny_model, tiny_tokenizer

from prm.client.retry import RetryPolicy
from rollout.build import check_directive, compose_launch_config, plan_policy, plan_reward, plan_run_settings
from rollout.policy.base import SamplingParams, WeightUpdate
from rollout.policy.parity import (ParityConfig, WeightParityError, check_parity, mismatch_metrics, probe_context)
from rollout.policy.vllm import (VLLMConfig, VLLMPolicy, completions_sampling, parse_completion,
                                 parse_prompt_logprobs, serving_layout)
from rollout.policy.vllm_server import VLLMNotInstalled, find_python
from rollout.server.app import ServerThread
from train.records import TrainSample

FAST = RetryPolicy(attempts=1, timeout_s=30)


def test_a_completion_gives_its_ids_logprobs_and_finish_reason():
    data = {"choices": [{"index": 0, "text": "ab", "token_ids": [5, 6], "finish_reason": "length",
                         "logprobs": {"token_logprobs": [-0.5, -1.25], "tokens": ["a", "b"]}}]}
    assert parse_completion(data) == ([5, 6], [-0.5, -1.25], "length", "ab")
    with pytest.raises(ValueError, match="return_token_ids"):
        parse_completion({"choices": [{"text": "a", "logprobs": {"token_logprobs": [-1.0]}}]})
    with pytest.raises(ValueError, match="2 token ids but 1 token log-probs"):
        parse_completion({"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}]})


def test_prompt_logprobs_give_the_actions_logprobs_and_top_k():
    ids = [7, 8, 9]
    choice = {"prompt_logprobs": [
        None,
        {"8": {"logprob": -0.1, "rank": 1}},
        # the token itself ranked 3rd, outside the top-2 (vLLM adds it to the row)
        {"9": {"logprob": -2.0, "rank": 3}, "4": {"logprob": -0.3, "rank": 1}, "5": {"logprob": -1.5, "rank": 2}},
    ]}
    assert parse_prompt_logprobs(choice, ids, 1, None) == [-0.1, -2.0]
    top = parse_prompt_logprobs(choice, ids, 1, 2)
    assert top.token_ids == [[8], [4, 5]] and top.logprobs == [[-0.1], [-0.3, -1.5]] and top.sampled == [-0.1, -2.0]
    with pytest.raises(ValueError, match="no log-prob for its own token"):
        parse_prompt_logprobs({"prompt_logprobs": [None, {"3": {"logprob": -1.0, "rank": 1}}, None]}, ids, 1, None)


def test_sampling_options_map_to_vllm_fields():
    sp = completions_sampling(SamplingParams(temperature=0.7, top_k=-1, max_new_tokens=9, stop=["\n"], seed=3))
    assert sp == {"max_tokens": 9, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "stop": ["\n"], "seed": 3}
    assert completions_sampling(SamplingParams(greedy=True))["temperature"] == 0.0


def test_a_tied_checkpoint_gets_its_lm_head_written_out(tmp_path):
    model = tiny_model(seed=1)
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")  # HF drops the tied copy
    assert serving_layout(tmp_path) is True
    head = load_file(tmp_path / "lm_head.safetensors")["lm_head.weight"]
    assert head.equal(model.model.embed_tokens.weight.detach())
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
    assert serving_layout(tmp_path) is False  # untied now: nothing more to do


def test_an_indexed_checkpoint_gets_the_lm_head_in_its_index(tmp_path):
    tiny_model(seed=1).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    serving_layout(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["lm_head.weight"] == "lm_head.safetensors"


def test_policy_vllm_plans_with_the_local_start_options_and_a_weights_dir():
    cfg = compose_launch_config(["policy=vllm", "policy.warm_start.max_conversations=7", "run.out_dir=/tmp/x"])
    plan = plan_policy(cfg.policy, plan_run_settings(cfg))
    assert plan.type == "vllm" and plan.config.urls == [] and plan.config.weights_dir == "/tmp/x/weights"
    assert plan.config.start_options(5).warm_start.max_conversations == 7
    assert plan.config.parity.tolerance == 1e-4 and plan.config.logprobs_mode == "processed_logprobs"
    # the directive modes take vLLM's ids, and its servers as the teacher
    check_directive(plan_reward(compose_launch_config(["reward=opd", "reward.teacher=policy"]).reward), plan,
                    SamplingParams())


def test_bad_vllm_options_are_clear_errors():
    with pytest.raises(ValueError, match="policy.sync='swap'"):
        VLLMConfig(sync="swap")
    with pytest.raises(ValueError, match="restarts the servers the launcher owns"):
        VLLMConfig(urls=["http://h:1"], sync="restart")
    with pytest.raises(ValueError, match="on_mismatch='ignore'"):
        ParityConfig(on_mismatch="ignore")
    assert VLLMConfig(url="http://h:1/v1").urls == ["http://h:1"]  # an OpenAI base URL is taken as the server's


def test_a_missing_vllm_install_names_the_install_step(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXTSTATE_VLLM_VENV", str(tmp_path / "none"))
    monkeypatch.delenv("NEXTSTATE_VLLM_PYTHON", raising=False)
    with pytest.raises(VLLMNotInstalled, match="scripts/install_vllm.sh"):
        find_python()


class StandIn:
    """An HTTP server with vLLM's endpoints, recording the calls (the client's side of the protocol, not vLLM)."""

    def __init__(self, *, reload_result=None, reset_ok=True, tokens=(5, 6)):
        self.calls: list[str] = []
        self.version = "default"  # vLLM's before any tag
        app = fastapi.FastAPI()

        @app.get("/health")
        async def health():
            return {}

        @app.get("/v1/models")
        async def models():
            return {"data": [{"id": "served-tiny"}]}

        @app.post("/v1/completions")
        async def completions(req: fastapi.Request):
            body = await req.json()
            self.calls.append(f"completions {body['model']} ignore_eos={body.get('ignore_eos', False)}")
            return {"choices": [{"index": 0, "text": "x", "token_ids": list(tokens), "finish_reason": "length",
                                 "logprobs": {"token_logprobs": [-1.0] * len(tokens)}}]}

        @app.get("/weight_info")
        async def weight_info():
            return {"weight_version": self.version}

        @app.post("/{op}")
        async def op(op: str, req: fastapi.Request):
            self.calls.append(op if op != "pause" else f"pause mode={req.query_params.get('mode')}")
            if op == "collective_rpc":
                body = await req.json()
                self.calls[-1] = f"collective_rpc {body['method']}"
                return {"results": [reload_result]}
            if op == "reset_prefix_cache":
                return {"success": reset_ok}
            if op == "update_weight_version":
                self.version = (await req.json())["new_version"]
            return {"status": "ok"}

        self.server = ServerThread(app)

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop()

    @property
    def url(self):
        return self.server.url


def _policy(url: str) -> VLLMPolicy:
    return VLLMPolicy(VLLMConfig(urls=[url], retry=FAST), tokenizer=tiny_tokenizer())


def test_a_sync_pauses_reloads_resets_the_prefix_cache_tags_and_resumes(tmp_path):
    tiny_model().save_pretrained(tmp_path)

    async def run(url, stand_in):
        pol = _policy(url)
        c = await pol.generate([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=2), session="e")
        assert c.output_ids == [5, 6] and c.weight_version == 0  # the server's own version (this client never synced)
        await pol.update_weights(WeightUpdate(version=3, path=str(tmp_path)))
        c = await pol.generate([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=2))
        assert c.weight_version == 3 and pol.weight_version == 3
        await pol.close()
        assert stand_in.version == "3"
        actor = _policy(url)  # a client that never syncs (a runner actor's) stamps what the server says it serves
        c = await actor.generate([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=2), session="a")
        assert c.weight_version == 3
        await actor.close()

    with StandIn() as s:
        asyncio.run(run(s.url, s))
        sync = s.calls[s.calls.index("pause mode=wait"):][:5]
    assert sync == ["pause mode=wait", "collective_rpc reload_weights", "reset_prefix_cache", "update_weight_version",
                    "resume"]
    assert (tmp_path / "lm_head.safetensors").exists()  # written in the layout that reloads exactly


@pytest.mark.parametrize("stand_in,message", [
    (dict(reload_result="RuntimeError: bad checkpoint"), "reload_weights"),
    (dict(reset_ok=False), "reset_prefix_cache"),
])
def test_a_failed_sync_step_still_resumes_and_fails_the_sync(tmp_path, stand_in, message):
    tiny_model().save_pretrained(tmp_path)

    async def run(url):
        pol = _policy(url)
        try:
            with pytest.raises(RuntimeError, match=message):
                await pol.update_weights(WeightUpdate(version=1, path=str(tmp_path)))
            assert pol.weight_version == 0
        finally:
            await pol.close()

    with StandIn(**stand_in) as s:
        asyncio.run(run(s.url))
        assert s.calls[-1] == "resume"  # a paused server would hang every later request


def test_the_parity_probe_ignores_eos_on_every_server():
    async def run(a, b):
        pol = VLLMPolicy(VLLMConfig(urls=[a, b], retry=FAST), tokenizer=tiny_tokenizer())
        out = await pol.probe_servers([1, 2, 3], SamplingParams(max_new_tokens=2))
        await pol.close()
        return out

    with StandIn() as s1, StandIn(tokens=(9,)) as s2:
        out = asyncio.run(run(s1.url, s2.url))
        assert out == {s1.url: ([5, 6], [-1.0, -1.0]), s2.url: ([9], [-1.0])}
        assert s1.calls == ["completions served-tiny ignore_eos=True"]


class ProbedPolicy:
    """A policy whose servers answer the probe with given log-probs (the parity check's arithmetic)."""

    def __init__(self, served):
        self.served = served

    def prompt_ids(self, messages):
        return [1, 2]

    async def probe_servers(self, context, sampling):
        assert sampling.max_new_tokens == 3 and sampling.seed is not None
        return self.served


class Scorer:
    version = 4

    def action_logprobs(self, sequences):
        return [[-1.0, -2.0, -3.0] for _ in sequences]


def test_parity_within_tolerance_passes_and_above_it_stops_naming_server_version_and_difference():
    cfg = ParityConfig(tolerance=1e-4, probe_tokens=3)
    good = ProbedPolicy({"http://a": ([4, 5, 6], [-1.0, -2.00005, -3.0])})
    result = asyncio.run(check_parity(good, Scorer(), 4, cfg, 1.0))
    assert result.max_difference == pytest.approx(5e-5) and not result.failed
    bad = ProbedPolicy({"http://a": ([4, 5, 6], [-1.0, -2.0, -3.0]), "http://b": ([4, 5, 6], [-1.0, -2.7, -3.0])})
    with pytest.raises(WeightParityError, match=r"v4: server http://b differs from the trainer by 0\.7 .*3 probe "
                                                r"tokens; tolerance 0\.0001"):
        asyncio.run(check_parity(bad, Scorer(), 4, cfg, 1.0))
    warned = asyncio.run(check_parity(bad, Scorer(), 4, ParityConfig(probe_tokens=3, on_mismatch="warn"), 1.0))
    assert list(warned.failed) == ["http://b"] and warned.metrics()["weight_sync/parity_failed_servers"] == 1.0


def test_a_server_without_a_probe_answer_fails_the_sync():
    broken = ProbedPolicy({"http://a": RuntimeError("connection refused")})
    with pytest.raises(RuntimeError, match="got no tokens from http://a: connection refused"):
        asyncio.run(check_parity(broken, Scorer(), 4, ParityConfig(probe_tokens=3), 1.0))


def test_the_probe_context_is_the_policys_rendering():
    assert probe_context(ProbedPolicy({})) == [1, 2]


def test_mismatch_metrics_on_a_worked_example():
    s = TrainSample(tokens=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], advantages=[0.0] * 4,
                    rollout_logprobs=[0.0, 0.0, -1.0, -2.0])
    m = mismatch_metrics([s], [[0.0, -9.0, -1.1, -1.8]])  # masked position 1 does not count
    assert m["logprobs/tokens"] == 2
    assert m["logprobs/mismatch_max"] == pytest.approx(0.2) and m["logprobs/mismatch_mean"] == pytest.approx(0.15)
    ratios = [math.exp(-0.1), math.exp(0.2)]
    assert m["logprobs/ratio_min"] == pytest.approx(ratios[0]) and m["logprobs/ratio_max"] == pytest.approx(ratios[1])
    assert m["logprobs/ratio_std"] == pytest.approx(abs(ratios[1] - ratios[0]) / 2)
    assert mismatch_metrics([s], [[0.0] * 4]) and mismatch_metrics([], []) == {}
