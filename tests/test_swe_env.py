"""The swe family for real: bwrap sandboxes, git checkouts, venvs built from PyPI (once, cached), swebench's grader.

Every bundled instance: the gold patch resolves it, an empty patch does not, and a patch that fixes the issue but breaks
a PASS_TO_PASS test does not. Plus episodes, check_env, malformed actions, the `instances=<file>` path for user data,
FAIL_TO_PASS / PASS_TO_PASS re-derived by running the tests, and the agent's sandbox boundaries.
"""

from __future__ import annotations

import json
import re

import pytest
from gymnasium.utils.env_checker import check_env

from envs.swe.bundled.sources import break_patch, source_instance
from envs.swe.env import SWEEnv
from envs.swe.git import git
from envs.swe.instances import bundled_instances
from envs.swe.pythons import choose_python
from envs.terminal.actions import SUBMIT_COMMAND
from tests.tiers import first_fast
from tests.sandbox_support import bwrap_or_skip, docker_host  # noqa: F401 (fixture)

import swebench  # noqa: F401 (the swe extra, always installed: a broken one fails)
pytestmark = pytest.mark.integration

INSTANCES = bundled_instances("all")


@pytest.fixture(scope="module")
def env():
    bwrap_or_skip()
    e = SWEEnv()
    yield e
    e.close()


@pytest.mark.parametrize("inst", first_fast(INSTANCES, ids=lambda i: i["instance_id"]))
def test_gold_resolves_empty_and_regressions_do_not(env, inst):
    gold = env.grade_patch(inst, inst["patch"])
    assert gold["resolved"] and gold["status"] == "RESOLVED_FULL", gold["log_tail"]
    requested = env.backend.environment(inst, _spec(inst)).info.python_requested
    # the requested minor version whenever this machine has it (pyenv's, found even with an empty HOME), else the closest
    assert gold["python_exact"] == choose_python(requested).exact
    if gold["python_exact"]:
        assert gold["python_used"].startswith(requested)
    empty = env.grade_patch(inst, "")
    assert not empty["resolved"] and set(empty["FAIL_TO_PASS"]["failure"]) == set(inst["FAIL_TO_PASS"])
    broken = env.grade_patch(
        inst, break_patch(inst["instance_id"], env.repos.ensure(inst["repo"]), inst["base_commit"])
    )
    assert not broken["resolved"]
    assert broken["FAIL_TO_PASS"]["failure"] == [] and broken["PASS_TO_PASS"]["failure"], broken["log_tail"]


def _spec(inst):
    from envs.swe.grading import repo_spec

    return repo_spec(inst)


def test_fail_to_pass_lists_are_derived_by_running_the_tests(env):
    inst = next(i for i in INSTANCES if i["instance_id"] == "nextstate__minicalc-2")
    fresh = source_instance(inst["instance_id"], env.repos.ensure(inst["repo"]))
    assert fresh["base_commit"] == inst["base_commit"] and fresh["patch"] == inst["patch"]  # builds are reproducible
    before = env.test_statuses(fresh, patch="")
    after = env.test_statuses(fresh, patch=fresh["patch"])
    f2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
    p2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
    assert f2p == inst["FAIL_TO_PASS"] and p2p == inst["PASS_TO_PASS"]


@pytest.mark.slow  # gymnasium's checker over a SWE episode (40 s); the episode test below stays
def test_check_env_passes(env):
    check_env(env, skip_render_check=True)


