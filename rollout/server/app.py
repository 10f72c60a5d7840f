"""A small inference server for development and tests: OpenAI chat completions and SGLang's native API, local model.

Endpoints (shapes follow the OpenAI API and SGLang's HTTP server, so the same clients talk to this and to production):
  GET  /health, /health_generate, /v1/models, /get_model_info, /stats
  POST /v1/chat/completions   messages (text and image parts), n, temperature, top_p, max_tokens, stop, seed, logprobs,
                              top_logprobs, and the extension return_token_ids (prompt_token_ids + choices[i].token_ids)
  POST /generate              text or input_ids (one or a batch), sampling_params, return_logprob, logprob_start_len
                              (an int or one per input), top_logprobs_num -> {text, output_ids, meta_info{finish_reason,
                              prompt_tokens, completion_tokens, cached_tokens, weight_version, output_token_logprobs:
                              [[logprob, token_id, null], ...], and with logprob_start_len K >= 0 input_token_logprobs:
                              the input's tokens from position K on, the first entry's logprob null (as SGLang's: the
                              logits before K are not computed), and with top_logprobs_num k input_top_logprobs: per
                              such token, the k most likely [logprob, token_id, null] of its position (the first
                              null)}}; max_new_tokens 0 scores the input without generating (as SGLang does)
  POST /update_weights_from_disk {model_path, weight_version?} -> {success, message}
  POST /flush_cache

`FaultConfig` injects latency and HTTP errors, for failure tests and the judge-latency benchmark.

Run it:  python -m rollout.server --model <hf-model-dir> [--port 30000] [--latency-s 0.5]
         python -m rollout.server --tiny [--env toolcall]   (the tiny Qwen3 policy=local starts from)
         python -m rollout.server --fixed-latency-s 1.0 [--env toolcall | --fixed-text TEXT]
             (no model: every generation request answers one valid action for the env, or TEXT, after 1.0 s)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request  # the `serve` extra
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, PlainTextResponse

from prm.client.router import loads as fast_loads
from rollout.build import compose_launch_config, plan_run
from rollout.event_loop import run_async
from rollout.policy.build import build_local_policy
from rollout.server.backends import (FixedBackend, GenOutput, GenParams, HFBackend, ModelBackend, ReplayBackend,
                                     byte_chat_tokenizer)

log = logging.getLogger(__name__)

GENERATION_PATHS = ("/generate", "/v1/chat/completions")


@dataclass
class FaultConfig:
    """Injected faults: each generation request waits `latency_s`; chosen requests answer `fail_status` instead."""

    latency_s: float = 0.0
    fail_status: int = 500
    fail_first: int = 0  # the first N generation requests fail
    fail_every: int = 0  # then every k-th one fails (0: never)
    fail_all: bool = False
    hold: threading.Event | None = None  # generation requests wait until it is set (tests: a judge that never answers)
    hold_max_s: float = 600.0  # ... or until this long has passed, so that a test that never sets it fails, not hangs
    paths: tuple[str, ...] = GENERATION_PATHS
    _seen: Any = field(default_factory=itertools.count, repr=False, init=False)

    def decide(self, path: str) -> int | None:
        """The status to fail this request with, or None to serve it."""
        if path not in self.paths:
            return None
        k = next(self._seen)
        if self.fail_all or k < self.fail_first:
            return self.fail_status
        if self.fail_every and (k - self.fail_first) % self.fail_every == self.fail_every - 1:
            return self.fail_status
        return None


def _text_of(content: Any, stats: Counter) -> str:
    """Flatten OpenAI message content (a string or a list of parts); images become a placeholder for text models."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append(part.get("text", ""))
        elif kind in ("image_url", "image", "input_image"):
            stats["images_received"] += 1
            parts.append("<image>")
        else:
            raise ValueError(f"unsupported content part type {kind!r}")
    return "".join(parts)


def _sglang_finish(o: GenOutput) -> dict[str, Any]:
    if o.finish_reason == "length":
        return {"type": "length", "length": len(o.output_ids)}
    return {"type": "stop", "matched": o.matched}


