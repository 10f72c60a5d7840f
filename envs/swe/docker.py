"""The docker SWE backend: SWE-bench's two image layers built locally, or SWE-bench's images when the engine has them.

- Environment image per (repo, version), built offline of any registry from the spec: on the SWE base image (the test
  image's Debian plus the compilers and libraries SWE-bench's base image carries: envs.swe.docker_base), the spec's
  system steps (`apt-get install ...`, run as written, from Debian's packages), this machine's pyenv interpreter of the
  spec's Python (copied in at its own path) and its copy as the environment's prefix at /opt/nextstate/venv
  (envs.swe.prefix) with the spec's packages from PyPI. SWE-bench makes a conda environment; no conda can be
  downloaded here, so `packages` (a requirements file, an environment.yml, conda package names) come from PyPI
  (envs.swe.requirements).
- Instance image per instance: the instance's repository store (its base commit and history, nothing later: the fix
  and the hidden tests are not in it) cloned at /testbed, the spec's pre_install steps and install run there, committed
  as SWE-bench's "SWE-bench" commit, owned by the agent's uid. The build containers use the host network; no other
  container does.
- `swebench/sweb.eval.x86_64.<instance>` (SWE-bench's own prebuilt instance image) is used instead when the engine
  already has it: its /testbed and conda environment as they are, and SWE-bench's eval script as it is.
Each episode is a fresh container of the instance image (no network, limits from DockerConfig, a non-root user).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from envs.cache import cache_dir as nextstate_cache_dir
from envs.runtime.docker import LABEL, DockerConfig, DockerRuntime, docker_client
from envs.runtime.host_paths import file_lock
from envs.swe.backend import (
    GRADING_LIMITS,
    HOST_CA_BUNDLE,
    LAYOUT,
    SETUP_IDENTITY,
    EnvironmentInfo,
    InstanceInfo,
    SWEBackend,
    Workspace,
    checkout_steps,
    exclude_products_step,
    install_dependencies,
    install_instance,
    run_eval,
)
from envs.swe.cutoff import DEFAULT_CUTOFF, UV, check_cutoff, uv_tools_dir
from envs.swe.docker_base import ensure_swe_base_image
from envs.swe.grading import REPO_DIR, VENV_DIR, RepoSpec
from envs.swe.pythons import PythonChoice, choose_python, installed_interpreters
from envs.swe.repos import RepoStore, instance_store
from envs.swe.requirements import read_requirements

log = logging.getLogger(__name__)

STORE_IN_IMAGE = "/opt/nextstate/repo.git"
ENV_LABEL = "nextstate.swe.environment"
INSTANCE_LABEL = "nextstate.swe.instance"
HEAD_LABEL = "nextstate.swe.head"
BUILD_CA_BUNDLE = "/tmp/nextstate-build-ca.crt"
SWEBENCH_IMAGE = "swebench/sweb.eval.x86_64.{}:latest"  # SWE-bench's instance images (`__` written `_1776_`)
SWEBENCH_ENV = "/opt/miniconda3/envs/testbed"
GRADING_CONTAINER = {"limits": GRADING_LIMITS, "memory_bytes": 16 << 30, "pids": 4096}  # a test suite's limits


@dataclass
class DockerEnvironment:
    image: str  # the instance image
    info: EnvironmentInfo
    instance: InstanceInfo
    head: str  # the setup commit in the image's /testbed
    official: bool = False  # SWE-bench's own image


def swebench_image(instance_id: str) -> str:
    """The name of SWE-bench's prebuilt instance image of `instance_id`."""
    return SWEBENCH_IMAGE.format(instance_id.replace("__", "_1776_")).lower()


