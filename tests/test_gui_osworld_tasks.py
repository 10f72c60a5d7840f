"""Every `os` task of an OSWorld tree on the local (sandboxed) desktop: it loads or is refused in one line, it runs, an
untouched desktop scores 0 on it, and nothing on the host changes.

The tree is $NEXTSTATE_OSWORLD_DIR (OSWorld's `evaluation_examples`; e.g. from a clone of xlang-ai/OSWorld), else the
small sample in tests/data/osworld_sample (NextState-written tasks in OSWorld's format, none of OSWorld's own: a folder
rename and a background script to stop, as in the bundled `osworld` set, a result file that never appears, and ones for
the sandbox, the terminal getter, an offline download and a task without an evaluator). The counts are printed; with the real tree,
`benchmarks/osworld_os_tasks.py` also checks the host's whole file tree.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from envs.gui.env import GUIEnv
from envs.gui.getters import FILES_ENV
from envs.gui.osworld_tasks import load_osworld_examples
from tests.gui_support import require_desktop_tools

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).parent / "data" / "osworld_sample"
TREE = Path(os.environ.get("NEXTSTATE_OSWORLD_DIR") or SAMPLE)
# A feasible task that an untouched desktop passes, because of the task itself (reported, not hidden)
KNOWN_TASK_BUGS = {
    # setup runs `sudo chsh -s $(which zsh)` without a user name, which changes root's shell; user's stays bash
    "6ebbfb01-ea72-4226-a2a6-dc428e111ed2": "its setup changes root's login shell, not the user's",
}


def test_the_repository_holds_no_osworld_task_files():
    """OSWorld's benchmark tasks carry a do-not-train canary: the bundled set and the sample are NextState-written (our
    ids, no uuid like OSWorld's, no source on the web); OSWorld's own trees are read from outside the repository."""
    gui = Path(__file__).parents[1] / "envs" / "gui" / "tasks"
    tasks = [t for f in gui.glob("*.json") for t in json.loads(f.read_text())]
    tasks += [json.loads(f.read_text()) for f in (SAMPLE / "examples").rglob("*.json")]
    ids = [t["id"] for t in tasks] + [i for ids in json.loads((SAMPLE / "test_all.json").read_text()).values() for i in ids]
    assert len(tasks) > 20 and ids
    uuid_like = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert not [i for i in ids if uuid_like.search(i)]
    assert not [t["id"] for t in tasks if "://" in str(t.get("source", ""))]


def host_facts() -> dict[str, str]:
    run = lambda argv: subprocess.run(argv, capture_output=True, text=True).stdout  # noqa: E731
    return {
        "dpkg -l": run(["dpkg", "-l"]),
        "getent passwd": run(["getent", "passwd"]),
        "/etc/shadow": Path("/etc/shadow").read_text() if os.path.exists("/etc/shadow") else "",
        "zsh": str(shutil.which("zsh")),
        "/test": str(os.path.exists("/test")),
    }


@pytest.fixture(scope="module")
def env():
    require_desktop_tools()
    e = GUIEnv(max_steps=5)
    yield e
    e.close()


def test_every_os_task_loads_or_is_refused_runs_and_scores_zero_untouched(env, capsys):
    before = host_facts()
    got = load_osworld_examples(TREE, domains=("os",), index=None)
    files = sorted((TREE / "examples" / "os").glob("*.json"))
    assert len(got.tasks) + len(got.skipped) == len(files)
    assert all("\n" not in why and why for why in got.skipped.values())  # one line each
    runs, above_zero = [], {}
    for task in got.tasks:
        env.reset(options={"task": task})
        _, score, terminated, _, _ = env.step("DONE")
        assert terminated and not env.last_evaluation.error, (task["id"], env.last_evaluation)
        runs.append(task["id"])
        if task["evaluator"]["func"] != "infeasible" and score > 0:
            above_zero[task["id"]] = score
    with capsys.disabled():
        print(f"\nOSWorld os tasks in {TREE}: {len(files)} files, {len(got.tasks)} load, {len(runs)} run, "
              f"{len(runs) - len(above_zero)} score 0 untouched; refused: {len(got.skipped)}")
        for tid, why in sorted(got.skipped.items()):
            print(f"  refused {tid}: {why[:150]}")
        for tid in above_zero:
            print(f"  {tid} scores {above_zero[tid]} untouched: {KNOWN_TASK_BUGS.get(tid, 'UNEXPECTED')}")
    assert set(above_zero) <= set(KNOWN_TASK_BUGS), above_zero
    assert host_facts() == before


def test_root_changes_stay_in_the_sandbox(env):
    """A solution that needs root (sudo apt-get install) scores 1, in the sandbox; the host never gets the package."""
    before = host_facts()
    task = load_osworld_examples(SAMPLE, domains=("os",), index=None)
    sudo_task = next(t for t in task.tasks if t["id"] == "ns-sample-sudo-install")
    env.reset(options={"task": sudo_task})
    res = env.desktop.execute("echo password | sudo -S apt-get install -y zsh && echo password | sudo -S mkdir /test",
                              shell=True, timeout=120)
    assert res.ok, res.stderr[-500:]
    _, score, *_ = env.step("DONE")
    assert score == 1.0
    env.reset(options={"task": sudo_task})  # the next episode's root is fresh again
    _, score, *_ = env.step("DONE")
    assert score == 0.0
    assert host_facts() == before


def test_terminal_output_getter_reads_the_ctrl_alt_t_terminal(env):
    got = load_osworld_examples(SAMPLE, domains=("os",), index=None)
    task = next(t for t in got.tasks if t["id"] == "ns-sample-terminal-output")
    env.reset(options={"task": task})
    assert env.desktop.execute("echo marigold > ~/answer.txt", shell=True).ok
    _, score, *_ = env.step("DONE")
    assert score == 1.0, env.desktop.terminal_output()


def test_a_remote_file_runs_once_it_is_mirrored(env, tmp_path, monkeypatch):
    got = load_osworld_examples(SAMPLE, domains=("os",), index=None)
    assert "cannot be fetched offline" in got.skipped["ns-sample-remote-file"]
    url = "https://files.example.invalid/os/setup.sh"
    (tmp_path / "ns-sample-remote-file").mkdir()  # OSWorld's cache layout: <task>/<uuid5(url)>_<name>
    (tmp_path / "ns-sample-remote-file" / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_setup.sh").write_text("echo hi\n")
    monkeypatch.setenv(FILES_ENV, str(tmp_path))
    task = next(t for t in load_osworld_examples(SAMPLE, domains=("os",), index=None).tasks
                if t["id"] == "ns-sample-remote-file")
    env.reset(options={"task": task})
    assert env.desktop.read_file("~/Desktop/setup.sh") == b"echo hi\n"
    assert env.desktop.execute("chmod +x ~/Desktop/setup.sh", shell=True).ok
    _, score, *_ = env.step("DONE")
    assert score == 1.0