class _DevApp(FastAPI):
    """FastAPI, with the generation endpoints (`direct`) called straight from the ASGI entry: the same handler, the
    same answers and HTTPException replies, without the dozen middleware and routing layers each request otherwise
    goes through (half of this server's CPU per request, measured by benchmarks/rollout_side.py)."""

    direct: dict[str, Any]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        handler = self.direct.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            return await super().__call__(scope, receive, send)
        scope["app"] = self
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except HTTPException as exc:
            response = await http_exception_handler(request, exc)
        except Exception:  # as Starlette's ServerErrorMiddleware answers it (and logs it)
            log.exception("%s failed", scope["path"])
            response = PlainTextResponse("Internal Server Error", status_code=500)
        await response(scope, receive, send)


@dataclass
class _Serving:
    """What the routes of one app share: the app (`app.state` holds the backend, the faults and the stats), how request
    bodies are read, and the lock that runs the backend one batch at a time (waiting on it keeps the event loop free).
    A route group is a function `add_<group>_routes(serving)`; a generation endpoint also registers itself with
    `direct`, so that lean servers call it straight from the ASGI entry (`_DevApp`)."""

    app: _DevApp
    model_name: str
    lean: bool
    stats: Counter = field(default_factory=Counter)
    gen_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def read_json(self, req: Request) -> Any:
        return fast_loads(await req.body()) if self.lean else await req.json()

    def direct(self, path: str, handler: Any) -> None:
        if self.lean:
            self.app.direct[path] = handler

    async def run_generation(self, path: str, prompt_ids: list[int], params: GenParams) -> list[GenOutput]:
        """One generation request through the injected faults, then the backend (one batch at a time)."""
        app, stats = self.app, self.stats
        f: FaultConfig = app.state.faults
        stats[f"requests:{path}"] += 1
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            if f.latency_s > 0:
                await asyncio.sleep(f.latency_s)
            held_until = time.monotonic() + f.hold_max_s
            while f.hold is not None and not f.hold.is_set() and time.monotonic() < held_until:
                await asyncio.sleep(0.01)
            status = f.decide(path)
            if status is not None:
                stats[f"injected_failures:{path}"] += 1
                raise HTTPException(status_code=status, detail=f"injected failure ({status})")
            if getattr(app.state.backend, "instant", False):  # no model: answered here, no worker thread, no lock
                return app.state.backend.generate(prompt_ids, params)
            try:
                async with self.gen_lock:
                    return await asyncio.to_thread(app.state.backend.generate, prompt_ids, params)
            except ValueError as exc:
                raise HTTPException(status_code=400, detail=str(exc)) from exc
        finally:
            stats["in_flight"] -= 1


def create_app(backend: ModelBackend, *, model_name: str = "nextstate-local", faults: FaultConfig | None = None,
               lean: bool = True):
    """`lean` (False: as before issue #33, benchmarks/rollout_side.py's `--baseline` servers): request bodies read by
    orjson (the json module for what it refuses: the same values), as the client writes them; a policy turn's
    thousands of token ids read by the json module were a large part of this server's CPU per request; and the
    generation endpoints called straight from the ASGI entry (`_DevApp`)."""
    app = _DevApp(title="NextState dev inference server")
    app.direct = {}
    serving = _Serving(app, model_name, lean)
    app.state.backend = backend
    app.state.faults = faults or FaultConfig()
    app.state.stats = serving.stats
    app.state.request_ids = deque(maxlen=10_000)  # SGLang `rid`s seen, newest last (routing tests, debugging)
    add_info_routes(serving)
    add_weight_routes(serving)
    add_sglang_routes(serving)
    add_openai_routes(serving)
    return app


def add_info_routes(serving: _Serving) -> None:
    """Liveness and what is served: /health, /health_generate, /v1/models, /get_model_info, /stats."""
    app, stats, model_name = serving.app, serving.stats, serving.model_name

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> dict[str, str]:
        tok = app.state.backend.tokenizer
        ids = tok.encode("ping", add_special_tokens=False) or [0]
        async with serving.gen_lock:
            await asyncio.to_thread(app.state.backend.generate, ids, GenParams(max_new_tokens=1))
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "nextstate"}]}

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        b = app.state.backend
        return {
            "model_path": model_name,
            "is_generation": True,
            "weight_version": b.weight_version,
            "context_length": b.context_length,
        }

    @app.get("/stats")
    async def get_stats() -> dict[str, Any]:
        return dict(stats)


