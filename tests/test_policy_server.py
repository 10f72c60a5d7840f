"""The development inference server, over a real socket, with a real (tiny) model."""

import json
import os

import httpx
import pytest

import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)
import torch
from serving_helpers import backend, model_server
from tiny_hf import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def srv():
    with model_server(seed=0) as s:
        yield s


def _teacher_forced_logprobs(model, prompt_ids, output_ids):
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    n = len(prompt_ids)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(output_ids)]


def test_chat_completions_returns_text_logprobs_and_exact_ids(srv):
    tok = tiny_tokenizer()
    body = {
        "model": "x",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 12,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 3,
        "n": 2,
        "seed": 7,
        "return_token_ids": True,
    }
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60).json()
    assert r["object"] == "chat.completion" and len(r["choices"]) == 2
    prompt = r["prompt_token_ids"]
    assert prompt == tok.encode(
        tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    for c in r["choices"]:
        ids, lps = c["token_ids"], [e["logprob"] for e in c["logprobs"]["content"]]
        assert len(ids) == len(lps) == len(c["logprobs"]["content"]) and 1 <= len(ids) <= 12
        assert c["finish_reason"] in ("stop", "length")
        assert all(len(e["top_logprobs"]) == 3 for e in c["logprobs"]["content"])
        # the logprobs are the model's own (temperature-1) logprobs of the sampled ids
        ref = _teacher_forced_logprobs(backend(srv).model, prompt, ids)
        assert max(abs(a - b) for a, b in zip(lps, ref)) < 1e-3
    assert r["usage"]["prompt_tokens"] == len(prompt)
    again = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60).json()
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in r["choices"]]  # same seed


def test_generate_has_sglang_shape(srv):
    tok = tiny_tokenizer()
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.0},
        "return_logprob": True,
        "rid": "ep-1:0",
    }
    r = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()
    meta = r["meta_info"]
    assert set(meta) >= {
        "id",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "weight_version",
        "output_token_logprobs",
    }
    assert (
        meta["id"] == "ep-1:0"
        and meta["prompt_tokens"] == len(ids)
        and meta["completion_tokens"] == len(r["output_ids"])
    )
    assert [e[1] for e in meta["output_token_logprobs"]] == r["output_ids"]
    assert all(e[2] is None for e in meta["output_token_logprobs"])
    assert meta["finish_reason"] in ({"type": "length", "length": 6}, {"type": "stop", "matched": r["output_ids"][-1]})
    assert r["text"] == tok.decode(r["output_ids"], skip_special_tokens=True)
    greedy_again = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()
    assert greedy_again["output_ids"] == r["output_ids"]
    ref = _teacher_forced_logprobs(backend(srv).model, ids, r["output_ids"])
    assert max(abs(e[0] - b) for e, b in zip(meta["output_token_logprobs"], ref)) < 1e-3
    batch = httpx.post(f"{srv.url}/generate", json={**body, "input_ids": [ids, ids[:-1]]}, timeout=60).json()
    assert isinstance(batch, list) and len(batch) == 2
    text_in = httpx.post(
        f"{srv.url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60
    )
    assert text_in.status_code == 200 and "output_token_logprobs" not in text_in.json()["meta_info"]


