"""Parsing of tool calls and boxed answers (pure functions)."""

import json

import pytest

from envs.toolcall.parsing import last_boxed, parse_action, strip_thinking

TOOLS = {
    "python": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    "calculator": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


def call(name="python", **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_qwen_tool_call():
    p = parse_action("Let me compute.\n" + call(code="print(1 + 2)"), TOOLS)
    assert (p.kind, p.tool_name, p.arguments) == ("tool_call", "python", {"code": "print(1 + 2)"})


def test_arguments_as_json_string_and_raw_newlines():
    text = '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(2)\\"}"}</tool_call>'
    assert parse_action(text, TOOLS).arguments == {"code": "print(2)"}
    raw = '<tool_call>{"name": "python", "arguments": {"code": "a = 1\nprint(a)"}}</tool_call>'
    assert parse_action(raw, TOOLS).arguments == {"code": "a = 1\nprint(a)"}


def test_unclosed_final_tool_call_is_tolerated():
    # A policy server that stops on "</tool_call>" may strip the stop string.
    p = parse_action('<tool_call>\n{"name": "python", "arguments": {"code": "print(3)"}}\n', TOOLS)
    assert p.kind == "tool_call" and p.arguments == {"code": "print(3)"}


def test_bad_json_reports_position():
    p = parse_action('<tool_call>{"name": "python" "arguments": {}}</tool_call>', TOOLS)
    assert p.kind == "error"
    assert "invalid" in p.error and "line 1 column 19" in p.error and "character 18" in p.error


def test_unknown_tool_lists_known_ones():
    p = parse_action(call("bash", cmd="ls"), TOOLS)
    assert p.kind == "error" and p.tool_name == "bash"
    assert "unknown tool 'bash'" in p.error and "calculator, python" in p.error


def test_missing_and_unexpected_and_mistyped_arguments():
    assert "needs the argument 'code'" in parse_action(call(), TOOLS).error
    assert "has no argument 'src'" in parse_action(call(code="1", src="x"), TOOLS).error
    assert "must be a string, not a number" in parse_action(call(code=5), TOOLS).error
    assert "must hold a JSON object, not an array" in parse_action("<tool_call>[1, 2]</tool_call>", TOOLS).error
    assert "no 'name'" in parse_action('<tool_call>{"arguments": {}}</tool_call>', TOOLS).error
    assert (
        "'arguments' must be a JSON object"
        in parse_action('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', TOOLS).error
    )


def test_answer_takes_last_boxed_with_nested_braces():
    p = parse_action("First \\boxed{1}, no wait: \\boxed{\\frac{1}{2}}.", TOOLS)
    assert (p.kind, p.answer) == ("answer", "\\frac{1}{2}")
    assert last_boxed("\\boxed{a{b{c}}d}") == ("a{b{c}}d", None)
    assert last_boxed("no answer") == (None, None)


def test_boxed_errors():
    assert "never closed" in parse_action("\\boxed{\\frac{1}{2}", TOOLS).error
    assert "empty" in parse_action("\\boxed{ }", TOOLS).error


def test_both_and_neither_and_several():
    both = parse_action(call(code="print(1)") + " \\boxed{1}", TOOLS)
    assert both.kind == "error" and "both a tool call and a \\boxed{} answer" in both.error
    neither = parse_action("The answer is 42.", TOOLS)
    assert neither.kind == "error" and "neither" in neither.error
    two = parse_action(call(code="print(1)") + call(code="print(2)"), TOOLS)
    assert two.kind == "error" and "2 tool calls" in two.error
    assert "not closed" in parse_action("<tool_call>{<tool_call>{}</tool_call>", TOOLS).error
    assert "without an opening" in parse_action('{"name": "python"}</tool_call>', TOOLS).error
    assert "empty" in parse_action("<tool_call> </tool_call>", TOOLS).error


def test_boxed_inside_code_is_not_an_answer():
    p = parse_action(call(code="print('\\\\boxed{1}')"), TOOLS)
    assert p.kind == "tool_call"


def test_thinking_is_ignored():
    assert strip_thinking("<think>maybe \\boxed{1}</think>\\boxed{2}") == "\\boxed{2}"
    assert parse_action("<think>try " + call(code="x") + "</think> \\boxed{7}", TOOLS).answer == "7"
    # Qwen3 templates open the block in the prompt: only the closing tag is generated.
    assert parse_action("draft \\boxed{1}</think>\\boxed{3}", TOOLS).answer == "3"


@pytest.mark.parametrize("junk", ["", " ", "\x00\x01", "<tool_call>", "}}}{{{", "\\boxed", '<tool_call>"</tool_call>'])
def test_junk_never_raises(junk):
    assert parse_action(junk, TOOLS).kind == "error"
