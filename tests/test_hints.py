"""Directive signals, the judge's side: hint parsing and selection, the teacher's context, the rule judge's hints from
real env signals, and the LLM judge's hint requests against a real loopback server."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from prm.factory import judge_config, make_judge
from prm.hints import HINT_LABEL, parse_hint, rule_hint, select_hint, with_hint
from prm.judge import RuleJudge, StepContext
from prm.noisy import NoisyJudge
from rollout.build import compose_launch_config, plan_judge, plan_reward


def test_parse_hint_reads_the_answer_after_the_reasoning():
    assert parse_hint("ok \\boxed{1} [HINT_START] Use 12 + 7. [HINT_END]") == "Use 12 + 7."
    assert parse_hint("<think>[HINT_START]draft[HINT_END]</think> \\boxed{-1}") is None
    assert parse_hint("<think>[HINT_START]draft[HINT_END]</think>", strip_think=False) == "draft"
    assert parse_hint("\\boxed{1} [HINT_START]   [HINT_END]") is None
    assert parse_hint("\\boxed{1} [HINT_START] never closed") is None and parse_hint(None) is None


def test_select_hint_takes_the_longest_valid_one_among_the_plus_one_votes():
    votes = [1, -1, 1, None, 1]
    hints = ["short", "the longest of all, but voted -1", "Check the file first.", "invalid vote's long hint", None]
    assert select_hint(votes, hints, min_chars=10) == "Check the file first."
    assert select_hint([1, 1], ["a" * 12, "b" * 12]) == "a" * 12  # the first of equal length
    assert select_hint([1], ["nine char"], min_chars=10) is None and select_hint([1], ["ten chars!"]) == "ten chars!"
    with pytest.raises(ValueError):
        select_hint([1, 1], ["x"])


def test_with_hint_appends_to_the_turns_last_user_or_tool_message():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "Q 1 + 2 ?"},
            {"role": "assistant", "content": "call"}, {"role": "tool", "content": "3", "image": None}]
    out = with_hint(msgs, "Answer 3.")
    assert out[-1]["content"] == f"3\n\n{HINT_LABEL} Answer 3." and out[-1]["role"] == "tool"
    assert out[:3] == msgs[:3] and msgs[-1]["content"] == "3"  # copied, not changed
    assert with_hint(msgs[:2], "Use +.")[1]["content"].endswith("Use +.")
    with pytest.raises(ValueError, match="no user or tool message"):
        with_hint([{"role": "system", "content": "s"}], "x")


def test_rule_hints_state_the_facts_of_each_family():
    assert rule_hint({"exit_code": 0, "error": False, "progress": True}) is None
    h = rule_hint({"parse_error": True, "parse_message": "found no command"})
    assert "could not be parsed (found no command)" in h
    h = rule_hint({"error": True, "exit_code": 127, "stderr_tail": "bash: yq: command not found"})
    assert "exited with code 127: bash: yq: command not found" in h
    h = rule_hint({"error": True, "exit_code": 1, "failed_tests": ["t.py::a", "t.py::b", "t.py::c", "t.py::d"],
                   "assertion": "assert 3 == 4"})
    assert "t.py::a, t.py::b, t.py::c and 1 more (assert 3 == 4)" in h
    assert "timed out" in rule_hint({"error": True, "timed_out": True, "exit_code": 124})
    h = rule_hint({"submitted": True, "tests_passed": 1, "tests_total": 3, "failed_tests": ["test -f out.txt"]})
    assert "test -f out.txt" in h
    assert "2 of 3 hidden tests" in rule_hint({"submitted": True, "tests_passed": 1, "tests_total": 3})
    assert "did not change the screen" in rule_hint({"screen_changed": False})
    assert rule_hint({"screen_changed": False, "progress": True}) is None
    assert "Still to do: the element" in rule_hint({"screen_changed": True, "milestone_missing": "the element X"})
    h = rule_hint({"expected": "calculator(12 + 7) = 19", "shown": "calculator(12 - 7) = 5"})
    assert h == "It should have been calculator(12 + 7) = 19, not calculator(12 - 7) = 5."
    assert "answer 7 is not correct" in rule_hint({"answer": "7", "correct": False})
    assert len(rule_hint({"error": True, "exit_code": 1, "stderr_tail": "x" * 2000})) <= 400


def test_shell_output_facts_from_a_real_pytest_run(tmp_path):
    from envs.terminal.actions import output_facts

    (tmp_path / "test_x.py").write_text("def add(a, b):\n    return a - b\n\n"
                                        "def test_add():\n    assert add(1, 2) == 3\n\n"
                                        "def test_ok():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1
    facts = output_facts(proc.stdout, proc.stderr, True)
    assert facts["failed_tests"] == ["test_x.py::test_add"]
    assert facts["assertion"].startswith("assert -1 == 3")
    proc = subprocess.run([sys.executable, "-c", "import json; json.loads('{')"], capture_output=True, text=True)
    facts = output_facts(proc.stdout, proc.stderr, True)
    assert facts["exception"].startswith("json.decoder.JSONDecodeError: Expecting property name")
    assert facts["stderr_tail"].endswith(facts["exception"])
    assert output_facts("all good", "", False) == {}


@pytest.mark.integration
def test_terminal_env_signals_give_a_hint(tmp_path):
    import envs

    env = envs.make("terminal")
    try:
        env.reset(options={"task": env.tasks("train")[0]})
        _, _, _, _, info = env.step("```bash\npython3 -c 'import no_such_module_here'\n```")
        s = info["signals"]
        assert s["error"] and s["exit_code"] == 1 and "No module named" in s["stderr_tail"]
        hint = rule_hint(s)
        assert hint.startswith("It exited with code 1:") and "no_such_module_here" in hint
        _, _, _, _, info = env.step("no block")
        assert "found no command" in rule_hint(info["signals"])
    finally:
        env.close()


def test_toolcall_chain_signals_give_the_right_step():
    import envs

    env = envs.make("toolcall", task_set="chain", tools=["calculator"])
    task = {"id": "c", "prompt": "Q 3 + 4 - 2 ?", "answer": "5", "intermediates": [7, 5],
            "chain": {"operands": [3, 4, 2], "ops": ["+", "-"]}}
    env.reset(options={"task": task})
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
    _, _, _, _, info = env.step(call % "3 - 4")
    assert rule_hint(info["signals"]) == "It should have been calculator(3 + 4) = 7, not calculator(3 - 4) = -1."
    _, _, _, _, info = env.step(call % "-1 - 2")  # consistent with its own wrong value: scored 0, still hinted
    assert info["signals"]["mistake"] == "propagated" and "calculator(7 - 2) = 5" in rule_hint(info["signals"])
    _, _, _, _, info = env.step("\\boxed{-3}")
    assert "It should have been \\boxed{5}, not \\boxed{-3}." == rule_hint(info["signals"])
    env.reset(options={"task": task})
    _, _, _, _, info = env.step(call % "3 + 4")
    assert rule_hint(info["signals"]) is None and info["signals"]["expected"] is None
    env.close()


def _ctx(signals, family="toolcall"):
    return StepContext(family=family, task_id="t", instruction="Q", history=[{"role": "user", "content": "Q"}],
                       action="a", next_state={"role": "tool", "content": "5"}, signals=signals)


def test_rule_judge_hints_and_their_votes():
    wrong = {"wrong": True, "expected": "calculator(3 + 4) = 7", "shown": "calculator(3 - 4) = -1"}
    j = RuleJudge(hints=True).score_now(_ctx(wrong))
    assert j.score == -1.0 and j.hint_votes == [1] and j.hint.startswith("It should have been")
    assert "[HINT_START]" in j.hint_raw[0] and "\\boxed{1}" in j.hint_raw[0]
    j = RuleJudge(hints=True).score_now(_ctx({"progress": True}))
    assert j.score == 1.0 and j.hint is None and j.hint_votes == [-1]
    j = RuleJudge().score_now(_ctx(wrong))  # hints off: nothing extra
    assert j.hint is None and j.hint_votes == [] and j.hint_raw == []
    assert RuleJudge(hints=True, min_hint_chars=500).score_now(_ctx(wrong)).hint is None
    # the noisy judge flips votes, never the hint
    noisy = NoisyJudge(RuleJudge(hints=True), accuracy=0.0)
    j = asyncio.run(noisy.score(_ctx(wrong)))
    assert j.votes == [1] and j.hint.startswith("It should have been")


def test_the_reward_decides_whether_the_judge_gives_hints():
    def plan(*overrides):
        cfg = compose_launch_config(list(overrides))
        return plan_judge(cfg.judge, plan_reward(cfg.reward))

    assert not plan().hints and plan("reward=opd").hints is True
    assert not make_judge(plan()).hints
    assert plan("reward=integrated", "judge.hints=true").hints is True
    assert isinstance(make_judge(plan("reward=gated")), RuleJudge) and make_judge(plan("reward=gated")).hints
    with pytest.raises(ValueError, match="judge=none gives none"):
        plan("reward=opd", "judge=none")
    with pytest.raises(ValueError, match="drop judge.hints=false"):
        plan("reward=combined", "judge.hints=false")
    with pytest.raises(ValueError, match="min_hint_chars"):
        judge_config({"type": "rule", "min_hint_chars": 0})


# ----- the LLM judge's hint requests, against a real loopback server -----
HINT_ANSWERS = {
    0: "The tool shows the sum was wrong. \\boxed{1} [HINT_START]Add 7, do not subtract it.[HINT_END]",
    1: "\\boxed{1} [HINT_START]Call the calculator on 12 + 7, the last result plus the next operand.[HINT_END]",
    2: "Nothing to learn here. \\boxed{-1}",
}


@pytest.mark.integration
def test_llm_judge_asks_m_hint_votes_and_keeps_the_longest():
    import fastapi  # noqa: F401 (the serve extra, always installed: a broken one fails)
    from serving_helpers import backend, replay_server, stats

    from prm.client.retry import RetryPolicy
    from prm.llm_judge import LLMJudge, LLMJudgeConfig

    hint_calls = []

    def pick(prompt: str, k: int) -> str:
        if "[HINT_START]" in prompt:  # the hint template asks for a hint between the markers
            hint_calls.append(k)
            return HINT_ANSWERS[(len(hint_calls) - 1) % 3]
        return "The step is wrong. \\boxed{-1}"

    retry = RetryPolicy(attempts=2, backoff_s=0.01, jitter=0.0, timeout_s=30)
    with replay_server(pick=pick) as srv:
        judge = LLMJudge(LLMJudgeConfig(urls=[srv.url + "/v1"], m=3, retry=retry, hint_max_tokens=512), hints=True)

        async def run():
            try:
                return await judge.score(_ctx({"exit_code": None}))
            finally:
                await judge.close()

        j = asyncio.run(run())
        prompts = backend(srv).prompts
        assert stats(srv)["requests:/v1/chat/completions"] == 6  # 3 score votes + 3 hint votes
    assert j.votes == [-1, -1, -1] and j.score == -1.0
    assert sorted(j.hint_votes) == [-1, 1, 1] and len(j.hint_raw) == 3
    assert j.hint == "Call the calculator on 12 + 7, the last result plus the next operand."
    assert sum("hindsight" in p for p in prompts) == 3  # the toolcall hint template reached the model
    assert judge.metrics()["judge/hint_requests"] == 3 and judge.metrics()["judge/hinted"] == 1