def test_episode_actions_observations_and_verdict(env):
    obs, info = env.reset(options={"task": "nextstate__textkit-2"})
    assert obs["role"] == "user" and "truncate" in obs["content"] and "/testbed" in info["system_prompt"]
    assert info["swe_environment"]["python_used"].startswith("3.11")
    obs, r, term, trunc, info = env.step("I think the bug is in trim.py")
    assert info["signals"]["parse_error"] and "```bash" in obs["content"] and not term
    obs, r, term, trunc, info = env.step(
        "```bash\ngit status --short && python -c 'import textkit, sys; print(textkit.__file__)'\n```"
    )
    assert info["signals"]["exit_code"] == 0 and "/testbed/textkit/__init__.py" in obs["content"]
    obs, r, term, trunc, info = env.step("```bash\npython -m pytest -q tests/test_trim.py 2>&1 | tail -1\n```")
    assert "passed" in obs["content"]  # the hidden tests are not there yet: the old ones pass
    obs, r, term, trunc, info = env.step(f"```bash\n{SUBMIT_COMMAND}\n```")
    assert term and r == -1.0 and info["outcome"] == -1.0 and "does not resolve" in obs["content"]
    assert info["signals"]["submitted"] and not info["signals"]["resolved"]
    assert info["swe"]["model_patch"] == "" and info["swe"]["timings"]["eval_s"] > 0


def test_demonstration_is_a_real_resolving_episode(env):
    messages = env.demonstration(next(i for i in INSTANCES if i["instance_id"] == "nextstate__ledger-2"))
    roles = [m["role"] for m in messages]
    assert roles[:2] == ["system", "user"] and roles.count("assistant") == 3
    assert "git apply" in messages[4]["content"] and "exit code: 0" in messages[5]["content"]
    assert "resolves the issue" in messages[-1]["content"]
    assert env.last_result["resolved"] and "ledger/csvio.py" in env.last_result["model_patch"]  # a new file counts


def test_agent_sandbox_boundaries(env):
    env.reset(options={"task": "nextstate__semverlite-1"})
    rt = env.workspace.runtime
    repo_cache = str(env.repos.ensure("nextstate/semverlite"))
    venv = "/opt/nextstate/venv"
    r = rt.exec(
        f"ls {repo_cache} 2>&1; touch {venv}/x 2>&1; "
        "python -c \"import socket; socket.create_connection(('pypi.org', 443), timeout=3)\" 2>&1 | tail -1; "
        "git log --oneline | head -3; id -u"
    )
    assert "No such file or directory" in r.stdout  # the repository's clone (its future included) is not there
    assert r.stdout.count("Read-only file system") == 1
    assert "Error" in r.stdout or "error" in r.stdout  # no network
    assert "SWE-bench" in r.stdout and r.stdout.strip().endswith("1000")
    # the agent may use git freely in its checkout: new objects go to its own store, not the shared cache
    r = rt.exec(
        "echo x >> README.md && git -c user.name=a -c user.email=b commit -qam wip && git stash list && echo ok"
    )
    assert r.ok, r.stderr
    patch = env.workspace.model_patch()
    assert "README.md" in patch  # committed work is still part of the model patch


def test_user_instances_file(env, tmp_path):
    """`env.instances=path.jsonl` with SWE-bench's own row format (test lists as JSON text, as the HF datasets store)."""
    rows = [
        dict(i, FAIL_TO_PASS=json.dumps(i["FAIL_TO_PASS"]), PASS_TO_PASS=json.dumps(i["PASS_TO_PASS"]))
        for i in INSTANCES[:2]
    ]
    for r in rows:
        r.pop("id", None)
        r.pop("split", None)
    path = tmp_path / "lite.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    user_env = SWEEnv(instances=str(path))
    try:
        pool = user_env.task_pool()
        assert [t["id"] for t in pool] == [r["instance_id"] for r in rows]
        report = user_env.grade_patch(pool[0], pool[0]["patch"])
        assert report["resolved"] and report["swebench_version"]
    finally:
        user_env.close()


