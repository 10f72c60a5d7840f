"""TerminalEnv: shell tasks in a sandbox, one command per step, graded by hidden tests.

Each episode gets a fresh Runtime (local bubblewrap by default, or docker) with the task's setup already run in its
workdir. An action is one ```bash block or a `shell_exec` tool call; the observation is the command's exit code, stdout and
stderr. The episode ends when the agent runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (or at the step limit); then the
hidden tests run in the same sandbox and the outcome is the fraction passed mapped to [-1, 1] (or, with
`outcome="binary"`, +1 if all pass else -1).

Terminal-Bench and Harbor task directories (`load_task_file(path, "terminal_bench" | "harbor")`, see
`envs.terminal.task_dirs`) run in their own environment instead: built from the task's Dockerfile
(`envs.terminal.task_image`, cached), over the namespace sandbox (local) or as an image (docker), with the task's
timeouts and resources; their tests run at the end from `/tests` (`envs.terminal.verifier`) in a sandbox of their own
over a snapshot of the agent's files, after every process of the agent's has ended, and the reward their format gives
(Harbor's reward file, Terminal-Bench's pytest summary) becomes the outcome the same way. Their oracle's files exist
only in a replay of the oracle that the env plays itself (`demonstration`, `replaying_demonstration`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from envs.base import PROGRESS, AgentEnv, Transition, class_or_instance
from envs.runtime import ExecResult
from envs.runtime.backends import make_runtime
from envs.taskfile import Task
from envs.terminal.actions import (
    SUBMIT_COMMAND,
    TOOL_SCHEMA,
    command_transition,
    is_submission,
    parse_shell_action,
)
from envs.terminal.demo import play_bash_commands
from envs.terminal.python_bases import PYTHON_FALLBACKS
from envs.terminal.task_dirs import FORMATS as TASK_DIR_FORMATS
from envs.terminal.task_dirs import load_task_dirs
from envs.terminal.tasks import bundled_tasks, validate_terminal_task

log = logging.getLogger(__name__)

OUTCOMES = ("fraction", "binary")
SELF_LOCATING = re.compile(r"BASH_SOURCE|\$0\b|\$\{0\}")  # an oracle that finds its files relative to itself

SYSTEM_PROMPT = """You are an expert Linux user solving a task in a sandboxed bash shell.

