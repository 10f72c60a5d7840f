"""VLLMPolicy (`policy=vllm`): vLLM servers, token ids in and token ids + log-probs out over `/v1/completions`.

Generation: each turn's prompt is the episode's exact token ids (the chat template applied here, later turns continued
from the earlier turns' ids: rollout/policy/token_server.py), sent as `prompt` with `return_token_ids` and `logprobs`;
the answer's `token_ids` and `logprobs.token_logprobs` are the sampled ids and their log-probs. Log-prob mode: vLLM's
default `raw_logprobs` are those of the temperature-1 model whatever the request's temperature; the servers this
policy starts run `--logprobs-mode processed_logprobs` (after temperature, and after top-k / top-p, which renormalize
over the kept tokens), which is this project's convention (log softmax(logits / T), docs/policies.md) whenever top-k
and top-p are off. `policy.logprobs_mode` says which mode given servers (`policy.urls`) run.

Scoring (the directive teacher, `reward.teacher=policy`): `/v1/completions` with the (context + action) ids as the
prompt and `prompt_logprobs: k`: every prompt position's log-prob and top-k, read for the action's tokens.

Weight sync (`policy.sync=reload`, the default): per server, `POST /pause?mode=wait` (requests in flight finish on the
old weights, new ones wait), `POST /collective_rpc {method: reload_weights, kwargs: {weights_path}}`, `POST
/reset_prefix_cache` (the KV blocks of the old weights must not serve a new request: measured, a cached prefix gave
the old weights' log-probs after a reload), `POST /update_weight_version`, `POST /resume`. Why the checkpoint is
written untied (`serving_layout`): on vLLM's CPU build the LM head's matrix multiply runs on a copy of its weights
prepacked at load (oneDNN); a model with tied embeddings has no `lm_head.weight` in its checkpoint, so an in-place
reload updates the embedding but leaves that prepacked copy stale, and the server then serves neither model (the new
layers under the old LM head: measured, max |delta log p| 0.7 against both). A checkpoint with `lm_head.weight` written
out, served as an untied model, reloads exactly (|delta| < 1e-6). `policy.sync=restart` (servers this policy owns):
stop the server and start it on the new checkpoint, the fallback (its cost: docs/benchmarks.md).

The version a completion carries: the version this client last synced the server to (exact: pause(wait) means no
request spans a sync), or for a client that never syncs (a runner actor's) the server's own `GET /weight_info`, asked
after the completion (a sync that ends between the two stamps the newer version).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prm.client.retry import RequestFailed
from rollout.policy.base import SamplingParams
from rollout.policy.local_config import LocalPolicyOptions, TokenizerOptions, WarmStartOptions
from rollout.policy.token_server import (Generation, TokenServerConfig, TokenServerPolicy, load_tokenizer,
                                         require_ok)
from rollout.policy.vllm_server import VLLMServer, VLLMServerOptions
from train.config import TinyModelConfig
from train.records import TeacherTopK

log = logging.getLogger(__name__)

SYNC_MODES = ("reload", "restart")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class VLLMConfig(TokenServerConfig):
    """`policy=vllm`. With `urls`: running vLLM servers (started with VLLM_SERVER_DEV_MODE=1 to be synced). Without:
    the launcher starts `server.num_servers` of them on `model_path`, or on the tiny model `policy=local` starts from
    (`model`, `tokenizer`, `warm_start`, `num_threads`: the same options), and stops them when the run ends."""

    tokenizer_path: str | None = None  # the model's HF tokenizer (its chat template); None: model_path's
    served_model_name: str | None = None  # the `model` of the requests; None: the servers' own (GET /v1/models)
    sync: str = "reload"  # reload: in place, no restart | restart: stop and start each owned server on the new weights
    # the servers' --logprobs-mode: processed_logprobs (after temperature, this project's convention) | raw_logprobs
    # (vLLM's default: the temperature-1 model's, right only at sampling.temperature=1)
    logprobs_mode: str = "processed_logprobs"
    server: VLLMServerOptions = field(default_factory=VLLMServerOptions)  # the servers the launcher starts
    # requests a server batches at once (vLLM's --max-num-seqs); None: vLLM's default
    max_batch: int | None = None
    # the start the launcher serves when model_path is unset: the tiny Qwen3 of policy=local, warm-started (cached)
    num_threads: int | None = 1  # torch threads of the launcher's process (the warm start, the trainer)
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    tokenizer: TokenizerOptions = field(default_factory=TokenizerOptions)
    warm_start: WarmStartOptions = field(default_factory=WarmStartOptions)

    def __post_init__(self) -> None:
        self.urls = [u[: -len("/v1")] if str(u).rstrip("/").endswith("/v1") else u
                     for u in ([self.urls] if isinstance(self.urls, str) else self.urls)]
        if self.url and str(self.url).rstrip("/").endswith("/v1"):
            self.url = str(self.url).rstrip("/")[: -len("/v1")]
        self._check_servers(require_urls=False, example="http://127.0.0.1:8000")
        if self.sync not in SYNC_MODES:
            raise ValueError(f"policy.sync={self.sync!r}: use one of {', '.join(SYNC_MODES)}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"policy.logprobs_mode={self.logprobs_mode!r}: use one of {', '.join(LOGPROBS_MODES)}")
        if self.sync == "restart" and self.urls:
            raise ValueError("policy.sync=restart restarts the servers the launcher owns: leave policy.urls empty "
                             "(or use policy.sync=reload with running servers)")
        for name, cls in (("server", VLLMServerOptions), ("model", TinyModelConfig), ("tokenizer", TokenizerOptions),
                          ("warm_start", WarmStartOptions)):
            value = getattr(self, name)
            if not isinstance(value, cls):
                setattr(self, name, cls(**dict(value)))

    def start_options(self, seed: int) -> LocalPolicyOptions:
        """The tiny start's options as policy=local takes them (rollout.policy.build.build_local_policy)."""
        return LocalPolicyOptions(num_threads=self.num_threads, model=self.model, tokenizer=self.tokenizer,
                                  warm_start=self.warm_start, seed=seed)


