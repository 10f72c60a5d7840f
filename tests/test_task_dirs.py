"""Terminal-Bench / Harbor task directories without building anything: the Dockerfile reader, the loaders and their
one-line refusals, the base mapping, the build cache key, and the outcome parsers (pytest's summary, Harbor's reward)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.terminal.dockerfile import DockerfileError, parse_dockerfile_text
from envs.terminal.env import TerminalEnv, outcome_from_reward
from envs.terminal.task_dirs import TaskRefused, load_task_dirs, read_task_dir
from envs.terminal.task_image import environment_key, resolve_base
from envs.terminal.verifier import choose_runner, parse_pytest_summary, parse_reward

BUNDLED = Path(__file__).resolve().parents[1] / "envs" / "terminal" / "task_dirs"


# ----- the Dockerfile reader -----
def test_dockerfile_steps_with_continuations_heredocs_and_variables():
    d = parse_dockerfile_text(
        "# a comment\nARG PY=3.11\nFROM python:${PY}-slim AS base\nENV A=1 B=\"two words\"\nENV C $A-x\n"
        "ENV PATH=/opt/v/bin:$PATH\nWORKDIR /app/$A\nARG N=7\nRUN apt-get update && \\\n    apt-get install -y jq\n"
        "RUN cat <<EOF > /app/f.txt\nhello $A\nEOF\nCOPY --chown=1000:1000 [\"a b\", \"/app/\"]\nCMD [\"bash\"]\n",
        environment={"PATH": "/usr/bin"},
    )
    assert d.base == "python:3.11-slim"
    assert [(s.op, s.args) for s in d.steps] == [
        ("ENV", ("A", "1")), ("ENV", ("B", "two words")), ("ENV", ("C", "1-x")), ("ENV", ("PATH", "/opt/v/bin:/usr/bin")),
        ("WORKDIR", ("/app/1",)), ("ARG", ("N", "7")), ("RUN", ("apt-get update && apt-get install -y jq",)),
        ("RUN", ("cat <<EOF > /app/f.txt\nhello $A\nEOF",)), ("COPY", ("a b", "/app/")),
    ]
    assert d.steps[-1].options == {"chown": "1000:1000"} and d.ignored == ("CMD (line 15)",)


@pytest.mark.parametrize("text, says", [
    ("RUN true\n", "comes before FROM"),
    ("# nothing\n", "no FROM"),
    ("FROM a\nFROM b\n", "multi-stage"),
    ("FROM a\nCOPY --from=build /x /y\n", "another image or stage"),
    ("FROM a\nSHELL [\"/bin/bash\", \"-c\"]\n", "not supported"),
    ("FROM a\nONBUILD RUN true\n", "not supported"),
    ("FROM a\nADD https://example.com/x.tgz /opt/\n", "of a URL"),
    ("FROM a\nRUN --mount=type=cache,target=/root/.cache pip install x\n", "flags"),
    ("FROM a\nRUN echo \\\n", "ends inside a continued line"),
    ("FROM a\nRUN cat <<EOF\nnever ends\n", "never ends"),
    ("FROM a\nENV =x\n", "not NAME=value"),
    ("FROM a\nCOPY one\n", "a destination"),
])
def test_dockerfile_refusals_name_the_line_and_the_reason(text, says):
    with pytest.raises(DockerfileError, match=says) as err:
        parse_dockerfile_text(text, "t/Dockerfile")
    assert str(err.value).startswith("t/Dockerfile") and "\n" not in str(err.value)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_any_text_is_a_dockerfile_or_a_clear_error(text):
    try:
        parse_dockerfile_text("FROM debian\n" + text)
    except DockerfileError:
        pass


# ----- the loaders -----
@pytest.mark.parametrize("fmt, ids", [
    ("harbor", ["count-log-levels", "fix-config-port", "sort-scores"]),
    ("terminal_bench", ["csv-column-sum", "git-feature-branch", "worker-report"]),
])
def test_the_bundled_task_directories_load(fmt, ids):
    got = load_task_dirs(BUNDLED / fmt, fmt)
    assert [t["id"] for t in got.tasks] == ids and got.refused == {}
    for task in got.tasks:
        assert task == TerminalEnv.validate_task(dict(task))  # what a file of them reads back as
        assert task["instruction"] and task["solution_script"] and Path(task["dockerfile"]).is_file()
    one = read_task_dir(BUNDLED / fmt / ids[0], fmt)  # a single task directory loads as itself too
    assert load_task_dirs(BUNDLED / fmt / ids[0], fmt).tasks == [one]


def test_harbor_fields_become_timeouts_and_resources():
    task = read_task_dir(BUNDLED / "harbor" / "count-log-levels", "harbor")
    assert (task["agent_timeout_s"], task["test_timeout_s"], task["build_timeout_s"]) == (300.0, 60.0, 300.0)
    assert task["resources"] == {"cpus": 1.0, "memory_mb": 1024.0, "storage_mb": 1024.0}
    assert task["timeout"] == 120.0  # one command: the agent's budget, at most MAX_COMMAND_TIMEOUT_S
    sized = read_task_dir(BUNDLED / "harbor" / "sort-scores", "harbor")
    assert sized["resources"] == {"memory_mb": 1024.0}  # the older `memory = "1G"`


def _copy(tmp_path: Path, fmt: str, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(BUNDLED / fmt / name, dst)
    return dst


@pytest.mark.parametrize("change, says", [
    (lambda d: (d / "task.toml").write_text((d / "task.toml").read_text().replace("gpus = 0", "gpus = 2")),
     "needs 2 GPU"),
    (lambda d: (d / "environment" / "docker-compose.yaml").write_text("services:\n  main: {}\n  db: {}\n"),
     "runs 2 services"),
    (lambda d: (d / "environment" / "Dockerfile").unlink(), "no environment/Dockerfile"),
    (lambda d: ((d / "environment" / "Dockerfile").unlink(),
                (d / "task.toml").write_text((d / "task.toml").read_text() + 'docker_image = "ghcr.io/x/y:1"\n')),
     "prebuilt image"),
    (lambda d: (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN add-apt-repository "
                                                             "ppa:deadsnakes/ppa && apt-get update\n"),
     "package source other than Debian"),
    (lambda d: (d / "tests" / "test.sh").write_text("curl -sf https://example.com/check.sh | sh\n"),
     "fetch from the web"),
    (lambda d: (d / "tests" / "test.sh").write_text("python3 /solution/check.py\n"), "the oracle's own files"),
    (lambda d: (d / "tests" / "test.sh").write_text('SRC="${1:-/solution}"\ncp "$SRC/cleaner.py" /app/\n'),
     "the oracle's own files"),
    (lambda d: (d / "tests" / "test.sh").write_text("git clone https://github.com/google/googletest.git\npytest\n"),
     "clone a repository from the web"),
    (lambda d: (d / "tests" / "test_judge.py").write_text("import os, requests\nBASE = 'http://judge.example.com:8081'\n"),
     "talk to judge.example.com over the network"),
    # each refusal rule reads what runs: these are the positive cases beside the negative ones below
    (lambda d: (d / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm\nRUN echo 'deb https://download.docker.com/linux/debian bookworm stable' > "
        "/etc/apt/sources.list.d/docker.list && apt-get update\n"), "download.docker.com"),
    (lambda d: (d / "tests" / "test.sh").write_text('curl -fsS "$CHECK_URL" | sh\n'), "fetch from the web"),
    (lambda d: (d / "tests" / "test.sh").write_text("curl -s http://localhost:8000/ && wget https://x.org/f\n"),
     "wget https://x.org/f"),
    (lambda d: (d / "tests" / "test.sh").write_text("bash solution/solve.sh # the answer\n"), "solution/solve.sh"),
    (lambda d: (d / "tests" / "test_o.py").write_text('"""Checks."""\nANSWER = open("/solution/answer.txt").read()\n'),
     "the oracle's own files"),
    (lambda d: (d / "tests" / "test_svc.py").write_text('import subprocess\nOUT = subprocess.run(["supervisorctl", '
                                                        '"status", "worker"], capture_output=True).stdout\n'),
     "a service the agent started still runs .'supervisorctl status'"),
    (lambda d: (d / "tests" / "test.sh").write_text("systemctl is-active nginx && pytest /tests\n"),
     "systemctl is-active"),
    (lambda d: (d / "tests" / "test_run.py").write_text('import subprocess, sys\n'
                                                        'subprocess.run([sys.executable, "solution/solve.py"])\n'),
     "solution/solve.py"),
    (lambda d: (d / "tests" / "test_api.py").write_text("from urllib import request\nU = 'https://api.example.org'\n"),
     "talk to api.example.org"),
    (lambda d: (d / "instruction.md").write_text("  \n"), "no instruction"),
    (lambda d: ((d / "instruction.md").unlink(), (d / "steps" / "milestone_1").mkdir(parents=True)),
     "multi-step task"),
    (lambda d: (d / "task.toml").write_text("[agent\n"), "task.toml cannot be read"),
    (lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = 'soon'\n"), "not a number of seconds"),
    (lambda d: (d / "environment" / "Dockerfile").write_text("FROM a\nFROM b\n"), "multi-stage"),
])
def test_a_task_that_cannot_run_here_is_refused_in_one_line(tmp_path, change, says):
    d = _copy(tmp_path, "harbor", "count-log-levels")
    change(d)
    with pytest.raises(TaskRefused, match=says) as err:
        read_task_dir(d, "harbor")
    assert "'count-log-levels'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("change", [
    # loopback: the task's own server
    lambda d: (d / "tests" / "test.sh").write_text("curl -sf http://localhost:8000/health || exit 1\n"
                                                   "wget -qO- http://127.0.0.1:9000/ && curl -g 'http://[::1]:80/'\n"),
    lambda d: (d / "tests" / "test.sh").write_text("curl -s localhost:8080/ready\n"),
    # URLs and commands in shell comments, a '#' inside a word or in quotes not being one
    lambda d: (d / "tests" / "test.sh").write_text("#!/bin/bash\n# curl -LsSf https://astral.sh/uv/install.sh | sh\n"
                                                   'echo "n=${#x} # not a comment"; true  # apt-get install jq\n'),
    # URLs in Python comments and docstrings, an HTTP client talking to loopback
    lambda d: (d / "tests" / "test_doc.py").write_text(
        '"""Tests for the API (docs: https://docs.example.com/api)."""\nimport requests\n\n\n'
        'def test_health():\n    """See https://example.org/health."""\n    # https://judge.example.com:8081\n'
        '    assert requests.get("http://localhost:8000/health").ok\n'),
    # /solution inside comments and docstrings
    lambda d: (d / "tests" / "test.sh").write_text((d / "tests" / "test.sh").read_text()
                                                   + "\n# compare with /solution/solve.sh by hand\n"),
    lambda d: (d / "tests" / "test_doc.py").write_text('"""Like /solution/solve.sh does."""\n# /solution\nX = 1\n'),
    # Debian's own apt sources, and a comment naming a PPA
    lambda d: (d / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm\nRUN sed -i 's/main/main contrib/' /etc/apt/sources.list.d/debian.sources\n"
        "RUN echo 'deb http://deb.debian.org/debian bookworm-backports main' > "
        "/etc/apt/sources.list.d/backports.list && echo ok  # not add-apt-repository ppa:x/y\n"),
], ids=["curl-loopback", "curl-bare-localhost", "shell-comments", "python-docstrings", "solution-in-shell-comment",
        "solution-in-python-comment", "debian-sources"])
