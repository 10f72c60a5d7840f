"""LLMJudge: m votes per step from an OpenAI-compatible judge model, aggregated into a step score.

Per step: the family's template is rendered from the StepContext (bounded context, screenshots as images), m requests go
out concurrently (bounded by `max_concurrency` across all steps), the first `\\boxed{}` of each answer is the vote, and
`prm.voting.aggregate` turns the votes into the score. A request that still fails after the retry policy, or an answer
without a valid vote, is an invalid vote; a step with no valid vote scores 0 (neutral) and is logged with the raw texts.
Nothing raises out of `score` except cancellation. Identical steps (same template and inputs) are judged once (LRU
cache, and concurrent duplicates share one in-flight judgement).

With hints on (directive signals, `prm/hints.py`), each step also gets m requests with the family's hint template
(`prm/templates/hints/<family>.txt`, at `hint_max_tokens`): each answers `\\boxed{1}` with a hint between
`[HINT_START]` and `[HINT_END]` when the next state says how the action should have differed, `\\boxed{-1}`
otherwise; the longest valid hint among the +1 answers is the step's hint. They go out together with the score votes.
With `hint_steps=directive` the templates are `prm/templates/hints_directive/<family>.txt`, which also answer
`\\boxed{1}` for a right step whose next state says what to do next (the paper's gate: the next state carries
directive information, not "the step was wrong").
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from envs.options import from_options
from envs.seeding import derive_seed
from prm.client.openai_chat import ChatClientConfig, OpenAIChatClient, to_openai_messages
from prm.client.retry import RetryPolicy
from prm.client.timing import add, phases
from prm.hints import MIN_HINT_CHARS, check_hint_steps, parse_hint, select_hint
from prm.judge import Judge, Judgement, StepContext
from prm.prompt import ContextLimits, RenderedPrompt, TemplateSet, render
from prm.voting import PLUS_MINUS, aggregate, parse_vote

log = logging.getLogger(__name__)

FAILED_PREFIX = "<judge request failed"
#: hint_steps -> the hint templates' subdirectory (prm/templates/<kind>/<family>.txt)
HINT_KINDS = {"wrong": "hints", "directive": "hints_directive"}


def _judge_retry() -> RetryPolicy:
    # judges think for thousands of tokens: a long per-try timeout, few tries
    return RetryPolicy(attempts=3, backoff_s=0.5, timeout_s=300.0)


@dataclass
class LLMJudgeConfig:
    urls: list[str] = field(default_factory=list)  # OpenAI-compatible base URLs, e.g. ["http://127.0.0.1:8000/v1"] ...
    url: str | None = None  # ... or one server (shorthand for urls=[url])
    model: str = "default"
    m: int = 1  # votes per step (the paper: 3 for GUI, 1 otherwise)
    temperature: float = 0.6
    max_tokens: int = 4096
    aggregate: str = "mean"  # "mean" of valid votes | "majority" (ties -> 0)
    template: str | None = (
        None  # one template file for every family (plugin envs), instead of prm/templates/<family>.txt
    )
    templates_dir: str | None = None  # a directory searched before prm/templates/
    limits: ContextLimits = field(default_factory=ContextLimits)
    images: bool = True  # send GUI screenshots as image parts (a vision judge); False: text only
    image_max_side: int = 1280  # downscale screenshots so the longer side is at most this (0: as they are)
    max_concurrency: int = 32  # judge requests in flight at once, all steps together
    max_connections: int = 1024  # connections to the judge servers at once (opened as needed): >= max_concurrency
    cache_size: int = 4096  # judged steps remembered (0: no cache)
    retry: RetryPolicy = field(default_factory=_judge_retry)
    api_key_env: str | None = "OPENAI_API_KEY"
    extra_body: dict[str, Any] = field(default_factory=dict)  # e.g. {"chat_template_kwargs": {"enable_thinking": true}}
    log_raw_chars: int = 400  # raw text shown per vote when a step falls back to neutral
    strip_think: bool = True  # parse the vote after the reasoning: a \\boxed{} inside <think>...</think> never counts
    hint_template: str | None = None  # one hint template for every family, instead of prm/templates/hints/<family>.txt
    hint_max_tokens: int = 8192  # a hint request's max new tokens (the paper: 8192 for hints, 4096 for scores)
    # each vote's sampling seed is derived from (seed, the prompt, the vote's index), so the same step gets the same votes
    # in every run whatever else is in flight (servers that honour the OpenAI `seed` field); None: unseeded votes
    seed: int | None = 0
    # a local HF model directory the launcher serves on vLLM for the judge when no url is given ("policy": a frozen
    # copy of the policy's starting weights); `model` is its served name (rollout.build.start_judge_servers)
    model_path: str | None = None
    server: dict[str, Any] = field(default_factory=dict)  # that server's options (rollout.policy.vllm_server)

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        self.urls = [u for u in self.urls if u] or ([self.url] if self.url else [])
        if not self.urls and not self.model_path:
            raise ValueError("the LLM judge needs a server: set judge.url=http://host:port/v1 (or judge.urls=[...]), "
                             "or judge.model_path=<hf dir> for a vLLM server the launcher starts")
        if self.m < 1:
            raise ValueError(f"judge.m must be >= 1, got {self.m}")
        if self.aggregate not in ("mean", "majority"):
            raise ValueError(f"judge.aggregate={self.aggregate!r}: use 'mean' or 'majority'")
        if self.max_concurrency < 1:
            raise ValueError("judge.max_concurrency must be >= 1")
        if self.hint_max_tokens < 1:
            raise ValueError(f"judge.hint_max_tokens must be >= 1, got {self.hint_max_tokens}")
        if isinstance(self.limits, Mapping):
            self.limits = ContextLimits(**self.limits)
        if not isinstance(self.retry, RetryPolicy):
            self.retry = RetryPolicy.from_config(self.retry)

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> LLMJudgeConfig:
        """From a config mapping: `url` or `urls`; unknown keys are an error naming the known ones."""
        return from_options(cls, cfg, "LLM judge")


@dataclass
class JudgeStats:
    steps: int = 0  # score() calls
    judged: int = 0  # steps that went to the model
    cache_hits: int = 0
    requests: int = 0
    failed_requests: int = 0
    invalid_votes: int = 0  # answers without a valid \boxed{} vote (failed requests included)
    neutral: int = 0  # steps with no valid vote, scored 0
    hint_requests: int = 0
    hinted: int = 0  # judged steps that got a hint
    prompt_tokens: int = 0  # as the server's `usage` reported them
    completion_tokens: int = 0


class LLMJudge(Judge):
    def __init__(self, cfg: LLMJudgeConfig, *, client: OpenAIChatClient | None = None, hints: bool = False,
                 min_hint_chars: int = MIN_HINT_CHARS, hint_steps: str = "wrong"):
        self.cfg = cfg
        self.hints = hints
        self.min_hint_chars = min_hint_chars
        self.hint_steps = check_hint_steps(hint_steps)
        self.templates = TemplateSet(cfg.templates_dir, cfg.template)
        self.hint_templates = (TemplateSet(cfg.templates_dir, cfg.hint_template, kind=HINT_KINDS[hint_steps])
                               if hints else None)
        self.client = client or OpenAIChatClient(
            ChatClientConfig(
                urls=cfg.urls,
                model=cfg.model,
                api_key_env=cfg.api_key_env,
                retry=cfg.retry,
                logprobs=False,
                return_token_ids=False,
                image_max_side=cfg.image_max_side,
                extra_body=dict(cfg.extra_body),
                max_connections=cfg.max_connections,
            ),
            name="judge server",
        )
        self.stats = JudgeStats()
        self._slots = asyncio.Semaphore(cfg.max_concurrency)
        self._cache: OrderedDict[str, Judgement] = OrderedDict()
        self._inflight: dict[str, _InFlight] = {}
        settings = {k: getattr(cfg, k) for k in ("model", "m", "temperature", "max_tokens", "aggregate", "images", "seed")}
        settings.update(hints=hints, min_hint_chars=min_hint_chars, hint_max_tokens=cfg.hint_max_tokens,
                        hint_steps=hint_steps)
        self._settings = json.dumps(settings, sort_keys=True)

    async def score(self, ctx: StepContext) -> Judgement:
        t0 = time.perf_counter()
        j = await self._score(ctx)
        j.latency_s = time.perf_counter() - t0
        return j

    async def _score(self, ctx: StepContext) -> Judgement:
        self.stats.steps += 1
        try:
            prompt = render(self.templates.for_family(ctx.family), ctx, self.cfg.limits, images=self.cfg.images)
        except Exception as exc:  # a template or context problem must not crash the rollout
            log.warning(
                "judge: could not render the prompt for %s step %d (%s): %s; neutral score",
                ctx.task_id,
                ctx.step_index,
                ctx.family,
                exc,
            )
            self.stats.neutral += 1
            return Judgement(0.0, [None], [f"<judge prompt failed: {type(exc).__name__}: {exc}>"])
        hint_prompt = self._hint_prompt(ctx)
        key = hashlib.sha256((prompt.key + (hint_prompt.key if hint_prompt else "") + self._settings).encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.stats.cache_hits += 1
            return _copy(cached, cached=True)
        entry = self._inflight.get(key)
        owner = entry is None
        if entry is None:
            entry = _InFlight(asyncio.create_task(self._judge_and_cache(key, prompt, hint_prompt, ctx)))
            self._inflight[key] = entry
        else:
            self.stats.cache_hits += 1  # the same step is being judged right now: share it
        entry.waiters += 1
        try:
            return _copy(await asyncio.shield(entry.task), cached=not owner)  # its tokens are counted once
        except asyncio.CancelledError:
            entry.waiters -= 1
            if entry.waiters == 0:  # nobody wants this judgement any more (e.g. the episode aborted)
                entry.task.cancel()
            raise

    def _hint_prompt(self, ctx: StepContext) -> RenderedPrompt | None:
        """The hint request's prompt (None with hints off, or when it cannot be rendered: the step then has no hint)."""
        if self.hint_templates is None:
            return None
        try:
            return render(self.hint_templates.for_family(ctx.family), ctx, self.cfg.limits, images=self.cfg.images)
        except Exception as exc:
            log.warning("judge: could not render the hint prompt for %s step %d (%s): %s; no hint", ctx.task_id,
                        ctx.step_index, ctx.family, exc)
            return None

    async def _judge_and_cache(self, key: str, prompt: RenderedPrompt, hint_prompt: RenderedPrompt | None,
                               ctx: StepContext) -> Judgement:
        try:
            judgement, cacheable = await self._judge(prompt, hint_prompt, ctx)
        finally:
            self._inflight.pop(key, None)
        if cacheable and self.cfg.cache_size > 0:  # failed requests are not cached: the next time may work
            self._cache[key] = judgement
            while len(self._cache) > self.cfg.cache_size:
                self._cache.popitem(last=False)
        return judgement

    async def _judge(self, prompt: RenderedPrompt, hint_prompt: RenderedPrompt | None,
                     ctx: StepContext) -> tuple[Judgement, bool]:
        self.stats.judged += 1
        messages = await self._encoded(prompt)
        m = self.cfg.m
        calls = [self._one_vote(messages, self.cfg.max_tokens, self._vote_seed(prompt, i)) for i in range(m)]
        if hint_prompt is not None:
            hint_messages = await self._encoded(hint_prompt)
            calls += [self._one_vote(hint_messages, self.cfg.hint_max_tokens, self._vote_seed(hint_prompt, i))
                      for i in range(m)]
            self.stats.hint_requests += m
        answers = await asyncio.gather(*calls)
        raws, hint_raws = [text for text, _ in answers[:m]], [text for text, _ in answers[m:]]
        prompt_tokens = sum(int(u.get("prompt_tokens") or 0) for _, u in answers)
        completion_tokens = sum(int(u.get("completion_tokens") or 0) for _, u in answers)
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        votes = [None if r.startswith(FAILED_PREFIX) else parse_vote(r, PLUS_MINUS, strip_think=self.cfg.strip_think) for r in raws]
        self.stats.invalid_votes += sum(v is None for v in votes)
        score = aggregate(votes, self.cfg.aggregate)
        if all(v is None for v in votes):
            self.stats.neutral += 1
            n = self.cfg.log_raw_chars
            log.warning(
                "judge: no valid vote for %s step %d (%s); neutral score 0. raw: %s",
                ctx.task_id,
                ctx.step_index,
                ctx.family,
                [r if len(r) <= n else r[:n] + "..." for r in raws],
            )
        failed = any(r.startswith(FAILED_PREFIX) for r in raws + hint_raws)
        judgement = Judgement(score, votes, list(raws), prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        if hint_prompt is not None:
            strip = self.cfg.strip_think
            judgement.hint_raw = hint_raws
            judgement.hint_votes = [None if r.startswith(FAILED_PREFIX) else parse_vote(r, PLUS_MINUS, strip_think=strip)
                                    for r in hint_raws]
            hints = [None if r.startswith(FAILED_PREFIX) else parse_hint(r, strip_think=strip) for r in hint_raws]
            judgement.hint = select_hint(judgement.hint_votes, hints, self.min_hint_chars)
            self.stats.hinted += judgement.hint is not None
        return judgement, not failed

    async def _encoded(self, prompt: RenderedPrompt) -> list[dict[str, Any]]:
        if prompt.images:  # encode screenshots once per step (not per vote), off the event loop
            return await asyncio.to_thread(to_openai_messages, prompt.messages, image_max_side=self.cfg.image_max_side)
        return prompt.messages

    def _vote_seed(self, prompt: RenderedPrompt, index: int) -> int | None:
        # keyed by the prompt (not the episode), as the judgement cache is: a cached and a fresh judgement agree
        return None if self.cfg.seed is None else derive_seed(self.cfg.seed, prompt.key, index)

    async def _one_vote(self, messages: list[dict[str, Any]], max_tokens: int,
                        seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """(the answer's text, the server's `usage` field: prompt_tokens / completion_tokens, {} when absent)."""
        traced = phases.get()
        t0 = time.perf_counter()
        async with self._slots:
            if traced is not None:  # the caller asked where the time goes: waiting here for a judge.max_concurrency slot
                add(traced, "slot_wait_s", time.perf_counter() - t0)
            self.stats.requests += 1
            try:
                res = await self.client.chat(
                    messages, temperature=self.cfg.temperature, max_tokens=max_tokens, n=1, logprobs=False, seed=seed
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # after the retry policy: an invalid vote, never a crash
                self.stats.failed_requests += 1
                return f"{FAILED_PREFIX}: {type(exc).__name__}: {exc}>", {}
        text = res.choices[0].text if res.choices else ""
        # a server answering a non-string content is a garbage answer (an invalid vote, no hint), never a crash
        return (text if isinstance(text, str) else ""), dict(res.usage or {})

    def metrics(self) -> dict[str, int]:
        return {f"judge/{k}": v for k, v in asdict(self.stats).items()}

    async def close(self) -> None:
        for entry in list(self._inflight.values()):
            entry.task.cancel()
        await self.client.aclose()


@dataclass
class _InFlight:
    task: asyncio.Task[Judgement]
    waiters: int = 0


def _copy(j: Judgement, *, cached: bool) -> Judgement:
    """A caller's own copy; a shared or remembered verdict cost this caller no tokens."""
    if cached:
        return Judgement(j.score, list(j.votes), list(j.raw), j.hint, list(j.hint_votes), list(j.hint_raw), cached=True)
    return dataclasses.replace(j, votes=list(j.votes), raw=list(j.raw), hint_votes=list(j.hint_votes),
                               hint_raw=list(j.hint_raw))