def completions_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """The request fields of our sampling options (vLLM's top_k -1 and top_p 1 sample the whole vocabulary)."""
    return {
        "max_tokens": sampling.max_new_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        **({"stop": list(sampling.stop)} if sampling.stop else {}),
        **({"seed": sampling.seed} if sampling.seed is not None else {}),
    }


def parse_completion(data: Any) -> tuple[list[int], list[float], str, str]:
    """(output ids, their log-probs, finish reason, text) from a `/v1/completions` answer to one prompt."""
    choices = data["choices"]
    if len(choices) != 1:
        raise ValueError(f"{len(choices)} choices for one prompt")
    c = choices[0]
    ids = c.get("token_ids")
    if ids is None:
        raise ValueError("the answer has no choices[0].token_ids (was return_token_ids sent? vLLM >= 0.10 has it)")
    lps = (c.get("logprobs") or {}).get("token_logprobs")
    if lps is None or len(lps) != len(ids):
        raise ValueError(f"{len(ids)} token ids but {None if lps is None else len(lps)} token log-probs")
    if any(x is None for x in lps):
        raise ValueError("a sampled token's log-prob is null")
    reason = FINISH_REASONS.get(str(c.get("finish_reason")), "stop")
    return [int(i) for i in ids], [float(x) for x in lps], reason, str(c.get("text") or "")


def parse_prompt_logprobs(choice: Any, ids: Sequence[int], start: int, k: int | None) -> Any:
    """The log-prob of each of `ids[start:]` (and with `k` its top-k, a TeacherTopK) from a choice's
    `prompt_logprobs`: per prompt position, None first, then {token id: {logprob, rank, decoded_token}}, holding the
    position's own token and the top-k."""
    rows = choice.get("prompt_logprobs")
    if rows is None or len(rows) != len(ids):
        raise ValueError(f"{None if rows is None else len(rows)} prompt log-prob rows for {len(ids)} prompt tokens "
                         "(was prompt_logprobs sent?)")
    sampled, top_ids, top_lps = [], [], []
    for pos in range(start, len(ids)):
        row = rows[pos]
        if not row:
            raise ValueError(f"prompt position {pos} has no log-probs")
        entry = row.get(str(ids[pos]))
        if entry is None or entry.get("logprob") is None:
            raise ValueError(f"prompt position {pos} has no log-prob for its own token {ids[pos]}")
        sampled.append(float(entry["logprob"]))
        if k is not None:
            ranked = sorted(((int(t), e) for t, e in row.items() if e.get("rank") is not None and e["rank"] <= k),
                            key=lambda te: te[1]["rank"])
            if not ranked:
                raise ValueError(f"prompt position {pos} has no top-{k}")
            top_ids.append([t for t, _ in ranked])
            top_lps.append([float(e["logprob"]) for _, e in ranked])
    return TeacherTopK(top_ids, top_lps, sampled) if k is not None else sampled


