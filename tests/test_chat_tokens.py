"""Token-exact multi-turn prompts with a real Hugging Face tokenizer and chat template."""

import copy

from tiny_hf import tiny_tokenizer

from rollout.policy.chat_tokens import ChatTokenizer

# Like Qwen3's: the last assistant turn gets an empty think block, earlier ones do not (re-templating changes history).
THINK_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tok(template=None):
    tok = tiny_tokenizer()
    if template:
        tok = copy.deepcopy(tok)
        tok.chat_template = template
    return tok


def _sampled(tok, text, stop=True):
    ids = tok.encode(text, add_special_tokens=False)
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")] if stop else ids


def test_later_turns_continue_from_the_exact_ids_of_earlier_turns():
    tok = _tok()
    ct = ChatTokenizer(tok)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "list files"}]
    p1 = ct.prompt(msgs, "ep")
    assert not p1.incremental and tok.decode(p1.ids).endswith("<|im_start|>assistant\n")
    out = _sampled(tok, "```bash\nls\n```")
    ct.record("ep", msgs, p1.ids, out, "```bash\nls\n```")
    msgs2 = msgs + [{"role": "assistant", "content": "```bash\nls\n```"}, {"role": "tool", "content": "a.txt"}]
    p2 = ct.prompt(msgs2, "ep")
    assert p2.incremental
    assert p2.ids[: len(p1.ids) + len(out)] == p1.ids + out
    # with a template that renders every turn alike, the result equals templating the whole conversation
    assert p2.ids == tok.encode(
        tok.apply_chat_template(msgs2, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    assert ct.stats == {"incremental": 1, "full": 1, "mismatch": 0}


def test_sampled_ids_are_kept_even_when_text_would_tokenize_differently():
    tok = tiny_tokenizer(merges=(("Ġ", "Ġ"),))  # "  " encodes as one token
    space, two_spaces = tok.convert_tokens_to_ids("Ġ"), tok.convert_tokens_to_ids("ĠĠ")
    assert tok.encode("  ", add_special_tokens=False) == [two_spaces]
    ct = ChatTokenizer(tok)
    msgs = [{"role": "user", "content": "hi"}]
    p1 = ct.prompt(msgs, "ep")
    sampled = [space, space, tok.convert_tokens_to_ids("<|im_end|>")]  # the model emitted two single spaces
    ct.record("ep", msgs, p1.ids, sampled, "  ")
    msgs2 = msgs + [{"role": "assistant", "content": "  "}, {"role": "user", "content": "again"}]
    p2 = ct.prompt(msgs2, "ep")
    assert p2.ids[: len(p1.ids) + 3] == p1.ids + sampled
    retokenized = tok.encode(
        tok.apply_chat_template(msgs2, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    assert two_spaces in retokenized and retokenized != p2.ids  # what re-tokenizing text would have trained on


def test_length_stop_gets_the_end_of_turn_tokens_appended():
    tok = _tok()
    ct = ChatTokenizer(tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    newline = tok.encode("\n", add_special_tokens=False)
    assert ct.turn_suffix == [im_end, *newline]
    msgs = [{"role": "user", "content": "q"}]
    p1 = ct.prompt(msgs, "s")
    cut = _sampled(tok, "partial", stop=False)  # stopped on length: no <|im_end|>
    ct.record("s", msgs, p1.ids, cut, "partial")
    p2 = ct.prompt(msgs + [{"role": "assistant", "content": "partial"}, {"role": "user", "content": "go on"}], "s")
    n = len(p1.ids) + len(cut)
    assert p2.ids[:n] == p1.ids + cut
    assert p2.ids[n : n + 2] == [im_end, *newline]


def test_qwen3_style_template_keeps_history_ids_where_retemplating_would_change_them():
    tok = _tok(THINK_TEMPLATE)
    ct = ChatTokenizer(tok)
    msgs = [{"role": "user", "content": "fix it"}]
    p1 = ct.prompt(msgs, "s")
    out = _sampled(tok, "<think>\n\n</think>\n\nrun tests")  # what a thinking model emits
    ct.record("s", msgs, p1.ids, out, "run tests")
    msgs2 = msgs + [{"role": "assistant", "content": "run tests"}, {"role": "tool", "content": "1 failed"}]
    p2 = ct.prompt(msgs2, "s")
    assert p2.incremental and p2.ids[: len(p1.ids) + len(out)] == p1.ids + out
    assert "<tool_response>\n1 failed\n</tool_response>" in tok.decode(p2.ids[len(p1.ids) + len(out) :])
    full = tok.encode(
        tok.apply_chat_template(msgs2, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    assert full != p2.ids  # re-templating would have dropped the sampled think block: exactly what we avoid


def test_edited_history_or_unknown_session_falls_back_to_the_full_template():
    tok = _tok()
    ct = ChatTokenizer(tok)
    msgs = [{"role": "user", "content": "a"}]
    p1 = ct.prompt(msgs, "s")
    ct.record("s", msgs, p1.ids, _sampled(tok, "b"), "b")
    edited = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    p2 = ct.prompt(edited, "s")
    assert not p2.incremental and ct.stats["mismatch"] == 1
    assert not ct.prompt(edited, None).incremental
    assert not ct.prompt(edited, "other").incremental
    ct.end_session("s")
    assert not ct.prompt(
        msgs + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "s"
    ).incremental


def test_sessions_are_bounded():
    tok = _tok()
    ct = ChatTokenizer(tok, max_sessions=2)
    msgs = [{"role": "user", "content": "a"}]
    for s in ("1", "2", "3"):
        ct.record(s, msgs, [1], [2], "x")
    assert list(ct._sessions) == ["2", "3"]


def test_encode_through_the_fast_backend_gives_the_tokenizers_ids():
    tok = _tok()
    ct = ChatTokenizer(tok)
    assert ct._backend is not None  # a fast tokenizer: its Rust backend is called directly
    texts = ["", "ls -la /tmp\n", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "é ü 数学 \t\n  x" * 20,
             '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call><|im_end|>']
    for text in texts:
        assert ct.encode(text) == list(tok.encode(text, add_special_tokens=False))