def add_weight_routes(serving: _Serving) -> None:
    """SGLang's weight and cache control: /flush_cache, /update_weights_from_disk."""
    app, stats = serving.app, serving.stats

    @app.post("/flush_cache")
    async def flush_cache() -> dict[str, Any]:
        return {"success": True}

    @app.post("/update_weights_from_disk")
    async def update_weights(req: Request) -> Any:
        body = await serving.read_json(req)
        path = body.get("model_path")
        if not path:
            return JSONResponse({"success": False, "message": "model_path is required"}, status_code=400)
        try:
            async with serving.gen_lock:  # no generation runs while weights change
                await asyncio.to_thread(app.state.backend.load_weights, path)
        except (OSError, ValueError, RuntimeError) as exc:
            stats["weight_update_failures"] += 1
            return JSONResponse({"success": False, "message": f"{type(exc).__name__}: {exc}"}, status_code=400)
        if body.get("weight_version") is not None:
            app.state.backend.weight_version = str(body["weight_version"])
        stats["weight_updates"] += 1
        return {
            "success": True,
            "message": f"loaded {path}",
            "num_paused_requests": 0,
            "weight_version": app.state.backend.weight_version,
        }


def add_sglang_routes(serving: _Serving) -> None:
    """SGLang's native generation: /generate (generating, or scoring the input with max_new_tokens 0)."""
    app, stats = serving.app, serving.stats

    @app.post("/generate")
    async def generate(req: Request) -> Any:
        body = await serving.read_json(req)
        tok = app.state.backend.tokenizer
        if body.get("input_ids") is not None:
            prompt = body["input_ids"]
        elif body.get("text") is not None:
            prompt = tok.encode(body["text"], add_special_tokens=False)
        else:
            raise HTTPException(status_code=400, detail="give text or input_ids")
        if body.get("rid") is not None:
            app.state.request_ids.append(body["rid"])
        batch = bool(prompt) and isinstance(prompt[0], list)
        sp = dict(body.get("sampling_params") or {})
        inputs = prompt if batch else [prompt]
        starts = body.get("logprob_start_len", -1)
        starts = list(starts) if isinstance(starts, list) else [starts] * len(inputs)
        if len(starts) != len(inputs):
            raise HTTPException(status_code=400, detail=f"{len(starts)} logprob_start_len for {len(inputs)} inputs")
        top_n = int(body.get("top_logprobs_num") or 0)
        results = []
        for ids, start in zip(inputs, starts):
            start = int(start if start is not None else -1)
            input_logprobs = input_top = None
            if body.get("return_logprob") and start >= 0:
                if start >= len(ids):
                    raise HTTPException(status_code=400, detail=f"logprob_start_len {start} >= input length {len(ids)}")
                try:
                    async with serving.gen_lock:
                        scored = await asyncio.to_thread(app.state.backend.score, list(ids))
                        if top_n > 0:
                            top = await asyncio.to_thread(_score_top, app.state.backend, list(ids), top_n)
                except ValueError as exc:
                    raise HTTPException(status_code=400, detail=str(exc)) from exc
                stats["scored_inputs"] += 1
                # SGLang computes the logits from position K on, so token K itself has no log-prob: null first
                input_logprobs = [[scored[k] if k > start else None, int(ids[k]), None] for k in range(start, len(ids))]
                if top_n > 0:
                    input_top = [[[lp, t, None] for t, lp in top[k]] if k > start and top[k] is not None else None
                                 for k in range(start, len(ids))]
            params = GenParams(
                max_new_tokens=int(sp.get("max_new_tokens", 128)),
                temperature=float(sp.get("temperature", 1.0)),
                top_p=float(sp.get("top_p", 1.0)),
                top_k=int(sp.get("top_k", -1)),
                stop=_as_list(sp.get("stop")),
                stop_token_ids=list(sp.get("stop_token_ids") or []),
                n=int(sp.get("n", 1)),
                seed=sp.get("sampling_seed"),  # SGLang's per-request seed
            )
            for o in await serving.run_generation("/generate", list(ids), params):
                meta: dict[str, Any] = {
                    "id": body.get("rid") or uuid.uuid4().hex,
                    "finish_reason": _sglang_finish(o),
                    "prompt_tokens": len(ids),
                    "completion_tokens": len(o.output_ids),
                    "cached_tokens": 0,
                    "weight_version": app.state.backend.weight_version,
                }
                if body.get("return_logprob"):
                    meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(o.logprobs, o.output_ids)]
                if input_logprobs is not None:
                    meta["input_token_logprobs"] = input_logprobs
                if input_top is not None:
                    meta["input_top_logprobs"] = input_top
                results.append({"text": o.text, "output_ids": o.output_ids, "meta_info": meta})
        # a Response, so FastAPI does not walk the answer through jsonable_encoder (most of a request's CPU here)
        return JSONResponse(results if batch or len(results) > 1 else results[0])

    serving.direct("/generate", generate)