def serving_layout(model_dir: str | Path) -> bool:
    """Make a checkpoint directory reload exactly on vLLM's CPU build: a model with tied embeddings gets its LM head
    written out (`lm_head.safetensors`, the embedding's tensor under `lm_head.weight`; in the index when there is one)
    and `tie_word_embeddings: false` in its config. Returns whether it changed anything. (Why: the module docstring.)"""
    from safetensors import safe_open
    from safetensors.torch import save_file

    d = Path(model_dir)
    config_path = d / "config.json"
    config = json.loads(config_path.read_text())
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    if not (config.get("tie_word_embeddings") or (text or {}).get("tie_word_embeddings")):
        return False
    embed_name, embed = None, None
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            names = [n for n in st.keys() if n.endswith("embed_tokens.weight")]
            if names:
                embed_name, embed = names[0], st.get_tensor(names[0])
                break
    if embed is None:
        raise ValueError(f"{d}: tied embeddings but no '*embed_tokens.weight' tensor in its safetensors")
    head = embed_name.replace("model.language_model.embed_tokens.weight", "lm_head.weight").replace(
        "model.embed_tokens.weight", "lm_head.weight")
    save_file({head: embed.contiguous()}, str(d / "lm_head.safetensors"), metadata={"format": "pt"})
    index = d / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data.setdefault("weight_map", {})[head] = "lm_head.safetensors"
        index.write_text(json.dumps(data, indent=2))
    config["tie_word_embeddings"] = False
    if text is not None:
        text["tie_word_embeddings"] = False
    config_path.write_text(json.dumps(config, indent=2))
    return True


