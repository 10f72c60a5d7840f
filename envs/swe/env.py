"""SWEEnv: SWE-bench instances solved with shell commands in a checkout of the repository, graded by swebench.

reset: the instance's environment (per (repo, version) and per instance, as SWE-bench's two image layers: built once,
envs.swe.backend) and a fresh checkout at `base_commit`, in a sandbox (local bubblewrap, or a docker container) with the
repo at /testbed and no network. step: one ```bash block (or
a `shell_exec` tool call) runs there; the observation is its exit code, stdout and stderr. The episode ends when the agent
runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` or at the step limit: the env takes `git diff` of the checkout as the
model patch, applies it to a fresh checkout, runs the official eval script (test patch applied, the spec's test command
between swebench's markers) and asks swebench's `get_eval_report` for the verdict. Outcome: +1 if resolved else
-1 (`outcome="resolved"`), or the fraction of FAIL_TO_PASS + PASS_TO_PASS tests passing mapped to [-1, 1]
(`outcome="tests"`). `info["swe"]` holds the report, the Python version used and the timings.

The agent's sandbox is closed (its processes gone) before the grading sandbox exists; the test patch and the eval
script are written only there. A failing verdict whose log shows the tests could not reach the network (envs.swe.network)
is flagged (`signals["network_error"]`, `info["swe"]["network_error"]`): offline, no patch could have passed them, and
`python -m envs.swe.validate` refuses such instances before training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from envs.base import PROGRESS, AgentEnv, Transition, class_or_instance
from envs.repeats import RepeatedWarning
from envs.cache import cache_dir as nextstate_cache_dir
from envs.swe import grading
from envs.swe.cutoff import DEFAULT_CUTOFF, check_cutoff
from envs.swe.docker import DockerSWEBackend
from envs.swe.instances import bundled_instances, validate_swe_instance
from envs.swe.local import LocalSWEBackend
from envs.swe.network import network_failure
from envs.swe.repos import HISTORIES, RepoStore
from envs.taskfile import Task
from envs.terminal.actions import (
    SUBMIT_COMMAND,
    TOOL_SCHEMA,
    command_transition,
    is_submission,
    parse_shell_action,
    test_failures,
)
from envs.terminal.demo import play_bash_commands

log = logging.getLogger(__name__)

OUTCOMES = ("resolved", "tests")
RUNTIMES = ("local", "docker", "auto")
ROW_RUNTIME = "nextstate_runtime"  # an instance row's own backend (written by envs.swe.validate); used by runtime=auto
NETWORK_TASKS = RepeatedWarning(log, "info['swe']['network_error'] of each such episode")

SYSTEM_PROMPT = """You are a software engineer fixing an issue in a Python repository, using a bash shell.

