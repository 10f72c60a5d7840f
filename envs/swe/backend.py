"""What the two SWE backends (envs.swe.local: bubblewrap, envs.swe.docker: containers) share: the records of what was
built, the build steps, and the per-episode steps (checkout, the agent's diff, the eval run), all written against the
Runtime protocol so they run the same in either sandbox.

Two layers, as SWE-bench's images: the *environment* of (repo, version) (SWE-bench's env image: the interpreter and the
spec's packages, no repository), and the *instance* (SWE-bench's instance image: the repository at the base commit with
the spec's pre-install steps and install run in it). What the install leaves in the checkout (generated version files,
compiled extensions, `.egg-info`) is kept per instance as a tarball of the checkout's untracked files and restored into
every checkout of that instance; the install's own entries in the environment (its metadata, entry points, the editable
hook pointing at /testbed) are the instance's copy of the environment. The environment is an interpreter prefix of its
own at /opt/nextstate/venv, as a conda environment is (envs.swe.prefix says why not a venv).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envs.runtime import Runtime
from envs.runtime.local import Limits
from envs.swe.grading import REPO_DIR, VENV_DIR, RepoSpec, apply_patch_script, eval_script
from envs.swe.condaenv import broken_imports_command
from envs.swe.cutoff import ENV_CONSTRAINTS, UV, compile_step, install_target
from envs.swe.prefix import activate_step, fresh_site_step
from envs.swe.pythons import PythonChoice

PRODUCTS = f"{VENV_DIR}/.nextstate-products.tar"  # what the install left in the checkout (untracked files)
PRODUCTS_LIST = f"{VENV_DIR}/.nextstate-products.txt"  # their paths, one a line (kept out of the agent's git status)
SETUP_IDENTITY = "-c user.name=SWE-bench -c user.email=setup@swebench.config"
LAYOUT = "l4"  # in every cache key and image tag: what a build writes changed with it, so older builds are not reused
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
EVAL_OUTPUT_BYTES = 256 << 20  # an eval log's cap
# the grading sandbox's limits: a test suite is not an agent's command (xarray's test_dataset.py takes over two minutes
# of CPU; under the agent's 120 s its pytest died midway and the verdict read "gold does not resolve")
GRADING_LIMITS = Limits(cpu_seconds=7200, memory_bytes=16 << 30, processes=2048, file_bytes=8 << 30,
                        open_files=4096, output_bytes=EVAL_OUTPUT_BYTES, tmpfs_bytes=4 << 30, timeout_s=1800)


def build_env() -> dict[str, str]:
    """The environment of every build command: this machine's pip configuration is not the environment's (an extra
    index, find-links, constraints meant for the host), only its CA bundle (networks that intercept TLS)."""
    env = {"HOME": "/tmp", "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": "/dev/null",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if os.path.isfile(HOST_CA_BUNDLE):
        env.update(PIP_CERT=HOST_CA_BUNDLE, SSL_CERT_FILE=HOST_CA_BUNDLE, REQUESTS_CA_BUNDLE=HOST_CA_BUNDLE)
    return env


@dataclass
class EnvironmentInfo:
    """What was built for (repo, version): written next to the environment and copied into every result."""

    key: str
    repo: str
    version: str
    python_requested: str
    python_used: str
    python_exact: bool
    python_executable: str
    notes: list[str] = field(default_factory=list)  # deviations from the official environment
    skipped_steps: list[str] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)  # pip freeze
    build_s: float = 0.0


@dataclass
class InstanceInfo:
    """What was built for one instance: its repository store and the spec's install run at its base commit."""

    instance_id: str
    base_commit: str
    key: str
    history: str  # "full": the base commit's whole history; "shallow": its tree only
    install: str  # the install command as run
    products: int = 0  # files the install left in the checkout
    products_bytes: int = 0
    store_s: float = 0.0
    install_s: float = 0.0
    source: str = "built"  # "built", or "swebench image" (SWE-bench's own prebuilt instance image)


