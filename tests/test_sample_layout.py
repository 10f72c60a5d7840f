"""Sample layouts: one sample per step, or one per trajectory with per-step spans checked against the token ids."""

from __future__ import annotations

import pytest

from rollout.policy.local import chat_prompt_ids
from train.records import Step, TrainSample, Trajectory
from train.sample_layout import build_samples, history_break
from train.tiny import build_tokenizer, render_chat
from toy_conversations import addition_conversation, addition_conversations


def step(t: int, prompt: list[int], output: list[int], adv: float | None, version: int = 0) -> Step:
    return Step(
        run_id="r",
        episode_id="e",
        group_id="g",
        task_id="x",
        step_index=t,
        action="",
        next_state={},
        signals={},
        advantage=adv,
        weight_version=version,
        prompt_ids=list(prompt),
        output_ids=list(output),
        output_logprobs=[-0.1 * (t + 1) - 0.01 * i for i in range(len(output))],
    )


def traj(*steps: Step, episode: str = "e") -> Trajectory:
    return Trajectory(run_id="r", episode_id=episode, group_id="g", task_id="x", steps=list(steps))


def check_spans(sample: TrainSample, tr: Trajectory) -> None:
    """Every span holds its step's output ids and logprobs, carries its advantage; everything else is masked."""
    covered = set()
    by_index = {s.step_index: s for s in tr.steps}
    for sp in sample.spans:
        s = by_index[sp.step_index]
        assert sample.tokens[sp.start : sp.end] == s.output_ids
        assert sample.tokens[: sp.start] == s.prompt_ids  # the step's context is exactly what the policy saw
        assert sample.rollout_logprobs[sp.start : sp.end] == s.output_logprobs
        assert sp.advantage == s.advantage and sp.weight_version == s.weight_version
        want_mask = 1 if s.advantage is not None else 0
        assert sample.loss_mask[sp.start : sp.end] == [want_mask] * (sp.end - sp.start)
        assert sample.advantages[sp.start : sp.end] == [s.advantage or 0.0] * (sp.end - sp.start)
        covered.update(range(sp.start, sp.end))
    for i in set(range(len(sample.tokens))) - covered:  # observation / template tokens: no gradient, no advantage
        assert sample.loss_mask[i] == 0 and sample.advantages[i] == 0.0 and sample.rollout_logprobs[i] == 0.0


def test_trajectory_layout_puts_each_advantage_on_exactly_its_output_span():
    s0 = step(0, [1, 2, 3], [10, 11], 0.5, version=3)
    s1 = step(1, [1, 2, 3, 10, 11, 50, 51], [12, 13, 14], -1.0, version=4)
    s2 = step(2, [1, 2, 3, 10, 11, 50, 51, 12, 13, 14, 60], [15], 2.0, version=4)
    tr = traj(s0, s1, s2)
    (sample,), stats = build_samples([tr], "trajectory")
    assert sample.tokens == [1, 2, 3, 10, 11, 50, 51, 12, 13, 14, 60, 15]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1]
    assert sample.advantages == [0, 0, 0, 0.5, 0.5, 0, 0, -1, -1, -1, 0, 2.0]
    assert [(sp.start, sp.end) for sp in sample.spans] == [(3, 5), (7, 10), (11, 12)]
    assert sample.weight_version == 3  # the oldest weights behind any scored token
    check_spans(sample, tr)
    assert (stats.trajectory_samples, stats.fallback_trajectories, stats.samples) == (1, 0, 1)


def test_unscored_steps_are_context_only_and_trailing_ones_are_cut():
    s0 = step(0, [1, 2], [10], None, version=0)  # a dropped bucket: no gradient, but the tokens stay as context
    s1 = step(1, [1, 2, 10, 50], [11, 12], 1.0, version=1)
    s2 = step(2, [1, 2, 10, 50, 11, 12, 60], [13], None)  # after the last scored step: not in the sample
    tr = traj(s0, s1, s2)
    (sample,), _ = build_samples([tr], "trajectory")
    assert sample.tokens == [1, 2, 10, 50, 11, 12]
    assert sample.loss_mask == [0, 0, 0, 0, 1, 1] and sample.weight_version == 1
    check_spans(sample, tr)
    assert build_samples([traj(step(0, [1], [2], None))], "trajectory")[0] == []


