"""Packing TrainSamples into right-padded, shifted micro-batches within a token budget."""

from __future__ import annotations

import pytest

from train.backends.microbatch import make_micro_batches, split_by_token_budget
from train.records import TrainSample


def sample(n: int, prompt: int, adv: float = 1.0) -> TrainSample:
    return TrainSample(
        tokens=list(range(10, 10 + n)),
        loss_mask=[0] * prompt + [1] * (n - prompt),
        advantages=[0.0] * prompt + [adv] * (n - prompt),
        rollout_logprobs=[0.0] * prompt + [-float(i) for i in range(prompt, n)],
    )


def test_budget_counts_padded_tokens_and_keeps_order():
    assert split_by_token_budget([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    assert split_by_token_budget([2, 6, 2], 12) == [[0, 1], [2]]  # [2, 6] pads to 12; adding a third makes 18
    assert split_by_token_budget([50, 3], 10) == [[0], [1]]  # longer than the budget: alone
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        split_by_token_budget([1], 0)


def test_targets_are_shifted_and_padding_is_masked():
    (mb,) = make_micro_batches([sample(5, 2, 0.5), sample(3, 1, -1.0)], max_tokens=100, pad_id=7)
    assert mb.tokens.tolist() == [[10, 11, 12, 13, 14], [10, 11, 12, 7, 7]]
    # position t is about token t+1: token 0 is never a target, loss tokens 2.. of sample 0, 1.. of sample 1
    assert mb.loss_mask.tolist() == [[0, 1, 1, 1], [1, 1, 0, 0]]
    assert mb.advantages.tolist() == [[0.0, 0.5, 0.5, 0.5], [-1.0, -1.0, 0.0, 0.0]]
    assert mb.old_logprobs.tolist() == [[0.0, -2.0, -3.0, -4.0], [-1.0, -2.0, 0.0, 0.0]]
    assert mb.lengths == [5, 3] and mb.real_tokens == 8 and mb.weight == 1.0


def test_weights_are_each_micro_batch_share_of_the_samples_with_loss():
    samples = [sample(4, 1), sample(4, 4), sample(4, 1), sample(4, 2), TrainSample([1, 2], [1, 0], [1, 0], [0, 0])]
    mbs = make_micro_batches(samples, max_tokens=8)
    # samples 1 (all prompt) and 4 (only token 0 marked: nothing to predict) are left out
    assert [mb.indices for mb in mbs] == [[0, 2], [3]]
    assert [mb.weight for mb in mbs] == pytest.approx([2 / 3, 1 / 3])
    every = make_micro_batches(samples, max_tokens=8, only_with_loss=False)
    assert sorted(i for mb in every for i in mb.indices) == [0, 1, 2, 3, 4]


def test_nothing_to_learn_gives_no_micro_batch():
    assert make_micro_batches([sample(3, 3)], 16) == []
    assert make_micro_batches([], 16) == []