@dataclass
class EvalRun:
    log: str
    patch_applied: bool
    timed_out: bool
    wall_s: float
    checkout_s: float = 0.0  # the grading workspace's checkout (what every episode's reset costs too)


@dataclass
class Workspace:
    """An episode's checkout at /testbed in its own sandbox (a LocalRuntime or a DockerRuntime)."""

    runtime: Runtime
    head: str  # the setup commit the agent's diff is taken against

    def model_patch(self) -> str:
        return model_patch(self.runtime, self.head)

    def close(self) -> None:
        self.runtime.close()


class SWEBackend:
    """The part of a backend that is the same for both: grading runs in a fresh workspace of the instance."""

    def environment(self, instance: dict[str, Any], spec: RepoSpec) -> Any:
        raise NotImplementedError

    def open(self, instance: dict[str, Any], spec: RepoSpec, env: Any, *, grading: bool = False) -> Workspace:
        """A fresh workspace of the instance; `grading`: the grading's (GRADING_LIMITS, not an agent's)."""
        raise NotImplementedError

    def evaluate(self, instance: dict[str, Any], spec: RepoSpec, env: Any, patch: str, timeout: float) -> EvalRun:
        """Apply `patch` to a fresh checkout and run the official eval script; return its log (stdout + stderr)."""
        t0 = time.monotonic()
        ws = self.open(instance, spec, env, grading=True)
        checkout_s = time.monotonic() - t0
        try:
            run = run_eval(ws.runtime, instance, spec, patch, timeout, official=getattr(env, "official", False))
        finally:
            ws.close()
        run.checkout_s = checkout_s
        return run


def checkout_steps(store: str, base: str, spec: RepoSpec, *, products: bool) -> list[str]:
    """The shell steps that check `base` out at /testbed from the instance's `store`, restore the install's products
    (kept out of git's view, as they are in SWE-bench's image where .gitignore covers them), and run the spec's
    repo-changing pre_install steps."""
    steps = [
        f"git clone -q --shared -n {shlex.quote(store)} . && git checkout -q --detach {base}",
        "git config core.fileMode false",  # the official diff ignores mode changes too
        "git remote remove origin",  # as SWE-bench's image: nothing points back at the store
    ]
    if products:
        # --touch: the products are newer than the sources just checked out, so a rebuild has nothing to redo
        steps.append(f"tar xf {PRODUCTS} --touch && {exclude_products_step()}")
    return steps + spec.repo_steps()


def exclude_products_step() -> str:
    """Keep the install's products (PRODUCTS_LIST) out of git's view in the checkout: the agent's `git diff` (new files
    included) is its own changes only, as in SWE-bench's image where the repositories' .gitignore covers them."""
    return f"sed -e 's/[][*?\\\\]/\\\\&/g' -e 's|^|/|' {PRODUCTS_LIST} >> .git/info/exclude"


