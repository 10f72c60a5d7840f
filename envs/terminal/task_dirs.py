"""Terminal-Bench and Harbor task directories as terminal tasks (`env.tasks_format=terminal_bench | harbor`).

Terminal-Bench (1.x): `task.yaml` (instruction, max_agent_timeout_sec, max_test_timeout_sec, parser_name, ...),
`Dockerfile` (+ `docker-compose.yaml` with one service), `run-tests.sh`, `tests/`, `solution.sh`.
Harbor (and Terminal-Bench 2.x): `task.toml` ([agent] / [verifier] timeout_sec, [environment] build_timeout_sec, cpus,
memory_mb, storage_mb, gpus), `instruction.md`, `environment/Dockerfile`, `tests/test.sh` (writes a reward to
`/logs/verifier/reward.txt` or `reward.json`), `solution/solve.sh`.

`load_task_dirs(path, fmt)` reads one task directory or a directory of them. Each becomes a plain task dict (paths as
strings, so it crosses processes and files like any other task) with `"task_dir"` set; what cannot run here is refused
with one line naming the task and the reason (`TaskRefused`), and a directory load skips those and logs each line.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envs.terminal.dockerfile import DockerfileError, parse_dockerfile
from envs.terminal.python_bases import PYTHON_FALLBACKS, asked_python, choose_python
from envs.terminal.script_rules import fetches_from_web, foreign_apt_source, oracle_reference, remote_server, \
    service_check, strip_shell_comments

log = logging.getLogger(__name__)

FORMATS = ("terminal_bench", "harbor")
# Terminal-Bench's own defaults when task.yaml leaves them out; Harbor's when task.toml does
TB_AGENT_TIMEOUT_S, TB_TEST_TIMEOUT_S = 180.0, 30.0
HARBOR_AGENT_TIMEOUT_S, HARBOR_TEST_TIMEOUT_S, HARBOR_BUILD_TIMEOUT_S = 600.0, 600.0, 600.0
DEFAULT_BUILD_TIMEOUT_S = 900.0
MAX_COMMAND_TIMEOUT_S = 120.0  # one command's limit: the task's agent timeout, at most this (env.command_timeout overrides)
# a test script that clones a repository from the web builds what its tests need from it: no offline runner can stand in
WEB_CLONE = re.compile(r"\bgit\s+clone\s[^\n]*?(https?://|git@)\S+")
PYTEST_CALL = re.compile(r"\bpytest\b")


class TaskRefused(ValueError):
    """A task directory this machine cannot run; str() is one line naming the task and the reason."""


@dataclass
class LoadedDirs:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # task dir -> the one-line reason


def is_task_dir(path: Path, fmt: str) -> bool:
    return (path / ("task.yaml" if fmt == "terminal_bench" else "task.toml")).is_file()


def load_task_dirs(path: str | Path, fmt: str, python_fallback: str = "exact") -> LoadedDirs:
    """Every task directory at `path` (the directory itself when it is one, else its subdirectories, sorted).
    `python_fallback`: what a python:3.X image this machine has no 3.X for gets (`exact`: refused; `nearest`: the
    nearest version it has, with a logged line)."""
    if fmt not in FORMATS:
        raise ValueError(f"tasks_format={fmt!r}: use one of {', '.join(FORMATS)}")
    if python_fallback not in PYTHON_FALLBACKS:
        raise ValueError(f"python_fallback={python_fallback!r}: use one of {', '.join(PYTHON_FALLBACKS)}")
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory of {fmt} tasks")
    dirs = [root] if is_task_dir(root, fmt) else sorted(p for p in root.iterdir() if is_task_dir(p, fmt))
    if not dirs:
        marker = "task.yaml" if fmt == "terminal_bench" else "task.toml"
        raise FileNotFoundError(f"{root}: neither a {fmt} task directory nor a folder of them (no {marker})")
    out = LoadedDirs()
    for d in dirs:
        try:
            out.tasks.append(read_task_dir(d, fmt, python_fallback))
        except TaskRefused as exc:
            out.refused[str(d)] = str(exc)
    return out


def read_task_dir(task_dir: str | Path, fmt: str, python_fallback: str = "exact") -> dict[str, Any]:
    d = Path(task_dir).resolve()
    return _read_terminal_bench(d, python_fallback) if fmt == "terminal_bench" else _read_harbor(d, python_fallback)


def _refuse(d: Path, reason: str) -> TaskRefused:
    return TaskRefused(f"terminal task {d.name!r} ({d}): {reason}")


def _read_terminal_bench(d: Path, python_fallback: str) -> dict[str, Any]:
    try:
        meta = yaml.safe_load((d / "task.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise _refuse(d, f"task.yaml cannot be read ({str(exc).splitlines()[0]})") from None
    if not isinstance(meta, dict):
        raise _refuse(d, "task.yaml is not a mapping")
    instruction = meta.get("instruction")
    if instruction is None and isinstance(meta.get("descriptions"), list):  # the older layout: keyed descriptions
        base = [x for x in meta["descriptions"] if isinstance(x, dict) and x.get("key", "base") == "base"]
        instruction = base[0].get("description") if base else None
    _check_compose(d, d / "docker-compose.yaml")
    dockerfile = d / "Dockerfile"
    tests = d / "tests"
    script = d / "run-tests.sh"
    if meta.get("parser_name", "pytest") != "pytest":
        raise _refuse(d, f"parser_name {meta['parser_name']!r}: only Terminal-Bench's pytest parser is supported")
    solution = d / "solution.sh"
    return _task(
        d,
        fmt="terminal_bench",
        python_fallback=python_fallback,
        instruction=instruction,
        dockerfile=dockerfile,
        tests_dir=tests,
        test_script=script if script.is_file() else None,
        solution=solution if solution.is_file() else None,
        solution_dir=None,
        agent_timeout_s=_seconds(d, meta, "max_agent_timeout_sec", TB_AGENT_TIMEOUT_S),
        test_timeout_s=_seconds(d, meta, "max_test_timeout_sec", TB_TEST_TIMEOUT_S),
        build_timeout_s=DEFAULT_BUILD_TIMEOUT_S,
        resources={},
        extra={k: meta[k] for k in ("difficulty", "category", "tags") if k in meta},
    )


def _read_harbor(d: Path, python_fallback: str) -> dict[str, Any]:
    try:
        meta = tomllib.loads((d / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _refuse(d, f"task.toml cannot be read ({exc})") from None
    env = meta.get("environment") or {}
    if not isinstance(env, dict):
        raise _refuse(d, "task.toml's [environment] is not a table")
    if int(env.get("gpus") or 0) > 0:
        raise _refuse(d, f"it needs {env['gpus']} GPU(s), which this machine does not have")
    _check_compose(d, d / "environment" / "docker-compose.yaml")
    dockerfile = d / "environment" / "Dockerfile"
    if not dockerfile.is_file() and env.get("docker_image"):
        raise _refuse(d, f"it runs the prebuilt image {env['docker_image']!r} from a registry and ships no "
                         "environment/Dockerfile to build it from")
    instruction_file = d / "instruction.md"
    try:
        instruction = instruction_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        instruction = None
    script = d / "tests" / "test.sh"
    solution = d / "solution" / "solve.sh"
    resources = {
        "cpus": _number(d, env, "cpus"),
        "memory_mb": _memory_mb(d, env),
        "storage_mb": _number(d, env, "storage_mb"),
    }
    return _task(
        d,
        fmt="harbor",
        python_fallback=python_fallback,
        instruction=instruction,
        dockerfile=dockerfile,
        tests_dir=d / "tests",
        test_script=script if script.is_file() else None,
        solution=solution if solution.is_file() else None,
        solution_dir=d / "solution" if solution.is_file() else None,
        agent_timeout_s=_seconds(d, meta.get("agent") or {}, "timeout_sec", HARBOR_AGENT_TIMEOUT_S),
        test_timeout_s=_seconds(d, meta.get("verifier") or {}, "timeout_sec", HARBOR_TEST_TIMEOUT_S),
        build_timeout_s=_seconds(d, env, "build_timeout_sec", HARBOR_BUILD_TIMEOUT_S),
        resources={k: v for k, v in resources.items() if v is not None},
        extra={k: v for k, v in (meta.get("metadata") or {}).items() if k in ("difficulty", "category", "tags")},
    )


def _task(d: Path, *, fmt: str, python_fallback: str, instruction: Any, dockerfile: Path, tests_dir: Path,
          test_script: Path | None, solution: Path | None, solution_dir: Path | None, agent_timeout_s: float,
          test_timeout_s: float, build_timeout_s: float, resources: dict[str, float], extra: dict[str, Any]
          ) -> dict[str, Any]:
    if not isinstance(instruction, str) or not instruction.strip():
        if (d / "steps").is_dir():
            raise _refuse(d, "it is a multi-step task (an instruction, tests and solution per folder of steps/); "
                          "only single-step tasks run here")
        raise _refuse(d, "it has no instruction")
    if not dockerfile.is_file():
        raise _refuse(d, f"it has no {dockerfile.relative_to(d)} to build its environment from")
    try:
        spec = parse_dockerfile(dockerfile)
    except DockerfileError as exc:
        raise _refuse(d, str(exc)) from None
    for step in spec.steps:
        if step.op == "RUN" and (found := foreign_apt_source(step.args[0])):
            raise _refuse(d, f"Dockerfile line {step.line} adds a package source other than Debian's and PyPI "
                             f"({found!r}), which this machine cannot reach")
    if not tests_dir.is_dir() and test_script is None:
        raise _refuse(d, "it has no tests")
    if fmt == "harbor" and test_script is None:
        raise _refuse(d, "it has no tests/test.sh")
    for f in _test_files(tests_dir, test_script):
        text = f.read_text(encoding="utf-8", errors="replace")
        # tests that run or read the oracle's files (its folder at /solution, or solution/solve.* next to the
        # workdir) pass for the oracle and for no agent, so they cannot score an episode
        if found := oracle_reference(text, python=f.suffix == ".py"):
            raise _refuse(d, f"its tests use the oracle's own files ({found!r} in {f.name}), which an "
                             "agent's episode never has")
        if found := service_check(text, python=f.suffix == ".py"):
            raise _refuse(d, f"its tests ask whether a service the agent started still runs ({found!r} in {f.name}); "
                             "here every agent process has ended before the tests run")
        if f.suffix == ".py" and (host := remote_server(text)):
            raise _refuse(d, f"its tests talk to {host} over the network ({f.name}), which this offline "
                             "sandbox cannot reach")
    if test_script is not None:
        code = strip_shell_comments(test_script.read_text(encoding="utf-8", errors="replace"))
        if m := WEB_CLONE.search(code):
            raise _refuse(d, f"its tests clone a repository from the web ({m.group(0)!r} in {test_script.name}), "
                             "which this machine cannot reach at test time")
        if (found := fetches_from_web(code)) and not PYTEST_CALL.search(code):
            raise _refuse(d, f"its tests fetch from the web ({found!r} in {test_script.name}) and are not a pytest "
                             "run this env can provide offline")
    python = _python(d, spec.base, python_fallback)
    return {
        "id": d.name,
        "instruction": instruction.strip(),
        "format": fmt,
        "task_dir": str(d),
        "dockerfile": str(dockerfile),
        "context": str(dockerfile.parent),
        "base_image": spec.base,
        "tests_dir": str(tests_dir) if tests_dir.is_dir() else None,
        "test_script": str(test_script) if test_script is not None else None,
        "solution_script": str(solution) if solution is not None else None,
        "solution_dir": str(solution_dir) if solution_dir is not None else None,
        "agent_timeout_s": agent_timeout_s,
        "test_timeout_s": test_timeout_s,
        "build_timeout_s": build_timeout_s,
        "timeout": min(agent_timeout_s, MAX_COMMAND_TIMEOUT_S),
        "resources": resources,
        **({"python": python} if python else {}),
        **extra,
    }


TASK_DIR_KEYS = ("id", "instruction", "format", "task_dir", "dockerfile", "context", "agent_timeout_s",
                 "test_timeout_s", "build_timeout_s", "timeout")


def validate_task_dir_task(task: dict[str, Any]) -> dict[str, Any]:
    """Check a task dict made by `read_task_dir` (e.g. read back from a file): its fields and that its files exist."""
    missing = [k for k in TASK_DIR_KEYS if k not in task]
    if missing:
        raise ValueError(f"terminal task {task.get('id')!r} from a task directory lacks {', '.join(missing)}; "
                         "load task directories with env.tasks_format=terminal_bench|harbor")
    if task["format"] not in FORMATS:
        raise ValueError(f"terminal task {task['id']!r}: format {task['format']!r} is not one of {', '.join(FORMATS)}")
    for key in ("dockerfile", "test_script", "solution_script"):
        if task.get(key) and not Path(task[key]).is_file():
            raise ValueError(f"terminal task {task['id']!r}: {key} {task[key]} does not exist")
    return dict(task)


def _python(d: Path, image: str, fallback: str) -> str | None:
    """The Python version (major.minor) a python:* image gets here, None for other images; refused in one line when
    this machine lacks it (unless `fallback` is nearest: then one logged line names both versions)."""
    asked = asked_python(image)
    if asked is None:
        return None
    try:
        interpreter, note = choose_python(asked, fallback)
    except ValueError as exc:
        raise _refuse(d, f"FROM {image} {exc}") from None
    if note:
        log.warning("terminal task %r (%s): FROM %s %s", d.name, d, image, note)
    return interpreter.version


def _test_files(tests_dir: Path, test_script: Path | None) -> list[Path]:
    files = sorted(p for p in tests_dir.rglob("*") if p.suffix in (".sh", ".py") and p.is_file()) \
        if tests_dir.is_dir() else []
    return files + ([test_script] if test_script is not None and test_script not in files else [])


def _check_compose(d: Path, compose: Path) -> None:
    if not compose.is_file():
        return
    try:
        data = yaml.safe_load(compose.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise _refuse(d, f"{compose.name} cannot be read ({str(exc).splitlines()[0]})") from None
    services = data.get("services") if isinstance(data, dict) else None
    if isinstance(services, dict) and len(services) > 1:
        raise _refuse(d, f"{compose.name} runs {len(services)} services ({', '.join(services)}); only single-"
                         "container tasks run here")


def _seconds(d: Path, table: dict[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise _refuse(d, f"{key}={value!r} is not a number of seconds") from None
    if value <= 0:
        raise _refuse(d, f"{key}={value} must be positive")
    return value


def _number(d: Path, table: dict[str, Any], key: str) -> float | None:
    if table.get(key) is None:
        return None
    try:
        return float(table[key])
    except (TypeError, ValueError):
        raise _refuse(d, f"[environment] {key}={table[key]!r} is not a number") from None


def _memory_mb(d: Path, env: dict[str, Any]) -> float | None:
    if env.get("memory_mb") is not None:
        return _number(d, env, "memory_mb")
    text = env.get("memory")  # the older form: "2G", "512M"
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise _refuse(d, f"[environment] memory={text!r} is not a size")
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[m.group(2).upper()]
    return float(m.group(1)) * scale


__all__ = ["FORMATS", "LoadedDirs", "TaskRefused", "is_task_dir", "load_task_dirs", "read_task_dir",
           "validate_task_dir_task"]