@pytest.mark.slow  # builds the instance's docker image in the session's fresh engine (2 min)
def test_docker_backend_resolves_and_rejects(docker_host):
    env = SWEEnv(runtime="docker", runtime_options={"docker_host": docker_host})
    try:
        inst = next(i for i in INSTANCES if i["instance_id"] == "nextstate__textkit-1")
        obs, info = env.reset(options={"task": inst})
        r = env.workspace.runtime.exec(
            "id -u; git log --oneline | head -1; python -c 'import textkit; print(textkit.__file__)'"
        )
        assert r.ok and "/testbed/textkit/__init__.py" in r.stdout and "SWE-bench" in r.stdout
        assert not r.stdout.startswith("0\n")
        gold = env.grade_patch(inst, inst["patch"])
        assert gold["resolved"] and gold["runtime"] == "docker"
        empty = env.grade_patch(inst, "")
        assert not empty["resolved"]
        broken = env.grade_patch(
            inst, break_patch(inst["instance_id"], env.repos.ensure(inst["repo"]), inst["base_commit"])
        )
        assert not broken["resolved"] and broken["PASS_TO_PASS"]["failure"]
    finally:
        env.close()


STAMPVER = next(i for i in INSTANCES if i["instance_id"] == "nextstate__stampver-1")


def test_install_products_are_in_every_checkout(env):
    """What the install writes into the repository (setuptools_scm's version file, the .egg-info) is in every episode's
    checkout, out of git's view, as in SWE-bench's instance image; without it every test of the instance fails."""
    env.reset(options={"task": STAMPVER})
    r = env.workspace.runtime.exec(
        "ls src/stampver/_version.py src/*.egg-info/PKG-INFO && git status --porcelain && "
        "python -c 'import stampver; print(\"version\", stampver.__version__)'"
    )
    assert r.ok, r.stderr
    assert "src/stampver/_version.py" in r.stdout and "version 0." in r.stdout
    assert "??" not in r.stdout and " M " not in r.stdout  # nothing untracked or modified: the diff is the agent's
    assert env.workspace.model_patch() == ""
    built = env.backend_for(STAMPVER).environment(STAMPVER, _spec(STAMPVER)).instance
    assert built.products >= 2 and built.install == "python -m pip install -e ."


def test_agent_cannot_reach_the_repositorys_future(env):
    """The clone holds the commit that fixed the instance (after its base commit); no object of it is in the agent's
    checkout or its store, by any git command."""
    clone = env.repos.ensure(STAMPVER["repo"])
    future = git("rev-parse", "HEAD", cwd=clone).strip()
    future_blob = git("rev-parse", "HEAD:src/stampver/label.py", cwd=clone).strip()
    assert future != STAMPVER["base_commit"]
    env.reset(options={"task": STAMPVER})
    rt = env.workspace.runtime
    objects = rt.exec("git cat-file --batch-all-objects --batch-check")
    assert objects.ok and objects.stdout.count("\n") > 5
    assert future not in objects.stdout and future_blob not in objects.stdout
    assert not rt.exec(f"git cat-file -e {future}").ok and not rt.exec(f"git cat-file -e {future_blob}").ok
    assert rt.exec("git log --all --format=%s").stdout.split() == ["SWE-bench", "Initial"]
    assert rt.exec("git grep NEXTSTATE-FUTURE-MARKER $(git rev-list --all)").stdout == ""


def _with_test(inst: dict, name: str, body: str, **extra) -> dict:
    """`inst` with a test patch that adds tests/<name> holding `body` (FAIL_TO_PASS: its one test)."""
    lines = body.splitlines()
    patch = (f"diff --git a/tests/{name} b/tests/{name}\nnew file mode 100644\n--- /dev/null\n+++ b/tests/{name}\n"
             f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}\n" for ln in lines))
    test = re.search(r"def (test_\w+)", body).group(1)
    return dict(inst, instance_id=f"{inst['instance_id']}-{test}", id=f"{inst['instance_id']}-{test}",
                test_patch=patch, FAIL_TO_PASS=[f"tests/{name}::{test}"], PASS_TO_PASS=[], **extra)


