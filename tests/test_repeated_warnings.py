"""Quiet runs (issue 27: one `env=swe` run printed 1,365 identical truncation warnings and ~650 progress lines that said
0/32): a warning that repeats is said once, then counted (envs/repeats.py), the policy's cut prompts reach the metrics
rows and the run summary through the step records, and plain progress output repeats a standing count only now and
then."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from rich.console import Console

from envs.repeats import RepeatedWarning
from loop_support import run_loop
from rollout.loop import EvalResult
from rollout.metrics import prompt_metrics, prompt_totals
from rollout.policy.base import SamplingParams
from rollout.policy.local import TRUNCATIONS_COUNTED_IN, LocalPolicy, chat_prompt_ids
from rollout.policy.local_config import LocalPolicyConfig
from rollout import progress as progress_module
from rollout.progress import PLAIN_QUIET_S, LiveProgress, print_summary
from train.records import Step, Trajectory
from train.tiny import build_model, build_tokenizer, render_chat, tiny_qwen3_config
from toy_conversations import addition_conversation, addition_conversations

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


def test_repeated_warning_is_logged_once_then_counted(caplog):
    log = logging.getLogger("test.repeats")
    rep = RepeatedWarning(log, "x/count in metrics.jsonl")
    with caplog.at_level(logging.DEBUG, logger="test.repeats"):
        firsts = [rep.warn("thing of %d units", n, size=n) for n in (5, 9, 7, 3)]
    assert firsts == [True, False, False, False]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "thing of 5 units (further ones are not logged, only counted: x/count in metrics.jsonl)"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG] == [
        "thing of 9 units", "thing of 7 units", "thing of 3 units"]
    assert (rep.count, rep.largest) == (4, 9)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([render_chat(c) for c in addition_conversations(100)], vocab_size=400)


def test_local_policy_warns_once_for_many_truncated_prompts_and_marks_each_completion(tok, caplog):
    conv = addition_conversation(1, 2)
    longs = [conv[:2] + [{"role": "user", "content": "x " * (100 + 20 * i)}] for i in range(6)]
    full = [len(chat_prompt_ids(tok, m)) for m in longs]
    short = conv[:2]
    assert len(chat_prompt_ids(tok, short)) < 96 < min(full)
    greedy = SamplingParams(greedy=True, max_new_tokens=2)

    async def main():
        policy = LocalPolicy(build_model(tiny_qwen3_config(len(tok)), seed=0), tok, LocalPolicyConfig(max_prompt_tokens=96))
        try:
            together = await asyncio.gather(*(policy.generate(m, greedy) for m in longs[:3]))  # one batch
            one_by_one = [await policy.generate(m, greedy) for m in longs[3:]]
            plain = await policy.generate(short, greedy)
            policy.prompt_ids(longs[0])  # the teacher's rendering: the same warning, counted
            return policy, together + one_by_one, plain
        finally:
            await policy.close()

    with caplog.at_level(logging.DEBUG, logger="rollout.policy.local"):
        policy, outs, plain = asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if r.name == "rollout.policy.local" and r.levelno >= logging.WARNING]
    assert said == [f"prompt of {full[0]} tokens left-truncated to max_prompt_tokens=96 (further ones are not logged, "
                    f"only counted: {TRUNCATIONS_COUNTED_IN})"]
    assert sum("left-truncated" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG) == 6
    assert [o.prompt_truncated_from for o in outs] == full and all(len(o.prompt_ids) == 96 for o in outs)
    assert plain.prompt_truncated_from is None
    assert (policy.stats.truncated_prompts, policy.stats.longest_prompt_tokens) == (7, max(full))
    assert (policy.truncations.count, policy.truncations.largest) == (7, max(full))


def _traj(*prompts: tuple[int, int | None]) -> Trajectory:
    t = Trajectory(run_id="r", episode_id="e", group_id="g", task_id="t")
    t.steps = [Step("r", "e", "g", "t", i, "a", {}, {}, prompt_tokens=n, prompt_truncated_from=cut)
               for i, (n, cut) in enumerate(prompts)]
    return t


def test_prompt_metrics_count_cut_prompts_and_the_longest_before_the_cut():
    trajs = [_traj((100, None), (96, 180)), _traj((96, 3003), (50, None)), _traj()]
    assert prompt_metrics(trajs) == {"policy/truncated_prompts": 2, "policy/longest_prompt_tokens": 3003}
    assert prompt_metrics([_traj((120, None))]) == {"policy/truncated_prompts": 0, "policy/longest_prompt_tokens": 120}
    assert prompt_metrics([]) == {"policy/truncated_prompts": 0, "policy/longest_prompt_tokens": 0}
    rows = [{"policy/truncated_prompts": 1365, "policy/longest_prompt_tokens": 2000},
            {"policy/truncated_prompts": 2, "policy/longest_prompt_tokens": 3003}, {"kind": "resume"}]
    assert prompt_totals(rows) == {"policy/truncated_prompts": 1367, "policy/longest_prompt_tokens": 3003}
    # an eval row carries them too, and a resumed run reads them back
    ev = EvalResult(iteration=0, accuracy=0.5, mean_outcome=0.5, episodes=2, aborted=0, wall_s=1.0,
                    prompts=prompt_metrics(trajs))
    assert ev.row()["policy/truncated_prompts"] == 2 and "prompts" not in ev.row()
    assert EvalResult.from_row(ev.row()) == ev


def test_summary_table_says_how_many_prompts_were_cut_and_the_longest(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("rollout.progress.Console", lambda **kw: Console(width=200, force_terminal=False))
    base = dict(iterations=1, mean_outcome_first=0.0, mean_outcome_last=0.0, mean_step_score=0.0, eval_before=None,
                eval_after=None, env_steps=0, steps_per_s=0.0, wall_s=1.0, aborted_episodes=0)
    print_summary(SimpleNamespace(**base, prompts={"policy/truncated_prompts": 1365,
                                                   "policy/longest_prompt_tokens": 3003}), tmp_path)
    out = capsys.readouterr().out
    assert "prompts cut to policy.max_prompt_tokens" in out and "1,365 (longest 3,003 tokens)" in out
    print_summary(SimpleNamespace(**base, prompts={"policy/truncated_prompts": 0,
                                                   "policy/longest_prompt_tokens": 80}), tmp_path)
    assert "prompts cut" not in capsys.readouterr().out


def test_a_run_with_cut_prompts_warns_once_and_counts_them_in_each_row_and_the_summary(tmp_path, caplog):
    """The loop on a real local farm and the tiny policy with a prompt limit that the later turns exceed."""

    def short_limit(base: LocalPolicy) -> LocalPolicy:
        return LocalPolicy(base.model, base.tokenizer, LocalPolicyConfig(max_batch=32, max_prompt_tokens=48))

    with caplog.at_level(logging.WARNING):
        summary, rows, steps, _ = run_loop(tmp_path, policy=short_limit, iterations=2)
    assert not isinstance(summary, Exception), summary
    cut = [s for s in steps if s["prompt_truncated_from"] is not None]
    assert cut and len(cut) < len(steps), "the limit should cut some prompts, not all"
    assert all(s["prompt_tokens"] <= 48 < s["prompt_truncated_from"] for s in cut)
    said = [r for r in caplog.records if "left-truncated" in r.getMessage()]
    assert len(said) == 1 and "only counted" in said[0].getMessage()
    train = [r for r in rows if r["kind"] == "train"]
    for r in train:
        mine = [s for s in steps if s["iteration"] == r["iteration"]]
        assert r["policy/truncated_prompts"] == sum(s["prompt_truncated_from"] is not None for s in mine)
        assert r["policy/longest_prompt_tokens"] == max(s["prompt_truncated_from"] or s["prompt_tokens"] for s in mine)
    assert summary.prompts == {"policy/truncated_prompts": len(cut),
                               "policy/longest_prompt_tokens": max(s["prompt_truncated_from"] for s in cut)}


def test_plain_progress_repeats_a_standing_count_only_every_quiet_interval(capsys, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    bars = LiveProgress()
    assert bars.progress.disable  # stderr is not a terminal here: plain lines
    for t in range(100):  # the loop refreshes the farm note every second while the first episodes run
        clock[0] = float(t)
        bars.update("iteration 1/4", 0, 32, f"note {t}")
    for done in (1, 8, 9, 15, 32, 32):
        bars.update("iteration 1/4", done, 32, f"done {done}")
    lines = capsys.readouterr().err.splitlines()
    every = int(PLAIN_QUIET_S)
    assert lines == [f"iteration 1/4: 0/32 note {t}" for t in range(0, 100, every)] + [
        f"iteration 1/4: {d}/32 done {d}" for d in (8, 32)]
