"""An OpenAI-compatible chat completions client: the LLM judge's, and the `openai` policy's (rollout.policy.openai).

Messages may carry a screenshot under "image" (an H×W×3 uint8 array, a PIL image or PNG bytes): it is sent as an
`image_url` content part (a base64 PNG data URL), the vision message format OpenAI, vLLM and SGLang accept. Servers
that accept the `return_token_ids` extension (vLLM, and `rollout.server.app`) also return `prompt_token_ids` and
each choice's `token_ids`.
"""

from __future__ import annotations

import base64
import io
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prm.client.retry import RequestFailed, RetryPolicy
from prm.client.router import ServerPool

log = logging.getLogger(__name__)


def image_data_url(image: Any, *, max_side: int = 0) -> str:
    """A `data:image/png;base64,...` URL from an array, a PIL image, PNG bytes or an existing URL string."""
    if isinstance(image, str):
        return image
    if isinstance(image, (bytes, bytearray)):
        raw = bytes(image)
    else:
        from PIL import Image

        img = image if isinstance(image, Image.Image) else Image.fromarray(_as_uint8(image))
        if max_side and max(img.size) > max_side:
            scale = max_side / max(img.size)
            img = img.resize((max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale))))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        raw = buf.getvalue()
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")


def _as_uint8(a: Any) -> Any:
    import numpy as np

    arr = np.asarray(a)
    return arr if arr.dtype == np.uint8 else arr.clip(0, 255).astype(np.uint8)


def to_openai_messages(messages: Sequence[Mapping[str, Any]], *, image_max_side: int = 0) -> list[dict[str, Any]]:
    """Our messages (with optional "image"/"images") as OpenAI chat messages with image_url parts."""
    out = []
    for m in messages:
        images = list(m.get("images") or []) + ([m["image"]] if m.get("image") is not None else [])
        content = m.get("content")
        if isinstance(content, list):  # content parts; {"type": "image", "image": array} becomes an image_url part
            content = [
                {"type": "image_url", "image_url": {"url": image_data_url(p["image"], max_side=image_max_side)}}
                if p.get("type") == "image"
                else p
                for p in content
            ]
        if images:
            parts: list[dict[str, Any]] = list(content) if isinstance(content, list) else []
            if isinstance(content, str) and content:
                parts.append({"type": "text", "text": content})
            parts += [
                {"type": "image_url", "image_url": {"url": image_data_url(i, max_side=image_max_side)}} for i in images
            ]
            content = parts
        msg = {"role": m["role"], "content": content if content is not None else ""}
        for k in ("name", "tool_calls", "tool_call_id"):
            if m.get(k) is not None:
                msg[k] = m[k]
        # the API has no "image" role semantics for tool messages with pictures: send those as user messages
        if images and msg["role"] == "tool" and "tool_call_id" not in msg:
            msg["role"] = "user"
        out.append(msg)
    return out


@dataclass
class ChatChoice:
    text: str
    finish_reason: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


@dataclass
class ChatResult:
    choices: list[ChatChoice]
    prompt_token_ids: list[int] | None = None
    weight_version: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)


def parse_chat_response(data: Mapping[str, Any]) -> ChatResult:
    choices = []
    for c in data["choices"]:
        msg = c.get("message") or {}
        lp = c.get("logprobs") or {}
        content_lp = lp.get("content") if isinstance(lp, Mapping) else None
        choices.append(
            ChatChoice(
                text=msg.get("content") or "",
                finish_reason=c.get("finish_reason") or "stop",
                token_ids=[int(t) for t in c["token_ids"]] if c.get("token_ids") is not None else None,
                logprobs=[float(e["logprob"]) for e in content_lp] if content_lp is not None else None,
            )
        )
    ptids = data.get("prompt_token_ids")
    version = data.get("weight_version") or (data.get("meta_info") or {}).get("weight_version")
    return ChatResult(
        choices,
        [int(t) for t in ptids] if ptids is not None else None,
        str(version) if version is not None else None,
        dict(data.get("usage") or {}),
    )


@dataclass
class ChatClientConfig:
    """An OpenAI-compatible chat client: which servers, which model, how requests are retried."""

    urls: list[str] = field(default_factory=list)  # base URLs ending in /v1, e.g. ["http://127.0.0.1:8000/v1"] ...
    url: str | None = None  # ... or one server (shorthand for urls=[url])
    model: str = "default"
    api_key_env: str | None = "OPENAI_API_KEY"  # the key is read from this environment variable, never from config
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    health_path: str = "models"  # GET {url}/models: every OpenAI-compatible server has it
    recheck_s: float = 5.0
    logprobs: bool = True
    return_token_ids: bool = (
        True  # ask for exact ids (vLLM / our server); other servers ignore or reject unknown fields
    )
    image_max_side: int = 0  # downscale screenshots so their longer side is at most this (0: as they are)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request (e.g. chat_template_kwargs)
    max_connections: int = 1024  # connections to the servers at once (opened as needed): >= requests in flight

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        self.urls = list(self.urls) or ([self.url] if self.url else [])
        if not self.urls:
            raise ValueError("no OpenAI-compatible server URL: set urls (or url) to e.g. http://127.0.0.1:8000/v1")
        if not isinstance(self.retry, RetryPolicy):
            self.retry = RetryPolicy.from_config(self.retry)


class OpenAIChatClient:
    """POST {url}/chat/completions over a `ServerPool` (retries, failover, session stickiness)."""

    def __init__(self, cfg: ChatClientConfig, *, name: str = "openai server"):
        self.cfg = cfg
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.pool = ServerPool(
            cfg.urls,
            retry=cfg.retry,
            health_path=cfg.health_path,
            recheck_s=cfg.recheck_s,
            max_connections=cfg.max_connections,
            headers=headers,
            name=name,
        )

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        temperature: float = 1.0,
        max_tokens: int = 256,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        n: int = 1,
        seed: int | None = None,
        logprobs: bool | None = None,
        session: str | None = None,
    ) -> ChatResult:
        body: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": to_openai_messages(messages, image_max_side=self.cfg.image_max_side),
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "n": n,
            **self.cfg.extra_body,
        }
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = seed
        if self.cfg.logprobs if logprobs is None else logprobs:
            body["logprobs"] = True
            if self.cfg.return_token_ids:
                body["return_token_ids"] = True
        data = await self.pool.post_json("chat/completions", body, session=session, what="chat completion")
        try:
            return parse_chat_response(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestFailed("chat completion", [("-", f"malformed answer: {exc}: {str(data)[:200]}")]) from exc

    async def aclose(self) -> None:
        await self.pool.aclose()
