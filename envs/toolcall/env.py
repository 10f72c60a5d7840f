"""ToolCallEnv: math problems solved with tools (a sandboxed Python interpreter, a calculator), answered in \\boxed{}.

Each step the agent either calls one tool (the next state is the tool's output, role "tool") or answers with
\\boxed{...} (the episode ends; math-verify compares the answer with the task's). Malformed turns get an observation
explaining the expected format and `signals["parse_error"]`; failed tool runs get `signals["error"]` and the reason in
the observation.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from envs.base import ERROR, PARSE_ERROR, PROGRESS, WRONG, AgentEnv, Transition, class_or_instance
from envs.taskfile import Task
from envs.toolcall import chain
from envs.toolcall.datasets import LOADERS
from envs.toolcall.grading import answers_match
from envs.toolcall.interpreter import CodeResult, InterpreterLimits
from envs.toolcall.parsing import CLOSE, OPEN, ParsedAction, parse_action
from envs.toolcall.tasks import bundled_tasks, validate_task
from envs.toolcall.tools import TOOL_NAMES, PythonTool, Tool, ToolOutput, build_tool

log = logging.getLogger(__name__)

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
TASK_SETS = ("mixed", "chain")  # the bundled sets: word problems and chains (tasks.py), chained calculator (chain.py)


def step_signals(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every step carries the same signal keys (None where they do not apply), so records have one schema."""
    base: dict[str, Any] = {
        PARSE_ERROR: False,
        ERROR: False,
        PROGRESS: False,
        "tool_name": None,
        "exit_code": None,
        "timed_out": False,
        "answer": None,
        "correct": None,
        WRONG: False,
        "mistake": None,  # chain tasks: what this step was (envs.toolcall.chain.STEP_LABELS)
        "expected": None,  # chain tasks, a step that was not right: the right step (envs.toolcall.chain.expected_step)
        "shown": None,  # ... and what the agent's step did
        # chain tasks, a right call: the call as done and the right step after it (what a directive hint on a right
        # step states; envs.toolcall.chain.expected_step)
        "confirmed": None,
        "next_step": None,
    }
    base.update(values)
    return base


@dataclass(frozen=True)
class ToolCallConfig:
    """Everything that shapes a ToolCallEnv episode besides the task source (the env's constructor kwargs)."""

    tools: tuple[str, ...] = ("python",)
    correct_reward: float = 1.0
    wrong_reward: float = -1.0
    limits: InterpreterLimits = field(default_factory=InterpreterLimits)
    python: str | None = None  # interpreter for the python tool (default: this one)
    sandbox: str = "bwrap"  # where the python tool runs code: bwrap | docker | none (see envs.toolcall.interpreter)
    docker_host: str | None = None  # sandbox=docker: the engine (default: $DOCKER_HOST)
    docker_image: str | None = None  # sandbox=docker: the image (default: the locally built sandbox image)

    def __post_init__(self) -> None:
        unknown = [t for t in self.tools if t not in TOOL_NAMES]
        if unknown or not self.tools:
            raise ValueError(f"unknown tools {unknown or '(none given)'}: choose from {', '.join(TOOL_NAMES)}")
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"tools are listed twice: {list(self.tools)}")

    def build_tools(self) -> dict[str, Tool]:
        docker = {"docker_host": self.docker_host, "docker_image": self.docker_image} if self.sandbox == "docker" else {}
        return {name: build_tool(name, self.limits, self.python, self.sandbox, **docker) for name in self.tools}


def system_prompt(tools: Sequence[Tool]) -> str:
    """Short on purpose: a tiny model reads it every turn."""
    first = tools[0].spec
    arg = next(iter(first.parameters.get("properties", {})), "x")
    lines = [
        "Solve the problem. Call one tool per turn:",
        f'{OPEN}\n{{"name": "{first.name}", "arguments": {{"{arg}": "..."}}}}\n{CLOSE}',
        "Tools:",
        *(f"- {t.spec.signature()}: {t.spec.description}" for t in tools),
        "Give the final answer as \\boxed{answer}.",
    ]
    return "\n".join(lines)


