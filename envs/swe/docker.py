"""The docker SWE backend: the local backend's steps in containers.

An image per (repo, version, Python) is built once from the test image (envs.runtime.images): the cached clone copied
in at /opt/nextstate/repo.git, the interpreter (the image's own when its minor version matches, else this machine's
pyenv build copied in at its own path), a venv at /opt/nextstate/venv with the spec's packages from PyPI (the build
container uses the host network; nothing else does) and the repo's editable install at /testbed. Each episode is a
fresh container of that image (no network, limits from DockerConfig) where the same checkout, diff and eval steps as the
local backend run, as a non-root user. No registry is needed, and none of SWE-bench's images.
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
from pathlib import PurePosixPath
from typing import Any

from envs.runtime.docker import LABEL, DockerConfig, DockerRuntime, docker_client
from envs.runtime.images import ensure_image
from envs.runtime.local import Limits
from envs.swe.backend import EnvironmentInfo, SWEBackend, Workspace, install_environment, open_workspace
from envs.swe.grading import REPO_DIR, VENV_DIR, RepoSpec, clean_requirements, requirement_paths
from envs.swe.pythons import Interpreter, PythonChoice, choose_python, installed_interpreters
from envs.swe.repos import RepoStore

log = logging.getLogger(__name__)

REPO_IN_IMAGE = "/opt/nextstate/repo.git"
ENV_LABEL = "nextstate.swe.environment"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BUILD_CA_BUNDLE = "/tmp/nextstate-build-ca.crt"
IMAGE_PYTHON = Interpreter("/usr/bin/python3.11", (3, 11, 2), "/usr")  # what the debootstrapped test image ships


@dataclass
class DockerEnvironment:
    image: str
    info: EnvironmentInfo


class DockerSWEBackend(SWEBackend):
    def __init__(self, repos: RepoStore, options: dict[str, Any] | None = None):
        opts = dict(options or {})
        self.repos = repos
        self.client = docker_client(opts.pop("docker_host", None))
        self.base_image = opts.pop("image", None) or ensure_image(self.client)
        limits = opts.pop("limits", None)
        self.limits = Limits(**limits) if isinstance(limits, dict) else (limits or Limits())
        self.container_options = opts  # other DockerConfig fields (memory_bytes, cpus, pids, user, ...)
        self.user = opts.get("user", DockerConfig.user)
        self._envs: dict[str, DockerEnvironment] = {}

    def environment(self, instance: dict[str, Any], spec: RepoSpec) -> DockerEnvironment:
        import docker

        choice = self._choose_python(spec.python)
        key = f"{spec.repo.replace('/', '__')}__{spec.version}__py{choice.interpreter.full}__{spec.key}"
        tag = f"nextstate-swe/{spec.repo.replace('/', '__').lower()}:{spec.version}-py{choice.interpreter.full}-{spec.key}"
        if key in self._envs:
            return self._envs[key]
        try:
            image = self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            image = self._build(instance, spec, choice, tag, key)
        info = EnvironmentInfo(**json.loads(image.labels[ENV_LABEL]))
        env = DockerEnvironment(tag, info)
        self._envs[key] = env
        return env

    def _choose_python(self, requested: str) -> PythonChoice:
        pool = (IMAGE_PYTHON, *[i for i in installed_interpreters() if i.minor != IMAGE_PYTHON.minor])
        return choose_python(requested, pool)

    def _build(self, instance: dict[str, Any], spec: RepoSpec, choice: PythonChoice, tag: str, key: str):
        t0 = time.monotonic()
        commit = instance.get("environment_setup_commit") or instance["base_commit"]
        repo_path = self.repos.ensure(spec.repo, commit)
        uid = self.user.partition(":")[0]
        container = self.client.containers.run(
            self.base_image, ["sleep", "infinity"], detach=True, network_mode="host", user="0", labels={LABEL: "1"}
        )
        notes: list[str] = []
        if not choice.exact:
            notes.append(f"python {spec.python} is not available; used {choice.interpreter.full}")
        try:
            _put_tree(
                container, str(repo_path / ".git") if (repo_path / ".git").is_dir() else str(repo_path), REPO_IN_IMAGE
            )
            if choice.interpreter.prefix != "/usr":
                _put_tree(container, choice.interpreter.prefix, choice.interpreter.prefix)

            build_env = {"HOME": "/root", "PIP_NO_CACHE_DIR": "1"}
            if os.path.isfile(HOST_CA_BUNDLE):
                # networks that intercept TLS use a CA the image lacks: trust the host's bundle while building only
                _put_file(container, HOST_CA_BUNDLE, BUILD_CA_BUNDLE)
                build_env.update(
                    PIP_CERT=BUILD_CA_BUNDLE, SSL_CERT_FILE=BUILD_CA_BUNDLE, REQUESTS_CA_BUNDLE=BUILD_CA_BUNDLE
                )

            def run(cmd: str, workdir: str = REPO_DIR) -> str:
                code, out = container.exec_run(["/bin/bash", "-c", cmd], workdir=workdir, environment=build_env)
                text = out.decode(errors="replace")
                if code != 0:
                    raise RuntimeError(f"building {tag}: `{cmd[:300]}` failed ({code}):\n{text[-3000:]}")
                return text

            run(
                f"mkdir -p {REPO_DIR} && git config --system safe.directory '*' && "
                f"git clone -q {REPO_IN_IMAGE} {REPO_DIR} && git -C {REPO_DIR} checkout -q --detach {commit}",
                "/",
            )
            for step in spec.repo_steps():
                run(step)
            if choice.interpreter.prefix != "/usr":  # e.g. /root/.pyenv/...: the agent's uid must reach it in the image
                parents = [str(p) for p in PurePosixPath(choice.interpreter.prefix).parents if str(p) != "/"]
                run(f"chmod o+x {' '.join(shlex.quote(p) for p in parents)}", "/")
            info = install_environment(run, run, spec, choice, key, lambda: self._requirements(run, spec.repo), notes)
            # an empty, agent-owned /testbed: every episode checks its own commit out there
            run(
                f"find {REPO_DIR} -mindepth 1 -delete && chown {self.user} {REPO_DIR} && rm -f /tmp/r.txt {BUILD_CA_BUNDLE}",
                "/",
            )
            info.build_s = time.monotonic() - t0
            repo_name, _, image_tag = tag.partition(":")
            container.commit(
                repository=repo_name,
                tag=image_tag,
                conf={
                    "Labels": {ENV_LABEL: json.dumps(asdict(info)), LABEL: "1", "nextstate.user": uid},
                    "WorkingDir": REPO_DIR,
                    "Cmd": ["/bin/bash"],
                },
            )
        finally:
            container.remove(force=True)
        log.info("built image %s in %.1f s", tag, time.monotonic() - t0)
        return self.client.images.get(tag)

    @staticmethod
    def _requirements(run, repo: str) -> str:
        for path in requirement_paths(repo):
            try:
                text = run(f"cat {shlex.quote(path)}")
            except RuntimeError:
                continue
            return clean_requirements(text)
        raise FileNotFoundError(f"{repo}: no requirements file at {requirement_paths(repo)}")

    def open(self, instance: dict[str, Any], spec: RepoSpec, env: DockerEnvironment) -> Workspace:
        cfg = DockerConfig(
            image=env.image,
            workdir=REPO_DIR,
            workdir_tmpfs=False,
            read_only_rootfs=False,
            limits=self.limits,
            env={
                "HOME": "/tmp",
                "VIRTUAL_ENV": VENV_DIR,
                "PATH": f"{VENV_DIR}/bin:/usr/local/bin:/usr/bin:/bin",
                "GIT_CONFIG_SYSTEM": "/etc/gitconfig",
            },
            **self.container_options,
        )
        rt = DockerRuntime(cfg, client=self.client)
        return open_workspace(rt, REPO_IN_IMAGE, instance, spec, env.info)


def _put_file(container, source: str, target: str) -> None:
    _put_tree(container, source, target)


def _put_tree(container, source: str, target: str) -> None:
    """Copy the host directory `source` into the container at `target` (a tar stream through the API)."""
    with tempfile.TemporaryFile() as f:
        with tarfile.open(fileobj=f, mode="w") as tar:
            tar.add(source, arcname=target.lstrip("/"))
        f.seek(0)
        if not container.put_archive("/", f):
            raise RuntimeError(f"copying {source} into the container failed")
