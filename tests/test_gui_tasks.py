"""Every bundled gui task: its scripted reference solution scores 1 and its scripted wrong solution scores 0. The
hand-written tasks run on the local Xvfb backend and on the OSWorld HTTP backend (our guest server in a docker
container); their seeded variants (same templates, other values) run on the local backend. Also the `osworld` set:
project-written tasks of OSWorld's `os` domain kind (its setup steps, getters and metrics, the same VM conventions: user
`user`, password `password`, ~/Desktop) that need only a shell and an X display."""

from __future__ import annotations

import json

import pytest

from envs.gui.env import GUIEnv
from envs.gui.task_builders import hand_written
from envs.gui.tasks import TASKS_DIR, bundled_tasks
from tests.tiers import first_fast
from tests.gui_support import docker_engine, guest_image, require_desktop_tools

pytestmark = pytest.mark.integration

HAND = bundled_tasks("hand-written")
VARIANTS = [t for t in bundled_tasks("all") if t["id"].startswith("ns-gen-")]
ALL = bundled_tasks("all")
OSWORLD = {t["id"]: t for t in bundled_tasks("osworld")}


@pytest.fixture(scope="module")
def local_env():
    require_desktop_tools()
    env = GUIEnv(split="all")
    yield env
    env.close()


@pytest.fixture(scope="module")
def docker_env():
    require_desktop_tools()
    host = docker_engine()
    image = guest_image(host)
    # one container, reset between episodes (processes killed, HOME emptied): the per-episode fresh container is
    # exercised separately below, at a few seconds per episode
    env = GUIEnv(split="all", backend="docker", docker_host=host, docker_image=image, docker_fresh_container=False)
    yield env
    env.close()


def test_the_bundled_set_is_large_and_split():
    train, evals = bundled_tasks("train"), bundled_tasks("eval")
    assert len(train) + len(evals) == len(ALL) and len(HAND) >= 20
    assert not {t["id"] for t in train} & {t["id"] for t in evals}
    apps = lambda ts: {a for t in ts for a in t["related_apps"]}
    assert apps(train) == apps(evals)  # the held-out split uses the same apps with new values
    assert not {t["instruction"] for t in train if "'" in t["instruction"]} & {t["instruction"] for t in evals}
    for t in ALL:
        assert t["nextstate"]["solution"] and t["nextstate"]["wrong"], t["id"]
    assert json.loads((TASKS_DIR / "bundled.json").read_text()) == hand_written()  # the file is what the builders make


def _check(env: GUIEnv, task: dict) -> None:
    messages, outcome = env.play(task, "solution")
    assert outcome == 1.0, f"{task['id']}: reference solution scored {outcome}: {env.last_evaluation}\n{messages[-1]}"
    messages, outcome = env.play(task, "wrong")
    assert outcome == 0.0, f"{task['id']}: wrong solution scored {outcome}: {env.last_evaluation}"


@pytest.mark.parametrize("task", HAND, ids=[t["id"] for t in HAND])
def test_bundled_task_local(local_env, task):
    _check(local_env, task)


@pytest.mark.parametrize("task", first_fast(HAND, ids=lambda t: t["id"]))
def test_bundled_task_osworld_docker(docker_env, task):
    _check(docker_env, task)


@pytest.mark.slow
@pytest.mark.parametrize("task", VARIANTS, ids=[t["id"] for t in VARIANTS])
def test_task_variant_local(local_env, task):
    _check(local_env, task)


# ----- OSWorld-format `os` tasks (project-written), run through OSWorld's setup steps and evaluator -----
# Each is solved the way a terminal user would, with a shell command run on the desktop (there is no GNOME terminal to
# type into); the point is that OSWorld-format setup and evaluation run here as written. Doing nothing scores 0.
ORACLES = {
    "ns-os-rename-folder": "mv ~/Desktop/photos_2023_draft ~/Desktop/photos_2023_final",
    # stop only this desktop's copy (the local backend shares the host's process table): the one running in our HOME,
    # and not this shell, whose own command line mentions ticker.sh
    "ns-os-stop-script": 'for p in $(pgrep -f ticker.sh); do [ "$p" != "$$" ] && [ "$(readlink /proc/$p/cwd)" = "$HOME" ] '
    "&& kill $p; done; true",
}


def _osworld(env: GUIEnv, task_id: str) -> None:
    task = OSWORLD[task_id]
    if task["evaluator"]["func"] == "infeasible":
        for action, want in (("FAIL", 1.0), ("DONE", 0.0)):
            env.reset(options={"task": task})
            _, reward, terminated, _, _ = env.step(action)
            assert terminated and reward == want
        return
    env.reset(options={"task": task})
    _, reward, terminated, _, _ = env.step("DONE")
    assert terminated and reward == 0.0, f"{task_id}: doing nothing scored {reward}"
    env.reset(options={"task": task})
    res = env.desktop.execute(ORACLES[task_id], shell=True)
    assert res.ok, res
    _, reward, terminated, _, info = env.step("DONE")
    assert terminated and reward == 1.0, f"{task_id}: the oracle scored {reward}: {env.last_evaluation}"


@pytest.mark.parametrize("task_id", sorted(OSWORLD))
def test_osworld_format_os_task_local(local_env, task_id):
    _osworld(local_env, task_id)


@pytest.mark.parametrize("task_id", first_fast(sorted(OSWORLD)))
def test_osworld_format_os_task_osworld_docker(docker_env, task_id):
    _osworld(docker_env, task_id)


def test_docker_backend_fresh_container_per_episode(docker_env):
    """The default docker mode: every reset is a new container, so nothing of the last episode survives."""
    host = docker_env.cfg.docker_host
    env = GUIEnv(split="all", backend="docker", docker_host=host, docker_image=docker_env.cfg.docker_image)
    try:
        _, outcome = env.play("ns-terminal-hello-file", "solution")
        assert outcome == 1.0
        first = env.desktop.container.id
        env.reset(options={"task": "ns-terminal-hello-file"})
        assert env.desktop.container.id != first
        assert not env.desktop.execute("test -e ~/hello.txt", shell=True).ok  # the file from the last episode is gone
    finally:
        env.close()
