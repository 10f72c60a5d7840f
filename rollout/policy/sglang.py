"""SGLangPolicy: SGLang's native `/generate` with token ids in and token ids + logprobs out.

The chat template is applied here with the policy's own Hugging Face tokenizer (a local path), and each episode's later
turns continue from the exact ids of its earlier turns (`ChatTokenizer`), so training never re-tokenizes text. Several
servers sit behind a `ServerPool`: an episode sticks to one server (its prefix cache), a down server's episodes move to
the others. `update_weights` posts `/update_weights_from_disk` to every server. `score_tokens` asks the servers for the
log-probs of given tokens (`/generate` with `max_new_tokens: 0`, `return_logprob`, `logprob_start_len`): the teacher's
log-probs of directive signals (`reward.teacher=policy`), with no second copy of the weights.

Vision-language models (`policy.vision.enabled=true`, e.g. Qwen3-VL): a prompt whose observations carry screenshots
goes as `text` (the chat template's rendering, one image placeholder per shown image) + `image_data` (the images as PNG
data URLs), which SGLang's multimodal processor expands itself (it rejects pre-expanded `input_ids` with images). The
prompt ids and processed images training needs are computed here with the model's own tokenizer and image processor
(train/vision.py), the same expansion, and checked against the server's prompt token count.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prm.client.retry import RequestFailed
from rollout.policy.base import Completion, Message, SamplingParams
from rollout.policy.export import MODEL_FILES, export_checkpoint, export_update  # noqa: F401 (their old home)
from rollout.policy.token_server import (Generation, TokenServerConfig, TokenServerPolicy, load_tokenizer,
                                         require_ok)
from train.config import VisionConfig
from train.records import TeacherTopK

log = logging.getLogger(__name__)


@dataclass
class SGLangConfig(TokenServerConfig):
    tokenizer: str | None = None  # local path of the policy's HF tokenizer (with its chat template); default model_path
    vision: VisionConfig = field(default_factory=VisionConfig)  # enabled: send the screenshots (a VL model)

    def __post_init__(self) -> None:
        self._check_servers(require_urls=True, example="http://127.0.0.1:30000")
        self.tokenizer = self.tokenizer or self.model_path
        if not isinstance(self.vision, VisionConfig):
            self.vision = VisionConfig(**dict(self.vision))


def image_data_url(image: Any) -> str:
    """An observation's image as a PNG data URL (what SGLang's `image_data` takes)."""
    import base64
    import io

    from train.vision import to_pil

    buf = io.BytesIO()
    to_pil(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def finish_reason(meta: Mapping[str, Any]) -> str:
    """SGLang's meta_info.finish_reason ({"type": "stop"|"length"|"abort", ...} or a plain string) as our string."""
    fr = meta.get("finish_reason")
    kind = fr.get("type") if isinstance(fr, Mapping) else fr
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(str(kind), "abort" if kind else "stop")