def test_what_does_not_run_or_stays_on_this_machine_is_not_refused(tmp_path, change):
    d = _copy(tmp_path, "harbor", "count-log-levels")
    change(d)
    assert read_task_dir(d, "harbor")["id"] == "count-log-levels"


def test_python_versions_at_load(tmp_path, monkeypatch, caplog):
    for v in ("3.12.1", "3.13.0"):
        (tmp_path / "pyenv" / "versions" / v / "bin").mkdir(parents=True)
        (tmp_path / "pyenv" / "versions" / v / "bin" / "python").write_text("")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    d = _copy(tmp_path, "harbor", "count-log-levels")
    dockerfile = d / "environment" / "Dockerfile"
    dockerfile.write_text("FROM python:3.12-slim\n")
    assert read_task_dir(d, "harbor")["python"] == "3.12"
    dockerfile.write_text("FROM python:3.14-slim\n")
    with pytest.raises(TaskRefused, match=r"'count-log-levels'.*FROM python:3\.14-slim asks for Python 3\.14, which "
                                          r"this machine does not have \(it has 3\.11, 3\.12, 3\.13\)"):
        read_task_dir(d, "harbor")
    with caplog.at_level("WARNING"):
        tasks = TerminalEnv.load_task_file(d, "harbor", options={"python_fallback": "nearest"})
    assert tasks[0]["python"] == "3.13" and "asks for Python 3.14" in caplog.text and "built with 3.13" in caplog.text
    dockerfile.write_text("FROM ubuntu:24.04\n")
    assert "python" not in read_task_dir(d, "harbor")
    with pytest.raises(ValueError, match="python_fallback='any'"):
        TerminalEnv(python_fallback="any")