def test_stop_token_ids_and_bad_requests(srv):
    tok = tiny_tokenizer()
    ids = tok.encode("abc", add_special_tokens=False)
    first = httpx.post(
        f"{srv.url}/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 5, "temperature": 0}},
        timeout=60,
    ).json()["output_ids"][0]
    r = httpx.post(
        f"{srv.url}/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 5, "temperature": 0, "stop_token_ids": [first]}},
        timeout=60,
    ).json()
    assert r["output_ids"] == [first] and r["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}
    assert httpx.post(f"{srv.url}/generate", json={}, timeout=60).status_code == 400
    assert (
        httpx.post(
            f"{srv.url}/v1/chat/completions", json={"messages": [{"content": "no role"}]}, timeout=60
        ).status_code
        == 400
    )
    assert (
        httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": [], "stream": True}, timeout=60).status_code
        == 400
    )
    too_long = httpx.post(f"{srv.url}/generate", json={"input_ids": [5] * 5000}, timeout=60)
    assert too_long.status_code == 400 and "context" in too_long.text


def test_health_models_and_info(srv):
    assert httpx.get(f"{srv.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{srv.url}/health_generate", timeout=60).status_code == 200
    assert httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"] == "nextstate-local"
    assert httpx.get(f"{srv.url}/get_model_info").json()["is_generation"] is True


def test_update_weights_from_disk_changes_outputs_and_version(tmp_path):
    from safetensors.torch import save_file

    other = tiny_model(seed=1)
    save_file(
        {k: v.contiguous() for k, v in other.state_dict().items() if k != "lm_head.weight"},
        str(tmp_path / "model.safetensors"),
    )
    tok = tiny_tokenizer()
    ids = tok.encode("same prompt", add_special_tokens=False)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}, "return_logprob": True}
    with model_server(seed=0) as s:
        before = httpx.post(f"{s.url}/generate", json=body, timeout=60).json()
        r = httpx.post(
            f"{s.url}/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "3"}, timeout=60
        ).json()
        assert r["success"] is True and r["weight_version"] == "3"
        after = httpx.post(f"{s.url}/generate", json=body, timeout=60).json()
        assert after["meta_info"]["weight_version"] == "3"
        assert after["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
        ref = _teacher_forced_logprobs(other, ids, after["output_ids"])  # now it is the other model that answers
        assert max(abs(e[0] - b) for e, b in zip(after["meta_info"]["output_token_logprobs"], ref)) < 1e-3
        bad = httpx.post(f"{s.url}/update_weights_from_disk", json={"model_path": str(tmp_path / "nope")}, timeout=60)
        assert bad.status_code == 400 and bad.json()["success"] is False
        (tmp_path / "wrong").mkdir()
        save_file({"not.a.weight": torch.zeros(2)}, str(tmp_path / "wrong" / "model.safetensors"))
        wrong = httpx.post(
            f"{s.url}/update_weights_from_disk", json={"model_path": str(tmp_path / "wrong")}, timeout=60
        )
        assert wrong.json()["success"] is False and "does not fit" in wrong.json()["message"]
        assert httpx.get(f"{s.url}/get_model_info").json()["weight_version"] == "3"


@pytest.mark.slow
def test_cli_serves_a_saved_model_in_an_owned_process(tmp_path):
    from rollout.server.app import ServerProcess

    tiny_model(seed=0).save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    (tmp_path / "r.json").write_text(json.dumps(["\\boxed{1}"]))
    with ServerProcess(["--model", str(tmp_path / "m"), "--latency-s", "0.2"], log_path=str(tmp_path / "log")) as p:
        pid = p.proc.pid
        r = httpx.post(
            f"{p.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert p.proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone
    with ServerProcess(["--replay", str(tmp_path / "r.json"), "--tokenizer", str(tmp_path / "m")]) as p:
        r = httpx.post(
            f"{p.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60
        )
        assert r.json()["choices"][0]["message"]["content"] == "\\boxed{1}"


def test_a_server_stops_when_its_owner_is_killed(tmp_path):
    """An owner that dies without stopping its server (SIGKILL: no cleanup runs) leaves no server behind."""
    import signal
    import subprocess
    import sys
    import time

    tiny_tokenizer().save_pretrained(tmp_path / "m")
    (tmp_path / "r.json").write_text(json.dumps(["\\boxed{1}"]))
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom rollout.server.app import ServerProcess\n"
         f"p = ServerProcess(['--replay', {str(tmp_path / 'r.json')!r}, '--tokenizer', {str(tmp_path / 'm')!r}]).start()\n"
         "print(p.proc.pid, p.url, flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        pid, url = owner.stdout.readline().split()
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        for _ in range(600):  # the server polls its parent every second; give a loaded machine time
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    finally:
        owner.kill()


def test_the_lean_server_answers_as_the_fastapi_routed_one():
    """The generation endpoints called straight from the ASGI entry (and bodies read by orjson) answer every request
    as they do through FastAPI's layers: results, HTTPException replies, a handler's crash as a plain 500."""
    from rollout.server.app import ServerThread, create_app
    from rollout.server.backends import FixedBackend, byte_chat_tokenizer

    tok = byte_chat_tokenizer()

    class Crash(FixedBackend):
        def generate(self, prompt_ids, params):
            if params.max_new_tokens == 13:
                raise RuntimeError("boom")
            return super().generate(prompt_ids, params)

    requests = [
        ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 64}, "return_logprob": True}),
        ("/generate", {"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 5}}),
        ("/generate", {"sampling_params": {}}),  # 400: neither text nor input_ids
        ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 13}}),  # the backend crashes: 500
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 64}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),  # 400
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),  # 400: bad messages
    ]
    answers = {}
    for lean in (False, True):
        with ServerThread(create_app(Crash(tok, "answer {n}"), lean=lean)) as srv:
            got = []
            for path, body in requests:
                r = httpx.post(srv.url + path, content=json.dumps(body), timeout=30)
                data = r.json() if r.headers["content-type"] == "application/json" else r.text
                if isinstance(data, dict):
                    data.pop("id", None), data.pop("created", None)
                    for res in [data, *data.get("choices", [])]:
                        res.get("meta_info", {}).pop("id", None)
                elif isinstance(data, list):
                    for res in data:
                        res["meta_info"].pop("id", None)
                got.append((r.status_code, r.headers["content-type"], data))
            answers[lean] = got
    assert answers[True] == answers[False]
    assert [status for status, _, _ in answers[True]] == [200, 200, 400, 500, 200, 400, 400]
    fixed = FixedBackend(tok, "answer {n}")
    assert fixed._encode("answer 7") == list(tok.encode("answer 7", add_special_tokens=False)) + [tok.eos_token_id]
