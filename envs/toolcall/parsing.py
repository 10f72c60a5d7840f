"""Parse one assistant turn: a Qwen-style tool call or a final answer in `\\boxed{...}`.

Accepted forms (the format Qwen models and our demonstrations use):

    <tool_call>
    {"name": "python", "arguments": {"code": "print(1 + 2)"}}
    </tool_call>

    ... \\boxed{3}

Rules, chosen for clean per-step credit assignment (one action = one tool call or one answer):
- Exactly one tool call per turn. Several calls are a parse error (the message says to make one call per turn).
- `arguments` may be an object or a JSON string holding one. Control characters inside JSON strings (a raw newline in
  the code) are tolerated. Every required argument must be present with the declared type; unknown arguments are errors.
- A missing `</tool_call>` at the very end is tolerated (a policy server may strip the stop string it stopped on).
- The answer is the content of the LAST `\\boxed{...}` outside tool calls, braces balanced (`\\boxed{\\frac{1}{2}}`).
- A turn with both a tool call and a boxed answer, or with neither, is a parse error.
- `<think>...</think>` blocks are ignored (a Qwen3 thinking turn may mention tools or boxed drafts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envs.action_text import loads_json, unencodable

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


@dataclass
class ParsedAction:
    """What one assistant turn holds: a tool call, an answer, or an error saying precisely what is wrong."""

    kind: str  # "tool_call" | "answer" | "error"
    tool_name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    answer: str | None = None
    error: str | None = None


def strip_thinking(text: str) -> str:
    """Drop `<think>` blocks; a lone `</think>` (the template opened the block) drops everything before it."""
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text


def last_boxed(text: str) -> tuple[str | None, str | None]:
    """(content of the last `\\boxed{...}`, None) or (None, error) when it is not closed; (None, None) when absent."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None, None
    start = matches[-1].end()
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip(), None
    return None, f"the last \\boxed{{ opened at character {matches[-1].start()} is never closed (unbalanced braces)"


def _split_tool_calls(text: str) -> tuple[list[str], str, str | None]:
    """(bodies of the <tool_call> blocks, the text outside them, error)."""
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    while True:
        i = text.find(OPEN, pos)
        if i < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:i])
        j = text.find(CLOSE, i + len(OPEN))
        if j < 0:
            rest = text[i + len(OPEN) :]
            if OPEN in rest:
                return bodies, "".join(outside), "a <tool_call> is not closed with </tool_call> before the next one"
            bodies.append(rest)  # unclosed at the very end: tolerated (stop-string stripping)
            pos = len(text)
            break
        body = text[i + len(OPEN) : j]
        if OPEN in body:
            return bodies, "".join(outside), "a <tool_call> is not closed with </tool_call> before the next one"
        bodies.append(body)
        pos = j + len(CLOSE)
    return bodies, "".join(outside), None


def parse_action(text: str, tools: Mapping[str, Mapping[str, Any]]) -> ParsedAction:
    """Parse one assistant turn against `tools` (name -> JSON schema of its arguments, OpenAI's `parameters`)."""
    text = strip_thinking(text)
    bodies, outside, err = _split_tool_calls(text)
    if err:
        return ParsedAction("error", error=err)
    answer, box_err = last_boxed(outside)
    if bodies and (answer is not None or box_err):
        return ParsedAction(
            "error", error="the turn has both a tool call and a \\boxed{} answer: do one per turn (call, or answer)"
        )
    if len(bodies) > 1:
        return ParsedAction("error", error=f"found {len(bodies)} tool calls: make exactly one tool call per turn")
    if bodies:
        return _parse_call(bodies[0], tools)
    if box_err:
        return ParsedAction("error", error=box_err)
    if answer is not None:
        if not answer:
            return ParsedAction("error", error="the \\boxed{} answer is empty")
        return ParsedAction("answer", answer=answer)
    if CLOSE in outside:
        return ParsedAction("error", error="found </tool_call> without an opening <tool_call>")
    return ParsedAction("error", error="found neither a <tool_call> nor a final answer in \\boxed{}")


def _parse_call(body: str, tools: Mapping[str, Mapping[str, Any]]) -> ParsedAction:
    known = ", ".join(sorted(tools)) or "(none)"
    body = body.strip()
    if not body:
        return ParsedAction(
            "error", error="the <tool_call> is empty: put a JSON object with 'name' and 'arguments' in it"
        )
    try:
        call = loads_json(body, strict=False)
    except json.JSONDecodeError as exc:
        return ParsedAction(
            "error",
            error=f"the JSON inside <tool_call> is invalid: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(character {exc.pos})",
        )
    except ValueError as exc:
        return ParsedAction("error", error=f"the JSON inside <tool_call> cannot be read: {exc}")
    if not isinstance(call, dict):
        return ParsedAction("error", error=f"the <tool_call> must hold a JSON object, not {_json_type(call)}")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ParsedAction("error", error=f"the tool call has no 'name' (a string); the tools are: {known}")
    if name not in tools:
        return ParsedAction("error", tool_name=name, error=f"unknown tool {name!r}; the tools are: {known}")
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = loads_json(args, strict=False) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ParsedAction(
                "error",
                tool_name=name,
                error=f"'arguments' is a string that is not valid JSON: {exc.msg} at character {exc.pos}",
            )
        except ValueError as exc:
            return ParsedAction(
                "error", tool_name=name, error=f"'arguments' is a string whose JSON cannot be read: {exc}"
            )
    if not isinstance(args, dict):
        return ParsedAction("error", tool_name=name, error=f"'arguments' must be a JSON object, not {_json_type(args)}")
    problem = check_arguments(name, args, tools[name])
    if problem:
        return ParsedAction("error", tool_name=name, arguments=args, error=problem)
    return ParsedAction("tool_call", tool_name=name, arguments=args)


def check_arguments(name: str, args: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """A message naming the first problem of `args` against the (flat) JSON schema `schema`, or None."""
    props: Mapping[str, Any] = schema.get("properties", {})
    takes = ", ".join(props) or "no arguments"
    for req in schema.get("required", []):
        if req not in args:
            return f"tool {name!r} needs the argument {req!r} (it takes: {takes})"
    for key, value in args.items():
        if key not in props:
            return f"tool {name!r} has no argument {key!r} (it takes: {takes})"
        want = props[key].get("type")
        types = _JSON_TYPES.get(want) if isinstance(want, str) else None
        if types and (not isinstance(value, types) or (want in ("integer", "number") and isinstance(value, bool))):
            return f"tool {name!r}: argument {key!r} must be {_article(want)}, not {_json_type(value)}"
        if isinstance(value, str) and unencodable(value):  # a JSON escape such as "\ud800" or "\u0000"
            return f"tool {name!r}: argument {key!r} {unencodable(value)}"
    return None


def _article(noun: str) -> str:
    return ("an " if noun[:1] in tuple("aeiou") else "a ") + noun


def _json_type(value: Any) -> str:
    """The JSON type of `value` with its article ("a string", "an array")."""
    for name, types in (
        ("string", str),
        ("boolean", bool),
        ("number", (int, float)),
        ("object", dict),
        ("array", list),
    ):
        if isinstance(value, types):
            return _article(name)
    return "null" if value is None else type(value).__name__
