"""The local SWE backend: SWE-bench's two image layers as directories, every command in bubblewrap.

Inside every sandbox the checkout is at /testbed and the environment at /opt/nextstate/venv, as in SWE-bench's images.
- The environment of (repo, version) (SWE-bench's env image): an interpreter prefix of its own (a hard-linked copy of
  a pyenv interpreter, as a conda environment is: envs.swe.prefix) with the spec's packages from PyPI, built once in a
  sandbox that may reach PyPI (a trusted step: only the spec's install commands run there). The interpreter is the one
  the spec asks for when this machine has it (pyenv), else the closest; the choice is written next to the environment
  and into every result.
- The instance (SWE-bench's instance image), built once per instance: a repository store holding the base commit and
  its history and nothing later (envs.swe.repos.instance_store: the fix and the hidden tests are not in it), and the
  spec's pre_install steps and install run in a checkout of the base commit, into the instance's own copy of the
  environment (`link_copy`: hard links to the (repo, version) environment's files, which the build may replace but not
  write into). What the install
  left in the checkout (version files, compiled extensions, .egg-info) is kept as a tarball.
Each episode gets a fresh checkout from the instance's store (`git clone --shared`: its own index, refs and new
objects, so the agent can use every git command), the install's products restored, the spec's repo-changing
pre_install steps run and committed (as the official instance image does: the agent's `git diff` holds its own changes
only), and the instance's environment mounted read-only.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envs.cache import cache_dir as nextstate_cache_dir
from envs.runtime.host_paths import file_lock, reachable_copy
from envs.runtime.local import Limits, LocalConfig, LocalRuntime, Mount
from envs.swe.backend import (
    GRADING_LIMITS,
    LAYOUT,
    build_env,
    EnvironmentInfo,
    InstanceInfo,
    SWEBackend,
    Workspace,
    checkout_steps,
    install_dependencies,
    install_instance,
    open_workspace,
)
from envs.swe.cutoff import DEFAULT_CUTOFF, TOOLS_DIR, check_cutoff, uv_tools_dir
from envs.swe.grading import REPO_DIR, VENV_DIR, RepoSpec
from envs.swe.prefix import link_copy
from envs.swe.pythons import PythonChoice, choose_python
from envs.swe.repos import RepoStore, instance_store
from envs.swe.requirements import read_requirements

log = logging.getLogger(__name__)

BUILD_LIMITS = Limits(
    cpu_seconds=7200,
    memory_bytes=16 << 30,
    processes=1024,
    file_bytes=8 << 30,
    open_files=4096,
    output_bytes=64 << 20,
    tmpfs_bytes=4 << 30,
    timeout_s=3600,
)
INFO_FILE = "nextstate-venv.json"
INSTANCE_FILE = "nextstate-instance.json"


@dataclass
class LocalEnvironment:
    """An instance ready to check out: its environment (with the install), its store, what was built."""

    venv_dir: Path  # the instance's environment
    store: Path  # the instance's repository store
    info: EnvironmentInfo  # the (repo, version) environment
    instance: InstanceInfo
    mounts: list[Mount]  # the store and the environment (read-only) and the interpreter tree, for every sandbox
    official: bool = False


class LocalSWEBackend(SWEBackend):
    def __init__(
        self,
        repos: RepoStore,
        cache_dir: Path | None = None,
        runtime_options: dict[str, Any] | None = None,
        history: str = "full",
        pypi_cutoff: str = DEFAULT_CUTOFF,
    ):
        self.repos = repos
        self.cache_dir = Path(cache_dir) if cache_dir else nextstate_cache_dir("swe")
        self.runtime_options = dict(runtime_options or {})
        self.history = history
        self.cutoff = check_cutoff(pypi_cutoff)
        self._envs: dict[str, LocalEnvironment] = {}

    # ----- environments -----
    def environment(self, instance: dict[str, Any], spec: RepoSpec) -> LocalEnvironment:
        """The instance's environment: the (repo, version) venv and the instance layer, each built on first use (one
        builder at a time across processes)."""
        choice = choose_python(spec.python)
        build = f"{spec.key}{LAYOUT}{self.cutoff.replace('-', '')}"  # what the builds depend on besides the repo
        env_key = f"{spec.repo.replace('/', '__')}__{spec.version}__py{choice.interpreter.full}__{build}"
        inst_key = f"{instance['instance_id']}__{build}__{instance['base_commit'][:12]}__{self.history}"
        if inst_key in self._envs:
            return self._envs[inst_key]
        base = self._base_venv(instance, spec, choice, env_key)
        info = EnvironmentInfo(**json.loads((base / INFO_FILE).read_text()))
        inst_dir = self.cache_dir / "instances" / inst_key
        with file_lock(self.cache_dir / "instances" / f".{inst_key}.lock"):
            if not (inst_dir / INSTANCE_FILE).exists():
                _built_or_dropped(inst_dir, lambda: self._build_instance(instance, spec, choice, base, inst_dir,
                                                                         inst_key))
        inst = InstanceInfo(**json.loads((inst_dir / INSTANCE_FILE).read_text()))
        store, venv = inst_dir / "repo.git", inst_dir / "venv"
        mounts = [Mount(str(store), str(store)), Mount(str(venv), VENV_DIR), *self._python_mounts(choice)]
        env = LocalEnvironment(venv, store, info, inst, mounts)
        self._envs[inst_key] = env
        return env

    def _base_venv(self, instance: dict[str, Any], spec: RepoSpec, choice: PythonChoice, key: str) -> Path:
        venv_dir = self.cache_dir / "venvs" / key
        with file_lock(self.cache_dir / "venvs" / f".{key}.lock"):
            if not (venv_dir / INFO_FILE).exists():
                _built_or_dropped(venv_dir, lambda: self._build_base(instance, spec, choice, venv_dir, key))
        return venv_dir

    def _python_mounts(self, choice: PythonChoice) -> list[Mount]:
        """Make the interpreter tree visible at its own path in the sandbox (venvs link to it); e.g. pyenv under /root
        (mode 700), which the sandbox's uid cannot bind, is mirrored (hard links when possible)."""
        prefix = choice.interpreter.prefix
        if prefix == "/usr" or prefix.startswith("/usr/"):
            return []
        return [Mount(str(reachable_copy(prefix, self.cache_dir, name=f"python-{choice.interpreter.full}")), prefix)]

    def _build_runtime(self, mounts: list[Mount], writable: Path) -> LocalRuntime:
        os.chmod(writable.parent, 0o755)
        tools = [Mount(str(uv_tools_dir(self.cache_dir)), TOOLS_DIR)] if self.cutoff else []
        return LocalRuntime(
            LocalConfig(
                mount_point=REPO_DIR,
                mounts=[*mounts, *tools, Mount(str(writable), VENV_DIR, writable=True)],
                network=True,
                limits=BUILD_LIMITS,
                env=build_env(),
            )
        )

    def _build_base(self, instance: dict[str, Any], spec: RepoSpec, choice: PythonChoice, venv_dir: Path, key: str):
        t0 = time.monotonic()
        commit = instance.get("environment_setup_commit") or instance["base_commit"]
        partial = _fresh(venv_dir.with_name(venv_dir.name + f".partial-{os.getpid()}"))
        notes: list[str] = []
        if not choice.exact:
            notes.append(f"python {spec.python} is not installed here; used {choice.interpreter.full}")
        with tempfile.TemporaryDirectory(prefix="nextstate-swe-env-", dir=partial.parent) as tmp:
            os.chmod(tmp, 0o755)
            mounts = self._python_mounts(choice)
            if spec.reads_checkout:  # the environment_setup_commit's requirement files, as SWE-bench reads them
                clone = self.repos.ensure(spec.repo, commit)
                store = instance_store(clone, commit, Path(tmp) / "store.git", "shallow")  # its files only
                mounts.append(Mount(str(store), str(store)))
            rt = self._build_runtime(mounts, partial)
            try:
                link_copy(Path(choice.interpreter.prefix), partial, rt.host_uid)  # the environment's prefix
                run = _runner(rt, f"building the environment {key}")
                if spec.reads_checkout:
                    run(f"git clone -q --shared -n {shlex.quote(str(store))} . && git checkout -q --detach {commit}")
                read = lambda cmd: rt.run(cmd, timeout=600).stdout.decode()  # noqa: E731
                info = install_dependencies(
                    run, read, spec, choice, key, lambda: read_requirements(_file_reader(rt), spec, notes), notes,
                    self.cutoff,
                )
            finally:
                rt.close()
        info.build_s = time.monotonic() - t0
        (partial / INFO_FILE).write_text(json.dumps(asdict(info), indent=1))
        _seal(partial, venv_dir)
        log.info("built %s in %.1f s (%s)", key, info.build_s, choice.describe())

    def _build_instance(
        self, instance: dict[str, Any], spec: RepoSpec, choice: PythonChoice, base: Path, inst_dir: Path, key: str
    ):
        t0 = time.monotonic()
        inst_dir.parent.mkdir(parents=True, exist_ok=True)
        partial = _fresh(inst_dir.with_name(inst_dir.name + f".partial-{os.getpid()}"))
        clone = self.repos.ensure(spec.repo, instance["base_commit"])
        store = instance_store(clone, instance["base_commit"], partial / "repo.git", self.history)
        t1 = time.monotonic()
        venv = partial / "venv"
        venv.mkdir()
        rt = self._build_runtime([Mount(str(store), str(store)), *self._python_mounts(choice)], venv)
        try:
            link_copy(base, venv, rt.host_uid)
            run = _runner(rt, f"installing {instance['instance_id']}")
            for step in checkout_steps(str(store), instance["base_commit"], spec, products=False):
                run(step)
            read = lambda cmd: rt.run(cmd, timeout=600).stdout.decode()  # noqa: E731
            install, count, size = install_instance(run, read, spec, cutoff=self.cutoff)
        finally:
            rt.close()
        info = InstanceInfo(
            instance_id=instance["instance_id"],
            base_commit=instance["base_commit"],
            key=key,
            history=self.history,
            install=install,
            products=count,
            products_bytes=size,
            store_s=t1 - t0,
            install_s=time.monotonic() - t1,
        )
        (partial / INSTANCE_FILE).write_text(json.dumps(asdict(info), indent=1))
        _seal(partial, inst_dir)
        log.info("built instance %s: store %.1f s, install %.1f s, %d products (%.1f MB)",
                 key, info.store_s, info.install_s, count, size / 1e6)

    # ----- episodes -----
    def open(self, instance: dict[str, Any], spec: RepoSpec, env: LocalEnvironment, *, grading: bool = False
             ) -> Workspace:
        opts = dict(self.runtime_options)
        opts.pop("docker_host", None)  # the docker backend's (runtime=auto shares the options)
        user_env = dict(opts.pop("env", {}) or {})
        limits = GRADING_LIMITS if grading else opts.pop("limits", None)
        opts.pop("limits", None)
        cfg = LocalConfig(
            mount_point=REPO_DIR,
            mounts=[*env.mounts, *[Mount(**m) for m in opts.pop("mounts", [])]],
            env={
                "HOME": "/tmp",
                "PATH": f"{VENV_DIR}/bin:/usr/local/bin:/usr/bin:/bin",
                **user_env,
            },
            limits=Limits(**limits) if isinstance(limits, dict) else (limits or Limits()),
            **opts,
        )
        rt = LocalRuntime(cfg)
        return open_workspace(rt, str(env.store), instance, spec)


def _built_or_dropped(final: Path, build) -> None:
    """Run `build` (which writes `<final>.partial-<pid>` and renames it to `final`); a failed build leaves nothing."""
    try:
        build()
    except BaseException:
        shutil.rmtree(final.with_name(final.name + f".partial-{os.getpid()}"), ignore_errors=True)
        raise


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _seal(partial: Path, final: Path) -> None:
    """Make what a build wrote root's (the sandbox uid that built it owns nothing in it) and put it in place."""
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "-h", "0:0", str(partial)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(partial)], check=True)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)


def _file_reader(rt: LocalRuntime):
    def read(path: str) -> str:
        return rt.read_file(path).decode()

    return read


def _runner(rt: LocalRuntime, what: str):
    def run(cmd: str) -> None:
        r = rt.exec(cmd, timeout=BUILD_LIMITS.timeout_s)
        if not r.ok:
            raise RuntimeError(
                f"{what}: `{cmd[:300]}` failed (exit {r.exit_code}, timed out {r.timed_out}):\n"
                f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )

    return run
