"""Batched sampling from an HF causal LM with a KV cache, returning the exact output ids and their logprobs.

Prompts of different lengths are left-padded; the attention mask hides the padding and position ids count only real
tokens, so a row's tokens, logits and logprobs are those of the same prompt run alone. Each row carries its own
sampling settings (temperature, top-k, top-p, greedy, token budget), so requests with different settings share a batch.

Randomness: every sampled token inverts the CDF at one uniform number, and each row draws its uniforms from its own
stream. A row with a `seed` gets a stream of its own (torch.Generator(seed)), so its sample is the same whichever rows
share the batch, in whatever order; rows without one draw theirs from the call's `generator` (then the sample depends on
the batch). Batching can still change a logit in its last bits (other padding widths, other matmul shapes), which
flips a drawn token only when its uniform lies within that difference of a CDF boundary (rare: once in ~10,000 steps
of two repeated Table 4 runs, docs/experiments/table4.md).

Vision-language models (Qwen3-VL): rows may carry their prompt's images (`vision`, train/vision.py); the prefill gets
the rows' pixels and Qwen-VL's multimodal RoPE positions (computed by the model's own `get_rope_index`, padding
ignored), and each decode step continues from the row's last position + 1 on all three axes.

Logprob convention (what a trainer recomputes): log_softmax(logits / temperature) at the sampled token, over the whole
vocabulary (top-k / top-p only restrict which token is drawn). Greedy rows (or temperature <= 0) take the argmax and
report temperature-1 logprobs.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from train.records import VisionInputs

log = logging.getLogger(__name__)

#: Called after each new token of a row that may stop on text: (row index, output ids so far) -> stop now?
StopCheck = Callable[[int, list[int]], bool]


def _cache_kwarg(model: PreTrainedModel) -> str:
    """transformers renamed `past_key_values` to `cache` during 5.x; use whichever this version's model takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass(frozen=True)
class RowSampling:
    """Sampling settings of one prompt."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # <= 0: no top-k
    greedy: bool = False
    max_new_tokens: int = 256
    seed: int | None = None  # this row's own random stream (None: the call's shared generator)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature <= 0.0


@dataclass
class SampleOutput:
    output_ids: list[int]  # includes the stop token when finish_reason == "stop" by token
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"


@dataclass
class SamplerStats:
    """What one `sample` call did (for throughput numbers)."""

    prompts: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    decode_steps: int = 0
    compactions: int = 0


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] ids and attention mask with every prompt right-aligned."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def row_uniforms(params: Sequence[RowSampling], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """[B, max budget] float64 uniforms, one per token a row may draw: from the row's own seed, else from `generator`."""
    width = max(p.max_new_tokens for p in params)
    out = torch.empty((len(params), width), dtype=torch.float64)
    out.fill_(0.5)  # greedy rows, and positions past a row's budget, never read theirs
    for i, p in enumerate(params):
        if p.is_greedy:
            continue
        g = torch.Generator().manual_seed(p.seed) if p.seed is not None else generator
        out[i, : p.max_new_tokens] = torch.rand(p.max_new_tokens, generator=g, dtype=torch.float64)
    return out.to(device)


def choose_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor | torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V] and return (tokens [B], logprobs [B]) per the module's convention.

    `uniforms`: one number in [0, 1) per row (float64 [B]) that the row's draw inverts its CDF at; a generator (or None)
    draws them here."""
    if not isinstance(uniforms, torch.Tensor):
        uniforms = torch.rand(logits.shape[0], generator=uniforms, dtype=torch.float64, device=logits.device)
    logits = logits.float()
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temp[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    tokens = logits.argmax(dim=-1)
    sampling = ~greedy
    if bool(sampling.any()):
        rows = sampling.nonzero(as_tuple=True)[0]
        drawn = _draw(scaled[rows], top_k[rows], top_p[rows], uniforms[rows])
        tokens = tokens.index_put((rows,), drawn)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _draw(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    vocab = scaled.shape[-1]
    if not bool(((top_k > 0) & (top_k < vocab)).any() or (top_p < 1.0).any()):
        return _draw_from(torch.softmax(scaled, dim=-1), uniforms)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    sorted_logits = sorted_logits.masked_fill(rank >= k[:, None], float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability mass of the tokens ranked above this one
    probs = probs.masked_fill(before >= top_p[:, None], 0.0)  # nucleus: keep until top_p is covered (the first always)
    return order.gather(-1, _draw_from(probs, uniforms)[:, None]).squeeze(-1)


def _draw_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row from (unnormalized) `probs` by inverting the CDF at the row's uniform number, where
    torch.multinomial draws one per vocabulary entry (~7 ms for 128 x 1024 on this CPU, 12% of a decode step)."""
    cdf = probs.double().cumsum(dim=-1)
    u = uniforms.to(torch.float64)[:, None] * cdf[:, -1:]
    # the first index whose cdf exceeds u; a zero-probability token has cdf equal to its predecessor's and is never hit
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