def add_openai_routes(serving: _Serving) -> None:
    """OpenAI's chat completions: /v1/chat/completions."""
    app, stats, model_name = serving.app, serving.stats, serving.model_name

    @app.post("/v1/chat/completions")
    async def chat(req: Request) -> Any:
        body = await serving.read_json(req)
        if body.get("stream"):
            raise HTTPException(status_code=400, detail="stream=true is not supported by this server")
        b = app.state.backend
        try:
            messages = [{"role": m["role"], "content": _text_of(m.get("content"), stats)} for m in body["messages"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise HTTPException(status_code=400, detail=f"bad messages: {exc}") from exc
        if getattr(b, "instant", False):  # the fixed backend never reads the prompt: no template, no prompt ids
            prompt_ids: list[int] = []
        else:
            text = b.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt_ids = b.tokenizer.encode(text, add_special_tokens=False)
        top_k = int(body.get("top_logprobs") or 0)
        params = GenParams(
            max_new_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 256),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            stop=_as_list(body.get("stop")),
            n=int(body.get("n", 1)),
            seed=body.get("seed"),
            top_logprobs=top_k if body.get("logprobs") else 0,
        )
        outs = await serving.run_generation("/v1/chat/completions", prompt_ids, params)
        choices = []
        for i, o in enumerate(outs):
            choice: dict[str, Any] = {
                "index": i,
                "message": {"role": "assistant", "content": o.text},
                "finish_reason": o.finish_reason,
                "logprobs": None,
            }
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "content": [
                        _token_logprob(b.tokenizer, t, lp, o, j, top_k)
                        for j, (t, lp) in enumerate(zip(o.output_ids, o.logprobs))
                    ]
                }
            if body.get("return_token_ids"):
                choice["token_ids"] = o.output_ids
            choices.append(choice)
        resp: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": sum(len(o.output_ids) for o in outs),
                "total_tokens": len(prompt_ids) + sum(len(o.output_ids) for o in outs),
            },
            "weight_version": b.weight_version,
        }
        if body.get("return_token_ids"):
            resp["prompt_token_ids"] = prompt_ids
        return JSONResponse(resp)

    serving.direct("/v1/chat/completions", chat)


def _score_top(backend: Any, ids: list[int], k: int) -> list[Any]:
    """The backend's input top-k (`HFBackend.score_top`); a backend without logits answers 400."""
    if not hasattr(backend, "score_top"):
        raise ValueError(f"{type(backend).__name__} gives no input top-k (top_logprobs_num)")
    return backend.score_top(ids, k)


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)


