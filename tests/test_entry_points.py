"""The rollout package's `python -m` commands, as the README and the docs name them, start and answer `--help`.

`rollout.server` is the package rollout/server/ (its `__main__`), `rollout.experiment_report` the kept command name of
rollout/experiment/report.py (a top-level module that calls its `main`), `rollout.view` the package rollout/view/, and
`rollout.launch` the Hydra launcher. tests/test_documented_commands.py checks the flags the docs quote; this checks that
each command itself still exists under its documented name, wherever its code lives.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: command -> what the first line of its --help starts with
ARGPARSE_COMMANDS = {
    "rollout.server": "usage: python -m rollout.server ",
    "rollout.experiment_report": "usage: python -m rollout.experiment_report ",
    "rollout.experiment.report": "usage: python -m rollout.experiment_report ",  # the module itself: the same command
    "rollout.view": "usage: python -m rollout.view ",
}


def _help(module: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("module", sorted(ARGPARSE_COMMANDS))
def test_entry_point_answers_help_with_its_usage_line(module: str):
    proc = _help(module)
    assert proc.returncode == 0, f"python -m {module} --help exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.startswith(ARGPARSE_COMMANDS[module]), proc.stdout[:500]


def test_the_launcher_answers_help_with_its_config_groups():
    proc = _help("rollout.launch")
    assert proc.returncode == 0, f"python -m rollout.launch --help exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert "powered by Hydra" in proc.stdout and "\nenv: " in proc.stdout, proc.stdout[:1000]


def test_the_documented_commands_are_these():
    """Every `python -m rollout.<x>` the README and the docs quote is one of the commands checked above."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    quoted = {m for p in docs for m in re.findall(r"python -m (rollout(?:\.\w+)*)", p.read_text())}
    assert quoted <= {*ARGPARSE_COMMANDS, "rollout.launch"}, quoted - {*ARGPARSE_COMMANDS, "rollout.launch"}
    assert {"rollout.server", "rollout.experiment_report", "rollout.view", "rollout.launch"} <= quoted, quoted