def test_tests_that_need_the_network_are_flagged_not_scored_silently(env):
    base = next(i for i in INSTANCES if i["instance_id"] == "nextstate__textkit-1")
    inst = _with_test(base, "test_online.py", "import socket\n\n\ndef test_online():\n"
                      "    socket.getaddrinfo('example.com', 443)\n")
    report = env.grade_patch(inst, inst["patch"])
    assert not report["resolved"] and "gaierror" in report["network_error"]
    fine = env.grade_patch(base, base["patch"])
    assert fine["resolved"] and fine["network_error"] is None


@pytest.mark.slow  # builds a tox environment (20 s)
def test_spec_test_command_runs_as_written_through_tox_current_env(env):
    """sphinx's spec runs `tox --current-env -epy39 -- ...`: tox-current-env links sys.executable into .tox/, and the
    environment's python must still be the environment's there (a venv's is not; a prefix of its own, as conda's,
    is)."""
    base = next(i for i in INSTANCES if i["instance_id"] == "nextstate__textkit-1")
    spec = {
        "python": "3.11",
        "install": "python -m pip install -e .",
        "pip_packages": ["pytest==8.3.3", "tox==4.16.0", "tox-current-env==0.0.11"],
        "pre_install": ["printf '[testenv]\\ncommands = python -m pytest -rA {posargs}\\n' > tox.ini"],
        "test_cmd": "tox --current-env -epy311 --",
    }
    inst = dict(base, nextstate_spec=spec)
    gold = env.grade_patch(inst, inst["patch"])
    log = re.sub(r"\x1b\[[0-9;]*m", "", gold["log_tail"])  # tox colors its output
    assert gold["resolved"] and "py311: commands[0]> python -m pytest -rA" in log, log
    assert not env.grade_patch(inst, "")["resolved"]


def test_validation_pass_writes_the_runnable_subset_and_resumes(tmp_path):
    from envs.swe.validate import Options, run

    base = next(i for i in INSTANCES if i["instance_id"] == "nextstate__textkit-1")
    offline = _with_test(base, "test_online.py", "import socket\n\n\ndef test_online():\n"
                         "    socket.getaddrinfo('example.com', 443)\n")
    rows = [base, offline]
    records = run(rows, None, tmp_path, Options(), workers=2)
    assert records[base["instance_id"]].verdict == "runnable"
    assert records[offline["instance_id"]].cause == "network"
    runnable = [json.loads(ln) for ln in (tmp_path / "runnable.jsonl").read_text().splitlines()]
    assert [r["instance_id"] for r in runnable] == [base["instance_id"]] and runnable[0]["nextstate_runtime"] == "local"
    assert "tests need the network" in (tmp_path / "table.md").read_text()
    again = run(rows, None, tmp_path, Options(), workers=1)  # resumes: nothing is graded again
    assert again[base["instance_id"]].wall_s == records[base["instance_id"]].wall_s


TEXTKIT = next(i for i in INSTANCES if i["instance_id"] == "nextstate__textkit-1")


def test_agent_processes_are_gone_before_grading(env, monkeypatch):
    """Grading starts only after the agent's sandbox is closed: nothing the agent left running sees the grading."""
    from envs.swe.local import LocalSWEBackend
    from tests.sandbox_support import processes_of_uid

    env.reset(options={"task": TEXTKIT})
    uid = env.workspace.runtime.host_uid
    env.workspace.runtime.exec("(sleep 600 &) ; nohup sleep 600 >/dev/null 2>&1 &")  # tries to stay behind
    seen = {}
    real = LocalSWEBackend.evaluate

    def spy(self, *args, **kwargs):
        seen["workspace"] = env.workspace
        seen["processes"] = processes_of_uid(uid) if uid is not None else []
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LocalSWEBackend, "evaluate", spy)
    _, _, term, _, info = env.step(f"```bash\n{SUBMIT_COMMAND}\n```")
    assert term and info["signals"]["submitted"]
    assert seen == {"workspace": None, "processes": []}