class DockerSWEBackend(SWEBackend):
    def __init__(
        self,
        repos: RepoStore,
        options: dict[str, Any] | None = None,
        history: str = "full",
        pypi_cutoff: str = DEFAULT_CUTOFF,
        cache_dir: Path | None = None,
    ):
        opts = dict(options or {})
        self.repos = repos
        self.history = history
        self.cutoff = check_cutoff(pypi_cutoff)
        self.cache_dir = Path(cache_dir) if cache_dir else nextstate_cache_dir("swe")
        self.client = docker_client(opts.pop("docker_host", None))
        self.base_image = opts.pop("image", None)  # None: the SWE base image (built on first use)
        self.use_swebench_images = bool(opts.pop("swebench_images", True))
        self.container_options = opts  # other DockerConfig fields (memory_bytes, cpus, pids, user, limits, ...)
        self.user = opts.get("user", DockerConfig.user)
        self._envs: dict[str, DockerEnvironment] = {}

    # ----- environments -----
    def environment(self, instance: dict[str, Any], spec: RepoSpec) -> DockerEnvironment:
        import docker

        iid = instance["instance_id"]
        if self.use_swebench_images:
            try:
                image = self.client.images.get(swebench_image(iid))
                return self._official(instance, spec, image)
            except docker.errors.ImageNotFound:
                pass
        choice = self._choose_python(spec.python)
        repo = spec.repo.replace("/", "__").lower()
        build = f"{spec.key}{LAYOUT}{self.cutoff.replace('-', '')}"  # what the builds depend on besides the repo
        env_tag = f"nextstate-swe/{repo}:{spec.version}-py{choice.interpreter.full}-{build}"
        key = f"{iid}__{build}__{instance['base_commit'][:12]}__{self.history}"
        inst_tag = f"nextstate-swe-inst/{iid.lower()}:{build}-{instance['base_commit'][:12]}-{self.history}"
        if key in self._envs:
            return self._envs[key]
        build_env = lambda: self._build_env(instance, spec, choice, env_tag)  # noqa: E731
        image = self._image(inst_tag, lambda: self._build_instance(instance, spec, self._image(env_tag, build_env),
                                                                   inst_tag, key))
        env = DockerEnvironment(
            inst_tag,
            EnvironmentInfo(**json.loads(image.labels[ENV_LABEL])),
            InstanceInfo(**json.loads(image.labels[INSTANCE_LABEL])),
            image.labels[HEAD_LABEL],
        )
        self._envs[key] = env
        return env

    def _image(self, tag: str, build):
        """The image `tag` from the engine, built by `build()` when missing (one builder at a time across processes
        and threads: two instances of one (repo, version) would otherwise both build its environment)."""
        import docker

        locks = self.cache_dir / "image-locks"
        with file_lock(locks / f".{tag.replace('/', '__').replace(':', '__')}.lock"):
            try:
                return self.client.images.get(tag)
            except docker.errors.ImageNotFound:
                return build()

    def _official(self, instance: dict[str, Any], spec: RepoSpec, image) -> DockerEnvironment:
        tag = swebench_image(instance["instance_id"])
        head = self._one_shot(tag, f"git -C {REPO_DIR} rev-parse HEAD").strip()
        python = self._one_shot(tag, f"{SWEBENCH_ENV}/bin/python -c 'import platform as p; print(p.python_version())'")
        version = python.strip()
        info = EnvironmentInfo(
            key=tag, repo=spec.repo, version=spec.version, python_requested=spec.python, python_used=version,
            python_exact=version.startswith(spec.python + "."), python_executable=f"{SWEBENCH_ENV}/bin/python",
            notes=["SWE-bench's own instance image"],
        )
        inst = InstanceInfo(instance_id=instance["instance_id"], base_commit=instance["base_commit"], key=image.id,
                            history="full", install=spec.install, source="swebench image")
        return DockerEnvironment(tag, info, inst, head, official=True)

    def _one_shot(self, image: str, cmd: str) -> str:
        out = self.client.containers.run(image, ["/bin/bash", "-c", cmd], remove=True, network_mode="none",
                                         labels={LABEL: "1"})
        return out.decode(errors="replace")

    def _choose_python(self, requested: str) -> PythonChoice:
        return choose_python(requested, tuple(i for i in installed_interpreters() if i.prefix != "/usr"))

    def _build_env(self, instance: dict[str, Any], spec: RepoSpec, choice: PythonChoice, tag: str):
        t0 = time.monotonic()
        commit = instance.get("environment_setup_commit") or instance["base_commit"]
        notes: list[str] = []
        if not choice.exact:
            notes.append(f"python {spec.python} is not available; used {choice.interpreter.full}")
        with tempfile.TemporaryDirectory(prefix="nextstate-swe-env-") as tmp, _BuildContainer(self, self._base()) as c:
            if spec.reads_checkout:  # the environment_setup_commit's requirement files, as SWE-bench reads them
                clone = self.repos.ensure(spec.repo, commit)
                store = instance_store(clone, commit, Path(tmp) / "store.git", "shallow")  # its files only
                c.put_tree(str(store), STORE_IN_IMAGE)
            for step in spec.skipped_steps():  # apt-get ...: Debian's packages, as root, in this build only
                c.run(f"export DEBIAN_FRONTEND=noninteractive; {step}", "/")
            # the interpreter's tree as the environment's prefix (envs.swe.prefix), and its shared library at its own
            # path too (the binary's RUNPATH)
            prefix = choice.interpreter.prefix
            c.put_tree(prefix, VENV_DIR)
            for lib in sorted(Path(prefix, "lib").glob("libpython*")):
                c.put_tree(str(lib), str(lib))
            parents = [str(p) for p in PurePosixPath(prefix).parents if str(p) != "/"]
            c.run(f"chmod o+x {' '.join(shlex.quote(p) for p in parents)}", "/")
            c.run(f"mkdir -p {REPO_DIR}" + (f" && git clone -q {STORE_IN_IMAGE} {REPO_DIR}" if spec.reads_checkout
                                              else ""), "/")
            info = install_dependencies(
                c.run, c.run, spec, choice, tag, lambda: read_requirements(c.read_file, spec, notes), notes,
                self.cutoff,
            )
            c.run(f"rm -rf {REPO_DIR} {STORE_IN_IMAGE} /tmp/*.in /tmp/*.pins /tmp/uv-cache", "/")
            info.build_s = time.monotonic() - t0
            image = c.commit(tag, {ENV_LABEL: json.dumps(asdict(info))})
        log.info("built environment image %s in %.1f s", tag, time.monotonic() - t0)
        return image

    def _build_instance(self, instance: dict[str, Any], spec: RepoSpec, env_image, tag: str, key: str):
        t0 = time.monotonic()
        base = instance["base_commit"]
        clone = self.repos.ensure(spec.repo, base)
        with tempfile.TemporaryDirectory(prefix="nextstate-swe-inst-") as tmp, _BuildContainer(self, env_image.id) as c:
            store = instance_store(clone, base, Path(tmp) / "store.git", self.history)
            c.put_tree(str(store), STORE_IN_IMAGE)
            t1 = time.monotonic()
            c.run(f"mkdir -p {REPO_DIR}", "/")
            for step in checkout_steps(STORE_IN_IMAGE, base, spec, products=False):
                c.run(step)
            install, count, size = install_instance(c.run, c.run, spec, archive=False, cutoff=self.cutoff)
            c.run(exclude_products_step())
            head = c.run(f"git {SETUP_IDENTITY} commit --allow-empty --no-verify -qam SWE-bench && git rev-parse HEAD")
            head = head.strip().splitlines()[-1]
            c.run(f"chown -R {self.user} {REPO_DIR}", "/")
            info = InstanceInfo(instance_id=instance["instance_id"], base_commit=base, key=key, history=self.history,
                                install=install, products=count, products_bytes=size, store_s=t1 - t0,
                                install_s=time.monotonic() - t1)
            image = c.commit(tag, {ENV_LABEL: env_image.labels[ENV_LABEL], INSTANCE_LABEL: json.dumps(asdict(info)),
                                   HEAD_LABEL: head})
        log.info("built instance image %s in %.1f s (%d products, %.1f MB)", tag, time.monotonic() - t0, count,
                 size / 1e6)
        return image

    def _base(self) -> str:
        return self.base_image or ensure_swe_base_image(self.client)

    # ----- episodes -----
    def open(self, instance: dict[str, Any], spec: RepoSpec, env: DockerEnvironment, *, grading: bool = False
             ) -> Workspace:
        """A fresh container of the instance image. `grading`: the grading's (GRADING_LIMITS); in SWE-bench's own
        image its script runs as root (nothing of the agent's is in it; a root command's cleanup must not end the
        container)."""
        path = f"{SWEBENCH_ENV}/bin:/opt/miniconda3/bin" if env.official else f"{VENV_DIR}/bin"
        cfg = DockerConfig(
            image=env.image,
            workdir=REPO_DIR,
            workdir_tmpfs=False,
            read_only_rootfs=False,
            env={
                "HOME": "/tmp",
                "VIRTUAL_ENV": SWEBENCH_ENV if env.official else VENV_DIR,
                "PATH": f"{path}:/usr/local/bin:/usr/bin:/bin",
                "GIT_CONFIG_SYSTEM": "/etc/gitconfig",
            },
            **{**self.container_options, **(GRADING_CONTAINER if grading else {}),
               **({"keep_background": True} if grading and env.official else {})},
        )
        rt = DockerRuntime(cfg, client=self.client)
        if env.official:
            # SWE-bench's images run everything as root. The agent here is not: it gets the checkout. The grading
            # runs as root, whose commands keep no capabilities (no DAC override): root gets the checkout back.
            owner = "0:0" if grading else self.user
            code, out = rt.container.exec_run(
                ["/bin/sh", "-c", f"chown -R {owner} {REPO_DIR} && git config --system safe.directory '*'"], user="0"
            )
            if code != 0:
                rt.close()
                raise RuntimeError(f"preparing {env.image} failed ({code}): {out.decode(errors='replace')[-2000:]}")
        return Workspace(rt, env.head)

    def evaluate(self, instance: dict[str, Any], spec: RepoSpec, env: DockerEnvironment, patch: str, timeout: float):
        if not env.official:
            return super().evaluate(instance, spec, env, patch, timeout)
        t0 = time.monotonic()
        ws = self.open(instance, spec, env, grading=True)
        checkout_s = time.monotonic() - t0
        try:  # SWE-bench's eval script as it is: as root, as in its harness (the agent is long gone)
            run = run_eval(_AsRoot(ws.runtime), instance, spec, patch, timeout, official=True)
        finally:
            ws.close()
        run.checkout_s = checkout_s
        return run


