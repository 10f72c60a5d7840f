"""The KV-cache sampler: logprobs equal a teacher-forced recomputation, batching changes nothing, stops are exact."""

import random

import pytest
import torch

from rollout.policy.sampler import RowSampling, SamplerStats, choose_tokens, sample, teacher_forced_logprobs
from train.tiny import build_model, tiny_qwen3_config

VOCAB = 300
EOS = 2


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def model(one_torch_thread):
    m = build_model(tiny_qwen3_config(VOCAB), seed=3)
    with torch.no_grad():  # a sharper output layer than the random init, so stops happen and greedy has clear maxima
        m.model.embed_tokens.weight.mul_(8.0)
    return m


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (1, 5, 17, 40, 3, 28, 9, 60)]


def assert_logprobs_match(model, prompts, outs, temperature):
    worst = 0.0
    for p, o in zip(prompts, outs):
        ref = teacher_forced_logprobs(model, p, o.output_ids, temperature=temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(ref, o.logprobs)))
    assert worst < 1e-4


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, -1), (0.7, 0.9, -1), (1.3, 1.0, 20)])
def test_sampled_logprobs_equal_teacher_forced(model, prompts, temperature, top_p, top_k):
    g = torch.Generator().manual_seed(1)
    params = RowSampling(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=24)
    outs = sample(model, prompts, params, stop_token_ids=[EOS], generator=g)
    assert all(len(o.output_ids) == len(o.logprobs) >= 1 for o in outs)
    assert_logprobs_match(model, prompts, outs, temperature)


def test_greedy_is_deterministic_and_batch_equals_single(model, prompts):
    params = RowSampling(greedy=True, max_new_tokens=30)
    a = sample(model, prompts, params, stop_token_ids=[EOS])
    b = sample(model, prompts, params, stop_token_ids=[EOS])
    assert [o.output_ids for o in a] == [o.output_ids for o in b]
    for p, o in zip(prompts, a):
        alone = sample(model, [p], params, stop_token_ids=[EOS])[0]
        assert alone.output_ids == o.output_ids
        assert alone.finish_reason == o.finish_reason
        assert max(abs(x - y) for x, y in zip(alone.logprobs, o.logprobs)) < 1e-4
    # greedy logprobs are those of the temperature-1 model, and greedy picks the argmax
    assert_logprobs_match(model, prompts, a, 1.0)
    for p, o in zip(prompts, a):
        logits = model(input_ids=torch.tensor([p + o.output_ids[:-1]])).logits[0, len(p) - 1 :]
        assert logits.argmax(-1).tolist() == o.output_ids


def test_stop_token_is_included_and_budget_gives_length(model, prompts):
    params = RowSampling(greedy=True, max_new_tokens=30)
    free = sample(model, prompts, params, stop_token_ids=[])
    # use the 4th generated token of the first prompt as the stop token: that row must stop right there
    stop_id = free[0].output_ids[3]
    outs = sample(model, prompts, params, stop_token_ids=[stop_id])
    assert outs[0].output_ids == free[0].output_ids[: free[0].output_ids.index(stop_id) + 1]
    assert outs[0].finish_reason == "stop"
    for f, o in zip(free, outs):
        if stop_id in f.output_ids:
            assert o.output_ids[-1] == stop_id and o.finish_reason == "stop"
        else:
            assert o.output_ids == f.output_ids and o.finish_reason == "length" and len(o.output_ids) == 30


def test_rows_keep_their_own_settings(model, prompts):
    rows = [RowSampling(greedy=True, max_new_tokens=n) for n in (1, 7, 3, 12, 2, 9, 5, 4)]
    outs = sample(model, prompts, rows, stop_token_ids=[])
    assert [len(o.output_ids) for o in outs] == [1, 7, 3, 12, 2, 9, 5, 4]
    full = sample(model, prompts, RowSampling(greedy=True, max_new_tokens=12), stop_token_ids=[])
    for r, o, f in zip(rows, outs, full):  # leaving the batch early (compaction) changes nobody's tokens
        assert o.output_ids == f.output_ids[: r.max_new_tokens]


def test_finished_rows_leave_the_batch(model, prompts):
    stats = SamplerStats()
    rows = [RowSampling(greedy=True, max_new_tokens=2)] * 7 + [RowSampling(greedy=True, max_new_tokens=20)]
    outs = sample(model, prompts, rows, stop_token_ids=[], stats=stats)
    assert stats.compactions >= 1 and stats.decode_steps == 20 and stats.new_tokens == 7 * 2 + 20
    assert outs[-1].output_ids == sample(model, [prompts[-1]], rows[-1], stop_token_ids=[])[0].output_ids


def test_stop_check_ends_a_row(model, prompts):
    seen = []

    def check(row, ids):
        seen.append(row)
        return len(ids) == 4

    outs = sample(model, prompts, RowSampling(greedy=True, max_new_tokens=10), stop_check=check, stop_check_rows=[1])
    assert len(outs[1].output_ids) == 4 and outs[1].finish_reason == "stop"
    assert all(len(o.output_ids) == 10 for i, o in enumerate(outs) if i != 1)
    assert set(seen) == {1}