Reply with a short thought and then exactly one ```bash code block holding the command(s) to run; you will see their exit
code, stdout and stderr. (Instead of the block you may call the shell_exec tool with {{"command": "..."}}.)
The repository is checked out at {repo_dir} and its Python environment is active (python, pip, pytest). Each command runs
in a fresh bash shell in {repo_dir}: files persist, but cd, variables and background processes do not. There is no
network. Commands are killed after {timeout:g} seconds. Edit the source files to fix the issue; do not modify the tests.
When you are done, reply with:
```bash
{submit}
```
Your changes (git diff) are then tested; you cannot run commands after that."""

USER_TEMPLATE = """Fix this issue in the repository at {repo_dir}:

<issue>
{problem}
</issue>"""


class SWEEnv(AgentEnv):
    family = "swe"

    def __init__(
        self,
        *,
        runtime: str = "auto",
        runtime_options: Mapping[str, Any] | None = None,
        instances: str | Path | Sequence[Task] | None = None,
        tasks: str | Path | Sequence[Task] | None = None,
        split: str = "train",
        repos_dir: str | None = None,
        cache_dir: str | None = None,
        outcome: str = "resolved",
        max_steps: int = 20,
        command_timeout: float = 60.0,
        eval_timeout: float = 1800.0,
        history: str = "full",
        pypi_cutoff: str = DEFAULT_CUTOFF,
        max_observation_chars: int = 8_000,
        max_action_chars: int = 16_000,
    ):
        super().__init__(
            max_steps=max_steps,
            tasks=instances if instances is not None else tasks,
            split=split,
            max_observation_chars=max_observation_chars,
            max_action_chars=max_action_chars,
        )
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome={outcome!r}: use one of {', '.join(OUTCOMES)}")
        if runtime not in RUNTIMES:
            raise ValueError(
                f"runtime={runtime!r}: use 'local' (bubblewrap), 'docker', or 'auto' (each instance row's "
                f"'{ROW_RUNTIME}', else local)"
            )
        if history not in HISTORIES:
            raise ValueError(f"history={history!r}: use one of {', '.join(HISTORIES)}")
        self.outcome_mode = outcome
        self.command_timeout = float(command_timeout)
        self.eval_timeout = float(eval_timeout)
        self.repos = RepoStore(repos_dir)
        self.cache = Path(cache_dir) if cache_dir else nextstate_cache_dir("swe")
        self.runtime_options = dict(runtime_options or {})
        self.history = history
        self.pypi_cutoff = check_cutoff(pypi_cutoff)
        self.runtime_kind = runtime
        self._backends: dict[str, Any] = {}
        self._active: Any = None
        self.workspace: Any = None
        self._spec: grading.RepoSpec | None = None
        self._environment: Any = None
        self.last_result: dict[str, Any] | None = None

    # ----- AgentEnv -----
    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        return bundled_instances(split)

    @classmethod
    def validate_task(cls, task: Task) -> Task:
        return validate_swe_instance(task)

    @property
    def backend(self) -> Any:
        """The backend of `runtime` (runtime=auto: the local one); `backend_for(task)` picks per instance."""
        return self._backend(self.runtime_kind if self.runtime_kind != "auto" else "local")

    def backend_for(self, task: Task) -> Any:
        kind = self.runtime_kind
        if kind == "auto":
            kind = str(task.get(ROW_RUNTIME) or "local")
            if kind not in ("local", "docker"):
                raise ValueError(f"instance {task.get('instance_id')!r}: {ROW_RUNTIME}={kind!r} (use local or docker)")
        return self._backend(kind)

    def _backend(self, kind: str) -> Any:
        if kind not in self._backends:
            if kind == "local":
                self._backends[kind] = LocalSWEBackend(
                    self.repos, self.cache, self.runtime_options, self.history, self.pypi_cutoff
                )
            else:
                self._backends[kind] = DockerSWEBackend(
                    self.repos, self.runtime_options, self.history, self.pypi_cutoff, self.cache
                )
        return self._backends[kind]

    def begin(self, task: Task) -> Transition:
        self._close_workspace()
        t0 = time.monotonic()
        self._spec = grading.repo_spec(task)
        self._active = self.backend_for(task)
        self._environment = self._active.environment(task, self._spec)
        t1 = time.monotonic()
        self.workspace = self._active.open(task, self._spec, self._environment)
        self.last_result = None
        self._timings = {"environment_s": t1 - t0, "checkout_s": time.monotonic() - t1}
        return Transition(
            USER_TEMPLATE.format(repo_dir=grading.REPO_DIR, problem=task["problem_statement"].strip()),
            role="user",
            extra_info={
                "system_prompt": self.system_prompt(),
                "tools": [TOOL_SCHEMA],
                "swe_environment": asdict(self._environment.info) | {"packages": None},
                "swe_instance": asdict(self._environment.instance),
            },
        )

    def act(self, action: str) -> Transition:
        parsed = parse_shell_action(action)
        if parsed.command is None:
            return parsed.parse_error()
        result = self.workspace.runtime.exec(parsed.command, timeout=self.command_timeout)
        if is_submission(result):
            report = self._grade()
            signals = {
                "submitted": True,
                "resolved": report["resolved"],
                "tests_passed": report["tests_passed"],
                "tests_total": report["tests_total"],
                "exit_code": 0,
            }
            if report["network_error"]:
                signals["network_error"] = report["network_error"]
            if report["resolved"]:
                signals[PROGRESS] = True
            else:  # what still fails, for a rule judge's hint
                failing = [*report["FAIL_TO_PASS"].get("failure", []), *report["PASS_TO_PASS"].get("failure", [])]
                signals["failed_tests"] = failing[:10]
                assertion = test_failures(report["log_tail"])[1]
                if assertion:
                    signals["assertion"] = assertion
                if report["model_patch"] and not report["patch_applied"]:
                    signals["error_message"] = "the edits do not apply as a patch to the repository"
                elif not report["model_patch"]:
                    signals["error_message"] = "submitted without changing any file"
            return Transition(
                self._verdict_text(report),
                role=parsed.role,
                signals=signals,
                outcome=self._outcome(report),
                extra_info={"swe": report},
            )
        return command_transition(parsed, result, self.command_timeout, self.max_observation_chars)

    def verify(self) -> float:
        return self._outcome(self._grade())

    def close(self) -> None:
        self._close_workspace()
        super().close()

    # ----- more -----
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(repo_dir=grading.REPO_DIR, timeout=self.command_timeout, submit=SUBMIT_COMMAND)

    def grade_patch(self, task: Task, patch: str) -> dict[str, Any]:
        """Grade `patch` for `task` without an episode (what `env.instances=...` users need for official verdicts)."""
        task = validate_swe_instance(task)
        spec = grading.repo_spec(task)
        backend = self.backend_for(task)
        return self._report(task, spec, backend, backend.environment(task, spec), patch)

    def test_statuses(self, task: Task, patch: str) -> dict[str, str]:
        """Per-test statuses of the instance's test files after `patch` and the test patch (derives FAIL_TO_PASS)."""
        spec = grading.repo_spec(task)
        backend = self.backend_for(task)
        run = backend.evaluate(task, spec, backend.environment(task, spec), patch, self.eval_timeout)
        return grading.test_status_map(task, spec, run.log)

    @class_or_instance
    def demonstration(self, task: Task | str) -> list[dict[str, str]]:
        """A reference conversation: look at the files the gold patch touches, apply it, submit; with the env's real
        observations. Raises unless the gold patch resolves the instance. Callable on the class too."""
        obs, info = self.reset(options={"task": task})
        assert self.task is not None
        gold = self.task.get("patch")
        if not gold:
            raise ValueError(f"SWE instance {self.task['id']!r} has no gold patch: it has no demonstration")
        files = [line[6:] for line in gold.splitlines() if line.startswith("+++ b/")]
        shown = [f for f in files if not f.startswith("/dev/null")][:1]
        actions = []
        if shown:
            actions.append(f"cat -n {shown[0]}" if self._exists(shown[0]) else f"ls {Path(shown[0]).parent}")
        body = gold if gold.endswith("\n") else gold + "\n"  # as is: a last context line may be a lone space
        actions.append(
            f"cat > /tmp/fix.patch <<'NEXTSTATE_PATCH'\n{body}NEXTSTATE_PATCH\ngit apply /tmp/fix.patch && git diff --stat"
        )
        actions.append(SUBMIT_COMMAND)
        messages, reward, done = play_bash_commands(self, obs, info, actions)
        if not done or reward < 1.0:
            raise ValueError(f"the gold patch of {self.task['id']!r} does not resolve it (outcome {reward})")
        return messages

    def _exists(self, path: str) -> bool:
        return self.workspace.runtime.exec(f"test -f {path}", timeout=10).ok

    def _grade(self) -> dict[str, Any]:
        assert self.task is not None and self._spec is not None
        t0 = time.monotonic()
        patch = self.workspace.model_patch()
        self._close_workspace()  # the agent's processes are gone before the grading sandbox exists
        diff_s = time.monotonic() - t0
        report = self._report(self.task, self._spec, self._active, self._environment, patch)
        report["timings"] = {
            **self._timings,
            "diff_s": diff_s,
            **report["timings"],
            "grade_total_s": time.monotonic() - t0,
        }
        self.last_result = report
        return report

    def _report(self, task: Task, spec: grading.RepoSpec, backend: Any, environment: Any, patch: str
                ) -> dict[str, Any]:
        t0 = time.monotonic()
        run = backend.evaluate(task, spec, environment, patch, self.eval_timeout)
        t1 = time.monotonic()
        verdict = grading.grade(task, spec, patch if patch is not None else None, run.log)
        info = environment.info
        offline = None if verdict.resolved else network_failure(run.log)
        if offline:
            NETWORK_TASKS.warn("%s: its tests need the network (%s); offline no patch can resolve it: refuse it "
                               "(python -m envs.swe.validate)", task["instance_id"], offline)
        return {
            "instance_id": task["instance_id"],
            "resolved": verdict.resolved,
            "status": verdict.status,
            "patch_applied": verdict.patch_applied,
            "FAIL_TO_PASS": verdict.fail_to_pass,
            "PASS_TO_PASS": verdict.pass_to_pass,
            "tests_passed": verdict.tests_passed,
            "tests_total": verdict.tests_total,
            "eval_timed_out": run.timed_out,
            "network_error": offline,
            "swebench_version": verdict.swebench_version,
            "spec_source": spec.source,
            "python_requested": info.python_requested,
            "python_used": info.python_used,
            "python_exact": info.python_exact,
            "environment_notes": info.notes,
            "skipped_steps": info.skipped_steps,
            "runtime": "docker" if isinstance(backend, DockerSWEBackend) else "local",
            "instance_build": asdict(environment.instance),
            "model_patch": patch,
            "log_tail": run.log[-4000:],
            "timings": {"eval_s": t1 - t0, "checkout_s": run.checkout_s, "report_s": time.monotonic() - t1},
        }

    def _outcome(self, report: dict[str, Any]) -> float:
        if self.outcome_mode == "resolved":
            return 1.0 if report["resolved"] else -1.0
        total = report["tests_total"]
        return (2.0 * report["tests_passed"] / total - 1.0) if total else -1.0

    @staticmethod
    def _verdict_text(report: dict[str, Any]) -> str:
        f2p, p2p = report["FAIL_TO_PASS"], report["PASS_TO_PASS"]

        def frac(d: dict[str, list[str]]) -> str:
            ok = len(d.get("success", []))
            return f"{ok}/{ok + len(d.get('failure', []))}"

        if not report["patch_applied"]:
            return "Submitted. The patch could not be applied or the tests did not run: not resolved."
        word = "resolves" if report["resolved"] else "does not resolve"
        return (
            f"Submitted. The patch {word} the issue: FAIL_TO_PASS {frac(f2p)}, PASS_TO_PASS {frac(p2p)} tests pass "
            f"({report['status']})."
        )

    def _close_workspace(self) -> None:
        if self.workspace is not None:
            try:
                self.workspace.close()
            finally:
                self.workspace = None
