"""Shell actions shared by the terminal and swe families: parse one command out of a model's reply, and render what the
command did as the next observation.

An action is one fenced ```bash block (```sh and ```shell are accepted too) or one `shell_exec` tool call in the
`<tool_call>{"name": "shell_exec", "arguments": {"command": "..."}}</tool_call>` form. Anything else is a parse error
with a message that says what to do instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from envs.action_text import loads_json, unencodable
from envs.base import ERROR, PARSE_ERROR, TRUNCATED_OUTPUT, Transition
from envs.runtime import ExecResult
from envs.spaces import truncate_middle

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUBMIT_COMMAND = f"echo {SUBMIT_MARKER}"
TOOL_NAME = "shell_exec"

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_BLOCK = re.compile(r"```(?:bash|sh|shell)[ \t]*\r?\n(.*?)```", re.DOTALL)
_ANY_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Run a bash command in the sandbox and return its exit code, stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the bash command to run"}},
            "required": ["command"],
        },
    },
}


@dataclass
class ShellAction:
    command: str | None  # None when the reply could not be parsed
    via: str = "bash_block"  # "bash_block" | "tool_call"
    error: str = ""  # why it could not be parsed (shown to the agent)

    @property
    def role(self) -> str:
        """The role of the observation that answers it: a tool call gets a "tool" message, a bash block a "user" one."""
        return "tool" if self.via == "tool_call" else "user"

    def parse_error(self) -> Transition:
        """The step of a reply that could not be parsed: says why, signals parse_error."""
        return Transition(f"could not parse the action: {self.error}", role=self.role,
                          signals={PARSE_ERROR: True, "parse_message": self.error})


def parse_shell_action(text: str) -> ShellAction:
    """Extract the one command of a reply; reasoning inside <think>...</think> is ignored."""
    visible = _THINK.sub("", text)
    calls = _TOOL_CALL.findall(visible)
    if calls:
        return _parse_tool_calls(calls)
    blocks = _BLOCK.findall(visible)
    if len(blocks) == 1:
        cmd = blocks[0].strip()
        if not cmd:
            return ShellAction(None, error="the ```bash block is empty: put the command to run inside it")
        return _checked(ShellAction(cmd))
    if len(blocks) > 1:
        return ShellAction(
            None, error=f"found {len(blocks)} ```bash blocks; put exactly one command block in each reply"
        )
    fences = _ANY_FENCE.findall(visible)[::2]  # opening fences only (they alternate with closing ones)
    if fences:
        langs = sorted({f or "(no language)" for f in fences})
        return ShellAction(
            None,
            error=f"found a code block marked {', '.join(langs)}, but no ```bash block; put the "
            "command in a block that starts with ```bash and ends with ```",
        )
    return ShellAction(
        None,
        error="found no command: reply with exactly one ```bash block holding the command to run "
        f"(or a {TOOL_NAME} tool call)",
    )


def _parse_tool_calls(calls: list[str]) -> ShellAction:
    if len(calls) > 1:
        return ShellAction(
            None, "tool_call", f"found {len(calls)} tool calls; make exactly one {TOOL_NAME} call per reply"
        )
    try:
        call = loads_json(calls[0])
    except json.JSONDecodeError as exc:
        return ShellAction(None, "tool_call", f"the tool call is not valid JSON ({exc.msg} at column {exc.colno})")
    except ValueError as exc:
        return ShellAction(None, "tool_call", f"the tool call's JSON cannot be read: {exc}")
    if not isinstance(call, dict) or call.get("name") != TOOL_NAME:
        name = call.get("name") if isinstance(call, dict) else None
        return ShellAction(None, "tool_call", f"unknown tool {name!r}; the only tool is {TOOL_NAME}")
    args = call.get("arguments", {})
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = loads_json(args)
        except ValueError:
            return ShellAction(None, "tool_call", f"the arguments of {TOOL_NAME} are not valid JSON")
    cmd = args.get("command") if isinstance(args, dict) else None
    if not isinstance(cmd, str) or not cmd.strip():
        return ShellAction(None, "tool_call", f'{TOOL_NAME} needs a non-empty string argument "command"')
    return _checked(ShellAction(cmd.strip(), "tool_call"))


def _checked(action: ShellAction) -> ShellAction:
    """A command bash cannot receive is a parse error: a NUL byte (it ends a C string: bash would never see the rest)
    or a lone surrogate (from a JSON escape such as "\\ud800": no UTF-8 text holds one)."""
    assert action.command is not None
    problem = unencodable(action.command)
    if problem:
        return ShellAction(None, action.via, f"the command {problem}; bash cannot run it: remove it")
    return action


def is_submission(result: ExecResult) -> bool:
    """The agent submits by running `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (its output's first line is the marker)."""
    first = result.stdout.lstrip().split("\n", 1)[0].strip()
    return first == SUBMIT_MARKER and result.exit_code == 0


def render_result(result: ExecResult, timeout: float, max_chars: int) -> tuple[str, bool]:
    """The observation text for one command: exit code, stdout, stderr (each cut in the middle if long), and notes on
    timeouts and the output cap. Returns (text, whether anything was cut)."""
    budget = max(max_chars - 300, 200)
    out, cut_out = truncate_middle(result.stdout, budget if not result.stderr else budget * 2 // 3)
    err, cut_err = truncate_middle(result.stderr, budget - len(out))
    parts = [f"exit code: {result.exit_code}"]
    if result.timed_out:
        parts.append(f"[the command timed out after {timeout:g} s and was killed]")
    if result.truncated:
        parts.append("[the command printed more than the output cap allows and was stopped]")
    if out:
        parts.append("stdout:\n" + out.rstrip("\n"))
    if err:
        parts.append("stderr:\n" + err.rstrip("\n"))
    if not out and not err:
        parts.append("(no output)")
    return "\n".join(parts), cut_out or cut_err or result.truncated


_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?)$", re.MULTILINE)
_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$", re.MULTILINE)
_PYTEST_E_LINE = re.compile(r"^E\s+(\S.*)$", re.MULTILINE)
TAIL_LINES, TAIL_CHARS, FACT_CHARS = 3, 300, 200


def exception_line(text: str) -> str | None:
    """The last Python exception line (`ValueError: ...`) in `text`, if any."""
    found = _EXCEPTION.findall(text)
    return found[-1].strip()[:FACT_CHARS] if found else None


def test_failures(text: str) -> tuple[list[str], str | None]:
    """(failing test ids, the first assertion message) from pytest output: its `FAILED <id> - <message>` summary lines
    and `E   ...` lines."""
    failed = _PYTEST_FAILED.findall(text)
    names = list(dict.fromkeys(name for name, _ in failed))
    e_line = _PYTEST_E_LINE.search(text)
    message = e_line.group(1) if e_line else next((m for _, m in failed if m), None)
    return names, message.strip()[:FACT_CHARS] if message else None


def tail(text: str, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str | None:
    """The last non-empty lines of `text`, joined by " / " and cut to `chars` from the end."""
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()][-lines:]
    joined = " / ".join(kept)
    return (joined if len(joined) <= chars else "..." + joined[-chars:]) or None


def output_facts(stdout: str, stderr: str, failed: bool) -> dict[str, object]:
    """What a command's output says for sure, for signals (keys only where found): the stderr tail of a failed command,
    the last exception line, the failing tests and their assertion."""
    facts: dict[str, object] = {}
    if failed and stderr.strip():
        facts["stderr_tail"] = tail(stderr)
    exception = exception_line(stderr) or exception_line(stdout)
    if exception:
        facts["exception"] = exception
    names, assertion = test_failures(stdout + "\n" + stderr)
    if names:
        facts["failed_tests"] = names[:10]
    if assertion:
        facts["assertion"] = assertion
    return facts


def command_transition(action: ShellAction, result: ExecResult, timeout: float, max_chars: int) -> Transition:
    """The step of a command that ran (and did not submit): its rendered output and the facts about it."""
    text, cut = render_result(result, timeout, max_chars)
    signals: dict[str, object] = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        TRUNCATED_OUTPUT: cut,
        ERROR: not result.ok,
        **output_facts(result.stdout, result.stderr, not result.ok),
    }
    return Transition(text, role=action.role, signals=signals)
