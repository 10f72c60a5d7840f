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
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prm.client.retry import RequestFailed, RetryPolicy
from prm.client.router import ServerPool
from rollout.policy.base import Completion, Message, Policy, SamplingParams, WeightUpdate
from rollout.policy.chat_tokens import ChatTokenizer
from train.config import VisionConfig
from train.records import TeacherTopK

log = logging.getLogger(__name__)


@dataclass
class SGLangConfig:
    urls: list[str] = field(default_factory=list)  # server base URLs, e.g. ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    url: str | None = None  # one server (shorthand for urls=[url])
    tokenizer: str | None = None  # local path of the policy's HF tokenizer (with its chat template); default model_path
    model_path: str | None = None  # the served model's HF directory (its config files go next to exported weights)
    weights_dir: str | None = None  # where in-memory weight updates are written for the servers to load (shared disk)
    keep_weight_versions: int = 2  # exported versions kept in weights_dir (older ones deleted)
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(timeout_s=600.0))  # per try: long generations
    health_path: str = "health"
    recheck_s: float = 5.0  # a down server is tried again after this long
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"enable_thinking": false}
    max_sessions: int = 1024  # episodes whose exact token ids are kept (least recently used dropped)
    check_on_start: bool = True  # GET /health on every server at start; fail if none answers
    score_batch: int = 16  # score_tokens: sequences per /generate request (requests go out concurrently)
    # connections to the servers at once (opened as needed): at least the episodes in flight, or turns wait for one
    max_connections: int = 1024
    vision: VisionConfig = field(default_factory=VisionConfig)  # enabled: send the screenshots (a VL model)

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        self.urls = list(self.urls) or ([self.url] if self.url else [])
        if not self.urls:
            raise ValueError(
                "policy.urls is empty: give the SGLang server URL(s), e.g. policy.urls=[http://127.0.0.1:30000]"
            )
        self.tokenizer = self.tokenizer or self.model_path
        if self.score_batch < 1:
            raise ValueError(f"policy.score_batch must be >= 1, got {self.score_batch}")
        if not isinstance(self.retry, RetryPolicy):
            self.retry = RetryPolicy.from_config(self.retry)
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


