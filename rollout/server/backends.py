"""What the development server (`rollout.server.app`) runs: a model backend from prompt token ids to output ids.

- `HFBackend`: any Hugging Face causal LM + tokenizer (the tiny local Qwen3 included), sampled with a KV cache; logprobs
  are those of the temperature-1 model (what training compares against), whatever the sampling temperature.
- `ReplayBackend`: answers with recorded texts in turn (tests and demos of exact answers, e.g. a judge that says
  \\boxed{1}); it tokenizes them with the real tokenizer so ids and text agree.
- `FixedBackend`: one fixed answer, tokenized once, and the prompt never read (`--fixed-latency-s`: a stand-in for a
  remote model whose only property is its latency; benchmarks/rollout_side.py).

Both are synchronous and thread-safe (a lock); the server calls them from a worker thread so its event loop stays free.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: End-of-turn tokens of common chat templates; whichever the vocabulary has stop generation.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>")


@dataclass
class GenParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the backend's end-of-turn tokens
    n: int = 1
    seed: int | None = None
    top_logprobs: int = 0  # also return the k most likely tokens at each position


@dataclass
class GenOutput:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    matched: int | str | None = None  # the stop token id or stop string that ended it
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""


class ModelBackend(Protocol):
    tokenizer: Any  # a Hugging Face tokenizer with a chat template
    weight_version: str
    context_length: int

    def generate(self, prompt_ids: Sequence[int], params: GenParams) -> list[GenOutput]: ...

    def load_weights(self, path: str) -> None: ...

    def score(self, ids: Sequence[int]) -> list[float | None]:
        """The log-prob of every token of `ids` given the tokens before it (None for the first): SGLang's
        input_token_logprobs. Raises ValueError if the backend cannot."""
        ...


CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_chat_tokenizer(merges: Sequence[tuple[str, str]] = ()) -> Any:
    """A byte-level BPE tokenizer with ChatML special tokens and chat template, built in memory (no download).

    One token per byte plus the given merges. Enough to serve recorded responses (`--replay`) or a model from config.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML_TEMPLATE
    )


def stop_token_ids(tokenizer: Any, extra: Sequence[int] = ()) -> set[int]:
    ids = {int(i) for i in extra}
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    ids.update(int(vocab[t]) for t in END_OF_TURN_TOKENS if t in vocab)
    return ids


def _trim_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    cut, which = len(text), None
    for s in stops:
        i = text.find(s) if s else -1
        if 0 <= i < cut:
            cut, which = i, s
    return text[:cut], which