def test_abort_ends_unfinished_rows(model, prompts):
    polls = []

    def abort():
        polls.append(1)
        return len(polls) >= 5

    rows = [RowSampling(greedy=True, max_new_tokens=2)] + [RowSampling(greedy=True, max_new_tokens=50)] * 7
    outs = sample(model, prompts, rows, stop_token_ids=[], should_abort=abort)
    assert outs[0].finish_reason == "length" and len(outs[0].output_ids) == 2
    assert all(o.finish_reason == "abort" and len(o.output_ids) == 5 for o in outs[1:])


def test_seeded_sampling_repeats():
    m = build_model(tiny_qwen3_config(VOCAB), seed=0)
    p = [[5, 6, 7], [8]]
    a = sample(m, p, RowSampling(max_new_tokens=15), generator=torch.Generator().manual_seed(7))
    b = sample(m, p, RowSampling(max_new_tokens=15), generator=torch.Generator().manual_seed(7))
    c = sample(m, p, RowSampling(max_new_tokens=15), generator=torch.Generator().manual_seed(8))
    assert [o.output_ids for o in a] == [o.output_ids for o in b]
    assert [o.output_ids for o in a] != [o.output_ids for o in c]


def test_a_seeded_row_draws_the_same_sample_in_any_batch(prompts):
    # the local policy batches whatever requests are queued: a seeded row must not depend on its neighbours or its place
    model = build_model(tiny_qwen3_config(VOCAB), seed=0)  # the random init: a flat distribution, so seeds matter
    rows = [RowSampling(max_new_tokens=20, seed=100 + i) for i in range(len(prompts))]
    batched = sample(model, prompts, rows, stop_token_ids=[EOS], generator=torch.Generator().manual_seed(1))
    order = [5, 2, 7, 0, 3]
    other = sample(model, [prompts[i] for i in order], [rows[i] for i in order], stop_token_ids=[EOS],
                   generator=torch.Generator().manual_seed(2))
    for i, o in zip(order, other):
        assert o.output_ids == batched[i].output_ids
    for i in (1, 6):
        alone = sample(model, [prompts[i]], rows[i], stop_token_ids=[EOS])[0]
        assert alone.output_ids == batched[i].output_ids
    # and the seed matters: another seed gives another sample for most rows
    reseeded = sample(model, prompts, [RowSampling(max_new_tokens=20, seed=200 + i) for i in range(len(prompts))],
                      stop_token_ids=[EOS])
    assert sum(a.output_ids != b.output_ids for a, b in zip(batched, reseeded)) >= len(prompts) // 2


def test_top_k_and_top_p_restrict_the_draw():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]] * 4000)
    ones = torch.ones(4000)
    g = torch.Generator().manual_seed(0)
    no = torch.zeros(4000, dtype=torch.bool)
    tok, lp = choose_tokens(logits, ones, torch.full((4000,), 2), ones, no, g)
    assert set(tok.tolist()) == {0, 1}
    full_logp = torch.log_softmax(logits[0], -1)
    assert torch.allclose(lp, full_logp[tok])  # the logprob is over the whole vocabulary, not the truncated one
    # probabilities 0.636, 0.234, 0.086, ...: top_p 0.8 keeps the first two (0.636 < 0.8 <= 0.870)
    tok, _ = choose_tokens(logits, ones, torch.full((4000,), -1), torch.full((4000,), 0.8), no, g)
    assert set(tok.tolist()) == {0, 1}
    tok, _ = choose_tokens(logits, ones, torch.full((4000,), -1), torch.full((4000,), 0.5), no, g)
    assert set(tok.tolist()) == {0}


def test_bad_input_is_rejected(model):
    with pytest.raises(ValueError, match="at least one token"):
        sample(model, [[1], []], RowSampling())
    with pytest.raises(ValueError, match="2 prompts but 1"):
        sample(model, [[1], [2]], [RowSampling()])
    with pytest.raises(ValueError, match="max_new_tokens"):
        RowSampling(max_new_tokens=0)


def test_draws_follow_the_distribution():
    # temperature 0.5 sharpens logits [1, 0, -1, -inf]: probabilities e^2, 1, e^-2 normalized = 0.867, 0.117, 0.016, 0
    n = 40000
    logits = torch.tensor([[1.0, 0.0, -1.0, float("-inf")]]).repeat(n, 1)
    tok, lp = choose_tokens(
        logits,
        torch.full((n,), 0.5),
        torch.full((n,), -1),
        torch.ones(n),
        torch.zeros(n, dtype=torch.bool),
        torch.Generator().manual_seed(3),
    )
    freq = torch.bincount(tok, minlength=4).double() / n
    assert freq.tolist() == pytest.approx([0.8668, 0.1173, 0.0159, 0.0], abs=0.006)
    assert lp[tok == 0][0].item() == pytest.approx(-0.14293, abs=1e-4)  # log 0.8668
