"""SFT warm start: the assistant-token mask, batching by token budget, and that it really learns."""

import copy
import itertools
import random

import pytest
import torch

from rollout.policy.local import chat_prompt_ids
from rollout.policy.sampler import RowSampling, sample
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from train.sft import lr_at, make_batches, sft, tokenize_conversation
from train.config import SFTConfig, sft_cache_fields
from toy_conversations import addition_conversation, addition_conversations


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([render_chat(c) for c in addition_conversations(200, max_operand=99)], vocab_size=512)


def test_mask_covers_exactly_the_assistant_outputs(tok):
    conv = addition_conversation(12, 34)
    tc = tokenize_conversation(tok, conv)
    assert tc.ids == tok.apply_chat_template(conv, tokenize=True, return_dict=False)
    masked = [i for i, m in zip(tc.ids, tc.loss_mask) if m]
    eos = tok.eos_token_id
    expected = []
    for m in conv:
        if m["role"] == "assistant":  # what the policy emits after "<|im_start|>assistant\n": content, then <|im_end|>
            expected += tok.encode(m["content"], add_special_tokens=False) + [eos]
    assert masked == expected
    # the masked tokens are two contiguous runs, each right after a generation prompt
    runs = [i for i in range(1, len(tc.loss_mask)) if tc.loss_mask[i] and not tc.loss_mask[i - 1]]
    assert len(runs) == 2
    for start in runs:
        assert tok.decode(tc.ids[start - 3 : start]) == "<|im_start|>assistant\n"
        assert tc.ids[:start] == chat_prompt_ids(tok, conv[: 2 if start == runs[0] else 4])


def test_a_template_that_is_not_prefix_stable_is_rejected(tok):
    qwen3_like = copy.deepcopy(tok)
    qwen3_like.chat_template = (
        "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n{{ m.content }}<|im_end|>\n"
        "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ValueError, match="not prefix-stable at message 2"):
        tokenize_conversation(qwen3_like, addition_conversation(1, 2))


def test_batches_respect_the_token_budget_and_cover_everything():
    rng = random.Random(0)
    lengths = [rng.randint(5, 120) for _ in range(500)]
    batches = make_batches(lengths, 600, random.Random(1))
    seen = sorted(i for b in batches for i in b)
    assert seen == list(range(500))
    assert all(max(lengths[i] for i in b) * len(b) <= 600 for b in batches)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    assert padded < 1.15 * sum(lengths)  # similar lengths share a batch


def test_lr_schedule_warms_up_then_decays():
    cfg = SFTConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [lr_at(s, 20, cfg) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:])) and lrs[-1] >= 0.1


def test_conversations_without_assistant_turns_are_skipped_or_rejected(tok):
    model = build_model(tiny_qwen3_config(len(tok)), seed=0)
    no_answer = [addition_conversation(1, 1)[:2]]
    with pytest.raises(ValueError, match="no.*assistant turn"):
        sft(model, tok, no_answer, SFTConfig(epochs=1, progress=False))
    res = sft(model, tok, no_answer + [addition_conversation(2, 2)], SFTConfig(epochs=1, progress=False))
    assert res.skipped == [0] and res.conversations == 1


@pytest.mark.slow
def test_sft_learns_the_demonstrations(tok):
    convs = addition_conversations(16, seed=0, max_operand=99)
    model = build_model(tiny_qwen3_config(len(tok)), seed=0)
    res = sft(model, tok, convs, SFTConfig(epochs=60, batch_tokens=512, lr=5e-3, warmup_steps=5, progress=False))
    assert res.epoch_losses[0] > 3.0
    assert res.epoch_losses[-1] < 0.05 * res.epoch_losses[0]
    assert res.tokens > 0 and res.loss_tokens < res.tokens and res.steps == len(res.losses)
    prompts = [chat_prompt_ids(tok, c[:k]) for c in convs for k in (2, 4)]
    targets = [c[k]["content"] for c in convs for k in (2, 4)]
    outs = sample(model, prompts, RowSampling(greedy=True, max_new_tokens=48), stop_token_ids=[tok.eos_token_id])
    texts = [tok.decode(o.output_ids, skip_special_tokens=True) for o in outs]
    # held-in turns come back verbatim, including the tool call that copies the numbers from the question
    assert texts[0] == targets[0] and texts[1] == targets[1]
    assert sum(t == g for t, g in zip(texts, targets)) >= 28
    assert all(o.output_ids[-1] == tok.eos_token_id for o, t, g in zip(outs, texts, targets) if t == g)


def test_bf16_autocast_trains(tok):
    model = build_model(tiny_qwen3_config(len(tok)), seed=0)
    res = sft(
        model,
        tok,
        addition_conversations(32, max_operand=99),
        SFTConfig(epochs=6, batch_tokens=1024, bf16=True, progress=False),
    )
    assert all(torch.isfinite(torch.tensor(res.losses)))
    assert res.epoch_losses[-1] < 0.5 * res.epoch_losses[0]
    assert next(model.parameters()).dtype == torch.float32  # weights stay float32; only the forward is autocast


def _context_nll(model, tok, convs) -> float:
    """Mean cross-entropy on the tokens outside the assistant turns (what the model reads)."""
    total = n = 0.0
    with torch.no_grad():
        for c in convs:
            t = tokenize_conversation(tok, c)
            ids = torch.tensor([t.ids])
            nll = torch.nn.functional.cross_entropy(model(input_ids=ids).logits[0, :-1], ids[0, 1:], reduction="none")
            ctx = 1.0 - torch.tensor(t.loss_mask[1:], dtype=torch.float)
            total += float((nll * ctx).sum())
            n += float(ctx.sum())
    return total / n


def test_context_loss_also_trains_on_what_the_model_reads(tok):
    convs = addition_conversations(8, seed=0, max_operand=99)
    nll = {}
    for w in (0.0, 1.0):
        model = build_model(tiny_qwen3_config(len(tok)), seed=0)
        res = sft(model, tok, convs, SFTConfig(epochs=10, batch_tokens=512, lr=5e-3, warmup_steps=5,
                                               context_loss_weight=w, progress=False))
        assert res.epoch_losses[-1] < 0.5 * res.epoch_losses[0]  # the reported loss is the assistant tokens' either way
        nll[w] = _context_nll(model, tok, convs)
    assert nll[1.0] < 0.5 * nll[0.0]
    with pytest.raises(ValueError, match="context_loss_weight"):
        SFTConfig(context_loss_weight=-1.0)
    # a weight of 0 (the default) leaves the warm-start cache keys as they were before the option
    assert "context_loss_weight" not in sft_cache_fields(SFTConfig())
    assert sft_cache_fields(SFTConfig(context_loss_weight=0.5))["context_loss_weight"] == 0.5