def _token_logprob(tok: Any, t: int, lp: float, o: GenOutput, j: int, k: int) -> dict[str, Any]:
    piece = tok.decode([t])
    entry: dict[str, Any] = {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8")), "top_logprobs": []}
    if k and j < len(o.top_logprobs):
        entry["top_logprobs"] = [
            {"token": tok.decode([a]), "logprob": b, "bytes": list(tok.decode([a]).encode("utf-8"))}
            for a, b in o.top_logprobs[j]
        ]
    return entry


# ----- running it: in a thread (tests, embedding) or as an owned child process -----


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without it, a response written in two parts (headers, body) waits for the
    # client's delayed ACK (~40 ms per request on loopback)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """Serves an ASGI app with uvicorn on a background thread; `url` once started. Stop it with `stop()` (or `with`)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.app = app
        self._sock = _bind(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name=f"server:{self.port}"
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, wait_s: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ServerProcess:
    """`python -m rollout.server ARGS` as a child process in its own process group, stopped by pid."""

    def __init__(self, args: list[str], *, host: str = "127.0.0.1", log_path: str | None = None, nice: int = 0):
        self.args = list(args)
        self.host = host
        self.log_path = log_path
        self.nice = nice  # > 0: lower CPU priority (e.g. a judge that stands in for a remote one on a small machine)
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, wait_s: float = 300.0) -> ServerProcess:
        ready = Path(tempfile.mkdtemp(prefix="ns-server-")) / "url"
        out = open(self.log_path or os.devnull, "ab")
        cmd = [
            sys.executable,
            "-m",
            "rollout.server",
            "--host",
            self.host,
            "--ready-file",
            str(ready),
            "--exit-with-parent",
            *self.args,
        ]
        if self.nice:
            cmd = ["nice", "-n", str(self.nice), *cmd]  # nice execs the server: the pid stays the one we own
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + wait_s
        while not ready.exists() or not ready.read_text().strip():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with code {self.proc.returncode} before it was ready: {cmd}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not ready after {wait_s:.0f} s: {cmd}")
            time.sleep(0.05)
        self.url = ready.read_text().strip()
        ready.unlink()
        ready.parent.rmdir()
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ----- CLI -----


def tiny_backend(env_name: str, *, seed: int = 0, warm_start: bool = True) -> ModelBackend:
    """The model `policy=local` starts from for `env_name` (warm-started on its demonstrations, cached), served as is:
    built by the launcher's own builder from `python -m rollout.launch env=<env_name> policy=local`'s config."""
    cfg = compose_launch_config([f"env={env_name}", "policy=local", f"policy.warm_start.enabled={warm_start}",
                                 f"run.seed={seed}"])
    plan = plan_run(cfg)
    _policy, model, tokenizer, info = build_local_policy(plan.policy.config, plan.env.families, plan.run.seed)
    log.info("tiny model for env %s: %s", env_name, info)
    return HFBackend(model, tokenizer, seed=seed, name=f"tiny-{env_name}")


#: `--fixed-latency-s` without `--fixed-text`: one valid action per env family (toolcall: a calculator call, cheap to
#: run; the env needs the calculator tool, e.g. env.tools=[python,calculator])
FIXED_ACTIONS = {
    "toolcall": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7 + 0 * {n}"}}\n</tool_call>',
    "terminal": "```bash\necho {n}\n```",
    "swe": "```bash\ngit status  # {n}\n```",
}


def _build_backend(args: argparse.Namespace) -> ModelBackend:
    if args.fixed_latency_s is not None:
        if args.fixed_latency_s < 0:
            raise SystemExit(f"--fixed-latency-s must be >= 0, got {args.fixed_latency_s}")
        text = args.fixed_text or FIXED_ACTIONS.get(args.env)
        if not text:
            raise SystemExit(f"--fixed-latency-s: no fixed action for env {args.env!r}: give --fixed-text "
                             f"(known envs: {', '.join(FIXED_ACTIONS)})")
        return FixedBackend(byte_chat_tokenizer(), text)
    if args.replay:
        responses = json.loads(Path(args.replay).read_text())
        if not (isinstance(responses, list) and responses and all(isinstance(r, str) for r in responses)):
            raise SystemExit(f"--replay {args.replay}: expected a JSON list of response strings")
        if args.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        else:
            tokenizer = byte_chat_tokenizer()
        return ReplayBackend(tokenizer, responses)
    if args.model:
        return HFBackend.from_pretrained(args.model, seed=args.seed)
    if args.tiny:
        return tiny_backend(args.env, seed=args.seed, warm_start=not args.no_warm_start)
    raise SystemExit("give --model <hf-model-dir>, --tiny, --replay <responses.json> --tokenizer <dir>, or "
                     "--fixed-latency-s <seconds>")


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """A daemon thread that sends this process SIGTERM once its parent changes (the parent died and the process was
    re-parented): the server then shuts down as on `ServerProcess.stop`. A thread, not PR_SET_PDEATHSIG, because that
    fires when the starting *thread* exits, and an owner may start its server from a short-lived worker thread."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        log.warning("the owner (pid %d) is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rollout.server", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a Hugging Face model directory (weights + tokenizer)")
    ap.add_argument("--tiny", action="store_true", help="serve the tiny local Qwen3 that policy=local starts from")
    ap.add_argument("--env", default="toolcall", help="with --tiny: the env whose demonstrations warm-start it")
    ap.add_argument("--no-warm-start", action="store_true", help="with --tiny: random weights, no SFT")
    ap.add_argument("--replay", help="a JSON list of recorded responses to answer with, in turn")
    ap.add_argument("--tokenizer", help="tokenizer directory for --replay (default: a byte-level ChatML tokenizer)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--model-name", default="nextstate-local")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latency-s", type=float, default=0.0, help="inject this delay into every generation request")
    ap.add_argument("--fixed-latency-s", type=float, default=None,
                    help="no model: answer every generation request after this many seconds with one valid action "
                         "for --env (or --fixed-text), without reading the prompt (benchmarks of the clients)")
    ap.add_argument("--fixed-text", help="with --fixed-latency-s: the answer (e.g. a judge's 'ok \\boxed{1}'); {n} in "
                    "it is numbered by call")
    ap.add_argument("--fail-every", type=int, default=0, help="every k-th generation request fails")
    ap.add_argument("--fail-first", type=int, default=0, help="the first N generation requests fail")
    ap.add_argument("--fail-status", type=int, default=500)
    ap.add_argument("--ready-file", help="write the server URL here once it accepts connections")
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--event-loop", default="auto", choices=["auto", "uvloop", "asyncio"],
                    help="auto: uvloop where it is installed (a third less CPU per request), else asyncio's")
    ap.add_argument("--http", default="auto", choices=["auto", "httptools", "h11"],
                    help="uvicorn's HTTP parser; auto: httptools (C) where it is installed, else h11")
    ap.add_argument("--lean", default="on", choices=["on", "off"],
                    help="on: request bodies read by orjson, the generation endpoints called without FastAPI's "
                         "middleware and routing, the fixed backend's answers encoded by the Rust tokenizer itself; "
                         "off: as before (benchmarks/rollout_side.py --baseline)")
    ap.add_argument("--exit-with-parent", action="store_true",
                    help="stop (SIGTERM to itself) once the process that started this one is gone, however it died "
                         "(ServerProcess passes it: a killed owner leaves no server behind)")
    args = ap.parse_args(argv)
    if args.exit_with_parent:
        _exit_with_parent(os.getppid())
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    backend = _build_backend(args)
    faults = FaultConfig(
        latency_s=args.fixed_latency_s if args.fixed_latency_s is not None else args.latency_s, fail_every=args.fail_every, fail_first=args.fail_first, fail_status=args.fail_status
    )
    if args.lean == "off":
        FixedBackend.lean = False
    app = create_app(backend, model_name=args.model_name, faults=faults, lean=args.lean == "on")

    import uvicorn

    sock = _bind(args.host, args.port)
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, lifespan="off", access_log=False,
                                           http=args.http))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            print(f"serving {args.model_name} on {url} (OpenAI base {url}/v1)", flush=True)
            if args.ready_file:
                tmp = Path(args.ready_file + ".tmp")
                tmp.write_text(url)
                tmp.rename(args.ready_file)
        await task

    run_async(serve(), args.event_loop)

