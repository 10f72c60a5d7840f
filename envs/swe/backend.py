"""What the two SWE backends (envs.swe.local: bubblewrap, envs.swe.docker: containers) share: the record of a built
environment, the build steps that install it, and the per-episode steps (checkout, the agent's diff, the eval run),
all written against the Runtime protocol so they run the same in either sandbox.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.runtime import Runtime
from envs.swe.grading import REPO_DIR, VENV_DIR, RepoSpec, apply_patch_script, eval_script
from envs.swe.pythons import PythonChoice

ARTIFACTS = f"{VENV_DIR}/.nextstate-artifacts.tar"  # build products the install left in the checkout (egg-info)
SETUP_IDENTITY = "-c user.name=SWE-bench -c user.email=setup@swebench.config"


@dataclass
class EnvironmentInfo:
    """What was built for (repo, version): written to <venv>/nextstate-venv.json and copied into every result."""

    key: str
    repo: str
    version: str
    python_requested: str
    python_used: str
    python_exact: bool
    python_executable: str
    install: str
    notes: list[str] = field(default_factory=list)  # deviations from the official environment
    skipped_steps: list[str] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)  # pip freeze
    build_s: float = 0.0


@dataclass
class EvalRun:
    log: str
    patch_applied: bool
    timed_out: bool
    wall_s: float


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
    """The part of a backend that is the same for both: grading runs in a fresh workspace of the environment."""

    def open(self, instance: dict[str, Any], spec: RepoSpec, env: Any) -> Workspace:
        raise NotImplementedError

    def evaluate(self, instance: dict[str, Any], spec: RepoSpec, env: Any, patch: str, timeout: float) -> EvalRun:
        """Apply `patch` to a fresh checkout and run the official eval script; return its log (stdout + stderr)."""
        ws = self.open(instance, spec, env)
        try:
            return run_eval(ws.runtime, instance, spec, patch, timeout)
        finally:
            ws.close()


def checkout(rt, repo_path: Path | str, base: str, spec: RepoSpec, info: EnvironmentInfo, *, run_as=None) -> str:
    """Check `base` out at /testbed in `rt`, restore install artifacts, run the repo's pre_install steps and commit them
    (the official instance image's "SWE-bench" commit). Returns that commit."""
    steps = [
        f"git clone -q --shared -n {shlex.quote(str(repo_path))} . && git checkout -q --detach {base}",
        "git config core.fileMode false",  # the official diff ignores mode changes too
    ]
    if info.artifacts:
        steps.append(
            f"tar xf {ARTIFACTS} && printf '%s\\n' {' '.join(shlex.quote(a) for a in info.artifacts)} "
            ">> .git/info/exclude"
        )
    steps += spec.repo_steps()
    steps.append(f"git {SETUP_IDENTITY} commit --allow-empty --no-verify -qam SWE-bench && git rev-parse HEAD")
    script = " && ".join(f"({s})" for s in steps)
    r = (run_as or rt.exec)(script, timeout=600)
    if not r.ok:
        raise RuntimeError(f"checking out {base} failed (exit {r.exit_code}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout.strip().splitlines()[-1]


def open_workspace(rt, repo_path: Path | str, instance: dict[str, Any], spec: RepoSpec, info: EnvironmentInfo) -> Workspace:
    """`checkout` the instance's base commit in a fresh runtime `rt` and wrap it; `rt` is closed if the checkout fails."""
    try:
        head = checkout(rt, repo_path, instance["base_commit"], spec, info)
    except Exception:
        rt.close()
        raise
    return Workspace(rt, head)


def install_environment(
    run: Callable[[str], object],
    read: Callable[[str], str],
    spec: RepoSpec,
    choice: PythonChoice,
    key: str,
    requirements: Callable[[], str],
    notes: list[str],
) -> EnvironmentInfo:
    """The build steps both backends run in the environment's checkout (at REPO_DIR, after the spec's repo steps): the
    venv at VENV_DIR, the spec's packages and install, a tarball of the build artifacts every checkout restores.
    `run(cmd)` raises when cmd fails; `read(cmd)` returns its stdout; `requirements()` the cleaned requirements text.
    Returns what was built (build_s is the caller's to set)."""
    run(f"{shlex.quote(choice.interpreter.executable)} -m venv {VENV_DIR}")
    activate = f"source {VENV_DIR}/bin/activate && "
    if spec.packages == "requirements.txt":
        run(
            f"cat > /tmp/r.txt <<'EOF_NEXTSTATE_REQS'\n{requirements()}\nEOF_NEXTSTATE_REQS\n"
            f"{activate}python -m pip install -r /tmp/r.txt"
        )
    elif spec.packages == "environment.yml":
        notes.append("the spec's conda environment.yml was not installed (conda-only); pip_packages were")
    elif spec.packages.strip():
        notes.append(f"conda packages '{spec.packages}' were installed with pip")
        run(f"{activate}python -m pip install {spec.packages}")
    if spec.pip_packages:
        run(f"{activate}python -m pip install {' '.join(shlex.quote(p) for p in spec.pip_packages)}")
    install, note = spec.venv_install()
    if note:
        notes.append(note)
    if install:
        run(f"{activate}{install}")
    found = read("find . -maxdepth 3 -name '*.egg-info' -type d -not -path './.git/*' | sort")
    artifacts = [p.removeprefix("./") for p in found.split()]
    if artifacts:
        run(f"tar cf {ARTIFACTS} {' '.join(shlex.quote(a) for a in artifacts)}")
    freeze = read(f"{activate}python -m pip freeze --all").splitlines()
    return EnvironmentInfo(
        key=key,
        repo=spec.repo,
        version=spec.version,
        python_requested=spec.python,
        python_used=choice.interpreter.full,
        python_exact=choice.exact,
        python_executable=choice.interpreter.executable,
        install=install,
        notes=notes,
        skipped_steps=spec.skipped_steps(),
        artifacts=artifacts,
        packages=freeze,
    )


def model_patch(rt, head: str) -> str:
    """The agent's changes (new files included) against the setup commit, computed inside the sandbox."""
    r = rt.exec(f"git add -A && git diff --cached --binary {head}", timeout=120)
    if not r.ok:
        raise RuntimeError(f"computing the model patch failed (exit {r.exit_code}): {r.stderr[-2000:]}")
    return r.stdout


def run_eval(rt, instance: dict[str, Any], spec: RepoSpec, patch: str, timeout: float) -> EvalRun:
    t0 = time.monotonic()
    rt.write_file(".git/nextstate/patch.diff", patch)
    rt.write_file(".git/nextstate/apply.sh", apply_patch_script(f"{REPO_DIR}/.git/nextstate/patch.diff"))
    rt.write_file(".git/nextstate/eval.sh", eval_script(instance, spec))
    apply = (
        "bash .git/nextstate/apply.sh"
        if patch.strip()
        else "echo '>>>>> Applied Patch (empty patch: nothing to apply)'"
    )
    r = rt.exec(f"({apply}) 2>&1 && bash .git/nextstate/eval.sh 2>&1", timeout=timeout)
    log_text = r.stdout + r.stderr
    if r.timed_out:
        log_text += "\n>>>>> Tests Timed Out\n"
    return EvalRun(log_text, ">>>>> Patch Apply Failed" not in log_text, r.timed_out, time.monotonic() - t0)