@dataclass
class _Rows:
    """The sampling settings of the rows in the batch, as tensors (index b: batch row b), and each row's uniforms."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    greedy: torch.Tensor
    uniforms: torch.Tensor  # [rows, max budget]: row b's k-th token inverts uniforms[b, k]

    @classmethod
    def of(cls, params: Sequence[RowSampling], generator: torch.Generator | None, device: torch.device) -> _Rows:
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            greedy=torch.tensor([p.is_greedy for p in params], dtype=torch.bool, device=device),
            uniforms=row_uniforms(params, generator, device),
        )

    def select(self, keep: torch.Tensor) -> _Rows:
        """Only the rows `keep` (batch indices), in that order."""
        return _Rows(self.temperature[keep], self.top_k[keep], self.top_p[keep], self.greedy[keep],
                     self.uniforms[keep])


@dataclass
class _Prefill:
    """The prompts run through the model once: what the decode loop continues from."""

    logits: torch.Tensor  # [n, vocab]: each row's next-token logits
    cache: DynamicCache
    cache_kw: dict  # the model's keyword for the cache
    next_pos: torch.Tensor  # each row's next position id
    full_mask: torch.Tensor | None  # with padding: one mask for the whole run, sliced each step; None without
    width: int  # the padded prompt width
    multimodal: bool  # 3-axis (M-RoPE) positions


def _prefill(model: PreTrainedModel, prompts: Sequence[Sequence[int]], pad_token_id: int, max_new: int,
             vision: Sequence[VisionInputs | None] | None, device: torch.device) -> _Prefill:
    """Left-pad the prompts and run them in one forward, keeping the KV cache."""
    n = len(prompts)
    ids, attn = left_pad(prompts, pad_token_id, device)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    next_pos = attn.sum(-1)  # position id of each row's next token
    # without padding no mask is needed (plain causal attention, the fastest path); with padding, one mask for the
    # whole run is allocated up front and sliced each step
    padded = not bool(attn.all())
    full_mask = torch.cat([attn, attn.new_ones((n, max_new))], dim=-1) if padded else None
    images = multimodal_prefill(model, ids, attn, vision)
    extra: dict = {}
    if images is not None:  # 3-axis positions; a row's next position is its largest + 1, not its length
        extra, positions, deltas = images
        next_pos = next_pos + deltas
    cache = DynamicCache(config=model.config)
    cache_kw = {_cache_kwarg(model): cache}
    out = model(
        input_ids=ids,
        attention_mask=attn if padded else None,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **extra,
        **cache_kw,
    )
    return _Prefill(out.logits[:, -1, :], cache, cache_kw, next_pos, full_mask, ids.shape[1], images is not None)


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    params: RowSampling | Sequence[RowSampling],
    *,
    stop_token_ids: Sequence[int] = (),
    pad_token_id: int = 0,
    generator: torch.Generator | None = None,
    stop_check: StopCheck | None = None,
    stop_check_rows: Sequence[int] | None = None,
    stats: SamplerStats | None = None,
    should_abort: Callable[[], bool] | None = None,
    vision: Sequence[VisionInputs | None] | None = None,
) -> list[SampleOutput]:
    """Sample a continuation of every prompt; rows finish on a stop token, on `stop_check`, or at their token budget.

    `stop_check` is only called for rows listed in `stop_check_rows` (all rows when None). Finished rows leave the
    batch (their cache entries are dropped) once at least half of the batch is done, so long stragglers run cheaply.
    `should_abort` is polled once per token; when it returns True, unfinished rows end with finish_reason "abort".
    `vision`: each row's images (None for a row without), for a vision-language model.
    """
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    n = len(prompts)
    row_params = [params] * n if isinstance(params, RowSampling) else list(params)
    if len(row_params) != n:
        raise ValueError(f"{n} prompts but {len(row_params)} sampling settings")
    device = next(model.parameters()).device
    stops = set(stop_token_ids)
    check_rows = set(range(n)) if stop_check_rows is None else set(stop_check_rows)
    budget = [p.max_new_tokens for p in row_params]
    rows = _Rows.of(row_params, generator, device)
    pre = _prefill(model, prompts, pad_token_id, max(budget), vision, device)
    logits, next_pos, full_mask = pre.logits, pre.next_pos, pre.full_mask

    outputs = [SampleOutput([], [], "length") for _ in range(n)]
    live = list(range(n))  # batch row -> original prompt index
    finished = [False] * n
    steps = 0
    compactions = 0
    while True:
        tokens, logprobs = choose_tokens(logits, rows.temperature, rows.top_k, rows.top_p, rows.greedy,
                                         rows.uniforms[:, steps])
        tok_list, lp_list = tokens.tolist(), logprobs.tolist()
        for b, i in enumerate(live):
            if finished[i]:
                continue
            o = outputs[i]
            o.output_ids.append(tok_list[b])
            o.logprobs.append(lp_list[b])
            if tok_list[b] in stops or (stop_check is not None and i in check_rows and stop_check(i, o.output_ids)):
                o.finish_reason, finished[i] = "stop", True
            elif len(o.output_ids) >= budget[i]:
                o.finish_reason, finished[i] = "length", True
        steps += 1
        active = [b for b, i in enumerate(live) if not finished[i]]
        if not active:
            break
        if should_abort is not None and should_abort():
            for b in active:
                outputs[live[b]].finish_reason = "abort"
            break
        if len(active) <= len(live) // 2:  # drop finished rows from the batch and the cache
            keep = torch.tensor(active, dtype=torch.long, device=device)
            pre.cache.batch_select_indices(keep)
            live = [live[b] for b in active]
            tokens, next_pos = tokens[keep], next_pos[keep]
            full_mask = full_mask[keep] if full_mask is not None else None
            rows = rows.select(keep)
            compactions += 1
        step_pos = next_pos[None, :, None].expand(3, -1, -1) if pre.multimodal else next_pos[:, None]
        out = model(
            input_ids=tokens[:, None],
            attention_mask=full_mask[:, : pre.width + steps] if full_mask is not None else None,
            position_ids=step_pos,
            use_cache=True,
            **pre.cache_kw,
        )
        next_pos = next_pos + 1
        logits = out.logits[:, -1, :]
    if stats is not None:
        stats.prompts += n
        stats.prompt_tokens += sum(len(p) for p in prompts)
        stats.new_tokens += sum(len(o.output_ids) for o in outputs)
        stats.decode_steps += steps
        stats.compactions += compactions
    return outputs


def multimodal_prefill(
    model: PreTrainedModel, ids: torch.Tensor, attn: torch.Tensor, vision: Sequence[VisionInputs | None] | None
) -> tuple[dict, torch.Tensor, torch.Tensor] | None:
    """(the prefill's image inputs, its [3, B, T] M-RoPE positions, each row's position offset) when some row has
    images; None otherwise (a text batch, or a text model)."""
    rows = [v for v in (vision or ()) if v is not None and v.num_images]
    if not rows:
        return None
    device = ids.device
    pixel_values = torch.cat([torch.as_tensor(v.pixel_values) for v in rows]).to(device)
    grid = torch.cat([torch.as_tensor(v.image_grid_thw) for v in rows]).to(device)
    mm_types = (ids == int(model.config.image_token_id)).to(torch.int32)
    positions, deltas = model.model.get_rope_index(ids, mm_types, image_grid_thw=grid, attention_mask=attn)
    extra = {"pixel_values": pixel_values, "image_grid_thw": grid, "mm_token_type_ids": mm_types}
    return extra, positions, deltas.reshape(-1).to(device)


@torch.no_grad()
def teacher_forced_logprobs(
    model: PreTrainedModel, prompt: Sequence[int], output: Sequence[int], temperature: float = 1.0
) -> list[float]:
    """Logprobs of `output` after `prompt` from one full forward pass (the reference a sampler must match)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(output)], dtype=torch.long, device=device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, torch.tensor(list(output), device=device)[:, None]).squeeze(-1).tolist()


__all__ = [
    "RowSampling",
    "SampleOutput",
    "SamplerStats",
    "StopCheck",
    "choose_tokens",
    "left_pad",
    "multimodal_prefill",
    "row_uniforms",
    "sample",
    "teacher_forced_logprobs",
]
