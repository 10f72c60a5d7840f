"""TerminalEnv: shell tasks in a sandbox, one command per step, graded by hidden tests.

Each episode gets a fresh Runtime (local bubblewrap by default, or docker) with the task's setup already run in its
workdir. An action is one ```bash block or a `shell_exec` tool call; the observation is the command's exit code, stdout and
stderr. The episode ends when the agent runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (or at the step limit); then the
hidden tests run in the same sandbox and the outcome is the fraction passed mapped to [-1, 1] (or, with
`outcome="binary"`, +1 if all pass else -1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.base import PROGRESS, AgentEnv, Transition, class_or_instance
from envs.runtime import ExecResult
from envs.runtime.backends import make_runtime
from envs.spaces import truncate_middle
from envs.taskfile import Task
from envs.terminal.actions import (
    SUBMIT_COMMAND,
    TOOL_SCHEMA,
    command_transition,
    is_submission,
    parse_shell_action,
)
from envs.terminal.demo import play_bash_commands
from envs.terminal.tasks import bundled_tasks, validate_terminal_task

log = logging.getLogger(__name__)

OUTCOMES = ("fraction", "binary")

SYSTEM_PROMPT = """You are an expert Linux user solving a task in a sandboxed bash shell.

Reply with a short thought and then exactly one ```bash code block holding the command(s) to run; you will see their exit
code, stdout and stderr. (Instead of the block you may call the shell_exec tool with {{"command": "..."}}.)
Each command runs in a fresh bash shell that starts in {workdir}: files persist between commands, but cd, variables
and background processes do not. There is no network access and no sudo. Commands are killed after {timeout:g} seconds.
When the task is done, reply with:
```bash
{submit}
```
After that you cannot run any more commands."""


def outcome_from_tests(passed: int, total: int, mode: str = "fraction") -> float:
    """Map a test result to the outcome reward: fraction -> 2 * passed / total - 1; binary -> +1 if all pass else -1."""
    if total <= 0:
        raise ValueError("a task needs at least one test")
    if mode == "binary":
        return 1.0 if passed == total else -1.0
    if mode == "fraction":
        return 2.0 * passed / total - 1.0
    raise ValueError(f"outcome={mode!r}: use one of {', '.join(OUTCOMES)}")


class TerminalEnv(AgentEnv):
    family = "terminal"

    def __init__(
        self,
        *,
        runtime: str = "local",
        runtime_options: Mapping[str, Any] | None = None,
        outcome: str = "fraction",
        progress_from_tests: bool = True,
        command_timeout: float | None = None,
        max_steps: int = 10,
        tasks: str | Path | Sequence[Task] | None = None,
        split: str = "train",
        max_observation_chars: int = 8_000,
        max_action_chars: int = 16_000,
    ):
        super().__init__(
            max_steps=max_steps,
            tasks=tasks,
            split=split,
            max_observation_chars=max_observation_chars,
            max_action_chars=max_action_chars,
        )
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome={outcome!r}: use one of {', '.join(OUTCOMES)}")
        self.runtime_kind = runtime
        self.runtime_options = dict(runtime_options or {})
        self.outcome_mode = outcome
        self.progress_from_tests = progress_from_tests
        self.command_timeout = command_timeout
        self.runtime: Any = None
        self._best_passed = 0
        self._failed_tests: list[str] = []  # the test commands that failed in the last _run_tests

    # ----- AgentEnv -----
    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        return bundled_tasks(split)

    @classmethod
    def validate_task(cls, task: Task) -> Task:
        return validate_terminal_task(task)

    def begin(self, task: Task) -> Transition:
        self._close_runtime()
        self.runtime = make_runtime(self.runtime_kind, self.runtime_options)
        self._best_passed = 0
        for i, cmd in enumerate(task["setup"]):
            r = self.runtime.exec(cmd, timeout=max(self._timeout(task), 60.0))
            if not r.ok:
                raise RuntimeError(
                    f"setup command {i + 1} of terminal task {task['id']!r} failed (exit {r.exit_code}, "
                    f"timed out: {r.timed_out}):\n$ {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
                )
        if self.progress_from_tests:
            self._best_passed = self._run_tests(task)[0]
        return Transition(
            task["instruction"].strip(),
            role="user",
            extra_info={"system_prompt": self.system_prompt(task), "tools": [TOOL_SCHEMA]},
        )

    def act(self, action: str) -> Transition:
        task = self.task
        assert task is not None
        parsed = parse_shell_action(action)
        if parsed.command is None:
            return parsed.parse_error()
        timeout = self._timeout(task)
        result = self.runtime.exec(parsed.command, timeout=timeout)
        if is_submission(result):
            return self._finish(task, parsed.role)
        step = command_transition(parsed, result, timeout, self.max_observation_chars)
        if self.progress_from_tests and result.ok:
            passed, total = self._run_tests(task)
            if passed > self._best_passed:
                self._best_passed = passed
                step.signals[PROGRESS] = True
            step.signals["tests_passed"], step.signals["tests_total"] = passed, total
        return step

    def verify(self) -> float:
        assert self.task is not None
        passed, total = self._run_tests(self.task)
        return outcome_from_tests(passed, total, self.outcome_mode)

    def close(self) -> None:
        self._close_runtime()
        super().close()

    # ----- more -----
    def system_prompt(self, task: Task) -> str:
        workdir = getattr(self.runtime, "config", None)
        workdir = getattr(workdir, "mount_point", None) or getattr(workdir, "workdir", None) or "/workspace"
        return SYSTEM_PROMPT.format(workdir=workdir, timeout=self._timeout(task), submit=SUBMIT_COMMAND)

    @class_or_instance
    def demonstration(self, task: Task | str) -> list[dict[str, str]]:
        """A reference conversation for `task`: system, user, then the reference solution's commands as assistant turns
        with the env's real observations, ending with the submit action. Raises if the reference does not pass.
        Callable on the class too (`TerminalEnv.demonstration(task)` uses a default env)."""
        obs, info = self.reset(options={"task": task})
        assert self.task is not None
        solution = list(self.task.get("solution") or [])
        if not solution:
            raise ValueError(f"terminal task {self.task['id']!r} has no reference solution")
        messages, reward, done = play_bash_commands(self, obs, info, [*solution, SUBMIT_COMMAND])
        if not done or reward < 1.0:
            raise ValueError(
                f"the reference solution of {self.task['id']!r} does not pass its tests (outcome {reward})"
            )
        return messages

    def _finish(self, task: Task, role: str) -> Transition:
        passed, total = self._run_tests(task)
        outcome = outcome_from_tests(passed, total, self.outcome_mode)
        signals = {"submitted": True, "tests_passed": passed, "tests_total": total, "exit_code": 0}
        if passed == total:
            signals[PROGRESS] = True
        else:  # the hidden test commands that failed (a rule judge's hint names them)
            signals["failed_tests"] = [truncate_middle(c, 120)[0] for c in self._failed_tests]
        return Transition(
            f"Submitted. {passed} of {total} hidden tests passed.", role=role, signals=signals, outcome=outcome
        )

    def _run_tests(self, task: Task) -> tuple[int, int]:
        passed = 0
        self._failed_tests = []
        for cmd in task["tests"]:
            r: ExecResult = self.runtime.exec(cmd, timeout=self._timeout(task))
            passed += int(r.ok)
            if not r.ok:
                self._failed_tests.append(cmd)
        return passed, len(task["tests"])

    def _timeout(self, task: Task) -> float:
        return float(self.command_timeout or task.get("timeout") or 30.0)

    def _close_runtime(self) -> None:
        if self.runtime is not None:
            try:
                self.runtime.close()
            finally:
                self.runtime = None