class HFBackend:
    """A Hugging Face causal LM sampled token by token with a KV cache (CPU or one GPU)."""

    def __init__(self, model: Any, tokenizer: Any, *, weight_version: str = "0", seed: int = 0, name: str = "local"):
        import torch

        self.torch = torch
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.weight_version = str(weight_version)
        self.name = name
        self.device = next(model.parameters()).device
        cfg = getattr(model, "config", None)
        self.context_length = int(getattr(cfg, "max_position_embeddings", 0) or 4096)
        gen_cfg = getattr(model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        extra = [eos] if isinstance(eos, int) else list(eos or [])
        self.stop_ids = stop_token_ids(tokenizer, extra)
        self._lock = threading.Lock()
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        params = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers 5 renamed it

    @classmethod
    def from_pretrained(cls, path: str, *, seed: int = 0, device: str = "cpu") -> HFBackend:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).to(device)
        return cls(model, tokenizer, seed=seed, name=Path(path).name)

    def generate(self, prompt_ids: Sequence[int], params: GenParams) -> list[GenOutput]:
        if not prompt_ids:
            raise ValueError("empty prompt")
        room = self.context_length - len(prompt_ids)
        if room <= 0:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {self.context_length}")
        params.max_new_tokens = max(0, min(params.max_new_tokens, room))
        with self._lock, self.torch.no_grad():
            return self._sample(list(prompt_ids), params)

    def score(self, ids: Sequence[int]) -> list[float | None]:
        """log softmax(logits) at each next token (temperature 1, as the sampler's logprobs), one forward pass."""
        if not ids:
            raise ValueError("empty input")
        x, logp = self._next_token_logprobs(ids)
        return [None, *logp.gather(1, x[0, 1:, None])[:, 0].tolist()]

    def score_top(self, ids: Sequence[int], k: int) -> list[list[tuple[int, float]] | None]:
        """At every token of `ids`: the k most likely tokens and their log-probs (temperature 1) of the distribution
        that predicts it (None for the first): SGLang's input_top_logprobs."""
        if not ids or k < 1:
            raise ValueError("score_top needs a non-empty input and k >= 1")
        _, logp = self._next_token_logprobs(ids)
        vals, top = self.torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
        return [None, *(list(zip(i, v)) for i, v in zip(top.tolist(), vals.tolist()))]

    def _next_token_logprobs(self, ids: Sequence[int]) -> tuple[Any, Any]:
        """The input as a [1, n] tensor and log softmax(logits) of positions 0..n-2 (each predicting the next
        token), one forward pass without gradient."""
        if len(ids) > self.context_length:
            raise ValueError(f"the input has {len(ids)} tokens; the model's context is {self.context_length}")
        torch = self.torch
        with self._lock, torch.no_grad():
            x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
            return x, torch.log_softmax(self.model(input_ids=x).logits[0, :-1].float(), dim=-1)

    def _sample(self, prompt: list[int], p: GenParams) -> list[GenOutput]:
        torch = self.torch
        n = max(1, p.n)
        gen = self._generator if p.seed is None else torch.Generator(device="cpu").manual_seed(int(p.seed))
        stops = self.stop_ids | {int(i) for i in p.stop_token_ids}
        outs = [GenOutput([], [], "length") for _ in range(n)]
        live = list(range(n))
        if p.max_new_tokens == 0:
            return outs
        ids = torch.tensor([prompt] * n, dtype=torch.long, device=self.device)
        res = self.model(input_ids=ids, use_cache=True)
        cache = getattr(res, "cache", None) or getattr(res, "past_key_values", None)
        logits = res.logits[:, -1, :].float()
        for _ in range(p.max_new_tokens):
            logp = torch.log_softmax(logits, dim=-1)
            tok = self._choose(logits, p, gen)
            chosen = logp.gather(1, tok[:, None])[:, 0]
            top = torch.topk(logp, p.top_logprobs, dim=-1) if p.top_logprobs > 0 else None
            still = []
            for row, i in enumerate(live):
                t = int(tok[row])
                o = outs[i]
                o.output_ids.append(t)
                o.logprobs.append(float(chosen[row]))
                if top is not None:
                    o.top_logprobs.append([(int(a), float(b)) for b, a in zip(top.values[row], top.indices[row])])
                if t in stops:
                    o.finish_reason, o.matched = "stop", t
                elif p.stop and _trim_at_stop(self.tokenizer.decode(o.output_ids), p.stop)[1] is not None:
                    o.finish_reason, o.matched = "stop", _trim_at_stop(self.tokenizer.decode(o.output_ids), p.stop)[1]
                else:
                    still.append(row)
            if not still:
                break
            if len(still) < len(live):  # drop finished rows from the batch (and their cache rows)
                keep = torch.tensor(still, device=self.device)
                tok = tok[keep]
                cache.batch_select_indices(keep)
                live = [live[r] for r in still]
            res = self.model(input_ids=tok[:, None], use_cache=True, **{self._cache_kw: cache})
            cache = getattr(res, "cache", None) or getattr(res, "past_key_values", None)
            logits = res.logits[:, -1, :].float()
        for o in outs:
            o.text = self.tokenizer.decode(o.output_ids, skip_special_tokens=True)
            if isinstance(o.matched, str):
                o.text = _trim_at_stop(o.text, [o.matched])[0]
        return outs

    def _choose(self, logits: Any, p: GenParams, gen: Any) -> Any:
        torch = self.torch
        if p.temperature <= 0:
            return torch.argmax(logits, dim=-1)
        scaled = logits / p.temperature
        if p.top_k and p.top_k > 0:
            kth = torch.topk(scaled, min(p.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) > p.top_p  # keep the smallest prefix reaching top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(1, order, sorted_logits)
        probs = torch.softmax(scaled, dim=-1)
        return torch.multinomial(probs.cpu(), 1, generator=gen)[:, 0].to(self.device)

    def load_weights(self, path: str) -> None:
        """Load a state dict from an HF model dir (*.safetensors / pytorch_model.bin) or one .safetensors/.pt file."""
        state = load_state_dict(path)
        with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            # tied embeddings may be saved once; anything else missing means the checkpoint does not fit this model
            missing = [k for k in missing if not k.endswith("lm_head.weight")]
            if missing or unexpected:
                raise ValueError(
                    f"checkpoint {path} does not fit the served model: "
                    f"missing {missing[:5]}, unexpected {unexpected[:5]}"
                )
            self.model.eval()


def load_state_dict(path: str) -> dict[str, Any]:
    import torch

    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors")) or sorted(p.glob("pytorch_model*.bin")) or sorted(p.glob("*.pt"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors, pytorch_model*.bin or *.pt file in {p}")
    elif p.is_file():
        files = [p]
    else:
        raise FileNotFoundError(f"weights path {p} does not exist")
    state: dict[str, Any] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(f)))
        else:
            obj = torch.load(str(f), map_location="cpu", weights_only=True)
            state.update(obj.get("state_dict", obj) if isinstance(obj, dict) else obj)
    return state


