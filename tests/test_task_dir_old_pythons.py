"""A task image on an older Python (python:3.6, 3.7, 3.8) is verified on that Python: the verifier's pytest is the
newest that runs there (pytest 8.4 needs 3.9), so under the `pytest` runner its untouched environment passes only the
test that checks the Python version (outcome 0) and its oracle both (+1), as on a 3.11 image."""

from __future__ import annotations

from pathlib import Path

import pytest

from envs.terminal.env import TerminalEnv
from envs.terminal.python_bases import available_pythons
from envs.terminal.task_dirs import read_task_dir
from tests.sandbox_support import task_dirs_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEST = """import sys


def test_the_answer_is_there():
    with open("/app/answer.txt") as f:
        assert f.read().strip() == "forty-two"


def test_it_runs_on_the_images_python():
    assert sys.version_info[:2] == ({major}, {minor})
"""


def _task_dir(root: Path, version: str) -> Path:
    major, minor = version.split(".")
    d = root / f"old-python-{major}-{minor}"
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text("instruction: Write forty-two into /app/answer.txt.\nparser_name: pytest\n"
                                 "max_agent_timeout_sec: 60\nmax_test_timeout_sec: 60\n")
    (d / "Dockerfile").write_text(f"FROM python:{version}-slim\nWORKDIR /app\n")
    (d / "docker-compose.yaml").write_text("services:\n  client:\n    build: .\n")
    (d / "tests" / "test_outputs.py").write_text(TEST.format(major=major, minor=minor))
    # the uv boilerplate's shape: a script that fetches its runner from the web, so `auto` picks the harness's pytest
    (d / "run-tests.sh").write_text("#!/bin/bash\ncurl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n"
                                    "uv run pytest $TEST_DIR/test_outputs.py -rA\n")
    (d / "solution.sh").write_text("#!/bin/bash\necho forty-two > /app/answer.txt\n")
    return d


@pytest.mark.parametrize("version", ["3.6", "3.7", "3.8"])
def test_an_older_python_image_is_verified_on_its_own_python(version, tmp_path):
    task_dirs_or_skip()
    if version not in available_pythons():
        pytest.skip(f"this machine has no Python {version} build (pyenv) to put in a python:{version} image")
    task = read_task_dir(_task_dir(tmp_path, version), "terminal_bench")
    env = TerminalEnv(tasks=[task], progress_from_tests=False)
    try:
        env.reset(options={"task": task["id"]})
        assert env.verify() == 0.0  # untouched: 1 of the 2 tests passes (it runs on 3.X), the answer's fails
        env.demonstration(task["id"])  # raises unless the oracle's outcome is +1 (both tests pass on 3.X)
    finally:
        env.close()