Reply with a short thought and then exactly one ```bash code block holding the command(s) to run; you will see their exit
code, stdout and stderr. (Instead of the block you may call the shell_exec tool with {{"command": "..."}}.)
Each command runs in a fresh bash shell that starts in {workdir}: files persist between commands, {kept}
Commands are killed after {timeout:g} seconds.
When the task is done, reply with:
```bash
{submit}
```
After that you cannot run any more commands."""


def outcome_from_reward(reward: float, mode: str = "fraction") -> float:
    """Map a reward in [0, 1] (a task directory's) to the outcome: fraction -> 2 * reward - 1; binary -> +1 iff 1."""
    if mode == "binary":
        return 1.0 if reward >= 1.0 else -1.0
    if mode == "fraction":
        return 2.0 * reward - 1.0
    raise ValueError(f"outcome={mode!r}: use one of {', '.join(OUTCOMES)}")


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
        progress_timeout: float = 10.0,
        command_timeout: float | None = None,
        max_steps: int = 10,
        tasks: str | Path | Sequence[Task] | None = None,
        split: str = "train",
        max_observation_chars: int = 8_000,
        max_action_chars: int = 16_000,
        test_runner: str = "auto",
        base_images: Mapping[str, str] | None = None,
        python_fallback: str = "exact",
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
        if progress_timeout <= 0:
            raise ValueError(f"progress_timeout={progress_timeout}: seconds, > 0")
        self.progress_timeout = float(progress_timeout)  # a task directory's per-step test run, at most
        self.command_timeout = command_timeout
        from envs.terminal.verifier import TEST_RUNNERS

        if test_runner not in TEST_RUNNERS:
            raise ValueError(f"test_runner={test_runner!r}: use one of {', '.join(TEST_RUNNERS)}")
        self.test_runner = test_runner  # how a task directory's tests run (envs.terminal.verifier)
        self.base_images = dict(base_images or {})  # FROM pattern -> local base (envs.terminal.task_image)
        if python_fallback not in PYTHON_FALLBACKS:
            raise ValueError(f"python_fallback={python_fallback!r}: use one of {', '.join(PYTHON_FALLBACKS)}")
        self.python_fallback = python_fallback  # read when task directories load (envs.terminal.python_bases)
        self.runtime: Any = None
        self._image: Any = None  # a task directory's TaskImage (what its verifier runs with)
        self._oracle_replay = False  # set only while the env replays a task directory's oracle itself
        self._agent_s = 0.0  # the episode's time so far (a task directory's agent timeout bounds it)
        self._reward = 0.0  # a task directory's last test reward, in [0, 1]
        self._best_reward = 0.0
        self._best_passed = 0
        self._failed_tests: list[str] = []  # what failed in the last _run_tests: test names, or "hidden test i of n"

    # ----- AgentEnv -----
    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        return bundled_tasks(split)

    @classmethod
    def validate_task(cls, task: Task) -> Task:
        if "task_dir" in task:
            from envs.terminal.task_dirs import validate_task_dir_task

            return validate_task_dir_task(task)
        return validate_terminal_task(task)

    @classmethod
    def load_task_file(cls, path: str | Path, fmt: str, options: Mapping[str, Any] | None = None) -> list[Task]:
        """`terminal_bench` / `harbor`: a task directory, or a directory of them. Tasks that cannot run here are
        skipped, each with a one-line reason (logged); `options` (the env's) give `python_fallback`."""
        if fmt not in TASK_DIR_FORMATS:
            raise ValueError(f"unknown terminal task format {fmt!r}; known: {', '.join(TASK_DIR_FORMATS)}")
        got = load_task_dirs(path, fmt, python_fallback=(options or {}).get("python_fallback", "exact"))
        for reason in got.refused.values():
            log.warning("skipped %s", reason)
        if not got.tasks:
            raise ValueError(f"none of the {len(got.refused)} {fmt} tasks at {path} can run here (reasons above)")
        log.info("%d %s tasks loaded from %s (%d skipped)", len(got.tasks), fmt, path, len(got.refused))
        return got.tasks

    def begin(self, task: Task) -> Transition:
        self._close_runtime()
        self._best_passed = 0
        self._agent_s = 0.0
        self._reward = self._best_reward = 0.0
        if "task_dir" in task:
            return self._begin_task_dir(task)
        self.runtime = make_runtime(self.runtime_kind, self.runtime_options)
        for i, cmd in enumerate(task["setup"]):
            r = self.runtime.exec(cmd, timeout=max(self._timeout(task), 60.0))
            if not r.ok:
                raise RuntimeError(
                    f"setup command {i + 1} of terminal task {task['id']!r} failed (exit {r.exit_code}, "
                    f"timed out: {r.timed_out}):\n$ {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
                )
        if self.progress_from_tests:
            self._best_passed = self._run_tests(task, final=False)[0]
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
        if "task_dir" in task:  # the task's agent timeout bounds all of the agent's commands together
            left = float(task["agent_timeout_s"]) - self._agent_s
            if left <= 0:
                return self._finish(task, parsed.role, note=f"The agent timeout of {task['agent_timeout_s']:g} s "
                                                               "is used up. ")
            timeout = min(timeout, left)
        t0 = time.monotonic()
        result = self._exec_agent_command(task, parsed.command, timeout)
        self._agent_s += time.monotonic() - t0
        if is_submission(result):
            return self._finish(task, parsed.role)
        step = command_transition(parsed, result, timeout, self.max_observation_chars)
        if self.progress_from_tests and result.ok:
            t0 = time.monotonic()  # per-step tests run on the episode's clock: it stays within the agent timeout
            passed, total = self._run_tests(task, final=False)
            self._agent_s += time.monotonic() - t0
            if passed > self._best_passed or ("task_dir" in task and self._reward > self._best_reward):
                self._best_passed = max(passed, self._best_passed)
                self._best_reward = max(self._reward, self._best_reward)
                step.signals[PROGRESS] = True
            step.signals["tests_passed"], step.signals["tests_total"] = passed, total
        return step

    def verify(self) -> float:
        """The outcome of the episode's state. For a task directory this ends the episode's sandbox (its processes
        first): its tests run on a snapshot, after every process of the agent's is gone."""
        assert self.task is not None
        passed, total = self._run_tests(self.task)
        return self._outcome(self.task, passed, total)

    def close(self) -> None:
        self._close_runtime()
        super().close()

    # ----- more -----
    def system_prompt(self, task: Task) -> str:
        workdir = getattr(self.runtime, "config", None)
        workdir = getattr(workdir, "mount_point", None) or getattr(workdir, "workdir", None) or "/workspace"
        if "task_dir" in task:  # a task directory's sandbox is a whole machine, as its container would be
            kept = "but cd and variables do not;\nbackground processes keep running. There is no network access."
        else:
            kept = "but cd, variables and\nbackground processes do not. There is no network access and no sudo."
        return SYSTEM_PROMPT.format(workdir=workdir, timeout=self._timeout(task), submit=SUBMIT_COMMAND, kept=kept)

    @class_or_instance
    def demonstration(self, task: Task | str) -> list[dict[str, str]]:
        """A reference conversation for `task`: system, user, then the reference solution's commands as assistant turns
        with the env's real observations, ending with the submit action. Raises if the reference does not pass.
        Callable on the class too (`TerminalEnv.demonstration(task)` uses a default env)."""
        with self.replaying_demonstration():
            obs, info = self.reset(options={"task": task})
            assert self.task is not None
            if "task_dir" in self.task:
                messages, reward, done = self._play_oracle(self.task, obs, info)
            else:
                solution = list(self.task.get("solution") or [])
                if not solution:
                    raise ValueError(f"terminal task {self.task['id']!r} has no reference solution")
                messages, reward, done = play_bash_commands(self, obs, info, [*solution, SUBMIT_COMMAND])
        if not done or reward < 1.0:
            raise ValueError(
                f"the reference solution of {self.task['id']!r} does not pass its tests (outcome {reward})"
            )
        return messages

    def _finish(self, task: Task, role: str, note: str = "") -> Transition:
        passed, total = self._run_tests(task)
        outcome = self._outcome(task, passed, total)
        signals = {"submitted": True, "tests_passed": passed, "tests_total": total, "exit_code": 0}
        if passed == total:
            signals[PROGRESS] = True
        else:  # which hidden tests failed (a rule judge's hint names them): never their code
            signals["failed_tests"] = list(self._failed_tests)
        text = f"{note}Submitted. {passed} of {total} hidden tests passed."
        if "task_dir" in task and task["format"] == "harbor":
            text = f"{note}Submitted. The verifier's reward is {self._reward:g}."
        return Transition(text, role=role, signals=signals, outcome=outcome)

    def _outcome(self, task: Task, passed: int, total: int) -> float:
        if "task_dir" in task:
            return outcome_from_reward(self._reward, self.outcome_mode)
        return outcome_from_tests(passed, total, self.outcome_mode)

    def _run_tests(self, task: Task, final: bool = True) -> tuple[int, int]:
        """Run the hidden tests. `final`: the episode's verification; else a per-step check, which changes nothing the
        agent continues from (a task directory's runs on a snapshot, in its own sandbox, within `progress_timeout`
        and the time the episode has left; a JSON task's on a throwaway copy of the workdir)."""
        if "task_dir" in task:
            from envs.terminal.verifier import run_tests

            timeout = None
            if not final:
                timeout = max(min(self.progress_timeout, float(task["agent_timeout_s"]) - self._agent_s), 0.1)
            run = run_tests(self.runtime, task, self._image, self.test_runner, final=final, timeout=timeout)
            self._reward = run.reward
            self._failed_tests = run.failed
            return run.passed, run.total
        passed = 0
        self._failed_tests = []
        with nullcontext() if final else self.runtime.throwaway_state():
            for i, cmd in enumerate(task["tests"]):
                r: ExecResult = self.runtime.exec(cmd, timeout=self._timeout(task))
                passed += int(r.ok)
                if not r.ok:
                    self._failed_tests.append(f"hidden test {i + 1} of {len(task['tests'])}")
        return passed, len(task["tests"])

    def _timeout(self, task: Task) -> float:
        return float(self.command_timeout or task.get("timeout") or 30.0)

    # ----- task directories (Terminal-Bench / Harbor) -----
    def _begin_task_dir(self, task: Task) -> Transition:
        from envs.terminal.task_runtime import task_runtime

        self.runtime, self._image = task_runtime(task, self.runtime_kind, self.runtime_options, self.base_images)
        if self.progress_from_tests:  # the first check runs on the episode's clock too
            t0 = time.monotonic()
            self._best_passed = self._run_tests(task, final=False)[0]
            self._best_reward = self._reward
            self._agent_s += time.monotonic() - t0
        return Transition(
            task["instruction"],
            role="user",
            extra_info={"system_prompt": self.system_prompt(task), "tools": [TOOL_SCHEMA]},
        )

    def _play_oracle(self, task: Task, obs: dict[str, Any], info: dict[str, Any]):
        """The task's oracle as one command, then submit (in a replay, `act` gives each command the oracle's files at
        /solution while it runs)."""
        command = self._oracle_command(task)
        if command is None:
            raise ValueError(f"terminal task {task['id']!r} has no oracle (solution/solve.sh or solution.sh)")
        messages, reward, done = play_bash_commands(self, obs, info, [command])
        if done:
            return messages, reward, done
        more, reward, done = play_bash_commands(self, obs, info, [SUBMIT_COMMAND])
        return messages + more[2:], reward, done

    @staticmethod
    def _oracle_command(task: Task) -> str | None:
        """The oracle as the action that runs it: its text (so a demonstration shows the commands), or `bash
        /solution/<script>` when it finds its files relative to itself (or holds a ``` fence)."""
        if not task.get("solution_script"):
            return None
        script = Path(task["solution_script"]).read_text(encoding="utf-8", errors="replace")
        if SELF_LOCATING.search(script) or "```" in script:
            return f"bash /solution/{Path(task['solution_script']).name}"
        return script.strip()

    @contextmanager
    def replaying_demonstration(self) -> Iterator[None]:
        """Within it, the env replays its own demonstration (`demonstration`, `envs.check_agent_env`): a task
        directory's commands then find the oracle's files at /solution while each runs, as the format's oracle agent
        has them. This state, set only by code that plays the env's reference, decides; never an action's text."""
        saved = self._oracle_replay
        self._oracle_replay = True
        try:
            yield
        finally:
            self._oracle_replay = saved

    def _exec_agent_command(self, task: Task, command: str, timeout: float) -> ExecResult:
        """One command of the agent; in a replay of the oracle (`replaying_demonstration`), with its files."""
        if "task_dir" not in task or not self._oracle_replay:
            return self.runtime.exec(command, timeout=timeout)
        from envs.terminal.verifier import mount_solution, unmount_solution

        mount_solution(self.runtime, task)
        try:
            return self.runtime.exec(command, timeout=timeout)
        finally:
            unmount_solution(self.runtime)

    def _close_runtime(self) -> None:
        if self.runtime is not None:
            try:
                self.runtime.close()
            finally:
                self.runtime = None
