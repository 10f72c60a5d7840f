"""The locally built tokenizer (Qwen's special tokens and chat format) and the tiny Qwen3 model."""

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from rollout.policy.local import chat_prompt_ids
from train.tiny import (
    IM_END,
    IM_START,
    PAD,
    TAG_TOKENS,
    build_model,
    build_tokenizer,
    render_chat,
    tiny_qwen3_config,
)
from toy_conversations import addition_conversation, addition_conversations


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([render_chat(c) for c in addition_conversations(300)], vocab_size=512)


def test_special_tokens_like_qwen3(tok):
    assert tok.convert_ids_to_tokens([0, 1, 2]) == [PAD, IM_START, IM_END]
    assert tok.eos_token == IM_END and tok.pad_token == PAD
    assert IM_START in tok.all_special_tokens
    for tag in TAG_TOKENS:  # single added tokens, but not "special": decoding keeps them, as Qwen3's tokenizer does
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, tag
        assert tag not in tok.all_special_tokens
    ids = tok.encode(f"{IM_START}assistant\n<tool_call>x</tool_call>{IM_END}", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"
    assert len(tok) <= 512
    # no merge was spent on pieces of the added tokens (training saw the texts cut at them)
    whole = set(TAG_TOKENS) | {PAD, IM_START, IM_END}
    assert not [t for t in tok.get_vocab() if t not in whole and ("<|" in t or "_call" in t or "_response" in t)]


def test_digits_are_single_tokens(tok):
    pieces = tok.convert_ids_to_tokens(tok.encode("x = 90817 + 3", add_special_tokens=False))
    assert [p for p in pieces if p.strip("Ġ").isdigit()] == ["9", "0", "8", "1", "7", "3"]


def test_any_text_round_trips_byte_level(tok):
    text = 'naïve café ✓ 東京 \t\n  {"a": [1, 2]} \\boxed{42}'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_qwen_format(tok):
    conv = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A1"},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "assistant", "content": "A2"},
    ]
    expected = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nA2<|im_end|>\n"
    )
    assert tok.apply_chat_template(conv, tokenize=False) == expected
    assert render_chat(conv) == expected
    prompt = tok.apply_chat_template(conv[:5], tokenize=False, add_generation_prompt=True)
    assert prompt == expected[: expected.index("A2")]  # prefix-stable, ends with the generation prompt


def test_tool_calls_field_and_tools_declaration(tok):
    conv = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "python", "arguments": {"code": "1"}}}],
        },
    ]
    tools = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(conv, tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert '\n<tools>\n{"type": "function", "function": {"name": "python"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call><|im_end|>'
        in text
    )
    assert render_chat(conv, tools=tools) == text


def test_unknown_role_is_a_clear_error(tok):
    with pytest.raises(Exception, match="unknown message role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_save_and_load_keep_everything(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    conv = addition_conversation(12, 34)
    assert chat_prompt_ids(again, conv[:4]) == chat_prompt_ids(tok, conv[:4])
    assert again.eos_token_id == tok.eos_token_id and again.pad_token_id == tok.pad_token_id
    assert (
        again.decode(again.encode("<tool_call>1</tool_call>"), skip_special_tokens=True) == "<tool_call>1</tool_call>"
    )


def test_vocab_size_too_small_is_rejected():
    with pytest.raises(ValueError, match="vocab_size=100"):
        build_tokenizer(["abc"], vocab_size=100)


def test_tiny_model_size_and_seed():
    cfg = tiny_qwen3_config(1024)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (128, 2, 4, 2)
    assert cfg.head_dim == 32 and cfg.tie_word_embeddings
    a, b, c = build_model(cfg, seed=1), build_model(cfg, seed=1), build_model(cfg, seed=2)
    assert isinstance(a, Qwen3ForCausalLM)
    n = sum(p.numel() for p in a.parameters())
    assert 0.5e6 < n < 0.6e6  # ~0.56M with a 1024 vocabulary (embeddings tied to the output layer)
    assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])
    assert next(a.parameters()).dtype == torch.float32


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        tiny_qwen3_config(100, hidden_size=130, num_heads=4)
    with pytest.raises(ValueError, match="divisible"):
        tiny_qwen3_config(100, num_heads=4, num_kv_heads=3)