class _AsRoot:
    """A DockerRuntime's run/write_file as root (SWE-bench's eval runs as root in its own images)."""

    def __init__(self, rt: DockerRuntime):
        self.rt = rt

    def write_file(self, path: str, data: str) -> None:
        q = shlex.quote(path)
        r = self.rt.run(f'mkdir -p -- "$(dirname -- {q})" && cat > {q}', timeout=30, stdin=data.encode(), user="0")
        if r.exit_code != 0:
            raise OSError(f"writing {path} in the container failed ({r.exit_code}): {r.stderr.decode(errors='ignore')}")

    def run(self, cmd: str, timeout: float | None = None, output_limit: int | None = None):
        return self.rt.run(cmd, timeout=timeout, output_limit=output_limit, user="0")


class _BuildContainer:
    """A root container of `image` on the host network for one trusted build step (the spec's commands only)."""

    def __init__(self, backend: DockerSWEBackend, image: str):
        self.backend = backend
        self.client = backend.client
        self.image = image
        self.env = {"HOME": "/root", "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": "/dev/null",
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1", "DEBIAN_FRONTEND": "noninteractive"}
        self.container = None

    def __enter__(self) -> _BuildContainer:
        self.container = self.client.containers.run(
            self.image, ["sleep", "infinity"], detach=True, network_mode="host", user="0", labels={LABEL: "1"}
        )
        if self.backend.cutoff:
            self.put_tree(str(uv_tools_dir(self.backend.cache_dir) / "uv"), UV)
        if os.path.isfile(HOST_CA_BUNDLE):
            # networks that intercept TLS use a CA the image lacks: trust the host's bundle while building only
            self.put_tree(HOST_CA_BUNDLE, BUILD_CA_BUNDLE)
            self.env.update(PIP_CERT=BUILD_CA_BUNDLE, SSL_CERT_FILE=BUILD_CA_BUNDLE, REQUESTS_CA_BUNDLE=BUILD_CA_BUNDLE)
        self.run("git config --system safe.directory '*'", "/")
        return self

    def __exit__(self, *exc) -> None:
        self.container.remove(force=True)

    def run(self, cmd: str, workdir: str = REPO_DIR) -> str:
        code, out = self.container.exec_run(["/bin/bash", "-c", cmd], workdir=workdir, environment=self.env)
        text = out.decode(errors="replace")
        if code != 0:
            raise RuntimeError(f"building in {self.image}: `{cmd[:300]}` failed ({code}):\n{text[-3000:]}")
        return text

    def read_file(self, path: str) -> str:
        try:
            return self.run(f"cat {shlex.quote(path)}")
        except RuntimeError as exc:
            raise FileNotFoundError(path) from exc

    def put_tree(self, source: str, target: str) -> None:
        """Copy the host path `source` into the container at `target` (a tar stream through the API)."""
        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w") as tar:
                tar.add(source, arcname=target.lstrip("/"))
            f.seek(0)
            if not self.container.put_archive("/", f):
                raise RuntimeError(f"copying {source} into the container failed")

    def commit(self, tag: str, labels: dict[str, str]):
        self.run(f"rm -f {BUILD_CA_BUNDLE} {UV}", "/")
        repo, _, image_tag = tag.partition(":")
        self.container.commit(repository=repo, tag=image_tag, conf={
            "Labels": {**labels, LABEL: "1"}, "WorkingDir": REPO_DIR, "Cmd": ["/bin/bash"],
        })
        return self.client.images.get(tag)
