"""What the token-exact server policies share (`policy=sglang`, `policy=vllm`): token ids in, token ids + log-probs
out, over one or several servers.

The chat template is applied here with the served model's own tokenizer, and each episode's later turns continue from
the exact ids of its earlier turns (`ChatTokenizer`), so training never re-tokenizes text. The servers sit behind a
`ServerPool` (an episode sticks to one server, a down server's episodes move to the others). A subclass says how its
engine is asked: the generation request and answer (`_generation_payload`, `_parse_generation`), the scoring of given
tokens (`_score_chunk`) and the weight sync of one server (`_sync_server`); the rest is here: routing, scoring in
batches, the weight sync's bookkeeping (a server that fails gets no traffic until a later sync reaches it) and the
parity probe (`probe_servers`, rollout/policy/parity.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prm.client.retry import RequestFailed, RetryPolicy
from prm.client.router import ServerPool
from rollout.policy.base import Completion, Message, Policy, SamplingParams, WeightUpdate
from rollout.policy.chat_tokens import ChatTokenizer
from rollout.policy.export import export_update
from rollout.policy.parity import ParityConfig

log = logging.getLogger(__name__)


@dataclass
class TokenServerConfig:
    """The options every token-exact server policy has."""

    urls: list[str] = field(default_factory=list)  # server base URLs, e.g. ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    url: str | None = None  # one server (shorthand for urls=[url])
    model_path: str | None = None  # the served model's HF directory (the trainer's starting weights, its config files)
    weights_dir: str | None = None  # where in-memory weight updates are written for the servers to load (shared disk)
    keep_weight_versions: int = 2  # exported versions kept in weights_dir (older ones deleted)
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(timeout_s=600.0))  # per try: long generations
    health_path: str = "health"
    recheck_s: float = 5.0  # a down server is tried again after this long
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"enable_thinking": false}
    max_sessions: int = 1024  # episodes whose exact token ids are kept (least recently used dropped)
    check_on_start: bool = True  # GET /health on every server at start; fail if none answers
    score_batch: int = 16  # score_tokens: sequences per scoring request (requests go out concurrently)
    # connections to the servers at once (opened as needed): at least the episodes in flight, or turns wait for one
    max_connections: int = 1024
    # after every weight sync, each server's log-probs on a fixed probe against the trainer's (rollout/policy/parity.py)
    parity: ParityConfig = field(default_factory=ParityConfig)

    def _check_servers(self, *, require_urls: bool, example: str) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        self.urls = [u for u in self.urls if u] or ([self.url] if self.url else [])
        if require_urls and not self.urls:
            raise ValueError(f"policy.urls is empty: give the server URL(s), e.g. policy.urls=[{example}]")
        if self.score_batch < 1:
            raise ValueError(f"policy.score_batch must be >= 1, got {self.score_batch}")
        if not isinstance(self.retry, RetryPolicy):
            self.retry = RetryPolicy.from_config(self.retry)
        if not isinstance(self.parity, ParityConfig):
            self.parity = ParityConfig(**dict(self.parity))


class Generation(NamedTuple):
    """One generation answer, parsed: the sampled ids and their log-probs, why it stopped, the text, the weight version
    of the server that answered."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    weight_version: int


