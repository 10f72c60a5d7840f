"""SGLang and OpenAI-compatible clients against real loopback servers: exact ids, sticky routing, failover, retries."""

import asyncio
import collections

import numpy as np
import pytest

import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)

from serving_helpers import model_server, replay_server, stats
from tiny_hf import save_weights, tiny_model, tiny_tokenizer

from rollout.policy.base import SamplingParams, WeightUpdate, generate
from rollout.policy.openai import OpenAIConfig, OpenAIPolicy
from prm.client.retry import RequestFailed, RetryPolicy
from prm.client.router import ServerPool
from rollout.policy.sglang import SGLangConfig, SGLangPolicy
from rollout.server.app import FaultConfig

pytestmark = pytest.mark.integration

FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, jitter=0.0, timeout_s=60)


def _sglang(urls, **kw):
    return SGLangPolicy(
        SGLangConfig(urls=list(urls), tokenizer="unused", retry=kw.pop("retry", FAST_RETRY), **kw),
        tokenizer=tiny_tokenizer(),
    )


def test_sglang_policy_keeps_exact_ids_across_turns_and_updates_weights(tmp_path):
    save_weights(tiny_model(seed=5), tmp_path)

    async def run(url):
        pol = _sglang([url])
        sp = SamplingParams(max_new_tokens=8, temperature=1.0)
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "task"}]
        turns = []
        for t in range(3):
            c = await generate(pol, msgs, sp, session="ep-7")  # the runner's call path
            assert len(c.output_ids) == len(c.output_logprobs) > 0 and c.finish_reason in ("stop", "length")
            turns.append(c)
            msgs = msgs + [{"role": "assistant", "content": c.text}, {"role": "tool", "content": f"result {t}"}]
        for prev, nxt in zip(turns, turns[1:]):
            assert nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
        assert pol.chat.stats["incremental"] == 2
        assert turns[0].weight_version == 0
        await pol.update_weights(WeightUpdate(version=4, path=str(tmp_path)))
        c = await pol.generate(msgs, sp, session="ep-8")
        assert c.weight_version == 4 and pol.weight_version == 4
        await pol.close()

    with model_server() as srv:
        asyncio.run(run(srv.url))
        assert stats(srv)["weight_updates"] == 1


def test_sessions_stick_to_one_server_and_move_when_it_goes_down():
    with replay_server(["ok"]) as a, replay_server(["ok"]) as b, replay_server(["ok"]) as c:
        servers = {s.url: s for s in (a, b, c)}

        async def run():
            pol = _sglang(servers)
            sp = SamplingParams(max_new_tokens=4)
            convs = {f"ep{i}": [{"role": "user", "content": f"task {i}"}] for i in range(6)}
            for _ in range(3):  # three turns of six interleaved episodes
                for ep, msgs in convs.items():
                    comp = await pol.generate(msgs, sp, session=ep)
                    msgs += [{"role": "assistant", "content": comp.text}, {"role": "user", "content": "next"}]
            homes = {ep: pol.pool.session_server(ep) for ep in convs}
            for url, srv in servers.items():
                seen = {rid.split(":")[0] for rid in srv.app.state.request_ids}
                assert seen == {ep for ep, home in homes.items() if home == url}  # every turn of an episode went home
            assert collections.Counter(homes.values()) == {u: 2 for u in servers}  # new sessions spread evenly
            # one server goes down: its episodes move to the others and keep going
            victim = homes["ep0"]
            servers[victim].stop()
            for ep, msgs in convs.items():
                await pol.generate(msgs, sp, session=ep)
            assert pol.pool.session_server("ep0") != victim
            assert {e: pol.pool.session_server(e) for e in convs if homes[e] != victim} == {
                e: h for e, h in homes.items() if h != victim
            }  # the others stayed put
            down = [s for s in pol.pool.stats() if s["url"] == victim][0]
            assert down["healthy"] is False and down["failures"] >= 1
            assert (await pol.health())[victim] is False
            await pol.close()

        asyncio.run(run())


def test_one_server_down_from_the_start_requests_go_to_the_others():
    with replay_server(["fine"]) as up:
        dead = replay_server(["never"]).__enter__()
        dead_url = dead.url
        dead.__exit__(None, None, None)  # a port nobody listens on any more

        async def run():
            pol = OpenAIPolicy(OpenAIConfig(urls=[dead_url + "/v1", up.url + "/v1"], retry=FAST_RETRY))
            outs = [
                await pol.generate([{"role": "user", "content": f"q{i}"}], SamplingParams(max_new_tokens=8))
                for i in range(6)
            ]
            assert all(o.text == "fine" for o in outs)
            by_url = {s["url"]: s for s in pol.client.pool.stats()}
            assert by_url[dead_url + "/v1"]["failures"] == 1  # tried once, marked down, then left alone
            assert by_url[up.url + "/v1"]["requests"] == 6
            await pol.close()

        asyncio.run(run())
        assert stats(up)["requests:/v1/chat/completions"] == 6


