"""The bundled per-domain app tasks (envs/gui/tasks/apps/<domain>.json, `env.task_set=apps`).

Fast: every task validates, names files its domain's generator writes, and each domain has train and eval tasks; the
generators write the same bytes every time; the generated directory is built once per generator version.
Slow tier: every task on the local sandboxed desktop with the real apps of the guest root: its reference solution
replays to 1, its scripted wrong solution (where it has one) scores 0, and an untouched desktop (DONE right after setup)
scores 0. A task whose app the guest lacks by design (VS Code's `code`, not a Debian package) is skipped with the
setup's one-line reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from envs.gui import app_files
from envs.gui.app_tasks import app_domains, app_tasks, domain_tasks
from envs.gui.env import GUIConfig, GUIEnv, _demo_cache_path
from envs.gui.setup_steps import SetupError
from envs.gui.solution import resolve_step
from envs.gui.tasks import files_dir_for, validate_task
from envs.runtime.rootfs_image import find_debootstrap
from tests.gui_support import require_desktop_tools

ALL = app_tasks("all")
OPTIONAL_APPS = ("code",)  # apps the guest root may lack by design: their tasks are skipped, not failed


def _relative_files(task: dict) -> list[str]:
    """The generated-file paths a task names: download urls, upload sources, cloud_file paths."""
    out = []
    for step in [*task.get("config", []), *task["evaluator"].get("postconfig", [])]:
        for f in (step.get("parameters") or {}).get("files", []):
            out += [f[k] for k in ("url", "local_path") if k in f]
    ev = task["evaluator"]
    specs = []
    for key in ("result", "expected"):
        v = ev.get(key)
        specs += v if isinstance(v, list) else [v]
    for spec in specs:
        if isinstance(spec, dict) and spec.get("type") == "cloud_file":
            out += spec["path"] if isinstance(spec["path"], list) else [spec["path"]]
    return [p for p in out if not p.startswith(("/", "file://", "http://", "https://"))]


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_app_task_validates_and_its_files_are_generated(tmp_path):
    assert ALL, "no app tasks found in envs/gui/tasks/apps/"
    ids = [t["id"] for t in ALL]
    assert len(ids) == len(set(ids)), "duplicate app task ids"
    app_files.build_all(tmp_path)
    for domain in app_domains():
        tasks = domain_tasks(domain)
        assert {t["nextstate"]["split"] for t in tasks} == {"train", "eval"}, f"{domain}: needs train and eval tasks"
        for t in tasks:
            validate_task(t)
            assert t["id"].startswith(f"ns-{domain}-") and t.get("related_apps"), t["id"]
            ns = t["nextstate"]
            assert ns.get("solution") and ns["solution"][-1] == "DONE", f"{t['id']}: a solution ending in DONE"
            assert ns.get("ready", {}).get("window"), f"{t['id']}: names the window to wait for"
            rel = _relative_files(t)
            if rel:
                assert ns.get("files") == "generated", f"{t['id']}: names generated files without files=generated"
            for path in rel:
                assert (tmp_path / path).is_file(), f"{t['id']}: {path} is not written by envs/gui/app_files"


def test_the_generators_write_the_same_bytes_every_time(tmp_path):
    assert set(app_domains()) <= set(app_files.domains()), "every task domain has a file generator"
    for domain in app_files.domains():
        a, b = tmp_path / f"{domain}-a", tmp_path / f"{domain}-b"
        app_files.build_domain(domain, a)
        app_files.build_domain(domain, b)
        got = _tree_digest(a)
        assert got, f"{domain}: its generator wrote nothing"
        assert got == _tree_digest(b), f"{domain}: its generator is not deterministic"
        assert all(p.startswith(f"{domain}/") for p in got), f"{domain}: files outside {domain}/"
    with pytest.raises(ValueError, match="no file generator for domain 'nope'"):
        app_files.build_domain("nope", tmp_path)


def test_the_generated_directory_is_built_once_per_generator_version(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path / "cache"))
    first = app_files.generated_dir()
    assert first.parent == tmp_path / "cache" / "gui-app-files" and first.name == app_files.digest()
    assert (first / ".complete").exists() and _tree_digest(first)
    stamp = (first / ".complete").stat().st_mtime_ns
    app_files._generated.cache_clear()  # another process: the finished directory is reused, not rebuilt
    assert app_files.generated_dir() == first and (first / ".complete").stat().st_mtime_ns == stamp
    # a changed generator source gives another key, hence a new directory
    pkg = tmp_path / "pkg"
    shutil.copytree(app_files.PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(app_files, "PACKAGE_DIR", pkg)
    assert app_files.digest() == first.name
    (pkg / "_zip.py").write_text((pkg / "_zip.py").read_text() + "\n# changed\n")
    app_files._digest.cache_clear()  # a new process
    assert app_files.digest() != first.name
    assert not list((tmp_path / "cache" / "gui-app-files").glob(".*partial*"))


def test_the_env_serves_the_app_tasks_and_their_files(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path))
    assert GUIConfig(task_set="apps").task_set == "apps"
    train, evals = GUIEnv.tasks("train", task_set="apps"), GUIEnv.tasks("eval", task_set="apps")
    assert len(train) + len(evals) == len(ALL) and not {t["id"] for t in train} & {t["id"] for t in evals}
    with pytest.raises(ValueError, match="unknown split 'osworld' for the app tasks"):
        GUIEnv.tasks("osworld", task_set="apps")
    env = GUIEnv(task_set="apps", split="eval")
    try:
        assert [t["id"] for t in env.task_pool()] == [t["id"] for t in evals]
    finally:
        env.close()
    generated = next(t for t in ALL if t["nextstate"].get("files") == "generated")
    assert files_dir_for(generated) == app_files.generated_dir()
    assert app_files.generated_dir().parent == tmp_path / "gui-app-files"
    bad = {**generated, "nextstate": {**generated["nextstate"], "files": "elsewhere"}}
    with pytest.raises(ValueError, match=f"{generated['id']}.*nextstate.files must be one of bundled, generated"):
        validate_task(bad)


# ----- the slow tier: the real apps on the sandboxed desktop -----
def _require_sandbox_root() -> None:
    require_desktop_tools()
    from envs.runtime.guest_image import GuestRecipe
    from envs.runtime.rootfs_image import default_cache_dir
    from envs.runtime.sandbox_root import DESKTOP_UID_BASE

    r = GuestRecipe()
    done = default_cache_dir() / "sandbox-roots" / f"{r.tarball_prefix}-{r.suite}-{r.key}-u{DESKTOP_UID_BASE}"
    if (done / ".complete").exists():
        return
    if os.geteuid() != 0 or find_debootstrap() is None:
        pytest.skip(f"the desktop's guest root ({done}) is not built and cannot be built here "
                    "(needs root and debootstrap: python -m envs.runtime.sandbox_root build)")


@pytest.fixture(scope="module")
def desktop_env():
    _require_sandbox_root()
    env = GUIEnv(split="all", task_set="apps", backend="local", isolation="sandbox")
    yield env
    env.close()


def _skip_if_app_optional(task: dict, exc: SetupError) -> None:
    missing = "is not installed in the desktop's guest root" in str(exc)
    if missing and any(f"'{app}'" in str(exc) for app in OPTIONAL_APPS):
        pytest.skip(f"{task['id']}: {exc}")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("task", ALL, ids=[t["id"] for t in ALL])
def test_app_task_solution_scores_1_and_untouched_desktop_0(desktop_env, task):
    try:
        _, outcome = desktop_env.play(task, "solution")
    except SetupError as exc:
        _skip_if_app_optional(task, exc)
        raise
    assert outcome == 1.0, f"{task['id']}: the reference solution scored {outcome}: {desktop_env.last_evaluation}"
    if task["nextstate"].get("wrong"):
        _, outcome = desktop_env.play(task, "wrong")
        assert outcome == 0.0, f"{task['id']}: the scripted wrong solution scored {outcome}"
    desktop_env.reset(options={"task": task})
    titles = [w.title for w in desktop_env.desktop.windows()]
    # the app opened as on OSWorld's VM: its task window only, no first-start dialog (envs/runtime/app_profiles.py)
    assert not [t for t in titles if "Tip of the Day" in t], titles
    _, outcome, terminated, _, _ = desktop_env.step("DONE")
    assert terminated and outcome == 0.0, f"{task['id']}: an untouched desktop scored {outcome}"
    assert not desktop_env.last_evaluation.error, desktop_env.last_evaluation


@pytest.mark.slow
@pytest.mark.integration
def test_an_app_task_demonstration_is_recorded_once_for_the_warm_start(desktop_env, monkeypatch):
    """The SFT warm start's demonstrations: the solution played live (real observations, the env's action format),
    then served from the cache, whose key includes the generated files' digest."""
    task = next(t for t in app_tasks("train") if t["id"] == "ns-libreoffice_calc-fill-totals")
    messages = desktop_env.demonstration(task)
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    actions = [m["content"] for m in messages if m["role"] == "assistant"]
    assert actions == [resolve_step(s, [], []) for s in task["nextstate"]["solution"]]
    assert all("sales.xlsx - LibreOffice Calc" in m["content"] for m in messages[1::2])
    assert _demo_cache_path(task, asdict(desktop_env.cfg)) != _demo_cache_path(
        {**task, "nextstate": {**task["nextstate"], "files": "bundled"}}, asdict(desktop_env.cfg))

    def no_replay(*args, **kwargs):
        raise AssertionError("the cached demonstration was played again")

    monkeypatch.setattr(desktop_env, "play", no_replay)
    assert desktop_env.demonstration(task) == messages
