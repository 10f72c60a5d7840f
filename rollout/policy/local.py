"""LocalPolicy: an HF causal LM (or a Qwen-VL vision-language model) in this process behind the Policy protocol, with
dynamic batching.

With a `VisionProcessor` (train/vision.py) the policy sees the screenshots: each prompt shows the latest observations'
images (`policy.vision.max_images`), its ids have the image placeholders expanded, and the completion carries the
processed images (`Completion.vision`), which travel with the step to the training sample.

`generate()` renders the messages with the tokenizer's chat template and queues the request. One background task takes up
to `max_batch` queued requests at a time, runs the sampler in a worker thread (so the event loop keeps serving envs and
judges) and resolves the callers' futures; requests that arrive while a batch runs wait for the next batch. Which
requests share a batch depends on timing, so a request with `SamplingParams.seed` draws from its own random stream
(rollout/policy/sampler.py): its sample is then the same in any batch (up to last-bit float differences of other batch
shapes); requests without one share the policy's generator. Weight updates
take the same lock as a batch, so a batch never mixes two weight versions and `Completion.weight_version` is exact.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from envs.repeats import RepeatedWarning
from rollout.policy.base import Completion, Message, Policy, SamplingParams, WeightUpdate
from rollout.policy.local_config import LocalPolicyConfig
from rollout.policy.sampler import RowSampling, SampleOutput, sample
from train.hf_models import is_vision_config, load_model
from train.records import VisionInputs
from train.tiny import PAD, clean_messages
from train.vision import VisionProcessor

log = logging.getLogger(__name__)

#: where the count of left-truncated prompts is reported (the first truncation's warning says so; the rest are counted)
TRUNCATIONS_COUNTED_IN = ("policy/truncated_prompts and policy/longest_prompt_tokens in metrics.jsonl, and the run "
                          "summary")


@dataclass
class PolicyStats:
    requests: int = 0
    batches: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    truncated_prompts: int = 0  # prompts cut to max_prompt_tokens (text: left-truncated; vision: oldest turns dropped)
    longest_prompt_tokens: int = 0  # the longest of those before it was cut


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[Completion]
    vision: VisionInputs | None = None
    truncated_from: int | None = None  # the prompt's length before it was cut to max_prompt_tokens


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
    """Token ids of the chat-template rendering of `messages` (extra message keys such as "image" are ignored)."""
    out = tokenizer.apply_chat_template(
        clean_messages(messages), add_generation_prompt=add_generation_prompt, tokenize=True
    )
    if isinstance(out, dict) or hasattr(out, "input_ids"):  # transformers 5 returns a BatchEncoding by default
        out = out["input_ids"]
    return list(out)


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> list[int]:
    """The prompt a policy continues: the rendered messages followed by the assistant generation prompt."""
    return chat_ids(tokenizer, messages, add_generation_prompt=True)


def truncate_prompt(ids: list[int], system_ids: list[int] | None, limit: int) -> list[int]:
    """Left-truncate `ids` to `limit` tokens, keeping the leading system turn when it leaves half the room for the rest."""
    if len(ids) <= limit:
        return ids
    if system_ids and ids[: len(system_ids)] == system_ids and len(system_ids) <= limit // 2:
        return system_ids + ids[len(ids) - (limit - len(system_ids)) :]
    return ids[len(ids) - limit :]


def find_stop(text: str, stops: Sequence[str]) -> int:
    """Index of the earliest occurrence of any stop string in `text`, or -1."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else -1


