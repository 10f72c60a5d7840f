"""`python -m rollout.launch env=gui env.tasks=<OSWorld tree> env.tasks_format=osworld_all`: a short RL run over a
mixed-domain OSWorld-format tree on the local sandboxed desktops, with the tasks this machine cannot run (a file from
the web, a web page, an app the guest lacks) left out at load in one line each and a summary line, the run going on
over the others.

The tree is written here, with NextState's own tasks (OSWorld's task files carry a do-not-train canary and never enter
the repository): VLC, LibreOffice Calc and the os domain run; the others are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.records import read_jsonl
from tests.test_gui_app_start import require_apps, write_tree

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a whole launch, desktops with apps

REPO = Path(__file__).resolve().parent.parent


def _check(command: str, expected: str) -> dict:
    return {"func": "exact_match", "result": {"type": "vm_command_line", "command": command, "shell": True},
            "expected": {"type": "rule", "rules": {"expected": expected}}}


TREE = {
    "vlc": [{
        "id": "ns-launch-vlc-recordings",
        "instruction": "Make VLC save its recordings in the Desktop folder.",
        "config": [{"type": "launch", "parameters": {"command": "VLC_VERBOSE=-1 vlc --no-audio --no-video-title-show",
                                                      "shell": True}}],
        "evaluator": {"func": "is_vlc_recordings_folder", "result": {"type": "vlc_config", "dest": "vlcrc"},
                      "expected": {"type": "rule", "rules": {"recording_file_path": "/home/user/Desktop"}}},
    }],
    "libreoffice_calc": [{
        "id": "ns-launch-calc-total",
        "instruction": "In budget.csv, add a row 'total' with the sum of the costs, and save it as CSV.",
        "config": [
            {"type": "execute", "parameters": {"command": "printf 'item,cost\\nrent,700\\nfood,250\\n' > "
                                                          "~/Desktop/budget.csv", "shell": True}},
            {"type": "launch", "parameters": {"command": ["libreoffice", "--calc", "/home/user/Desktop/budget.csv"]}},
        ],
        "evaluator": _check("grep -c '^total,950' ~/Desktop/budget.csv", "1\n"),
    }, {
        "id": "ns-launch-calc-web-file",
        "instruction": "Sort the sheet by cost.",
        "config": [{"type": "download", "parameters": {"files": [
            {"url": "https://files.example.invalid/sheets/costs.xlsx", "path": "/home/user/Desktop/costs.xlsx"}]}}],
        "evaluator": _check("true", "never"),
    }],
    "os": [{
        "id": "ns-launch-os-notes",
        "instruction": "Create a folder 'notes' on the Desktop with an empty file todo.txt in it.",
        "config": [],
        "evaluator": _check("[ -f ~/Desktop/notes/todo.txt ] && echo yes || echo no", "yes\n"),
    }],
    "chrome": [{
        "id": "ns-launch-chrome-page",
        "instruction": "Bookmark this page.",
        "config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://www.example.com/"]}}],
        "evaluator": _check("true", "never"),
    }],
    "vs_code": [{
        "id": "ns-launch-code-theme",
        "instruction": "Switch VS Code to its dark theme.",
        "config": [{"type": "launch", "parameters": {"command": ["code"]}}],
        "evaluator": _check("true", "never"),
    }],
}


def test_a_short_rl_run_over_a_mixed_domain_osworld_tree(tmp_path):
    require_apps("vlc", "libreoffice")
    tree = write_tree(tmp_path / "osworld", TREE)
    out = tmp_path / "run"
    env = {**os.environ, "HOME": str(tmp_path / "home"), "NEXTSTATE_CACHE": str(tmp_path / "cache")}
    env.pop("NEXTSTATE_OSWORLD_FILES", None)
    env.pop("NEXTSTATE_OSWORLD_FETCH", None)
    cmd = [sys.executable, "-m", "rollout.launch", "env=gui", f"env.tasks={tree}", "env.tasks_format=osworld_all",
           f"run.out_dir={out}", "env.max_steps=2", "farm.num_envs=2", "loop.iterations=2",
           "loop.tasks_per_iteration=3", "loop.samples_per_task=2", "loop.eval_tasks=0", "sampling.max_new_tokens=16"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{log[-6000:]}"
    # left out at load, each in one line naming why, and counted in one summary line
    lines = log.splitlines()
    why = {"ns-launch-calc-web-file": "cannot be fetched offline", "ns-launch-chrome-page": "has no network",
           "ns-launch-code-theme": "'code' is not installed"}
    for tid, reason in why.items():
        assert any(tid in line and reason in line for line in lines), (tid, log[-4000:])
    assert any("OSWorld tasks skipped: 3 (" in line and "kept: 3" in line for line in lines), log[-4000:]
    assert "have no demonstration and are left out" in log  # OSWorld-format tasks come without one
    # the run went on over the runnable tasks, of several app domains, none aborted
    episodes = read_jsonl(out / "episodes.jsonl")
    assert len(episodes) == 2 * 3 * 2
    assert {e["task_id"] for e in episodes} == {"ns-launch-vlc-recordings", "ns-launch-calc-total",
                                                "ns-launch-os-notes"}
    assert all(e["status"] == "ok" for e in episodes), [(e["task_id"], e.get("reason")) for e in episodes]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if r.get("kind") == "train"] == [0, 1]
    assert all(r["episodes_aborted"] == 0 for r in rows if r.get("kind") == "train")