def parse_weight_version(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default  # SGLang's default version is the string "default"


def parse_generate_response(data: Any, *, fallback_version: int) -> tuple[list[int], list[float], str, str, int]:
    """(output_ids, logprobs, finish_reason, text, weight_version) from one `/generate` answer."""
    if isinstance(data, list):
        if len(data) != 1:
            raise ValueError(f"/generate returned {len(data)} results for one prompt")
        data = data[0]
    meta = data.get("meta_info") or {}
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ValueError("the /generate answer has no meta_info.output_token_logprobs (was return_logprob sent?)")
    logprobs = [float(e[0]) for e in entries]
    ids_from_logprobs = [int(e[1]) for e in entries]
    output_ids = [int(i) for i in data.get("output_ids") or ids_from_logprobs]
    if output_ids != ids_from_logprobs:
        raise ValueError(
            f"/generate output_ids ({len(output_ids)}) disagree with the ids in output_token_logprobs ({len(entries)})"
        )
    version = parse_weight_version(meta.get("weight_version"), fallback_version)
    return output_ids, logprobs, finish_reason(meta), str(data.get("text", "")), version


def scoring_start(context: Sequence[int]) -> int:
    """`logprob_start_len` for scoring the tokens after `context`: one before them. SGLang's first entry from
    logprob_start_len K on is None (token K's log-prob needs the logits at K-1, which it does not compute: "Always
    pad the first one with None" in its scheduler), so asking from the last context token gives every action token
    its log-prob (and top-k)."""
    return len(context) - 1


def _action_entries(entries: Any, expected_ids: Sequence[int]) -> Any:
    """The entries of the expected ids among those from `scoring_start` on: one more than the ids (the last context
    token's, dropped), or exactly as many (a server that leaves the unscored first entry out)."""
    if entries is not None and len(entries) == len(expected_ids) + 1:
        return list(entries[1:])
    return entries


def parse_input_logprobs(data: Any, expected_ids: Sequence[int]) -> list[float]:
    """The log-probs of `expected_ids` from one `/generate` answer's `meta_info.input_token_logprobs`, `(logprob,
    token_id, text|None)` per input token from logprob_start_len on (`scoring_start`: the entry before the ids is
    dropped)."""
    entries = _action_entries((data.get("meta_info") or {}).get("input_token_logprobs"), expected_ids)
    if entries is None:
        raise ValueError("the /generate answer has no meta_info.input_token_logprobs (was return_logprob sent?)")
    if len(entries) != len(expected_ids):
        raise ValueError(f"{len(entries)} input token log-probs for the {len(expected_ids)} tokens asked for")
    ids = [int(e[1]) for e in entries]
    if ids != [int(i) for i in expected_ids]:
        raise ValueError("the input token log-probs are for other token ids than the ones sent")
    if any(e[0] is None for e in entries):
        raise ValueError("an input token log-prob is null (the first token of a sequence has none)")
    return [float(e[0]) for e in entries]


def parse_input_topk(data: Any, expected_ids: Sequence[int], k: int) -> TeacherTopK:
    """The top-k at each of `expected_ids` from one `/generate` answer asked with `top_logprobs_num: k` from
    `scoring_start`: `meta_info.input_top_logprobs` holds per input position a list of `(logprob, token_id,
    text|None)` (None at a position with no logits), aligned with `input_token_logprobs`."""
    meta = data.get("meta_info") or {}
    sampled = parse_input_logprobs(data, expected_ids)
    top = meta.get("input_top_logprobs")
    if top is None:
        raise ValueError("the /generate answer has no meta_info.input_top_logprobs (was top_logprobs_num sent?)")
    if len(top) == len(meta.get("input_token_logprobs") or ()) == len(expected_ids) + 1:
        top = top[1:]
    if len(top) != len(expected_ids):
        raise ValueError(f"{len(top)} input top-k rows for the {len(expected_ids)} tokens asked for")
    ids, lps = [], []
    for row in top:
        if not row:
            raise ValueError("an input top-k row is null or empty (a position without logits)")
        if len(row) > k:
            raise ValueError(f"an input top-k row has {len(row)} entries for top_logprobs_num={k}")
        if any(e[0] is None for e in row):
            raise ValueError("an input top-k entry has a null log-prob")
        ids.append([int(e[1]) for e in row])
        lps.append([float(e[0]) for e in row])
    return TeacherTopK(ids, lps, sampled)


class SGLangPolicy(TokenServerPolicy):
    """Policy over SGLang servers' native API (rollout/policy/token_server.py: what it shares with policy=vllm)."""

    engine = "SGLang"
    generate_path = "generate"

    def __init__(self, cfg: SGLangConfig, *, tokenizer: Any = None):
        super().__init__(cfg, tokenizer if tokenizer is not None else load_tokenizer(cfg.tokenizer, "SGLang"))
        self.vision = None
        if cfg.vision.enabled:
            from train.vision import VisionProcessor  # the image processor: only for a vision-language model

            if not cfg.tokenizer:
                raise ValueError("policy.vision.enabled needs policy.model_path (the VL model's HF directory)")
            self.vision = VisionProcessor.from_pretrained(cfg.tokenizer, cfg.vision)

    async def generate(
        self, messages: Sequence[Message], sampling: SamplingParams, session: str | None = None
    ) -> Completion:
        if self.vision is not None and any(m.get("image") is not None for m in messages):
            await self.start()
            return await self._generate_with_images(messages, sampling, session)
        return await super().generate(messages, sampling, session)

    def _generation_payload(self, prompt_ids: Sequence[int], sampling: SamplingParams, rid: str | None) -> dict:
        payload: dict[str, Any] = {
            "input_ids": list(prompt_ids),
            "sampling_params": self._sampling_params(sampling),
            "return_logprob": True,
            "logprob_start_len": -1,  # logprobs of the output only
        }
        if rid is not None:  # readable in server logs; unique, since SGLang rejects a rid that is still in flight
            payload["rid"] = f"{rid}:{uuid.uuid4().hex[:8]}"
        return payload

    def _parse_generation(self, data: Any, server: str) -> Generation:
        return Generation(*parse_generate_response(data, fallback_version=self.weight_version))

    def _probe_payload(self, context: Sequence[int], sampling: SamplingParams) -> dict:
        payload = self._generation_payload(context, sampling, None)
        payload["sampling_params"]["ignore_eos"] = True
        return payload

    async def _generate_with_images(
        self, messages: Sequence[Message], sampling: SamplingParams, session: str | None
    ) -> Completion:
        """`text` + `image_data` (SGLang expands the placeholders); the ids and images for training from our own
        processor, checked against the server's count of prompt tokens."""
        assert self.vision is not None
        text_prompt, images = self.vision.render(messages)
        ids, vision = await asyncio.to_thread(self.vision.encode, text_prompt, images)
        payload: dict[str, Any] = {
            "text": text_prompt,
            "image_data": [image_data_url(im) for im in images],
            "sampling_params": self._sampling_params(sampling),
            "return_logprob": True,
            "logprob_start_len": -1,
        }
        if session is not None:
            payload["rid"] = f"{session}:{len(messages)}:{uuid.uuid4().hex[:8]}"
        data = await self.pool.post_json("generate", payload, session=session, what="SGLang /generate")
        try:
            out_ids, logprobs, reason, text, version = parse_generate_response(
                data, fallback_version=self.weight_version
            )
            served = (data[0] if isinstance(data, list) else data).get("meta_info", {}).get("prompt_tokens")
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise RequestFailed("SGLang /generate", [("-", f"malformed answer: {exc}")]) from exc
        if served is not None and int(served) != len(ids):
            raise RequestFailed("SGLang /generate", [("-", (
                f"the server's prompt has {served} tokens, ours {len(ids)}: its image processor or tokenizer differs "
                "from policy.model_path's"))])
        return Completion(text, ids, out_ids, logprobs, reason, weight_version=version, vision=vision)

    def _sampling_params(self, sampling: SamplingParams) -> dict[str, Any]:
        return {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": 0.0 if sampling.greedy else sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            **({"stop": list(sampling.stop)} if sampling.stop else {}),
            # the turn's own seed: SGLang samples from it when started with --enable-deterministic-inference
            **({"sampling_seed": sampling.seed} if sampling.seed is not None else {}),
        }

    async def _score_chunk(self, chunk: list[tuple[Sequence[int], Sequence[int]]], k: int | None) -> list[Any]:
        """One scoring `/generate` request (no generation: `max_new_tokens: 0`, `logprob_start_len` = the context's
        last token, `scoring_start`, so `input_token_logprobs` holds it and then the action's tokens): each action's
        log-probs, or with `k` its top-k (`top_logprobs_num`, read from `meta_info.input_top_logprobs`)."""
        payload: dict[str, Any] = {
            "input_ids": [[*c, *a] for c, a in chunk],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": [scoring_start(c) for c, _ in chunk],
        }
        if k is not None:
            payload["top_logprobs_num"] = k
        data = await self.pool.post_json("generate", payload, what="SGLang /generate (scoring)")
        results = data if isinstance(data, list) else [data]
        try:
            if len(results) != len(chunk):
                raise ValueError(f"{len(results)} answers for {len(chunk)} sequences")
            if k is not None:
                return [parse_input_topk(r, a, k) for r, (_, a) in zip(results, chunk)]
            return [parse_input_logprobs(r, a) for r, (_, a) in zip(results, chunk)]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise RequestFailed("SGLang /generate (scoring)", [("-", f"malformed answer: {exc}")]) from exc

    async def _sync_server(self, url: str, path: str, version: int) -> None:
        """`/update_weights_from_disk {model_path, weight_version, flush_cache}` (SGLang flushes its prefix cache and
        tags its answers' meta_info.weight_version)."""
        body = {"model_path": path, "weight_version": str(version), "flush_cache": True}
        require_ok(await self.pool.call(url, "POST", "update_weights_from_disk", json=body,
                                        what="SGLang /update_weights_from_disk"), "SGLang /update_weights_from_disk", url)