class ReplayBackend:
    """Answers with recorded texts (in turn, or chosen by `pick(prompt_text, call_index)`), tokenized for real."""

    def __init__(
        self,
        tokenizer: Any,
        responses: Sequence[str] = (),
        *,
        pick: Callable[[str, int], str] | None = None,
        weight_version: str = "0",
        context_length: int = 1 << 20,
    ):
        if not responses and pick is None:
            raise ValueError("ReplayBackend needs recorded responses or a pick function")
        self.tokenizer = tokenizer
        self.responses = list(responses)
        self.pick = pick
        self.weight_version = str(weight_version)
        self.context_length = context_length
        self.stop_ids = stop_token_ids(tokenizer)
        self._eos = int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else None
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._prompt_ids: list[list[int]] = []

    @property
    def prompts(self) -> list[str]:
        """The prompts it was asked, as text (tests and debugging)."""
        return [self.tokenizer.decode(ids) for ids in self._prompt_ids]

    def generate(self, prompt_ids: Sequence[int], params: GenParams) -> list[GenOutput]:
        prompt_text = self.tokenizer.decode(list(prompt_ids)) if self.pick else ""
        outs = []
        for _ in range(max(1, params.n)):
            with self._lock:
                k = next(self._counter)
                self._prompt_ids.append(list(prompt_ids))
            text = self.pick(prompt_text, k) if self.pick else self.responses[k % len(self.responses)]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            finish, matched = "length", None
            if len(ids) >= params.max_new_tokens:
                ids = ids[: params.max_new_tokens]
                text = self.tokenizer.decode(ids)
            elif self._eos is not None:
                ids = ids + [self._eos]
                finish, matched = "stop", self._eos
            outs.append(GenOutput(ids, [0.0] * len(ids), finish, matched, text=text))
        return outs

    def score(self, ids: Sequence[int]) -> list[float | None]:
        raise ValueError("the replay backend has no model: it cannot score tokens")

    def load_weights(self, path: str) -> None:
        if not Path(path).exists():
            raise FileNotFoundError(f"weights path {path} does not exist")


class FixedBackend:
    """Answers every request with one fixed text (`{n}` in it: numbered by call, so that no two answers are alike, e.g.
    no judge-cache hits between episodes); it keeps nothing and never looks at the prompt, so a benchmark that puts it
    behind a fixed latency measures its clients, not this server."""

    instant = True  # answered on the server's event loop; the chat endpoint skips templating the prompt (usage: 0 tokens)
    #: False: answers encoded through the transformers wrapper, as before issue #33 (`--lean off`)
    lean: bool = True

    def __init__(self, tokenizer: Any, text: str, *, weight_version: str = "0", context_length: int = 1 << 20):
        if not text:
            raise ValueError("the fixed backend needs a non-empty answer")
        self.tokenizer = tokenizer
        self.weight_version = str(weight_version)
        self.context_length = context_length
        self.text = text
        self._numbered = "{n}" in text
        self._counter = itertools.count()
        eos = tokenizer.eos_token_id
        self._eos = [int(eos)] if eos is not None else []
        self._fixed = self._encode(text)

    def _encode(self, text: str) -> list[int]:
        # a fast tokenizer's Rust backend called directly: the ids of tokenizer.encode (which calls it too) without
        # the Python around it, most of the cost of a numbered answer (as rollout/policy/chat_tokens.py does)
        tok = self.tokenizer
        backend = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
        if self.lean and backend is not None and not getattr(tok, "split_special_tokens", False):
            return backend.encode(text, add_special_tokens=False).ids + self._eos
        return list(self.tokenizer.encode(text, add_special_tokens=False)) + self._eos

    def generate(self, prompt_ids: Sequence[int], params: GenParams) -> list[GenOutput]:
        outs = []
        for _ in range(max(1, params.n)):
            text = self.text.replace("{n}", str(next(self._counter))) if self._numbered else self.text
            ids = self._encode(text) if self._numbered else list(self._fixed)
            finish, matched = "stop", (self._eos[0] if self._eos else None)
            if len(ids) > params.max_new_tokens:
                ids, finish, matched = ids[: params.max_new_tokens], "length", None
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
            outs.append(GenOutput(ids, [0.0] * len(ids), finish, matched, text=text))
        return outs

    def score(self, ids: Sequence[int]) -> list[float | None]:
        raise ValueError("the fixed backend has no model: it cannot score tokens")

    def load_weights(self, path: str) -> None:
        if not Path(path).exists():
            raise FileNotFoundError(f"weights path {path} does not exist")