@pytest.mark.slow  # builds the instance's docker image (2 min in the session's fresh engine); the local
# backend's same guarantee is in the default tier
def test_docker_agent_container_is_gone_before_grading(docker_host, monkeypatch):
    from envs.swe.docker import DockerSWEBackend

    env = SWEEnv(runtime="docker", runtime_options={"docker_host": docker_host})
    try:
        env.reset(options={"task": TEXTKIT})
        agent = env.workspace.runtime.container.id
        env.workspace.runtime.exec("nohup sleep 600 >/dev/null 2>&1 &")
        seen = {}
        real = DockerSWEBackend.evaluate

        def spy(self, *args, **kwargs):
            seen["alive"] = agent in {c.id for c in self.client.containers.list(all=True)}
            return real(self, *args, **kwargs)

        monkeypatch.setattr(DockerSWEBackend, "evaluate", spy)
        _, _, term, _, info = env.step(f"```bash\n{SUBMIT_COMMAND}\n```")
        assert term and seen == {"alive": False}
    finally:
        env.close()


@pytest.mark.slow  # builds the instance's docker image too
def test_swebench_prebuilt_image_is_used_when_the_engine_has_it(docker_host):
    """An image named as SWE-bench names its instance images (`swebench/sweb.eval.x86_64.<instance>`) is used as it
    is: its /testbed, its conda environment `testbed` under /opt/miniconda3, SWE-bench's eval script unchanged. Built
    here from our own instance image in SWE-bench's layout (no registry is reachable)."""
    from envs.runtime.docker import LABEL
    from envs.swe.docker import swebench_image
    from envs.swe.grading import repo_spec

    ours = SWEEnv(runtime="docker", runtime_options={"docker_host": docker_host, "swebench_images": False})
    name = swebench_image(TEXTKIT["instance_id"])
    client = ours.backend.client
    try:
        built = ours.backend.environment(TEXTKIT, repo_spec(TEXTKIT))
        # SWE-bench's layout: `source /opt/miniconda3/bin/activate; conda activate testbed` puts the environment first
        c = client.containers.create(built.image, ["true"], user="0", network_mode="none", labels={LABEL: "1"})
        c.put_archive("/", _tar({
            "opt/miniconda3/bin/activate":
                'conda() { [ "$1" = activate ] && export PATH=/opt/miniconda3/envs/$2/bin:$PATH; }\n',
            "opt/miniconda3/envs/testbed": "/opt/nextstate/venv",  # a symlink
        }))
        repo, _, tag = name.partition(":")
        c.commit(repository=repo, tag=tag)
        c.remove(force=True)
        env = SWEEnv(runtime="docker", runtime_options={"docker_host": docker_host})
        try:
            official = env.backend.environment(TEXTKIT, repo_spec(TEXTKIT))
            assert official.official and official.image == name and official.instance.source == "swebench image"
            gold = env.grade_patch(TEXTKIT, TEXTKIT["patch"])
            assert gold["resolved"] and "conda activate testbed" in gold["log_tail"], gold["log_tail"]
            assert not env.grade_patch(TEXTKIT, "")["resolved"]
            env.reset(options={"task": TEXTKIT})
            r = env.workspace.runtime.exec("command -v python; id -u; git status --porcelain")
            assert r.stdout.startswith("/opt/miniconda3/envs/testbed/bin/python") and "\n0\n" not in r.stdout
        finally:
            env.close()
    finally:
        ours.close()
        try:
            client.images.remove(name, force=True)
        except Exception:
            pass


def _tar(entries: dict[str, str]) -> bytes:
    """A tar stream of files (text) and, for a value starting with '/', symlinks to it."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, value in entries.items():
            info = tarfile.TarInfo(path)
            if value.startswith("/"):
                info.type, info.linkname = tarfile.SYMTYPE, value
                tar.addfile(info)
            else:
                data = value.encode()
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