def checkout(rt, store: str, base: str, spec: RepoSpec) -> str:
    """Check the instance out in a fresh runtime `rt` (see `checkout_steps`) and commit the setup; return the commit."""
    steps = checkout_steps(store, base, spec, products=True)
    steps.append(f"git {SETUP_IDENTITY} commit --allow-empty --no-verify -qam SWE-bench && git rev-parse HEAD")
    r = rt.exec(" && ".join(f"({s})" for s in steps), timeout=600)
    if not r.ok:
        raise RuntimeError(f"checking out {base} failed (exit {r.exit_code}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout.strip().splitlines()[-1]


def open_workspace(rt, store: str, instance: dict[str, Any], spec: RepoSpec) -> Workspace:
    """`checkout` the instance's base commit in a fresh runtime `rt` and wrap it (`rt` is closed if that fails)."""
    try:
        head = checkout(rt, store, instance["base_commit"], spec)
    except Exception:
        rt.close()
        raise
    return Workspace(rt, head)


def install_dependencies(
    run: Callable[[str], object],
    read: Callable[[str], str],
    spec: RepoSpec,
    choice: PythonChoice,
    key: str,
    requirements: Callable[[], list[str]],
    notes: list[str],
    cutoff: str = "",
) -> EnvironmentInfo:
    """The environment of (repo, version), built in a checkout of its environment_setup_commit at REPO_DIR, in the
    copy of the interpreter's prefix at VENV_DIR (envs.swe.prefix; the caller made it): the spec's packages (a
    requirements file, a conda environment, conda package names: all from PyPI), then its pip_packages, each step held
    to PyPI as of `cutoff` (envs.swe.cutoff; '' for today's). The repository itself is not installed here (that is per
    instance). `run(cmd)` raises when cmd fails; `read(cmd)` returns its stdout; `requirements()` the pip requirement
    lines of `packages`."""
    run(fresh_site_step())
    run(activate_step())
    if cutoff:  # the installers a fresh conda environment had then (pip's resolver and legacy paths changed since)
        try:
            run(f"UV_CACHE_DIR=/tmp/uv-cache UV_NO_CONFIG=1 {UV} pip install --quiet --upgrade "
                f"--python {VENV_DIR}/bin/python --exclude-newer {cutoff} pip setuptools wheel")
        except RuntimeError as exc:
            notes.append(f"pip, setuptools and wheel are the interpreter's (uv: {_last_error(exc)})")
    reqs = requirements()
    if reqs:
        try:
            run(_pip_install(reqs, "requirements", cutoff))
        except RuntimeError:
            if spec.packages != "environment.yml":
                raise
            # conda resolves an environment as a whole; from PyPI some of its packages may not exist for this
            # Python: install the others one by one and say which were left out
            for req in reqs:
                try:
                    run(_pip_install([req], "one", cutoff))
                except RuntimeError as exc:
                    notes.append(f"conda dependency {req!r} not installable from PyPI: {_last_error(exc)}")
        if spec.packages == "environment.yml":
            for dist, module, error in json.loads(read(broken_imports_command(f"{VENV_DIR}/bin/python", reqs)) or "[]"):
                run(f"{VENV_DIR}/bin/python -m pip uninstall -y {shlex.quote(dist)}")
                notes.append(f"conda dependency {dist} left out: `import {module}` fails without conda's libraries "
                             f"({error})")
    if spec.pip_packages:
        run(_pip_install(list(spec.pip_packages), "pip_packages", cutoff))
    freeze = read(f"{VENV_DIR}/bin/python -m pip freeze --all").splitlines()
    if cutoff:
        notes.append(f"PyPI held to releases before {cutoff}")
        run(f"{VENV_DIR}/bin/python -m pip freeze --all > {ENV_CONSTRAINTS}")
    return EnvironmentInfo(
        key=key,
        repo=spec.repo,
        version=spec.version,
        python_requested=spec.python,
        python_used=choice.interpreter.full,
        python_exact=choice.exact,
        python_executable=f"{VENV_DIR}/bin/python{choice.interpreter.minor}",
        notes=notes,
        skipped_steps=spec.skipped_steps(),
        packages=freeze,
    )


def _pip_install(lines: list[str], tag: str, cutoff: str) -> str:
    """One shell command: write `lines` as a requirements file and pip-install it into the environment, resolved at
    `cutoff` when set (one command: a local sandbox's /tmp lives as long as one command)."""
    req, pins = f"/tmp/{tag}.in", f"/tmp/{tag}.pins"
    body = "\n".join(lines)
    cmd = f"cat > {req} <<'EOF_NEXTSTATE_REQS'\n{body}\nEOF_NEXTSTATE_REQS\n"
    if cutoff:
        return cmd + f"{compile_step(req, pins, cutoff)} && {VENV_DIR}/bin/python -m pip install -r {req} -c {pins}"
    return cmd + f"{VENV_DIR}/bin/python -m pip install -r {req}"


def _last_error(exc: Exception) -> str:
    lines = [ln for ln in str(exc).splitlines() if "ERROR" in ln or "error" in ln]
    return (lines[-1] if lines else str(exc).splitlines()[0])[:200]


def install_instance(
    run: Callable[[str], object], read: Callable[[str], str], spec: RepoSpec, *, archive: bool = True, cutoff: str = ""
) -> tuple[str, int, int]:
    """In the instance's checkout at REPO_DIR (pre_install steps done), run the spec's install into the instance's
    environment at VENV_DIR (what it pulls held to `cutoff`, the environment's own pins kept where they satisfy it) and
    keep what it left in the checkout (PRODUCTS_LIST, and PRODUCTS when `archive`). Returns (the install command as run,
    the number of product files, the size of their tarball)."""
    install, _note = spec.venv_install()
    if install:
        target = install_target(install) if cutoff else None
        pins = ""
        if target:
            inp, out = "/tmp/install.in", "/tmp/install.pins"
            pins = (
                f"echo {shlex.quote(target)} > {inp} && "
                f"{{ {compile_step(inp, out, cutoff, ENV_CONSTRAINTS, for_env_var=True)} || "
                f"{compile_step(inp, out, cutoff, for_env_var=True)}; }} && "
                f"export PIP_CONSTRAINT={out} && "
            )
        run(f"{pins}source {VENV_DIR}/bin/activate && {install}")
    run(f"git -c core.quotePath=false ls-files --others > {PRODUCTS_LIST}")
    if archive:  # (a docker instance image keeps them in place)
        run(f"tar cf {PRODUCTS} --verbatim-files-from -T {PRODUCTS_LIST}")
    size_cmd = f"stat -c %s {PRODUCTS}" if archive else f"tar cf - --verbatim-files-from -T {PRODUCTS_LIST} | wc -c"
    count, size = read(f"wc -l < {PRODUCTS_LIST} && {size_cmd}").split()
    return install, int(count), int(size)


def model_patch(rt, head: str) -> str:
    """The agent's changes (new files included) against the setup commit, computed inside the sandbox."""
    r = rt.exec(f"git add -A && git diff --cached --binary {head}", timeout=120)
    if not r.ok:
        raise RuntimeError(f"computing the model patch failed (exit {r.exit_code}): {r.stderr[-2000:]}")
    return r.stdout


def run_eval(rt, instance: dict[str, Any], spec: RepoSpec, patch: str, timeout: float, *, official: bool = False
             ) -> EvalRun:
    """Apply `patch` in the workspace of `rt` and run the eval script (SWE-bench's own, with its conda activation,
    in SWE-bench's images: `official`)."""
    t0 = time.monotonic()
    rt.write_file(".git/nextstate/patch.diff", patch)
    rt.write_file(".git/nextstate/apply.sh", apply_patch_script(f"{REPO_DIR}/.git/nextstate/patch.diff"))
    rt.write_file(".git/nextstate/eval.sh", eval_script(instance, spec, official=official))
    apply = (
        "bash .git/nextstate/apply.sh"
        if patch.strip()
        else "echo '>>>>> Applied Patch (empty patch: nothing to apply)'"
    )
    # a test run of thousands of tests prints megabytes (`-rA`): the command cap of an agent's command would cut it
    r = rt.run(f"({apply}) 2>&1 && bash .git/nextstate/eval.sh 2>&1", timeout=timeout, output_limit=EVAL_OUTPUT_BYTES)
    log_text = (r.stdout + r.stderr).decode("utf-8", errors="replace")
    if r.timed_out:
        log_text += "\n>>>>> Tests Timed Out\n"
    if r.truncated:
        log_text += f"\n>>>>> Output Truncated at {EVAL_OUTPUT_BYTES} bytes\n"
    return EvalRun(log_text, ">>>>> Patch Apply Failed" not in log_text, r.timed_out, time.monotonic() - t0)