def test_a_prompt_that_does_not_extend_the_history_falls_back_to_step_samples_and_is_counted():
    s0 = step(0, [1, 2, 3], [10, 11], 0.5)
    s1 = step(1, [1, 2, 3, 10, 99, 50], [12], -1.0)  # history re-rendered as [10, 99], not the sampled [10, 11]
    good = traj(step(0, [1], [5], 1.0), step(1, [1, 5, 7], [6], 1.0), episode="ok")
    samples, stats = build_samples([traj(s0, s1), good], "trajectory")
    assert history_break([s0, s1]) == 1
    assert (stats.trajectories, stats.trajectory_samples, stats.fallback_trajectories) == (2, 1, 1)
    assert [len(s.spans) for s in samples] == [1, 1, 2]  # two per-step samples, then the good trajectory's sample
    assert samples[0].tokens == [1, 2, 3, 10, 11] and samples[1].tokens == [1, 2, 3, 10, 99, 50, 12]


def test_step_layout_matches_the_dynamic_history_samples():
    s0 = step(0, [1, 2, 3], [10, 11], 0.5, version=2)
    s1 = step(1, [1, 2, 3, 10, 11, 50], [12], None)
    s2 = step(2, [7, 8], [13, 14], -0.25, version=3)  # a truncated prompt is fine for per-step samples
    tr = traj(s0, s1, s2)
    samples, stats = build_samples([tr], "step")
    assert [s.step_index for s in samples] == [0, 2] and [s.weight_version for s in samples] == [2, 3]
    for sample in samples:
        check_spans(sample, tr)
    assert samples[1].tokens == [7, 8, 13, 14] and samples[1].loss_mask == [0, 0, 1, 1]
    assert stats.trajectory_samples == 0 and stats.samples == 2
    with pytest.raises(ValueError, match="sample_layout='episode'"):
        build_samples([tr], "episode")


# ----- the real chat template: what the runner does turn by turn ------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([render_chat(c) for c in addition_conversations(80, seed=1)], vocab_size=420)


def chat_trajectory(tok, conv, output_ids_of) -> Trajectory:
    """Steps as the runner records them: prompt = template(messages so far) + generation prompt; output = the
    policy's ids for the assistant text (then <|im_end|>); the text goes back into the history as a message."""
    steps = []
    history = conv[:2]
    for t, i in enumerate(i for i, m in enumerate(conv) if m["role"] == "assistant"):
        prompt = chat_prompt_ids(tok, history)
        output = output_ids_of(conv[i]["content"]) + [tok.eos_token_id]
        s = step(t, prompt, output, adv=[0.7, -1.2][t % 2], version=t)
        steps.append(s)
        history = conv[: i + 2]  # + the assistant message and the observation after it
    return traj(*steps)


def test_real_chat_template_prompts_extend_the_history_so_spans_match_the_token_ids(tokenizer):
    conv = addition_conversation(417, 86)
    tr = chat_trajectory(tokenizer, conv, lambda text: tokenizer.encode(text, add_special_tokens=False))
    (sample,), stats = build_samples([tr], "trajectory")
    assert stats.trajectory_samples == 1 and len(sample.spans) == 2
    check_spans(sample, tr)
    # the masked gap between the two outputs is the template's turn end + the tool result turn + generation prompt
    gap = tokenizer.decode(sample.tokens[sample.spans[0].end : sample.spans[1].start])
    assert "<tool_response>\n503\n</tool_response>" in gap and gap.rstrip().endswith("assistant")
    assert tokenizer.decode(sample.tokens[sample.spans[1].start : sample.spans[1].end]).startswith("The answer is")


def test_a_non_canonical_tokenization_re_renders_differently_and_falls_back(tokenizer):
    conv = addition_conversation(12, 30)

    def spelled_out(text: str) -> list[int]:  # a sampler may emit a word as pieces; the template re-encodes it whole
        ids = []
        for ch in text:
            ids += tokenizer.encode(ch, add_special_tokens=False)
        return ids

    assert spelled_out(conv[2]["content"]) != tokenizer.encode(conv[2]["content"], add_special_tokens=False)
    tr = chat_trajectory(tokenizer, conv, spelled_out)
    samples, stats = build_samples([tr], "trajectory")
    assert stats.fallback_trajectories == 1 and stats.trajectory_samples == 0
    assert len(samples) == 2 and all(len(s.spans) == 1 for s in samples)
    for s in samples:
        check_spans(s, tr)
