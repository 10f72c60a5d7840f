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

import copy
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from train.config import TinyVisionConfig

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


# The same format for a vision-language model: an image content part is Qwen-VL's placeholder (the processor expands
# `<|image_pad|>` to one token per merged patch: train/vision.py).
VL_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{%- for part in c if part.type == 'text' -%}{{ part.text }}{%- endfor -%}",
    "{%- for part in c -%}{%- if part.type == 'text' -%}{{ part.text }}{%- elif part.type == 'image' -%}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{%- endif -%}{%- endfor -%}",
)
assert VL_CHAT_TEMPLATE != CHAT_TEMPLATE


def vision_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A copy of a tiny tokenizer with Qwen-VL's vision tokens (special, after the text vocabulary, so every text id
    keeps its meaning) and the chat template that renders image parts."""
    from train.vision import VISION_TOKENS

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)}, replace_extra_special_tokens=False)
    tok.chat_template = VL_CHAT_TEMPLATE
    return tok


def tiny_image_processor(vision: TinyVisionConfig) -> Any:
    """Qwen2-VL's image processor (its PIL backend: no torchvision) for the tiny vision tower's patches."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=vision.patch_size, merge_size=2, temporal_patch_size=2,
                                    min_pixels=vision.min_pixels, max_pixels=vision.max_pixels)


def tiny_qwen3vl_config(text: Qwen3Config, tokenizer: PreTrainedTokenizerFast, vision: TinyVisionConfig) -> Any:
    """A Qwen3-VL config whose language model has the shape of the tiny Qwen3 `text` (its rotary frequencies split
    over the (t, h, w) axes, Qwen3-VL's interleaved M-RoPE) and a small vision tower; the vocabulary is `tokenizer`'s
    (the text model's plus the vision tokens)."""
    from transformers import Qwen3VLConfig

    from train.vision import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START

    half = text.head_dim // 2
    section = [half - 2 * (half // 3), half // 3, half // 3]
    ids = {name: int(tokenizer.convert_tokens_to_ids(t)) for name, t in (
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END),
        ("image_token_id", IMAGE_PAD), ("video_token_id", VIDEO_PAD))}
    rope = {**(getattr(text, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 1_000_000.0}),
            "mrope_section": section, "mrope_interleaved": True}
    cfg = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
            num_hidden_layers=text.num_hidden_layers, num_attention_heads=text.num_attention_heads,
            num_key_value_heads=text.num_key_value_heads, head_dim=text.head_dim,
            max_position_embeddings=text.max_position_embeddings, rms_norm_eps=text.rms_norm_eps,
            rope_parameters=rope, pad_token_id=text.pad_token_id, eos_token_id=text.eos_token_id,
            attention_dropout=0.0,
        ),
        vision_config=dict(
            depth=vision.depth, hidden_size=vision.hidden_size, intermediate_size=vision.intermediate_size,
            num_heads=vision.num_heads, patch_size=vision.patch_size, spatial_merge_size=2, temporal_patch_size=2,
            out_hidden_size=text.hidden_size, num_position_embeddings=256,
            deepstack_visual_indexes=list(vision.deepstack_layers),
        ),
        tie_word_embeddings=text.tie_word_embeddings,
        **ids,
    )
    cfg.architectures = ["Qwen3VLForConditionalGeneration"]
    return cfg


def vision_model_from_text(text_model: Qwen3ForCausalLM, config: Any, seed: int = 0) -> Any:
    """A Qwen3VLForConditionalGeneration whose language model is `text_model` (weights copied; the vision tokens'
    embedding rows and the vision tower freshly initialized with `seed`). On text alone it computes what `text_model`
    computes: with no image, the three M-RoPE axes carry the same position, i.e. plain RoPE."""
    from transformers import Qwen3VLForConditionalGeneration

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config).float()
    src = text_model.state_dict()
    dst = model.state_dict()
    with torch.no_grad():
        for k, v in src.items():
            target = "lm_head.weight" if k == "lm_head.weight" else "model.language_model." + k.removeprefix("model.")
            if target not in dst:
                raise KeyError(f"{k} of the text model has no place ({target}) in the vision-language model")
            if v.shape == dst[target].shape:
                dst[target].copy_(v)
            else:  # the vocabulary rows: the text ids first, the vision tokens after
                dst[target][: v.shape[0]].copy_(v)
    return model.eval()


def build_model(config: Qwen3Config, seed: int = 0) -> Qwen3ForCausalLM:
    """A freshly initialized Qwen3ForCausalLM (float32, eval mode); the same seed gives the same weights."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):  # don't disturb the caller's RNG stream
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.float().eval()


__all__ = [
    "CHAT_TEMPLATE",
    "VL_CHAT_TEMPLATE",
    "IM_END",
    "IM_START",
    "PAD",
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "build_model",
    "build_tokenizer",
    "clean_messages",
    "render_chat",
    "tiny_image_processor",
    "tiny_qwen3_config",
    "tiny_qwen3vl_config",
    "vision_model_from_text",
    "vision_tokenizer",
]