class VLLMPolicy(TokenServerPolicy):
    """Policy over vLLM servers (`/v1/completions`, token ids in and out). `servers`: those it owns (started by the
    launcher, stopped by `close`), in the order of `cfg.urls`."""

    engine = "vLLM"
    generate_path = "v1/completions"

    def __init__(self, cfg: VLLMConfig, *, tokenizer: Any = None, servers: Sequence[VLLMServer] = ()):
        if not cfg.urls:
            raise ValueError("policy=vllm has no server URLs: give policy.urls, or let the launcher start servers "
                             "(rollout.build)")
        if tokenizer is None:
            tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.model_path, "vLLM")
        super().__init__(cfg, tokenizer)
        self.servers = list(servers)
        self.model_name = cfg.served_model_name
        self.versions = {s.url: 0 for s in self.pool.servers}  # the version each server was synced to here
        self._synced = False  # this client ran a sync (else it asks the servers for their version)
        self._no_weight_info: set[str] = set()  # servers that gave no usable GET /weight_info
        self.sync_seconds: list[float] = []  # each sync's wall time (the benchmark's time per sync)

    async def start(self) -> None:
        if self._started:
            return
        await super().start()
        if self.model_name is None:  # the servers' own name for the model
            data = await self.pool.call(self.pool.servers[0].url, "GET", "v1/models", what="vLLM /v1/models")
            self.model_name = str(data["data"][0]["id"])

    # ----- generation -----
    def _generation_payload(self, prompt_ids: Sequence[int], sampling: SamplingParams, rid: str | None) -> dict:
        return {"model": self.model_name, "prompt": list(prompt_ids), **completions_sampling(sampling),
                "logprobs": 0, "return_token_ids": True, "skip_special_tokens": True}

    def _probe_payload(self, context: Sequence[int], sampling: SamplingParams) -> dict:
        return {**self._generation_payload(context, sampling, None), "ignore_eos": True}

    def _parse_generation(self, data: Any, server: str) -> Generation:
        ids, lps, reason, text = parse_completion(data)
        return Generation(ids, lps, reason, text, self.versions.get(server, self.weight_version))

    async def _generate_ids(self, prompt_ids: Sequence[int], sampling: SamplingParams, session: str | None,
                            rid: str | None) -> Generation:
        if self.model_name is None:
            await self.start()
        gen = await super()._generate_ids(prompt_ids, sampling, session, rid)
        if self._synced:
            return gen
        return gen._replace(weight_version=await self._server_version(session))

    async def _server_version(self, session: str | None) -> int:
        """A client that never synced (a runner actor's) asks its session's server for the version it serves."""
        url = (self.pool.session_server(session) if session is not None else None) or self.pool.servers[0].url
        if url in self._no_weight_info:
            return self.versions.get(url, self.weight_version)
        try:
            data = await self.pool.call(url, "GET", "weight_info", what="vLLM /weight_info")
        except RequestFailed:  # a server without the dev endpoints: the version this client knows, from now on
            self._no_weight_info.add(url)
            return self.versions.get(url, self.weight_version)
        version = str((data or {}).get("weight_version"))
        return int(version) if version.isdigit() else 0  # "default": never synced

    # ----- scoring -----
    async def _score_chunk(self, chunk: list[tuple[Sequence[int], Sequence[int]]], k: int | None) -> list[Any]:
        """One `/v1/completions` request, the (context + action) ids of each sequence a prompt, `prompt_logprobs`
        (k, or 0: the prompt tokens' own), one token generated (the least vLLM allows)."""
        if self.model_name is None:
            await self.start()
        prompts = [[*c, *a] for c, a in chunk]
        body = {"model": self.model_name, "prompt": prompts, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": k or 0}
        what = "vLLM /v1/completions (scoring)"
        data = await self.pool.post_json(self.generate_path, body, what=what)
        try:
            choices = sorted(data["choices"], key=lambda c: c["index"])
            if len(choices) != len(chunk):
                raise ValueError(f"{len(choices)} answers for {len(chunk)} sequences")
            return [parse_prompt_logprobs(ch, ids, len(c), k) for ch, ids, (c, _) in zip(choices, prompts, chunk)]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RequestFailed(what, [("-", f"malformed answer: {exc}")]) from exc

    # ----- weight sync -----
    async def _checkpoint_path(self, update: Any) -> str:
        path = await super()._checkpoint_path(update)
        await asyncio.to_thread(serving_layout, path)
        return path

    async def update_weights(self, update: Any) -> None:
        t0 = time.perf_counter()
        await super().update_weights(update)
        self._synced = True
        self.sync_seconds.append(time.perf_counter() - t0)

    async def _sync_server(self, url: str, path: str, version: int) -> None:
        if self.cfg.sync == "restart":
            server = self._owned(url)
            await asyncio.to_thread(server.restart, path)
        else:
            await self._reload(url, path, version)
        self.versions[url] = version

    def _owned(self, url: str) -> VLLMServer:
        for s in self.servers:
            if s.url == url:
                return s
        raise RuntimeError(f"policy.sync=restart: the server {url} is not one this policy started")

    async def _reload(self, url: str, path: str, version: int) -> None:
        """Pause (in-flight requests finish first), reload in place, reset the prefix cache, tag the version, resume
        (always, even after a failed step: a paused server would hang every later request)."""
        call = self.pool.call
        await call(url, "POST", "pause?mode=wait", what="vLLM /pause")
        try:
            answer = await call(url, "POST", "collective_rpc", json={"method": "reload_weights",
                                                                     "kwargs": {"weights_path": path}},
                                what="vLLM /collective_rpc reload_weights")
            errors = [r for r in (answer or {}).get("results", []) if r not in (None, "None")]
            if errors:
                raise RequestFailed("vLLM reload_weights", [(url, str(errors))])
            require_ok(await call(url, "POST", "reset_prefix_cache", what="vLLM /reset_prefix_cache"),
                       "vLLM /reset_prefix_cache (its blocks of the old weights would serve new requests)", url)
            await call(url, "POST", "update_weight_version", json={"new_version": str(version)},
                       what="vLLM /update_weight_version")
        finally:
            await call(url, "POST", "resume", what="vLLM /resume")

    async def close(self) -> None:
        await super().close()
        if self.servers:
            await asyncio.to_thread(stop_servers, self.servers)

    def server_memory_kib(self) -> dict[str, int]:
        """Each owned server's memory (PSS of its processes)."""
        return {s.url: s.memory_kib() for s in self.servers}


def start_policy_servers(cfg: VLLMConfig, model_dir: str, run_dir: Path, max_logprobs: int = 20) -> list[VLLMServer]:
    """`cfg.server.num_servers` owned servers on `model_dir` (brought to the layout that reloads exactly), started
    together; if any fails, the others are stopped and the error raised."""
    serving_layout(model_dir)
    o = cfg.server
    log_dir = Path(o.log_dir) if o.log_dir else run_dir / "servers"
    servers = [VLLMServer(model_dir, o, name=f"vllm-policy-{i}", log_path=log_dir / f"vllm-policy-{i}.log",
                          port=o.port + i if o.port else 0, served_name=cfg.served_model_name or "nextstate-policy",
                          logprobs_mode=cfg.logprobs_mode, max_logprobs=max_logprobs, max_num_seqs=cfg.max_batch)
               for i in range(o.num_servers)]
    cfg.served_model_name = servers[0].served_name
    with ThreadPoolExecutor(len(servers)) as pool:
        started = [pool.submit(s.start) for s in servers]
        errors = [f.exception() for f in started]
    if any(errors):
        stop_servers(servers)
        raise next(e for e in errors if e is not None)
    return servers


def stop_servers(servers: Sequence[VLLMServer]) -> None:
    for s in servers:
        try:
            s.close()
        except Exception:  # one server's failure to stop must not leave the others running
            log.exception("stopping %s failed", s.name)


__all__ = ["LOGPROBS_MODES", "SYNC_MODES", "VLLMConfig", "VLLMPolicy", "completions_sampling", "parse_completion",
           "parse_prompt_logprobs", "serving_layout", "start_policy_servers", "stop_servers"]
