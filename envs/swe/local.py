"""The local SWE backend: a venv per (repo, version) built once from PyPI, and a checkout per episode, in bubblewrap.

Inside every sandbox the checkout is at /testbed and the venv at /opt/nextstate/venv, as in SWE-bench's images. The venv
is built once in a sandbox that may reach PyPI (a trusted step: only the spec's install commands run there), with the
repo's editable install pointing at /testbed; every later sandbox mounts it read-only, so whichever checkout is mounted
at /testbed is what Python imports. The interpreter is the one the spec asks for when this machine has it (pyenv), else
the closest; the choice is written next to the venv and into every result.

A checkout borrows the objects of the cached clone (`git clone --shared`) and has its own index, refs and objects, so the
agent can use every git command. The spec's repo-changing pre_install steps run in it and are committed (as the official
instance image does), so the agent's `git diff` holds its own changes only.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envs.runtime.host_paths import reachable_copy
from envs.runtime.local import Limits, LocalConfig, LocalRuntime, Mount
from envs.swe.backend import EnvironmentInfo, SWEBackend, Workspace, install_environment, open_workspace
from envs.swe.grading import (
    REPO_DIR,
    VENV_DIR,
    RepoSpec,
    clean_requirements,
    requirement_paths,
)
from envs.cache import cache_dir as nextstate_cache_dir
from envs.swe.pythons import PythonChoice, choose_python
from envs.swe.repos import RepoStore, file_lock

log = logging.getLogger(__name__)

BUILD_LIMITS = Limits(
    cpu_seconds=3600,
    memory_bytes=16 << 30,
    processes=1024,
    file_bytes=8 << 30,
    open_files=4096,
    output_bytes=64 << 20,
    tmpfs_bytes=4 << 30,
    timeout_s=1800,
)


@dataclass
class LocalEnvironment:
    venv_dir: Path
    info: EnvironmentInfo
    mounts: list[Mount]  # the venv (read-only) and the interpreter tree, for every sandbox of this environment


class LocalSWEBackend(SWEBackend):
    def __init__(self, repos: RepoStore, cache_dir: Path | None = None, runtime_options: dict[str, Any] | None = None):
        self.repos = repos
        self.cache_dir = Path(cache_dir) if cache_dir else nextstate_cache_dir("swe")
        self.runtime_options = dict(runtime_options or {})
        self._envs: dict[str, LocalEnvironment] = {}

    # ----- environments -----
    def environment(self, instance: dict[str, Any], spec: RepoSpec) -> LocalEnvironment:
        """The venv for the instance's (repo, version), built on first use (one builder at a time across processes)."""
        choice = choose_python(spec.python)
        key = f"{spec.repo.replace('/', '__')}__{spec.version}__py{choice.interpreter.full}__{spec.key}"
        if key in self._envs:
            return self._envs[key]
        venv_dir = self.cache_dir / "venvs" / key
        with file_lock(self.cache_dir / "venvs" / f".{key}.lock"):
            if not (venv_dir / "nextstate-venv.json").exists():
                self._build(instance, spec, choice, venv_dir, key)
        info = EnvironmentInfo(**json.loads((venv_dir / "nextstate-venv.json").read_text()))
        env = LocalEnvironment(venv_dir, info, [Mount(str(venv_dir), VENV_DIR), *self._python_mounts(choice)])
        self._envs[key] = env
        return env

    def _python_mounts(self, choice: PythonChoice) -> list[Mount]:
        """Make the interpreter tree visible at its own path in the sandbox (venvs link to it); e.g. pyenv under /root
        (mode 700), which the sandbox's uid cannot bind, is mirrored (hard links when possible)."""
        prefix = choice.interpreter.prefix
        if prefix == "/usr" or prefix.startswith("/usr/"):
            return []
        return [Mount(str(reachable_copy(prefix, self.cache_dir, name=f"python-{choice.interpreter.full}")), prefix)]

    def _build(self, instance: dict[str, Any], spec: RepoSpec, choice: PythonChoice, venv_dir: Path, key: str) -> None:
        t0 = time.monotonic()
        repo_path = self.repos.ensure(spec.repo, instance.get("environment_setup_commit") or instance["base_commit"])
        commit = instance.get("environment_setup_commit") or instance["base_commit"]
        partial = venv_dir.with_name(venv_dir.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        os.chmod(venv_dir.parent, 0o755)
        mounts = [
            Mount(str(repo_path), str(repo_path)),
            Mount(str(partial), VENV_DIR, writable=True),
            *self._python_mounts(choice),
        ]
        rt = LocalRuntime(
            LocalConfig(
                mount_point=REPO_DIR,
                mounts=mounts,
                network=True,
                limits=BUILD_LIMITS,
                env={"HOME": "/tmp", "PIP_NO_CACHE_DIR": "1"},
            )
        )
        notes: list[str] = []
        if not choice.exact:
            notes.append(f"python {spec.python} is not installed here; used {choice.interpreter.full}")
        try:
            if rt.host_uid is not None:
                os.chown(partial, rt.host_uid, rt.host_uid)
            run = _runner(rt, f"building the environment {key}")
            run(f"git clone -q --shared -n {shlex.quote(str(repo_path))} . && git checkout -q --detach {commit}")
            for step in spec.repo_steps():
                run(step)
            # /tmp is private to each command: install_environment writes the requirements and installs them in one
            info = install_environment(
                run,
                lambda cmd: rt.run(cmd, timeout=120).stdout.decode(),
                spec,
                choice,
                key,
                lambda: self._requirements(rt, spec.repo),
                notes,
            )
        finally:
            rt.close()
        info.build_s = time.monotonic() - t0
        (partial / "nextstate-venv.json").write_text(json.dumps(asdict(info), indent=1))
        if os.geteuid() == 0:  # from now on the sandbox uid that built it owns nothing in it
            subprocess.run(["chown", "-R", "-h", "0:0", str(partial)], check=True)
        shutil.rmtree(venv_dir, ignore_errors=True)
        partial.rename(venv_dir)
        log.info("built %s in %.1f s (%s)", key, info.build_s, choice.describe())

    def _requirements(self, rt: LocalRuntime, repo: str) -> str:
        for path in requirement_paths(repo):
            try:
                text = rt.read_file(path).decode()
            except (FileNotFoundError, OSError):
                continue
            lines = []
            for line in text.splitlines():
                if line.strip().startswith("-r"):
                    ref = os.path.normpath(os.path.join(os.path.dirname(path), line.strip()[2:].strip()))
                    try:
                        lines += rt.read_file(ref).decode().splitlines()
                    except (FileNotFoundError, OSError):
                        pass
                else:
                    lines.append(line)
            return clean_requirements("\n".join(lines))
        raise FileNotFoundError(f"{repo}: no requirements file at {requirement_paths(repo)}")

    # ----- episodes -----
    def open(self, instance: dict[str, Any], spec: RepoSpec, env: LocalEnvironment) -> Workspace:
        repo_path = self.repos.ensure(spec.repo, instance["base_commit"])
        opts = dict(self.runtime_options)
        user_env = dict(opts.pop("env", {}) or {})
        limits = opts.pop("limits", None)
        cfg = LocalConfig(
            mount_point=REPO_DIR,
            mounts=[Mount(str(repo_path), str(repo_path)), *env.mounts, *[Mount(**m) for m in opts.pop("mounts", [])]],
            env={
                "HOME": "/tmp",
                "VIRTUAL_ENV": VENV_DIR,
                "PATH": f"{VENV_DIR}/bin:/usr/local/bin:/usr/bin:/bin",
                **user_env,
            },
            limits=Limits(**limits) if isinstance(limits, dict) else (limits or Limits()),
            **opts,
        )
        rt = LocalRuntime(cfg)
        return open_workspace(rt, repo_path, instance, spec, env.info)


def _runner(rt: LocalRuntime, what: str):
    def run(cmd: str) -> None:
        r = rt.exec(cmd, timeout=BUILD_LIMITS.timeout_s)
        if not r.ok:
            raise RuntimeError(
                f"{what}: `{cmd[:300]}` failed (exit {r.exit_code}, timed out {r.timed_out}):\n"
                f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )

    return run