class ToolCallEnv(AgentEnv):
    """Tool-calling math env. Options (constructor kwargs): see README "Tool-call env"."""

    family: ClassVar[str] = "toolcall"
    task_options: ClassVar[tuple[str, ...]] = ("task_set",)  # picks the bundled set: tasks(split, task_set=...)

    def __init__(
        self,
        *,
        tools: Sequence[str] = ("python",),
        max_steps: int = 6,
        correct_reward: float = 1.0,
        wrong_reward: float = -1.0,
        timeout_s: float = 8.0,
        cpu_s: int = 5,
        memory_mb: int = 1024,
        file_size_mb: int = 16,
        open_files: int = 64,
        max_output_bytes: int = 4000,
        processes: int = 64,
        python: str | None = None,
        sandbox: str = "bwrap",
        docker_host: str | None = None,
        docker_image: str | None = None,
        tasks: str | Path | Sequence[Task] | None = None,
        split: str = "train",
        task_set: str = "mixed",
        max_observation_chars: int = 16_000,
        max_action_chars: int = 16_000,
    ):
        if task_set not in TASK_SETS:
            raise ValueError(f"task_set={task_set!r}: use one of {', '.join(TASK_SETS)}")
        super().__init__(
            max_steps=max_steps,
            tasks=tasks,
            split=split,
            max_observation_chars=max_observation_chars,
            max_action_chars=max_action_chars,
        )
        if isinstance(tools, str):
            tools = [t.strip() for t in tools.split(",") if t.strip()]
        limits = InterpreterLimits(
            timeout_s=timeout_s,
            cpu_s=cpu_s,
            memory_mb=memory_mb,
            file_size_mb=file_size_mb,
            open_files=open_files,
            max_output_bytes=max_output_bytes,
            processes=processes,
        )
        self.config = ToolCallConfig(
            tuple(tools), float(correct_reward), float(wrong_reward), limits, python, sandbox, docker_host, docker_image
        )
        if task_set == "chain" and "calculator" not in self.config.tools:
            raise ValueError(f"task_set=chain needs the calculator tool (tools: {list(self.config.tools)})")
        self.task_set = task_set
        self.tools = self.config.build_tools()
        self._schemas = {name: tool.spec.parameters for name, tool in self.tools.items()}
        self.system_prompt = chain.SYSTEM_PROMPT if task_set == "chain" else system_prompt(list(self.tools.values()))
        self.format_hint = (
            f'Expected format: {OPEN}{{"name": "<tool>", "arguments": {{...}}}}{CLOSE} with one of the tools '
            f"({', '.join(self.tools)}), or the final answer as \\boxed{{answer}}."
        )
        self._reached = 0  # how many of the task's intermediates the tool outputs have shown so far
        self._chain = chain.ChainState()

    # ----- task sources -----
    @classmethod
    def tasks(cls, split: str = "train", task_set: str = "mixed") -> Sequence[Task]:
        """The bundled `task_set` for `split`: "mixed" (word problems and chains), "chain" (chained calculator)."""
        if task_set == "chain":
            return chain.chain_tasks(split)
        if task_set != "mixed":
            raise ValueError(f"task_set={task_set!r}: use one of {', '.join(TASK_SETS)}")
        return bundled_tasks(split)

    @classmethod
    def validate_task(cls, task: Task) -> Task:
        return validate_task(task)

    @classmethod
    def load_task_file(cls, path: str | Path, fmt: str) -> list[Task]:
        """Tasks from a file in a named format: `dapo_math` (DAPO-Math-17k parquet / JSONL), `aime` (AIME JSONL)."""
        if fmt not in LOADERS:
            raise ValueError(f"unknown toolcall task format {fmt!r}; known: {', '.join(LOADERS)}")
        return LOADERS[fmt](path)

    def task_pool(self) -> list[Task]:
        if self._task_pool is None and self._task_source is None and self.task_set != "mixed":
            self._task_source = list(self.tasks(self.split, task_set=self.task_set))  # on first use: envs are cheap
        return super().task_pool()

    # ----- the episode -----
    def begin(self, task: Task) -> Transition:
        self._reached = 0
        self._chain = chain.ChainState()
        return Transition(
            task["prompt"],
            role="user",
            extra_info={
                "system_prompt": chain.SYSTEM_PROMPT if chain.is_chain_task(task) else self.system_prompt,
                "tools": [t.spec.openai_schema() for t in self.tools.values()],
            },
        )

    def act(self, action: str) -> Transition:
        parsed = parse_action(action, self._schemas)
        if parsed.kind == "error":
            assert parsed.error is not None
            return self.parse_error(parsed.error, tool_name=parsed.tool_name)
        if parsed.kind == "answer":
            return self._answer(parsed)
        return self._call(parsed)

    def parse_error(self, reason: str, tool_name: str | None = None) -> Transition:
        """A turn that is neither one valid tool call nor an answer (also what the base class rejects: same signals)."""
        signals = {PARSE_ERROR: True, "tool_name": tool_name, "parse_message": reason}
        if self.task is not None and chain.is_chain_task(self.task):
            signals["mistake"] = "malformed"
            signals["expected"] = chain.expected_step(self.task, self._chain.calls)
        return Transition(
            f"Could not parse your turn: {reason}.\n{self.format_hint}", role="user", signals=step_signals(signals)
        )

    def verify(self) -> float:
        # Truncated by the step limit: no answer was given.
        return self.config.wrong_reward

    def close(self) -> None:
        for tool in self.tools.values():
            tool.close()
        self.tools = {}
        super().close()

    # ----- steps -----
    def _call(self, parsed: ParsedAction) -> Transition:
        assert parsed.tool_name is not None
        try:
            out = self.tools[parsed.tool_name].run(parsed.arguments)
        except Exception as exc:  # a tool bug must not end the episode; the agent and the judge see it
            log.exception("tool %s raised", parsed.tool_name)
            out = ToolOutput(content=f"[tool error: {type(exc).__name__}: {exc}]", exit_code=1, error=str(exc))
        signals = step_signals(
            {
                ERROR: out.error is not None,
                PROGRESS: self._progress(out),
                "tool_name": parsed.tool_name,
                "exit_code": out.exit_code,
                "timed_out": out.timed_out,
            }
        )
        if out.error:
            signals["error_reason"] = out.error
        if self.task is not None and chain.is_chain_task(self.task):
            self._chain_signals(signals, parsed, out)
        return Transition(out.content, role="tool", signals=signals, extra_info={"tool": out.details})

    def _chain_signals(self, signals: dict[str, Any], parsed: ParsedAction, out: ToolOutput) -> None:
        """The chain verdict replaces the generic progress reading: +1 right value, 0 consistent, -1 wrong."""
        assert self.task is not None
        expression = str(parsed.arguments.get("expression", "")) if parsed.tool_name == "calculator" else ""
        shown = _NUMBER.findall(out.stdout)
        value = None if out.error or not shown else float(shown[-1])
        calls = self._chain.calls
        label = chain.call_verdict(self.task, self._chain, expression, value)
        signals["mistake"] = label
        if label != "ok":
            signals["expected"] = chain.expected_step(self.task, calls)
            signals["shown"] = chain.shown_call(expression, value) if expression else f"a {parsed.tool_name} call"
        else:
            signals["confirmed"] = chain.shown_call(expression, value)
            signals["next_step"] = chain.expected_step(self.task, calls + 1)
        signals[PROGRESS] = label == "ok"
        signals[WRONG] = chain.VOTE.get(label, -1) < 0 and not signals[ERROR]

    def _progress(self, out: ToolOutput) -> bool:
        """Progress = the output shows the next intermediate value not yet seen (or the answer); without intermediates,
        a call that ran without error and printed something."""
        assert self.task is not None
        inter = self.task.get("intermediates")
        if not inter:
            return out.error is None and bool(out.stdout.strip())
        shown = [float(m) for m in _NUMBER.findall(out.stdout)]

        def seen(v: float) -> bool:
            return any(abs(s - v) <= 1e-9 * max(1.0, abs(v)) for s in shown)

        before = self._reached
        try:
            final = float(self.task["answer"])
        except ValueError:
            final = None
        if final is not None and seen(final):
            self._reached = len(inter)
        while self._reached < len(inter) and seen(float(inter[self._reached])):
            self._reached += 1
        return self._reached > before

    def _answer(self, parsed: ParsedAction) -> Transition:
        assert self.task is not None and parsed.answer is not None
        correct = answers_match(parsed.answer, str(self.task["answer"]))
        cfg = self.config
        signals = step_signals({PROGRESS: correct, "answer": parsed.answer, "correct": correct})
        if chain.is_chain_task(self.task):
            label = chain.answer_verdict(self.task, self._chain, parsed.answer, correct)
            signals["mistake"] = label
            signals[WRONG] = chain.VOTE.get(label, -1) < 0
            if label != "ok":
                signals["expected"] = chain.expected_step(self.task, self._chain.calls)
                signals["shown"] = f"\\boxed{{{parsed.answer}}}"
        return Transition(
            f"Final answer {parsed.answer} received: {'correct' if correct else 'incorrect'}.",
            role="user",
            signals=signals,
            outcome=cfg.correct_reward if correct else cfg.wrong_reward,
        )

    # ----- supervised warm start -----
    @class_or_instance
    def demonstration(self, task: Task, noise: Mapping[str, Any] | chain.ChainNoise | None = None,
                      hints: Mapping[str, Any] | chain.ChainHints | None = None) -> list[dict[str, Any]]:
        """The reference conversation for `task`: system, user, assistant tool call running the solution code, the
        tool's observation (byte-identical to the env's for that call), assistant `\\boxed{answer}`.

        Needs the task's `solution_code`; its `solution_output` (bundled tasks carry it) saves running the code,
        otherwise the code runs in the sandboxed interpreter, exactly as the env would run it.

        Chain tasks (`task_set=chain`) are demonstrated with calculator calls; `noise` ({rates, mistakes, seed}, see
        `chain.ChainNoise`) injects one dominant mistake per step for a deliberately weak warm start; `hints` ({rate,
        seed}, see `chain.ChainHints`) cuts some conversations at a step whose context carries a hint's signals
        (`envs.base.HINT_SIGNALS`), followed by the right step.
        """
        config = self.config
        task = validate_task(task)
        if chain.is_chain_task(task):
            if "calculator" not in config.tools:
                raise ValueError(f"chain demonstrations use the calculator, which this config lacks ({config.tools})")
            if noise is not None and not isinstance(noise, chain.ChainNoise):
                noise = chain.ChainNoise(**noise)
            if hints is not None and not isinstance(hints, chain.ChainHints):
                hints = chain.ChainHints(**hints)
            return chain.demonstration(task, chain.SYSTEM_PROMPT, noise, hints)
        if noise:
            raise ValueError(f"task {task['id']!r}: noisy demonstrations exist for chain tasks only")
        if hints:
            raise ValueError(f"task {task['id']!r}: hint-following demonstrations exist for chain tasks only")
        code = task.get("solution_code")
        if not code:
            raise ValueError(f"task {task['id']!r} has no 'solution_code': it has no demonstration")
        if "python" not in config.tools:
            raise ValueError(f"demonstrations use the python tool, which this config lacks (tools: {config.tools})")
        tools = config.build_tools()
        try:
            if "solution_output" in task:
                observed = PythonTool.render(
                    CodeResult(stdout=task["solution_output"], stderr="", exit_code=0), config.limits
                )
            else:
                observed = tools["python"].run({"code": code})
        finally:
            for tool in tools.values():
                tool.close()
        if observed.error:
            raise ValueError(f"task {task['id']!r}: the solution code fails: {observed.content}")
        call = json.dumps({"name": "python", "arguments": {"code": code}}, ensure_ascii=False)
        return [
            {"role": "system", "content": system_prompt(list(tools.values()))},
            {"role": "user", "content": task["prompt"]},
            {"role": "assistant", "content": f"{OPEN}\n{call}\n{CLOSE}"},
            {"role": "tool", "content": observed.content},
            {"role": "assistant", "content": f"\\boxed{{{task['answer']}}}"},
        ]

    @classmethod
    def demonstration_labels(cls, task: Task, messages: Sequence[Mapping[str, Any]]) -> list[str] | None:
        """What each assistant turn of a conversation was (chain tasks: `chain.STEP_LABELS`); None for other tasks."""
        return chain.label_conversation(task, messages) if chain.is_chain_task(task) else None
