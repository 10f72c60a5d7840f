"""A tiny Qwen3-architecture policy built locally: a byte-level BPE tokenizer with Qwen's chat format, and a small model.

Nothing is downloaded. The tokenizer is trained on the caller's texts (rendered conversations), has the special tokens
Qwen3 has (`<|endoftext|>` pad, `<|im_start|>`, `<|im_end|>` eos; `<tool_call>`, `</tool_call>`, `<tool_response>`,
`</tool_response>`, `<think>`, `</think>` as added non-special tokens, as in Qwen3's tokenizer, so decoding with
`skip_special_tokens=True` keeps the tool-call tags) and a chat template that renders conversations in Qwen's format.

Numbers: by default (`digits="single"`) the pre-tokenizer isolates every digit (Qwen2/3's rule), so 0-9 are single
tokens and an integer is spelled digit by digit. That keeps the tiny model's view of numbers identical to a real Qwen
policy's, makes every integer's spelling independent of which numbers happened to be frequent in the training texts, and
lets a small model learn arithmetic digit-wise instead of memorizing one token per number. `digits="runs"` makes a digit
run one pre-token instead, so BPE learns the frequent numbers (e.g. 0-29 in the chained-calculator tasks) as single
tokens: a task that copies operands then copies one token, not a spelling.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

log = logging.getLogger(__name__)

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]  # ids 0, 1, 2
# Added tokens that are not "special" in Qwen3's tokenizer: they survive decode(skip_special_tokens=True).
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen2/Qwen3's pre-tokenization split (the cl100k pattern with single digits): words with one leading non-letter,
# single digits, punctuation runs, newlines, whitespace.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The same split with a whole digit run as one pre-token (digits="runs").
DIGIT_RUN_SPLIT_PATTERN = QWEN_SPLIT_PATTERN.replace(r"|\p{N}|", r"|\p{N}+|")
DIGIT_MODES = {"single": QWEN_SPLIT_PATTERN, "runs": DIGIT_RUN_SPLIT_PATTERN}

# Qwen's chat format without the thinking branch (like Qwen2.5 / Qwen3-Instruct-2507): each message is
# <|im_start|>{role}\n{content}<|im_end|>\n; consecutive tool results share one user turn, each inside
# <tool_response>\n...\n</tool_response>; assistant `tool_calls` are rendered as <tool_call>\n{json}\n</tool_call>;
# `tools` go into the system turn as JSON lines inside <tools></tools> (the wording of that preamble is ours).
# Prefix-stable: rendering messages[:k] with add_generation_prompt is a prefix of rendering messages[:k+1].
CHAT_TEMPLATE = """
{%- macro text(c) -%}
{%- if c is string -%}{{ c }}
{%- elif c is iterable -%}{%- for part in c if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
{{ '<|im_start|>system\\n' }}
{%- if first_is_system %}{{ text(messages[0].content) + '\\n\\n' }}{% endif -%}
{{ '# Tools\\n\\nCall a function by writing a JSON object {"name": ..., "arguments": {...}} inside <tool_call></tool_call> tags. Functions:\\n<tools>' }}
{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor -%}
{{ '\\n</tools><|im_end|>\\n' }}
{%- elif first_is_system -%}
{{ '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' }}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'user' or m.role == 'system' -%}
{{ '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' }}
{%- elif m.role == 'assistant' -%}
{{ '<|im_start|>assistant\\n' + text(m.content) }}
{%- for call in (m.tool_calls or []) -%}
{%- set f = call.function if call.function is defined else call -%}
{%- if not loop.first or text(m.content) %}{{ '\\n' }}{% endif -%}
{{ '<tool_call>\\n{"name": "' + f.name + '", "arguments": ' }}
{%- if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif -%}
{{ '}\\n</tool_call>' }}
{%- endfor -%}
{{ '<|im_end|>\\n' }}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif -%}
{{ '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif -%}
{%- else -%}
{{ raise_exception('unknown message role: ' + m.role) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}
"""

#: Keys of a message the template reads; everything else (e.g. "image") is dropped before rendering.
MESSAGE_KEYS = ("role", "content", "tool_calls", "name")


def clean_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages reduced to what the chat template reads (extra keys such as "image" arrays are ignored)."""
    out = []
    for i, m in enumerate(messages):
        if "role" not in m:
            raise ValueError(f"message {i} has no 'role' (keys: {sorted(m)})")
        d = {k: m[k] for k in MESSAGE_KEYS if k in m and m[k] is not None}
        d.setdefault("content", "")
        out.append(d)
    return out


def _raise(message: str) -> None:
    raise ValueError(message)


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


_jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_jinja.filters["tojson"] = _tojson
_jinja.globals["raise_exception"] = _raise
_compiled_template = _jinja.from_string(CHAT_TEMPLATE)


def render_chat(
    messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False, tools: list[dict] | None = None
) -> str:
    """The chat template rendered without a tokenizer (to get texts to train the tokenizer on).

    Equal to `tokenizer.apply_chat_template(messages, tokenize=False, ...)` of a tokenizer from `build_tokenizer`.
    """
    return _compiled_template.render(
        messages=clean_messages(messages), add_generation_prompt=add_generation_prompt, tools=tools
    )


_ADDED_SPLIT = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TAG_TOKENS))


def _without_added_tokens(texts: Iterable[str]) -> Iterator[str]:
    """The texts cut at every special / tag token, as encoding will cut them: no merge learns pieces of "<tool_call>"."""
    for text in texts:
        yield from (piece for piece in _ADDED_SPLIT.split(text) if piece)


def build_tokenizer(texts: Iterable[str], vocab_size: int = 1024, digits: str = "single") -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` (rendered conversations) with Qwen's special tokens and chat format.

    Every byte is in the vocabulary, so any text encodes; `vocab_size` counts the specials and tags too. `digits`:
    "single" (every digit its own token, Qwen's rule) or "runs" (BPE may learn whole numbers).
    """
    if digits not in DIGIT_MODES:
        raise ValueError(f"digits={digits!r}: use one of {', '.join(DIGIT_MODES)}")
    n_fixed = 256 + len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    if vocab_size < n_fixed:
        raise ValueError(f"vocab_size={vocab_size} is below the {n_fixed} fixed entries (256 bytes + special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(DIGIT_MODES[digits]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_without_added_tokens(texts), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])  # ids after the BPE vocab
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        extra_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def tiny_qwen3_config(
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    pad_token_id: int = 0,
    eos_token_id: int = 2,
) -> Qwen3Config:
    """A small Qwen3 config (GQA, q/k norms, RoPE, SwiGLU), float32, SDPA attention."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        use_cache=True,
        attention_dropout=0.0,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(config: Qwen3Config, seed: int = 0) -> Qwen3ForCausalLM:
    """A freshly initialized Qwen3ForCausalLM (float32, eval mode); the same seed gives the same weights."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):  # don't disturb the caller's RNG stream
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.float().eval()


__all__ = [
    "CHAT_TEMPLATE",
    "IM_END",
    "IM_START",
    "PAD",
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "build_model",
    "build_tokenizer",
    "clean_messages",
    "render_chat",
    "tiny_qwen3_config",
]