def test_tests_that_serve_and_call_on_loopback_still_load(tmp_path):
    d = _copy(tmp_path, "harbor", "count-log-levels")
    (d / "tests" / "test_server.py").write_text("import requests\nURL = 'http://127.0.0.1:8000/health'\n")
    (d / "tests" / "test.sh").write_text((d / "tests" / "test.sh").read_text() + "\ngit clone /app/repo /tmp/copy\n")
    assert read_task_dir(d, "harbor")["id"] == "count-log-levels"


def test_a_folder_load_skips_the_refused_and_keeps_the_rest(tmp_path, caplog):
    _copy(tmp_path, "terminal_bench", "csv-column-sum")
    bad = _copy(tmp_path, "terminal_bench", "worker-report")
    (bad / "docker-compose.yaml").write_text("services:\n  client: {}\n  redis: {}\n")
    got = load_task_dirs(tmp_path, "terminal_bench")
    assert [t["id"] for t in got.tasks] == ["csv-column-sum"] and list(got.refused) == [str(bad)]
    with caplog.at_level("WARNING"):
        assert [t["id"] for t in TerminalEnv.load_task_file(tmp_path, "terminal_bench")] == ["csv-column-sum"]
    assert "worker-report" in caplog.text and "2 services" in caplog.text
    (tmp_path / "csv-column-sum" / "task.yaml").write_text("instruction: [not, text]\n")
    with pytest.raises(ValueError, match="none of the 2 terminal_bench tasks"):
        TerminalEnv.load_task_file(tmp_path, "terminal_bench")