class SGLangPolicy(Policy):
    """Policy over SGLang servers' native API. Extra over the protocol: `session` routing, `end_session`, `health`."""

    def __init__(self, cfg: SGLangConfig, *, tokenizer: Any = None):
        self.cfg = cfg
        if tokenizer is None:
            if not cfg.tokenizer:
                raise ValueError(
                    "the SGLang policy applies the chat template itself: set policy.tokenizer (or "
                    "policy.model_path) to the served model's local Hugging Face directory"
                )
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
        self.vision = None
        if cfg.vision.enabled:
            from train.vision import VisionProcessor  # the image processor: only for a vision-language model

            if not cfg.tokenizer:
                raise ValueError("policy.vision.enabled needs policy.model_path (the VL model's HF directory)")
            self.vision = VisionProcessor.from_pretrained(cfg.tokenizer, cfg.vision)
        self.tokenizer = tokenizer
        self.chat = ChatTokenizer(tokenizer, template_kwargs=cfg.chat_template_kwargs, max_sessions=cfg.max_sessions)
        self.pool = ServerPool(
            cfg.urls,
            retry=cfg.retry,
            health_path=cfg.health_path,
            recheck_s=cfg.recheck_s,
            max_sessions=cfg.max_sessions,
            max_connections=cfg.max_connections,
            name="sglang server",
        )
        self.weight_version = 0
        self._started = False

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.cfg.check_on_start:
            health = await self.pool.check_health()
            if not any(health.values()):
                raise RuntimeError(f"no SGLang server answers /{self.cfg.health_path}: {self.pool.stats()}")
            down = [u for u, ok in health.items() if not ok]
            if down:
                log.warning("SGLang servers down at start (will be retried): %s", down)

    async def generate(
        self, messages: Sequence[Message], sampling: SamplingParams, session: str | None = None
    ) -> Completion:
        await self.start()
        if self.vision is not None and any(m.get("image") is not None for m in messages):
            return await self._generate_with_images(messages, sampling, session)
        prompt = self.chat.prompt(messages, session)
        payload: dict[str, Any] = {
            "input_ids": prompt.ids,
            "sampling_params": self._sampling_params(sampling),
            "return_logprob": True,
            "logprob_start_len": -1,  # logprobs of the output only
        }
        if session is not None:  # readable in server logs; unique, since SGLang rejects a rid that is still in flight
            payload["rid"] = f"{session}:{len(messages)}:{uuid.uuid4().hex[:8]}"
        data = await self.pool.post_json("generate", payload, session=session, what="SGLang /generate")
        try:
            out_ids, logprobs, reason, text, version = parse_generate_response(
                data, fallback_version=self.weight_version
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise RequestFailed("SGLang /generate", [("-", f"malformed answer: {exc}")]) from exc
        self.chat.record(session, messages, prompt.ids, out_ids, text)
        return Completion(text, list(prompt.ids), out_ids, logprobs, reason, weight_version=version)

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

    def end_session(self, session: str) -> None:
        self.chat.end_session(session)
        self.pool.end_session(session)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The chat template's ids for `messages` as a fresh conversation (no session), with the generation prompt."""
        return list(self.chat.prompt(messages).ids)

    async def score_tokens(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """The served weights' log-prob of each action token given its context, forced, no generation: batches of
        `score_batch` sequences per `/generate` request (`max_new_tokens: 0`, `logprob_start_len` = the context's
        last token, `scoring_start`, so `input_token_logprobs` holds it and then the action's tokens)."""
        return await self._score(sequences, None, "score_tokens")

    async def score_topk(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], k: int) -> list[TeacherTopK]:
        """The served weights' top-k at each action token given its context (`top_logprobs_num: k`, read from
        `meta_info.input_top_logprobs`) with each token's own log-prob, batched as `score_tokens`. At the servers'
        temperature 1: reward.teacher=policy needs sampling.temperature=1 (checked at start)."""
        if k < 1:
            raise ValueError(f"score_topk needs k >= 1, got {k}")
        return await self._score(sequences, k, "score_topk")

    async def _score(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], k: int | None,
                     what: str) -> list[Any]:
        """`score_batch` sequences per scoring request, the requests in flight together, the answers in order."""
        await self.start()
        for context, _ in sequences:
            if not context:
                raise ValueError(f"{what} needs a non-empty context before the action")
        chunks = [list(sequences[i: i + self.cfg.score_batch]) for i in range(0, len(sequences), self.cfg.score_batch)]
        out = await asyncio.gather(*(self._score_chunk(c, k) for c in chunks))
        return [x for chunk in out for x in chunk]

    async def _score_chunk(self, chunk: list[tuple[Sequence[int], Sequence[int]]], k: int | None) -> list[Any]:
        """One scoring `/generate` request (no generation): each action's log-probs, or with `k` its top-k."""
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

    async def health(self) -> dict[str, bool]:
        return await self.pool.check_health()

    async def update_weights(self, update: WeightUpdate) -> None:
        """Every server loads the new weights from disk; a server that fails gets no traffic until a later update.

        `update.path` is a checkpoint directory the servers can read; an in-memory `state_dict` is first written to
        `weights_dir/v<version>/` (safetensors, plus the served model's config files when `model_path` is set).
        """
        path = update.path
        if path is None:
            if update.state_dict is None:
                raise ValueError("WeightUpdate has neither a path nor a state_dict")
            if not self.cfg.weights_dir:
                raise ValueError("set policy.weights_dir (a directory the SGLang servers can read) to sync weights")
            path = await export_update(update, self.cfg)
        body = {"model_path": path, "weight_version": str(update.version), "flush_cache": True}
        results = await self.pool.broadcast("update_weights_from_disk", body)
        failed = {}
        for url, r in results.items():
            ok = isinstance(r, Mapping) and r.get("success", False)
            self.pool.set_stale(url, not ok)
            if not ok:
                failed[url] = r.get("message") if isinstance(r, Mapping) else f"{type(r).__name__}: {r}"
        if len(failed) == len(results):
            raise RuntimeError(f"no server loaded weights v{update.version} from {path}: {failed}")
        if failed:
            log.warning(
                "servers that failed to load weights v%d get no traffic until an update reaches them: %s",
                update.version,
                failed,
            )
        self.weight_version = update.version

    async def close(self) -> None:
        await self.pool.aclose()


#: files of an HF model directory that describe the model (not weights); copied next to exported weights
MODEL_FILES = ("config.json", "generation_config.json")


async def export_update(update: WeightUpdate, cfg: Any) -> str:
    """Write `update.state_dict` under `cfg.weights_dir` (off the event loop) as the servers' next checkpoint: the
    shared step of the server policies' (sglang, openai) weight syncs. `cfg` has weights_dir, model_path and
    keep_weight_versions."""
    return await asyncio.to_thread(
        export_checkpoint,
        update.state_dict,
        Path(cfg.weights_dir),
        update.version,
        cfg.model_path,
        cfg.keep_weight_versions,
    )


def export_checkpoint(
    state_dict: Mapping[str, Any], root: Path, version: int, model_path: str | None = None, keep: int = 2
) -> str:
    """Write `state_dict` as `root/v<version>/model.safetensors` (shared tensors saved once); returns the directory."""
    from safetensors.torch import save_file

    out = root / f"v{version}"
    tmp = root / f".v{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    seen: set[int] = set()
    tensors = {}
    for k, v in state_dict.items():  # tied embeddings: keep the first name (HF drops lm_head.weight the same way)
        ptr = v.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        tensors[k] = v.detach().to("cpu").contiguous()
    save_file(tensors, str(tmp / "model.safetensors"))
    for name in MODEL_FILES if model_path else ():
        src = Path(model_path) / name
        if src.is_file():
            shutil.copy2(src, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # servers never see a half-written checkpoint
    old = sorted((p for p in root.glob("v*") if p.is_dir() and p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
    for p in old[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    return str(out)
