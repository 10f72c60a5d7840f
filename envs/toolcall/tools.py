"""Tools a tool-call env can offer: their schemas (OpenAI style) and how a call runs and is rendered for the agent.

`python` runs code in the sandboxed interpreter (a fresh process per call: no state carries over between calls; see
envs.toolcall.interpreter for the sandboxes).
`calculator` evaluates one arithmetic expression in process (no code execution: a small AST walk).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from envs.toolcall.interpreter import CodeResult, InterpreterLimits, PythonInterpreter, limit_hit


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str  # one short line: it goes into the system prompt every turn
    parameters: dict[str, Any]  # JSON schema of the arguments (an object)

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def signature(self) -> str:
        return f"{self.name}({', '.join(self.parameters.get('properties', {}))})"


@dataclass
class ToolOutput:
    """A tool call's result: `content` is what the agent sees; the rest become step signals."""

    content: str
    stdout: str = ""  # the part of the output that carries values (progress is read from it, never from tracebacks)
    exit_code: int = 0
    timed_out: bool = False
    error: str | None = None  # why the call failed (exception, non-zero exit, timeout, kill), None when it succeeded
    details: dict[str, Any] = field(default_factory=dict)


class Tool(Protocol):
    spec: ToolSpec

    def run(self, arguments: Mapping[str, Any]) -> ToolOutput: ...

    def close(self) -> None: ...


NO_OUTPUT = "[no output: print() the values you want to see]"


class PythonTool:
    spec = ToolSpec(
        "python",
        "run Python 3 code in a fresh process and return what it prints",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source; print() the results"}},
            "required": ["code"],
        },
    )

    def __init__(self, limits: InterpreterLimits | None = None, python: str | None = None, sandbox: str = "bwrap",
                 **sandbox_options: Any):
        self.interpreter = PythonInterpreter(limits, python=python, sandbox=sandbox, **sandbox_options)

    def run(self, arguments: Mapping[str, Any]) -> ToolOutput:
        return self.render(self.interpreter.run(arguments["code"]), self.interpreter.limits)

    def close(self) -> None:
        self.interpreter.close()

    @staticmethod
    def render(r: CodeResult, limits: InterpreterLimits) -> ToolOutput:
        """The observation for one interpreter run (used by the env and by demonstrations, so both are identical)."""
        parts: list[str] = []
        if r.stdout:
            parts.append(r.stdout.rstrip("\n"))
        if r.stderr:
            parts.append("[stderr]\n" + r.stderr.rstrip("\n"))
        error: str | None = None
        if r.killed_reason:
            error = r.killed_reason
            parts.append(f"[killed: {r.killed_reason}]")
        elif r.exit_code != 0:
            error = f"exit code {r.exit_code}"
            limit = limit_hit(r, limits)
            if limit:
                error = f"{error}: {limit}"
                parts.append(f"[{limit}]")
            parts.append(f"[exit code {r.exit_code}]")
        if r.truncated:
            parts.append(f"[output truncated to {limits.max_output_bytes} bytes per stream]")
        return ToolOutput(
            content="\n".join(parts) if parts else NO_OUTPUT,
            stdout=r.stdout,
            exit_code=r.exit_code,
            timed_out=r.timed_out,
            error=error,
            details={"wall_s": round(r.wall_s, 4), "truncated": r.truncated},
        )


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_DIGITS = 4000  # of a calculator result (Python's str() of an int stops at 4300)
_FUNCS = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max}


class CalculatorTool:
    spec = ToolSpec(
        "calculator",
        "evaluate one arithmetic expression, e.g. (12 + 7) * 3",
        {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "+ - * / // % ** ( ) sqrt abs round min max"}
            },
            "required": ["expression"],
        },
    )

    def __init__(self, max_exponent: int = 1000, max_chars: int = 500):
        self.max_exponent = max_exponent
        self.max_chars = max_chars

    def close(self) -> None:
        pass

    def run(self, arguments: Mapping[str, Any]) -> ToolOutput:
        expr = arguments["expression"]
        if len(expr) > self.max_chars:
            return self._fail(f"the expression is longer than {self.max_chars} characters")
        try:
            value = self._eval(ast.parse(expr.strip(), mode="eval").body)
            if isinstance(value, int) and value.bit_length() > MAX_DIGITS * 3.33:
                raise ValueError(f"the result has more than {MAX_DIGITS} digits")  # a product of big powers
            text = str(value)
        except SyntaxError as exc:
            where = f" at character {exc.offset}" if exc.offset else ""
            return self._fail(f"invalid expression: {exc.msg}{where}")
        except RecursionError:
            return self._fail("the expression nests too deeply")
        except (ArithmeticError, ValueError, TypeError) as exc:
            return self._fail(f"{type(exc).__name__}: {exc}")
        return ToolOutput(content=text, stdout=text)

    @staticmethod
    def _fail(message: str) -> ToolOutput:
        return ToolOutput(content=f"error: {message}", exit_code=1, error=message)

    def _check_power(self, base: Any, exponent: Any) -> None:
        """Refuse powers whose result is too big to show: ((9**999)**999)**999 would run for minutes in the env."""
        if abs(exponent) > self.max_exponent:
            raise ValueError(f"exponent {exponent} is larger than {self.max_exponent}")
        if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
            digits = exponent * (base.bit_length() - 1) * math.log10(2)
            if digits > MAX_DIGITS:
                raise ValueError(f"the result would have about {digits:.3g} digits; the calculator shows {MAX_DIGITS}")

    def _eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self._eval(node.operand))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
        ):
            return _FUNCS[node.func.id](*(self._eval(a) for a in node.args))
        raise ValueError(f"unsupported syntax: {ast.unparse(node)!r}")


#: Tools that `tools=[...]` in the env config can name.
TOOL_NAMES = ("python", "calculator")


def build_tool(name: str, limits: InterpreterLimits, python: str | None = None, sandbox: str = "bwrap",
               **sandbox_options: Any) -> Tool:
    """`sandbox` and `sandbox_options` (docker_host, docker_image) configure the python tool's interpreter."""
    if name == "python":
        return PythonTool(limits, python, sandbox, **sandbox_options)
    if name == "calculator":
        return CalculatorTool()
    raise ValueError(f"unknown tool {name!r}: choose from {', '.join(TOOL_NAMES)}")
