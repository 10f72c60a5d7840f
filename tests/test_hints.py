"""Directive signals, the judge's side: hint parsing and selection, the teacher's context, the rule judge's hints from
real env signals, and the LLM judge's hint requests against a real loopback server."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from prm.factory import judge_config, make_judge
from prm.hints import HINT_LABEL, parse_hint, rule_directive_hint, rule_hint, select_hint, step_rule_hint, with_hint
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


# ----- judge.hint_steps: hints on right steps whose next state is directive -----
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'


def _chain_steps(actions, task=None):
    """The signals of real tool-call chain steps (the bundled set's first training task unless `task`)."""
    import envs
    from envs.toolcall.chain import chain_tasks

    task = task or chain_tasks("train")[0]
    env = envs.make("toolcall", task_set="chain", tools=["calculator"])
    try:
        env.reset(options={"task": task})
        return task, [env.step(a)[4]["signals"] for a in actions]
    finally:
        env.close()


def _right_actions(task):
    ops, operands, inter = task["chain"]["ops"], task["chain"]["operands"], task["intermediates"]
    left = [operands[0], *inter[:-1]]
    return [CALL % f"{a} {op} {b}" for a, op, b in zip(left, ops, operands[1:])] + [f"\\boxed{{{task['answer']}}}"]


def test_directive_templates_on_a_real_chain_task():
    from envs.toolcall.chain import chain_tasks

    task = chain_tasks("train")[0]
    ops, operands, inter = task["chain"]["ops"], task["chain"]["operands"], task["intermediates"]
    _, signals = _chain_steps(_right_actions(task), task)
    for k in range(len(ops)):  # every right call: it was right, and the next call (or the answer) is named
        hint = step_rule_hint(signals[k], "directive")
        left = operands[0] if k == 0 else inter[k - 1]
        done = f"calculator({left} {ops[k]} {operands[k + 1]}) = {inter[k]}"
        assert hint.startswith(f"{done} is right; the next step is ")
        assert hint.endswith((f"calculator({inter[k]} {ops[k + 1]} {operands[k + 2]}) = {inter[k + 1]}."
                              if k + 1 < len(ops) else f"\\boxed{{{task['answer']}}}."))
        assert rule_hint(signals[k]) is None and step_rule_hint(signals[k], "wrong") is None  # today's: none
    # the right final answer: nothing comes next, no hint in either option
    assert step_rule_hint(signals[-1], "directive") is None and rule_directive_hint(signals[-1]) is None


def test_directive_option_keeps_the_wrong_step_templates():
    task = {"id": "c", "prompt": "Q 14 + 23 - 5 ?", "answer": "32", "intermediates": [37, 32],
            "chain": {"operands": [14, 23, 5], "ops": ["+", "-"]}}
    _, (flipped,) = _chain_steps([CALL % "14 - 23"], task)
    wrong_hint = "It should have been calculator(14 + 23) = 37, not calculator(14 - 23) = -9."
    assert step_rule_hint(flipped, "wrong") == step_rule_hint(flipped, "directive") == wrong_hint
    assert rule_directive_hint(flipped) is None  # a wrong step never gets the right-step template
    _, (right,) = _chain_steps([CALL % "14 + 23"], task)
    assert step_rule_hint(right, "directive") == ("calculator(14 + 23) = 37 is right; the next step is "
                                                  "calculator(37 - 5) = 32.")
    # scored 0 (consistent with its own wrong value): the wrong-step template, as before
    _, (_, propagated) = _chain_steps([CALL % "14 - 23", CALL % "-9 - 5"], task)
    assert propagated["mistake"] == "propagated" and rule_directive_hint(propagated) is None
    assert "calculator(37 - 5) = 32" in step_rule_hint(propagated, "directive")


def test_rule_judge_hint_steps_wrong_vs_directive():
    from envs.toolcall.chain import chain_tasks

    task = chain_tasks("train")[1]
    actions = _right_actions(task)
    _, right = _chain_steps(actions, task)
    wrong_first = task["chain"]["operands"][0] + 1000  # a wrong value at the first call
    _, (bad,) = _chain_steps([CALL % f"{wrong_first} + 1"], task)

    def judged(hint_steps):
        judge = RuleJudge(hints=True, hint_steps=hint_steps)
        return [judge.score_now(_ctx(s)) for s in [*right, bad]]

    today, directive = judged("wrong"), judged("directive")
    assert [j.hint is not None for j in today] == [False] * len(right) + [True]  # the default: wrong steps only
    assert [j.hint is not None for j in directive] == [True] * (len(right) - 1) + [False, True]
    assert [j.hint_votes for j in directive] == [[1]] * (len(right) - 1) + [[-1], [1]]
    assert [j.score for j in directive] == [j.score for j in today]  # the option changes hints, never scores
    assert today[-1].hint == directive[-1].hint
    assert RuleJudge(hints=True).hint_steps == "wrong" and judge_config({"type": "rule"}).hint_steps == "wrong"


def test_hint_steps_is_declared_once_with_a_clear_error():
    judge = make_judge(judge_config({"type": "rule", "hints": True, "hint_steps": "directive"}))
    assert judge.hint_steps == "directive"
    for bad in ("all", "right", ""):
        with pytest.raises(ValueError, match="unknown judge.hint_steps .* use wrong or directive"):
            judge_config({"type": "rule", "hint_steps": bad})
        with pytest.raises(ValueError, match="judge.hint_steps"):
            RuleJudge(hint_steps=bad)
    with pytest.raises(ValueError, match="judge.hint_steps"):
        step_rule_hint({}, "bogus")
    cfg = compose_launch_config(["reward=opd", "judge.hint_steps=directive"])
    assert plan_judge(cfg.judge, plan_reward(cfg.reward)).hint_steps == "directive"


def test_right_step_hints_count_as_right_in_the_metrics():
    from types import SimpleNamespace

    from rollout.metrics import directive_metrics
    from train.records import EpisodeStatus

    task = _first_chain_task()
    _, signals = _chain_steps(_right_actions(task), task)
    judge = RuleJudge(hints=True, hint_steps="directive")
    steps = [SimpleNamespace(judge=judge.score_now(_ctx(s)), teacher_gap=None, advantage=0.0, advantage_mode="opd",
                             distill_weight=None, teacher_topk_summary=None) for s in signals]
    traj = SimpleNamespace(status=EpisodeStatus.OK, family="toolcall", steps=steps)
    m = directive_metrics([traj])
    n = len(signals)
    assert m["directive/toolcall/hint_rate_right"] == pytest.approx((n - 1) / n)  # all right, all but the answer hinted
    assert m["directive/toolcall/hint_rate_wrong"] == 0.0


def _first_chain_task():
    from envs.toolcall.chain import chain_tasks

    return chain_tasks("train")[0]


class _StubClient:
    """An OpenAI-compatible client whose answers are given: the LLM judge's parsing, without a server."""

    def __init__(self, answer):
        self.answer = answer

    async def chat(self, messages, **kw):
        from types import SimpleNamespace

        text = self.answer(messages[-1]["content"])
        return SimpleNamespace(choices=[SimpleNamespace(text=text)], usage=None)

    async def aclose(self):
        return None


GARBAGE = [None, "", "\x00\xff garbage", "\\boxed{", "\\boxed{1}", "\\boxed{1} [HINT_START][HINT_END]",
           "\\boxed{1} [HINT_START]unterminated hint that goes on",
           "\\boxed{-1} [HINT_START]a long enough hint[HINT_END]",
           "\\boxed{1} [HINT_START]short[HINT_END]", "\\boxed{7} [HINT_START]a long enough hint[HINT_END]",
           "<think>\\boxed{1} [HINT_START]inside the reasoning only[HINT_END]", ["not", "a", "string"], 42,
           "[HINT_END] backwards [HINT_START] \\boxed{1}"]


@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
@pytest.mark.parametrize("hint_steps", ["wrong", "directive"])
def test_llm_judge_garbage_hint_answers_give_no_hint(garbage, hint_steps):
    from prm.llm_judge import LLMJudge, LLMJudgeConfig

    client = _StubClient(lambda prompt: garbage)
    judge = LLMJudge(LLMJudgeConfig(urls=["http://unused/v1"], m=2), client=client, hints=True, hint_steps=hint_steps)
    j = asyncio.run(judge.score(_ctx({"exit_code": None})))
    assert j.hint is None and len(j.hint_votes) == 2 and j.score in (-1.0, 0.0, 1.0)
    assert judge.metrics()["judge/hinted"] == 0


def test_llm_judge_directive_prompt_asks_for_right_step_hints():
    from prm.llm_judge import LLMJudge, LLMJudgeConfig

    prompts = []

    def answer(prompt):
        prompts.append(prompt)
        return "\\boxed{1} [HINT_START]The result 37 is right; the next operand is - 5.[HINT_END]"

    for hint_steps in ("wrong", "directive"):
        judge = LLMJudge(LLMJudgeConfig(urls=["http://unused/v1"], m=1), client=_StubClient(answer), hints=True,
                         hint_steps=hint_steps)
        j = asyncio.run(judge.score(_ctx({"progress": True})))
        assert j.hint == "The result 37 is right; the next operand is - 5."
    wrong_prompts, directive_prompts = prompts[:2], prompts[2:]
    hint_prompt = [p for p in directive_prompts if "[HINT_START]" in p]
    assert len(hint_prompt) == 1 and "confirms the step was right" in hint_prompt[0]
    assert not any("confirms the step was right" in p for p in wrong_prompts)