def load_tokenizer(path: str | None, engine: str) -> Any:
    if not path:
        raise ValueError(f"the {engine} policy applies the chat template itself: set policy.model_path to the "
                         "served model's local Hugging Face directory (or name its tokenizer's)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class TokenServerPolicy(Policy):
    """A Policy over token-exact inference servers. Extra over the protocol: `session` routing, `end_session`,
    `health`, `probe_servers`."""

    engine = "server"  # its name in messages and logs
    generate_path = ""  # the generation endpoint, relative to a server's base URL

    def __init__(self, cfg: TokenServerConfig, tokenizer: Any):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.chat = ChatTokenizer(tokenizer, template_kwargs=cfg.chat_template_kwargs, max_sessions=cfg.max_sessions)
        self.pool = ServerPool(cfg.urls, retry=cfg.retry, health_path=cfg.health_path, recheck_s=cfg.recheck_s,
                               max_sessions=cfg.max_sessions, max_connections=cfg.max_connections,
                               name=f"{self.engine} server")
        self.weight_version = 0
        self._started = False

    @property
    def parity_config(self) -> ParityConfig | None:  # type: ignore[override]
        return self.cfg.parity if self.cfg.parity.enabled else None

    # ----- what an engine says -----
    def _generation_payload(self, prompt_ids: Sequence[int], sampling: SamplingParams, rid: str | None) -> dict:
        raise NotImplementedError

    def _parse_generation(self, data: Any, server: str) -> Generation:
        raise NotImplementedError

    async def _score_chunk(self, chunk: list[tuple[Sequence[int], Sequence[int]]], k: int | None) -> list[Any]:
        raise NotImplementedError

    async def _sync_server(self, url: str, path: str, version: int) -> None:
        """Make the server at `url` serve the checkpoint at `path` as `version`; raises if it could not."""
        raise NotImplementedError

    # ----- shared -----
    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.cfg.check_on_start:
            health = await self.pool.check_health()
            if not any(health.values()):
                raise RuntimeError(f"no {self.engine} server answers /{self.cfg.health_path}: {self.pool.stats()}")
            down = [u for u, ok in health.items() if not ok]
            if down:
                log.warning("%s servers down at start (will be retried): %s", self.engine, down)

    async def generate(
        self, messages: Sequence[Message], sampling: SamplingParams, session: str | None = None
    ) -> Completion:
        await self.start()
        prompt = self.chat.prompt(messages, session)
        rid = f"{session}:{len(messages)}" if session is not None else None
        gen = await self._generate_ids(prompt.ids, sampling, session, rid)
        self.chat.record(session, messages, prompt.ids, gen.output_ids, gen.text)
        return Completion(gen.text, list(prompt.ids), gen.output_ids, gen.logprobs, gen.finish_reason,
                          weight_version=gen.weight_version)

    async def _generate_ids(self, prompt_ids: Sequence[int], sampling: SamplingParams, session: str | None,
                            rid: str | None) -> Generation:
        what = f"{self.engine} /{self.generate_path}"
        data, server = await self.pool.post_json_served(
            self.generate_path, self._generation_payload(prompt_ids, sampling, rid), session=session, what=what)
        try:
            return self._parse_generation(data, server)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise RequestFailed(what, [(server, f"malformed answer: {exc}")]) from exc

    def end_session(self, session: str) -> None:
        self.chat.end_session(session)
        self.pool.end_session(session)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The chat template's ids for `messages` as a fresh conversation (no session), with the generation prompt."""
        return list(self.chat.prompt(messages).ids)

    async def score_tokens(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """The served weights' log-prob of each action token given its context, forced, no generation: batches of
        `score_batch` sequences per request, the requests in flight together."""
        return await self._score(sequences, None, "score_tokens")

    async def score_topk(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], k: int) -> list[Any]:
        """The served weights' top-k at each action token given its context, with each token's own log-prob, batched
        as `score_tokens`. At temperature 1 (the servers' scoring): reward.teacher=policy needs sampling.temperature=1
        (checked at start)."""
        if k < 1:
            raise ValueError(f"score_topk needs k >= 1, got {k}")
        return await self._score(sequences, k, "score_topk")

    async def _score(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], k: int | None,
                     what: str) -> list[Any]:
        await self.start()
        for context, _ in sequences:
            if not context:
                raise ValueError(f"{what} needs a non-empty context before the action")
        chunks = [list(sequences[i: i + self.cfg.score_batch]) for i in range(0, len(sequences), self.cfg.score_batch)]
        out = await asyncio.gather(*(self._score_chunk(c, k) for c in chunks))
        return [x for chunk in out for x in chunk]

    async def probe_servers(self, context: Sequence[int], sampling: SamplingParams,
                            ) -> dict[str, tuple[list[int], list[float]] | BaseException]:
        """Every server (stale and down ones included) continues `context` as `sampling` says, end-of-sequence
        ignored: url -> (sampled ids, their log-probs), or the error it gave (the weight sync's parity check)."""
        await self.start()
        payload = self._probe_payload(context, sampling)

        async def one(url: str) -> tuple[list[int], list[float]] | BaseException:
            try:
                gen = self._parse_generation(await self.pool.call(url, "POST", self.generate_path, json=payload,
                                                                  what=f"{self.engine} parity probe"), url)
            except Exception as exc:  # reported per server to the caller, who decides
                return exc
            return gen.output_ids, gen.logprobs

        urls = [s.url for s in self.pool.servers]
        return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls))))

    def _probe_payload(self, context: Sequence[int], sampling: SamplingParams) -> dict:
        """The parity probe's generation request: `_generation_payload` with end-of-sequence ignored."""
        raise NotImplementedError

    async def health(self) -> dict[str, bool]:
        return await self.pool.check_health()

    async def update_weights(self, update: WeightUpdate) -> None:
        """Every server loads the new weights (`_sync_server`, concurrently); a server that fails gets no traffic
        until a later update reaches it, and when none succeeds this raises. `update.path` is a checkpoint directory
        the servers can read; an in-memory `state_dict` is first written to `weights_dir/v<version>/`."""
        path = await self._checkpoint_path(update)
        urls = [s.url for s in self.pool.servers]
        results = await asyncio.gather(*(self._sync_server(u, path, update.version) for u in urls),
                                       return_exceptions=True)
        failed = {}
        for url, r in zip(urls, results):
            self.pool.set_stale(url, isinstance(r, BaseException))
            if isinstance(r, BaseException):
                failed[url] = f"{type(r).__name__}: {r}"
        if len(failed) == len(urls):
            raise RuntimeError(f"no server loaded weights v{update.version} from {path} ({self.engine}): {failed}")
        if failed:
            log.warning("servers that failed to load weights v%d get no traffic until an update reaches them: %s",
                        update.version, failed)
        self.weight_version = update.version

    async def _checkpoint_path(self, update: WeightUpdate) -> str:
        if update.path is not None:
            return update.path
        if update.state_dict is None:
            raise ValueError("WeightUpdate has neither a path nor a state_dict")
        if not self.cfg.weights_dir:
            raise ValueError(f"set policy.weights_dir (a directory the {self.engine} servers can read) to sync weights")
        return await export_update(update, self.cfg)

    async def close(self) -> None:
        await self.pool.aclose()


def require_ok(answer: Any, what: str, url: str) -> Any:
    """An engine's JSON answer that must say success (`{"success": true}`): returned, else RequestFailed."""
    if isinstance(answer, Mapping) and answer.get("success") is False:
        raise RequestFailed(what, [(url, str(answer.get("message") or answer))])
    return answer


__all__ = ["Generation", "TokenServerConfig", "TokenServerPolicy", "load_tokenizer", "require_ok"]