def test_wrong_folders_and_formats_say_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no task.toml"):
        load_task_dirs(tmp_path, "harbor")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_task_dirs(tmp_path / "missing", "harbor")
    with pytest.raises(ValueError, match="unknown terminal task format 'swe'"):
        TerminalEnv.load_task_file(tmp_path, "swe")
    with pytest.raises(ValueError, match="lacks"):
        TerminalEnv.validate_task({"id": "x", "instruction": "y", "task_dir": str(tmp_path)})


# ----- base images and the cache key -----
def test_from_images_map_to_a_local_base():
    assert resolve_base("python:3.13-slim-bookworm@sha256:abc") == "debian-python"
    assert resolve_base("public.ecr.aws/docker/library/python:3.12-slim") == "debian-python"
    assert resolve_base("ghcr.io/laude-institute/t-bench/python-3-13:20250620") == "debian-python"
    assert resolve_base("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624") == "debian"
    assert resolve_base("ubuntu:24.04") == resolve_base("debian:bookworm-slim") == "debian"
    assert resolve_base("alpine:3.20") is None
    assert resolve_base("alpine:3.20", {"alpine:*": "debian"}) == "debian"  # env.base_images comes first
    with pytest.raises(ValueError, match="the local bases are"):
        resolve_base("alpine:3.20", {"alpine:*": "alpine"})


def test_the_build_key_follows_every_file_of_the_context(tmp_path):
    d = _copy(tmp_path, "harbor", "count-log-levels")
    task = read_task_dir(d, "harbor")
    key = environment_key(task, "base-x.tar")
    assert environment_key(task, "base-x.tar") == key and environment_key(task, "base-y.tar") != key
    (d / "environment" / "service.log").write_text("INFO changed\n")
    assert environment_key(task, "base-x.tar") != key
    (d / "environment" / "service.log").chmod(0o600)  # modes are part of the image too
    assert environment_key(task, "base-x.tar") != environment_key(read_task_dir(d, "harbor"), "base-y.tar")


# ----- outcomes -----
def test_pytest_summary_and_reward_files():
    out = ("....\n=========================== short test summary info ============================\n"
           "PASSED ../tests/test_outputs.py::test_a\nFAILED ../tests/test_outputs.py::test_b - AssertionError: x\n"
           "ERROR ../tests/test_outputs.py::test_c\n========== 1 failed, 1 passed in 0.02s ==========\n")
    assert parse_pytest_summary(out) == {"../tests/test_outputs.py::test_a": "PASSED",
                                         "../tests/test_outputs.py::test_b": "FAILED",
                                         "../tests/test_outputs.py::test_c": "ERROR"}
    assert parse_pytest_summary("PASSED test_x (no summary section)") == {}
    assert [parse_reward(t) for t in ("1\n", "0", "0.5", '{"reward": 0.25}', '{"a": 1, "b": 0}', "", "nan", "x",
                                      "7", "-1", "true", '{"reward": "high"}')] == [
        1.0, 0.0, 0.5, 0.25, 0.5, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert [outcome_from_reward(r) for r in (0.0, 0.5, 1.0)] == [-1.0, 0.0, 1.0]
    assert [outcome_from_reward(r, "binary") for r in (0.0, 0.99, 1.0)] == [-1.0, -1.0, 1.0]


def test_the_test_runner_choice():
    fetching = read_task_dir(BUNDLED / "harbor" / "fix-config-port", "harbor")  # curl | sh for uv
    plain = read_task_dir(BUNDLED / "harbor" / "count-log-levels", "harbor")
    assert choose_runner(fetching, "auto") == "pytest" and choose_runner(plain, "auto") == "script"
    assert choose_runner(fetching, "script") == "script" and choose_runner(plain, "pytest") == "pytest"
    with pytest.raises(ValueError, match="test_runner='uv'"):
        choose_runner(plain, "uv")
    with pytest.raises(ValueError, match="test_runner='uv'"):
        TerminalEnv(test_runner="uv")