class LocalPolicy(Policy):
    """The `local` policy: a (tiny) HF causal LM sampled in process. Implements rollout.policy.base.Policy."""

    in_process = True  # weight sync hands it a state dict in memory (rollout/weight_sync.py)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: LocalPolicyConfig | None = None,
        weight_version: int = 0,
        vision: VisionProcessor | None = None,
    ):
        self.cfg = cfg or LocalPolicyConfig()
        if is_vision_config(model.config) != (vision is not None):
            raise ValueError("a vision-language model needs a VisionProcessor (and a text model none)")
        self.vision = vision
        if self.cfg.num_threads:
            torch.set_num_threads(self.cfg.num_threads)
        self.model = model.to(self.cfg.device).eval()
        self.tokenizer = tokenizer
        self.weight_version = weight_version
        self.stats = PolicyStats()
        self.truncations = RepeatedWarning(log, TRUNCATIONS_COUNTED_IN)  # one warning per policy, then a count
        max_pos = int(getattr(model.config.get_text_config(), "max_position_embeddings", 1 << 30))
        if self.cfg.max_prompt_tokens >= max_pos:
            raise ValueError(
                f"max_prompt_tokens={self.cfg.max_prompt_tokens} leaves no room to generate within the model's "
                f"max_position_embeddings={max_pos}; lower it"
            )
        self.max_positions = max_pos
        if len(tokenizer) > _vocab(model.config):
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {_vocab(model.config)}"
            )
        self.stop_token_ids = sorted(
            {t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(PAD)) if isinstance(t, int) and t >= 0}
        )
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_token_ids[0]
        self._generator = torch.Generator(device=self.cfg.device).manual_seed(self.cfg.seed)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-policy")
        self._pending: list[_Request] = []
        self._running: list[_Request] = []  # the batch in the sampler now
        self._worker: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @classmethod
    def from_pretrained(
        cls, path: str | Path, cfg: LocalPolicyConfig | None = None, weight_version: int = 0
    ) -> LocalPolicy:
        """A policy from a directory holding a save_pretrained model and its tokenizer (a vision-language model: and
        its image processor)."""
        from transformers import AutoTokenizer

        model = load_model(path)
        if is_vision_config(model.config):
            vision = VisionProcessor.from_pretrained(path)
            return cls(model, vision.tokenizer, cfg, weight_version, vision=vision)
        return cls(model, AutoTokenizer.from_pretrained(str(path)), cfg, weight_version)

    # ----- the Policy protocol -----
    async def generate(self, messages: Sequence[Message], sampling: SamplingParams) -> Completion:
        if self._closed:
            raise RuntimeError("LocalPolicy.generate() after close()")
        if not messages:
            raise ValueError("generate() needs at least one message")
        self._ensure_worker()
        ids, vision, truncated_from = self._prompt(messages)
        fut: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(ids, sampling, fut, vision, truncated_from))
        self.stats.requests += 1
        assert self._wakeup is not None
        self._wakeup.set()
        return await fut

    async def update_weights(self, update: WeightUpdate) -> None:
        if update.state_dict is None and update.path is None:
            raise ValueError("WeightUpdate has neither a state_dict nor a path")
        self._ensure_worker()
        assert self._lock is not None
        async with self._lock:  # waits for the running batch; the next batch sees the new weights
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load_weights, update)
            self.weight_version = update.version
        log.info("local policy now at weight version %d", update.version)

    async def close(self) -> None:
        self._closed = True
        stranded = self._running + self._pending  # taken before the worker unwinds and forgets its batch
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        for req in stranded:
            if not req.future.done():
                req.future.set_exception(RuntimeError("LocalPolicy was closed before this request finished"))
        self._running, self._pending = [], []
        self._executor.shutdown(wait=True)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The prompt `generate` would sample from for `messages` (chat template, left-truncated as configured)."""
        return self._prompt_ids(messages)[0]

    def rng_state(self) -> Any:
        return self._generator.get_state()

    def set_rng_state(self, state: Any) -> None:
        if state is not None:
            self._generator.set_state(state)

    # ----- internals -----
    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._worker is not None and not self._worker.done() and self._loop is loop:
            return
        if self._loop is not loop:  # first use, or a new event loop (e.g. successive asyncio.run calls)
            if self._pending:  # their futures belong to the old loop, whose callers are gone
                log.warning("dropping %d requests left from a previous event loop", len(self._pending))
            self._loop, self._wakeup, self._lock = loop, asyncio.Event(), asyncio.Lock()
            self._pending, self._running = [], []
        self._worker = loop.create_task(self._serve(), name="local-policy-batcher")

    def _prompt(self, messages: Sequence[Message]) -> tuple[list[int], VisionInputs | None, int | None]:
        """(prompt ids, images, the prompt's length before it was cut to max_prompt_tokens or None)."""
        if self.vision is None:
            ids, full = self._prompt_ids(messages)
            return ids, None, full
        return self._vision_prompt(messages)

    def _count_truncation(self, tokens: int, how: str) -> None:
        self.stats.truncated_prompts += 1
        self.stats.longest_prompt_tokens = max(self.stats.longest_prompt_tokens, tokens)
        self.truncations.warn("prompt of %d tokens %s to max_prompt_tokens=%d", tokens, how, self.cfg.max_prompt_tokens,
                              size=tokens)

    def _vision_prompt(self, messages: Sequence[Message]) -> tuple[list[int], VisionInputs | None, int | None]:
        """The prompt with the latest screenshots; too long, the oldest turns after the first user message go (cutting
        token ids could split an image's placeholders)."""
        kept = list(messages)
        first = next((i for i, m in enumerate(kept) if m.get("role") == "user"), 0)
        full: int | None = None
        while True:
            ids, vision = self.vision.prompt(kept)
            if len(ids) <= self.cfg.max_prompt_tokens:
                if full is not None:
                    self._count_truncation(full, "(images included) cut by its oldest turns")
                return ids, vision, full
            if not self.cfg.truncate_prompts or len(kept) <= first + 2:
                raise ValueError(
                    f"prompt has {len(ids)} tokens (images included), above max_prompt_tokens="
                    f"{self.cfg.max_prompt_tokens}"
                )
            full = len(ids) if full is None else full
            del kept[first + 1 : first + 3]  # the oldest (assistant, observation) pair after the task

    def _prompt_ids(self, messages: Sequence[Message]) -> tuple[list[int], int | None]:
        """(prompt ids, the prompt's length before it was left-truncated to max_prompt_tokens or None)."""
        ids = chat_prompt_ids(self.tokenizer, messages)
        if len(ids) <= self.cfg.max_prompt_tokens:
            return ids, None
        if not self.cfg.truncate_prompts:
            raise ValueError(
                f"prompt has {len(ids)} tokens, above max_prompt_tokens={self.cfg.max_prompt_tokens} "
                "(set truncate_prompts=True to left-truncate it)"
            )
        system_ids = chat_ids(self.tokenizer, messages[:1], False) if messages[0].get("role") == "system" else None
        self._count_truncation(len(ids), "left-truncated")
        return truncate_prompt(ids, system_ids, self.cfg.max_prompt_tokens), len(ids)

    async def _serve(self) -> None:
        assert self._wakeup is not None and self._lock is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch = [r for r in self._pending[: self.cfg.max_batch] if not r.future.done()]
                del self._pending[: self.cfg.max_batch]
                if not batch:
                    continue
                async with self._lock:
                    version = self.weight_version
                    self._running = batch
                    try:
                        outs = await loop.run_in_executor(self._executor, self._run_batch, batch)
                    except Exception as exc:  # a sampler failure fails this batch's requests, not the server
                        log.exception("local policy batch of %d failed", len(batch))
                        for r in batch:
                            if not r.future.done():
                                r.future.set_exception(exc)
                        continue
                    finally:
                        self._running = []
                for r, (o, text) in zip(batch, outs):
                    if not r.future.done():
                        r.future.set_result(
                            Completion(
                                text=text,
                                prompt_ids=r.prompt_ids,
                                output_ids=o.output_ids,
                                output_logprobs=o.logprobs,
                                finish_reason=o.finish_reason,
                                weight_version=version,
                                vision=r.vision,
                                prompt_truncated_from=r.truncated_from,
                            )
                        )

    def _run_batch(self, batch: list[_Request]) -> list[tuple[SampleOutput, str]]:
        params = []
        for r in batch:
            s = r.sampling
            room = self.max_positions - len(r.prompt_ids)
            params.append(
                RowSampling(
                    temperature=s.temperature,
                    top_p=s.top_p,
                    top_k=s.top_k,
                    greedy=s.greedy,
                    max_new_tokens=max(1, min(s.max_new_tokens, room)),
                    seed=s.seed,  # its own stream: the sample does not depend on which requests share this batch
                )
            )
        stop_rows = [i for i, r in enumerate(batch) if r.sampling.stop]
        window = {i: max(len(s.encode()) for s in batch[i].sampling.stop) + 4 for i in stop_rows}

        def stop_check(i: int, out: list[int]) -> bool:
            # every token is at least one byte, so a stop string that ends in the newest token lies in this window
            tail = self.tokenizer.decode(out[-window[i] :], skip_special_tokens=True)
            return find_stop(tail, batch[i].sampling.stop) >= 0

        outs = sample(
            self.model,
            [r.prompt_ids for r in batch],
            params,
            stop_token_ids=self.stop_token_ids,
            pad_token_id=self.pad_token_id,
            generator=self._generator,
            stop_check=stop_check if stop_rows else None,
            stop_check_rows=stop_rows,
            should_abort=lambda: self._closed,
            vision=[r.vision for r in batch] if self.vision is not None else None,
        )
        results = []
        for r, o in zip(batch, outs):
            text = self.tokenizer.decode(o.output_ids, skip_special_tokens=True)
            if r.sampling.stop:
                cut = find_stop(text, r.sampling.stop)
                if cut >= 0:  # the text ends before the stop string (as OpenAI / SGLang return it)
                    text = text[:cut]
            results.append((o, text))
        self.stats.batches += 1
        self.stats.batch_sizes.append(len(batch))
        self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in batch)
        self.stats.output_tokens += sum(len(o.output_ids) for o in outs)
        return results

    def _load_weights(self, update: WeightUpdate) -> None:
        if update.state_dict is not None:
            state = update.state_dict
        else:
            loaded = load_model(update.path)
            have, want = _vocab(loaded.config), _vocab(self.model.config)
            if have != want:
                raise ValueError(f"checkpoint {update.path} has vocab_size {have}, the policy {want}")
            state = loaded.state_dict()
        with torch.no_grad():
            self.model.load_state_dict(_to_device(state, self.cfg.device), strict=True)
        self.model.eval()


def _vocab(config: Any) -> int:
    return int(config.get_text_config().vocab_size)


def _to_device(state: dict[str, Any], device: str) -> dict[str, Any]:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


__all__ = ["LocalPolicy", "LocalPolicyConfig", "PolicyStats", "chat_prompt_ids", "find_stop", "truncate_prompt"]