def test_500s_are_retried_then_succeed_or_fail_with_every_try_listed():
    with replay_server(["ok"], faults=FaultConfig(fail_first=2)) as srv:

        async def run():
            pool = ServerPool([srv.url], retry=RetryPolicy(attempts=3, backoff_s=0.01, jitter=0))
            r = await pool.post_json("generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})
            assert r["text"] == "ok"
            srv.app.state.faults = FaultConfig(fail_all=True)
            with pytest.raises(RequestFailed) as info:
                await pool.post_json("generate", {"text": "x"}, what="SGLang /generate")
            assert len(info.value.errors) == 3 and all("HTTP 500" in e for _, e in info.value.errors)
            srv.app.state.faults = FaultConfig(fail_all=True, fail_status=400)
            with pytest.raises(RequestFailed) as info:
                await pool.post_json("generate", {"text": "x"})
            assert len(info.value.errors) == 1  # a 4xx is not retried
            await pool.aclose()

        asyncio.run(run())
        s = stats(srv)
        assert s["requests:/generate"] == 3 + 3 + 1 and s["injected_failures:/generate"] == 2 + 3 + 1


def test_a_server_that_misses_a_weight_update_gets_no_traffic(tmp_path):
    save_weights(tiny_model(seed=2), tmp_path)
    with model_server() as good, replay_server(["x"]) as bad:

        async def nobody_loads():
            pol = _sglang([good.url, bad.url])
            try:
                with pytest.raises(RuntimeError, match="no server loaded weights"):
                    await pol.update_weights(WeightUpdate(version=1, path=str(tmp_path / "nope")))
            finally:
                await pol.close()

        asyncio.run(nobody_loads())

        async def run2():
            pol = _sglang([good.url, bad.url])
            bad.app.state.backend.load_weights = lambda p: (_ for _ in ()).throw(OSError("disk full"))
            await pol.update_weights(WeightUpdate(version=1, path=str(tmp_path)))
            assert [s["stale"] for s in pol.pool.stats()] == [False, True]
            for i in range(4):
                c = await pol.generate(
                    [{"role": "user", "content": str(i)}], SamplingParams(max_new_tokens=3), session=f"s{i}"
                )
                assert c.weight_version == 1
            await pol.close()

        asyncio.run(run2())
        assert stats(bad).get("requests:/generate", 0) == 0


def test_openai_policy_sends_screenshots_as_vision_messages_and_reads_ids():
    with model_server() as srv:

        async def run():
            pol = OpenAIPolicy(OpenAIConfig(urls=[srv.url + "/v1"], retry=FAST_RETRY))
            msgs = [
                {"role": "user", "content": "click OK", "image": np.zeros((20, 30, 3), np.uint8)},
                {"role": "assistant", "content": "click(1, 2)"},
                {"role": "tool", "content": "done", "image": np.ones((20, 30, 3), np.uint8)},
            ]
            c = await pol.generate(msgs, SamplingParams(max_new_tokens=6))
            assert len(c.output_ids) == len(c.output_logprobs) > 0 and c.prompt_ids
            no_ids = OpenAIPolicy(OpenAIConfig(urls=[srv.url + "/v1"], return_token_ids=False, retry=FAST_RETRY))
            c2 = await no_ids.generate(msgs[:1], SamplingParams(max_new_tokens=4))
            assert c2.output_ids == [] and c2.output_logprobs == [] and c2.text is not None
            await pol.close()
            await no_ids.close()

        asyncio.run(run())
        assert stats(srv)["images_received"] == 3


def test_in_memory_weights_are_exported_and_loaded_by_every_server(tmp_path):
    import torch

    trained = tiny_model(seed=3)
    with model_server() as a, model_server() as b:

        async def run():
            pol = _sglang([a.url, b.url], weights_dir=str(tmp_path / "w"), keep_weight_versions=2)
            for v in (1, 2, 3):
                await pol.update_weights(WeightUpdate(version=v, state_dict=trained.state_dict()))
            c = await pol.generate([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=5), session="s")
            await pol.close()
            return c

        c = asyncio.run(run())
        assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v2", "v3"]  # older versions cleaned up
        assert c.weight_version == 3 and stats(a)["weight_updates"] == stats(b)["weight_updates"] == 3
        ids = torch.tensor([c.prompt_ids + c.output_ids])
        with torch.no_grad():
            logp = torch.log_softmax(trained(input_ids=ids).logits[0].float(), -1)
        n = len(c.prompt_ids)
        ref = [float(logp[n - 1 + i, t]) for i, t in enumerate(c.output_ids)]
        assert max(abs(x - y) for x, y in zip(c.output_logprobs, ref)) < 1e-3  # served by the trained weights


def test_requests_go_straight_to_the_transport_with_the_clients_headers_and_json(monkeypatch):
    """ClientShards sends through aiohttp by default, or straight to its httpx transport (backend "httpx"), skipping
    httpx's client layers; not when a proxy is set in the environment (httpx's client routes by it). Every way a
    request carries the pool's headers, its JSON body and the Host header, and a bad status raises."""
    from fastapi import FastAPI, Request

    from prm.client import router
    from prm.client.aiohttp_client import AiohttpClient
    from rollout.server.app import ServerThread

    app = FastAPI()

    @app.post("/echo")
    async def echo(req: Request) -> dict:
        if req.query_params.get("fail"):
            from fastapi import HTTPException

            raise HTTPException(status_code=400, detail="bad")
        return {"auth": req.headers.get("authorization"), "type": req.headers.get("content-type"),
                "host": req.headers.get("host"), "body": await req.json()}

    sent = []

    def spy_on(cls, name, label):
        real = getattr(cls, name)

        async def spy(self, *args):
            sent.append((label, next(a for a in args if isinstance(a, str))))  # the method (after _send's transport)
            return await real(self, *args)

        monkeypatch.setattr(cls, name, spy)

    spy_on(router.ClientShards, "_send", "httpx")
    spy_on(AiohttpClient, "request", "aiohttp")
    with ServerThread(app) as srv:
        async def main():
            pool = ServerPool([srv.url], headers={"Authorization": "Bearer k"}, retry=RetryPolicy(attempts=1))
            got = await pool.post_json("echo", {"x": [1, "é"]})
            with pytest.raises(RequestFailed, match="HTTP 400"):
                await pool.post_json("echo?fail=1", {})
            await pool.aclose()
            return got

        got = asyncio.run(main())
        assert got == {"auth": "Bearer k", "type": "application/json", "host": f"127.0.0.1:{srv.port}",
                       "body": {"x": [1, "é"]}}
        assert sent == [("aiohttp", "POST")] * 2
        sent.clear()
        monkeypatch.setattr(router.ClientShards, "backend", "httpx")
        assert asyncio.run(main()) == got and sent == [("httpx", "POST")] * 2
        monkeypatch.setattr(router.ClientShards, "backend", "aiohttp")
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # applies to https URLs only: this one goes direct
        sent.clear()
        assert router._env_proxies()
        assert asyncio.run(main()) == got and sent == []  # through httpx's client


def test_request_bodies_by_orjson_are_what_the_json_module_writes_and_fail_the_same():
    import dataclasses
    import json
    import math

    from prm.client.router import _body, loads

    plain = {"input_ids": list(range(3000)), "sampling_params": {"temperature": 0.7, "top_p": 1.0, "seed": 2**40},
             "rid": "e1:2:ab", "text": "é \u2063 \n \"q\"", "nested": [[1, 2.5], (3, True, False)]}
    for payload in (plain, {"x": None}, {1: "int key"}, {"big": 2**70}, [], {"s": "\ud800"[:0] + "ok"}):
        headers, content = _body(payload)
        assert headers == {"content-type": "application/json"}
        assert json.loads(content) == json.loads(_body(payload, fast=False)[1]) == json.loads(json.dumps(payload))
    for bad in ({"t": math.nan}, {"t": [math.inf]}):  # the json module refuses them (allow_nan=False); so do we
        with pytest.raises(ValueError):
            _body(bad)

    @dataclasses.dataclass
    class D:
        a: int = 1

    with pytest.raises(TypeError):  # the json module cannot write a dataclass: neither do we
        _body({"d": D()})
    for text in (b'{"a": [1, 2.5, "x"]}', b'{"lp": NaN, "x": -Infinity}', b'{"big": 123456789012345678901234}',
                 '\ufeff{"bom": 1}'.encode()):  # orjson refuses the last three; the json module reads them
        assert repr(loads(text)) == repr(json.loads(text))
    with pytest.raises(ValueError):
        loads(b"{not json")
