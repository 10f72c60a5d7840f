"""Everything we take from swebench, in one module: the per-(repo, version) specs, the eval script, and the verdict.

We pin swebench 4.x (`swebench>=4.1,<5`): its classic API holds the specs that plain SWE-bench / Lite / Verified
instances need (`MAP_REPO_VERSION_TO_SPECS`: Python version, install command, test command) and builds the eval script
(`make_eval_script_list_py`). swebench 5.x dropped those tables (its instances carry their own image and script); with
5.x installed, instances whose repo has a spec here (bundled repos, or an instance's own `nextstate_spec`) still grade,
through 5.x's `TestSpec` and log parsers, and other instances fail with a message saying to install 4.x.

The verdict is always swebench's own `get_eval_report` on a test log made the official way: the test patch applied, the
spec's test command as written (`pytest -rA`, sympy's `bin/test`, sphinx's `tox --current-env`) on the test files the
test patch touches, between the `>>>>> Start Test Output` / `>>>>> End Test Output` markers that `set -x` prints. In our
environments only the activation differs (the environment's prefix instead of conda's) and the install the script
re-runs after the patch is left out (its products are in the checkout); in SWE-bench's own images it runs unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

VENV_DIR = "/opt/nextstate/venv"  # where the environment's venv is mounted inside every sandbox
REPO_DIR = "/testbed"  # where the repository is checked out inside every sandbox (as in SWE-bench's images)
START_MARK = ">>>>> Start Test Output"
END_MARK = ">>>>> End Test Output"
APPLY_FAIL_MARK = ">>>>> Patch Apply Failed"
DEFAULT_TEST_CMD = "pytest --no-header -rA --tb=no -p no:cacheprovider"
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
# pre_install steps that need the system package manager: not possible in a sandbox, recorded as skipped
_SYSTEM_STEP = re.compile(r"^\s*(sudo\s+)?(apt(-get)?|yum|dnf|apk|conda|source\s+/opt/miniconda3)\b")


class SpecNotFound(LookupError):
    """No spec for an instance's (repo, version)."""


class SwebenchUnavailable(ImportError):
    """swebench is not installed (or its API cannot grade this instance)."""


def swebench_version() -> str:
    try:
        import swebench
    except ImportError as exc:
        raise SwebenchUnavailable("swebench is not installed: pip install 'nextstate[swe]' (swebench>=4.1,<5)") from exc
    return str(getattr(swebench, "__version__", "unknown"))


def classic_api() -> bool:
    """True when the installed swebench has the 4.x API (spec tables, make_eval_script_list_py)."""
    try:
        import swebench.harness.test_spec.python  # noqa: F401
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class RepoSpec:
    """How to build the environment of (repo, version) and how to run its tests (SWE-bench's spec fields)."""

    repo: str
    version: str
    python: str
    test_cmd: str
    install: str = ""
    pip_packages: tuple[str, ...] = ()
    packages: str = ""  # "requirements.txt", "environment.yml", or package names
    pre_install: tuple[str, ...] = ()
    eval_commands: tuple[str, ...] = ()
    log_parser: str = "parse_log_pytest"  # used with swebench 5.x and for repos swebench does not know
    source: str = ""  # where the spec came from: "instance", "bundled", "swebench 4.1.0"
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """Identifies the environment this spec builds (anything that changes the venv changes the key)."""
        text = json.dumps(
            [
                self.repo,
                self.version,
                self.python,
                self.install,
                self.pip_packages,
                self.packages,
                list(self.pre_install),
            ],
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def reads_checkout(self) -> bool:
        """Whether building the environment reads files of the environment_setup_commit (its requirements)."""
        return self.packages in ("requirements.txt", "environment.yml")

    def repo_steps(self) -> list[str]:
        """pre_install steps that change the repository (run in every checkout, as the official instance image does)."""
        return [s for s in self.pre_install if not _SYSTEM_STEP.search(s)]

    def skipped_steps(self) -> list[str]:
        return [s for s in self.pre_install if _SYSTEM_STEP.search(s)]

    def venv_install(self) -> tuple[str, str]:
        """(install command for a shared venv, note). A non-editable `pip install .` becomes editable, so the venv
        follows whatever checkout is mounted at /testbed (the official eval re-runs the install after the patch)."""
        cmd = self.install.strip()
        m = re.match(r"^(python -m pip|pip) install (\.)(\s|$)", cmd)
        if m:
            return cmd.replace(" install .", " install -e .", 1), "non-editable install made editable (shared venv)"
        return cmd, ""


def _spec_from_dict(repo: str, version: str, d: dict[str, Any], source: str) -> RepoSpec:
    if "python" not in d:
        raise ValueError(f"spec of {repo} {version} ({source}) has no 'python'")
    test_cmd = d.get("test_cmd", DEFAULT_TEST_CMD)
    if isinstance(test_cmd, list):
        test_cmd = test_cmd[-1]
    pre = d.get("pre_install", ())
    return RepoSpec(
        repo=repo,
        version=str(version),
        python=str(d["python"]),
        test_cmd=str(test_cmd),
        install=str(d.get("install", "")),
        pip_packages=tuple(d.get("pip_packages", ())),
        packages=str(d.get("packages", "")),
        pre_install=tuple([pre] if isinstance(pre, str) else pre),
        eval_commands=tuple(d.get("eval_commands", ())),
        log_parser=str(d.get("log_parser", "parse_log_pytest")),
        source=source,
        raw=dict(d, test_cmd=test_cmd),
    )


@lru_cache(maxsize=1)
def bundled_specs() -> dict[str, dict[str, dict[str, Any]]]:
    text = resources.files("envs.swe").joinpath("bundled/specs.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def repo_spec(instance: dict[str, Any]) -> RepoSpec:
    """The spec of the instance's (repo, version): its own `nextstate_spec`, else a bundled one, else swebench's."""
    repo, version = instance["repo"], str(instance.get("version", ""))
    own = instance.get("nextstate_spec")
    if own:
        return _spec_from_dict(repo, version, own if isinstance(own, dict) else json.loads(own), "instance")
    bundled = bundled_specs().get(repo, {})
    if version in bundled:
        return _spec_from_dict(repo, version, bundled[version], "bundled")
    if classic_api():
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

        if version in MAP_REPO_VERSION_TO_SPECS.get(repo, {}):
            return _spec_from_dict(
                repo, version, MAP_REPO_VERSION_TO_SPECS[repo][version], f"swebench {swebench_version()}"
            )
        known = sorted(MAP_REPO_VERSION_TO_SPECS.get(repo, {}))
        hint = f" (swebench knows versions {', '.join(known)})" if known else " (swebench does not know this repo)"
    else:
        hint = (
            f"; swebench {swebench_version() if _installed() else '(not installed)'} has no spec tables: "
            "pip install 'swebench>=4.1,<5'"
        )
    raise SpecNotFound(
        f"no spec for {repo} version {version!r}{hint}. Give the instance a 'nextstate_spec' "
        "({python, install, test_cmd, pip_packages}) to grade repositories swebench does not cover."
    )


def _installed() -> bool:
    try:
        swebench_version()
        return True
    except SwebenchUnavailable:
        return False


def requirement_paths(repo: str) -> list[str]:
    """Where a repo keeps its requirements file (swebench's table, else requirements.txt)."""
    if classic_api():
        from swebench.harness.constants import MAP_REPO_TO_REQS_PATHS

        if repo in MAP_REPO_TO_REQS_PATHS:
            return list(MAP_REPO_TO_REQS_PATHS[repo])
    return ["requirements.txt"]


def environment_yml_paths(repo: str) -> list[str]:
    """Where a repo keeps the conda environment file its spec's `packages: environment.yml` means."""
    if classic_api():
        from swebench.harness.constants import MAP_REPO_TO_ENV_YML_PATHS

        if repo in MAP_REPO_TO_ENV_YML_PATHS:
            return list(MAP_REPO_TO_ENV_YML_PATHS[repo])
    return ["environment.yml"]


def clean_requirements(text: str) -> str:
    """Drop the lines swebench drops (`-e .`, comments, `.[test`) and apply its package replacements."""
    keep = [ln for ln in text.splitlines() if not ln.strip().startswith(("-e .", "#", ".[test"))]
    text = "\n".join(keep)
    if classic_api():
        from swebench.harness.test_spec.python import clean_requirements as official

        text = official(text)
    return text


def test_directives(instance: dict[str, Any]) -> list[str]:
    """The test files the test patch touches (what the test command runs), as swebench computes them."""
    if classic_api():
        from swebench.harness.test_spec.python import get_test_directives

        return list(get_test_directives(instance))
    files = re.findall(r"diff --git a/.* b/(.*)", instance["test_patch"])
    return [f for f in files if not any(f.endswith(ext) for ext in NON_TEST_EXTS)]


def eval_script(instance: dict[str, Any], spec: RepoSpec, *, official: bool = False) -> str:
    """The official eval script for the instance, run in /testbed.

    With swebench 4.x this is `make_eval_script_list_py`'s output. `official`: as it is (SWE-bench's own images, with
    their conda environment). Otherwise our venv's activation replaces conda's, and the install it re-runs after the
    patch is left out: the instance's environment already holds the install (editable, so it follows /testbed), and
    its products were restored into the checkout. Without swebench 4.x, the same steps built here.
    """
    activate = f"source {VENV_DIR}/bin/activate"
    base, test_patch = instance["base_commit"], instance["test_patch"]
    if classic_api():
        from swebench.harness.test_spec.python import make_eval_script_list_py

        registered = _register_with_swebench(spec)
        lines = make_eval_script_list_py(instance, spec.raw, "testbed", REPO_DIR, base, test_patch)
        if registered != spec.test_cmd:  # swebench reads the test command by (repo, version): the instance's own wins
            lines = [spec.test_cmd + line[len(registered):] if line.startswith(f"{registered} ") else line
                     for line in lines]
        body = lines if official else [_venv_line(line, spec, activate) for line in lines]
        body = [line for line in body if line is not None]
    else:
        files = re.findall(r"diff --git a/.* b/(.*)", test_patch)
        reset = f"git checkout {base} {' '.join(files)}"
        delim = "EOF_114329324912"
        body = [
            activate,
            f"cd {REPO_DIR}",
            *spec.eval_commands,
            "git status",
            "git show",
            f"git -c core.fileMode=false diff {base}",
            reset,
            f"git apply -v - <<'{delim}'\n{test_patch}\n{delim}",
            f": '{START_MARK}'",
            " ".join([spec.test_cmd, *test_directives(instance)]),
            f": '{END_MARK}'",
            reset,
        ]
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *body]) + "\n"


def _venv_line(line: str, spec: RepoSpec, activate: str) -> str | None:
    """One line of the official eval script as it runs with our venv (None: left out)."""
    if line.startswith("source /opt/miniconda3/bin/activate"):
        return None
    if line.startswith("conda activate"):
        return activate
    if spec.install and line == spec.install:
        return None
    if line.startswith("git config --global"):
        return None  # HOME is a private tmpfs; safe.directory is set in the sandbox's system gitconfig
    return line


def apply_patch_script(patch_path: str) -> str:
    """Apply the model patch the way the official harness does: git apply, then --reject, then patch with fuzz."""
    return (
        f"cd {REPO_DIR}\n"
        f"if git apply --verbose {patch_path}; then echo '>>>>> Applied Patch (git apply)';\n"
        f"elif git apply --verbose --reject {patch_path}; then echo '>>>>> Applied Patch (git apply --reject)';\n"
        f"elif patch --batch --fuzz=5 -p1 -i {patch_path}; then echo '>>>>> Applied Patch (patch)';\n"
        f"else echo '{APPLY_FAIL_MARK}'; exit 1; fi\n"
    )


@dataclass
class GradeReport:
    instance_id: str
    resolved: bool
    status: str  # RESOLVED_FULL | RESOLVED_PARTIAL | RESOLVED_NO
    patch_applied: bool
    fail_to_pass: dict[str, list[str]] = field(default_factory=dict)  # {"success": [...], "failure": [...]}
    pass_to_pass: dict[str, list[str]] = field(default_factory=dict)
    swebench_version: str = ""

    @property
    def tests_passed(self) -> int:
        return len(self.fail_to_pass.get("success", [])) + len(self.pass_to_pass.get("success", []))

    @property
    def tests_total(self) -> int:
        return self.tests_passed + len(self.fail_to_pass.get("failure", [])) + len(self.pass_to_pass.get("failure", []))


def grade(instance: dict[str, Any], spec: RepoSpec, model_patch: str | None, log_text: str) -> GradeReport:
    """swebench's verdict for `model_patch` from the eval log `log_text` (stdout and stderr of the eval script)."""
    from swebench.harness.grading import get_eval_report, get_resolution_status

    version = swebench_version()
    iid = instance["instance_id"]
    with tempfile.TemporaryDirectory(prefix="nextstate-grade-") as tmp, _PARSING:
        test_spec = _test_spec(instance, spec)
        path = Path(tmp) / "test_output.txt"
        path.write_text(log_text, encoding="utf-8")
        pred = {"instance_id": iid, "model_name_or_path": "nextstate", "model_patch": model_patch}
        report = get_eval_report(test_spec, pred, str(path), include_tests_status=True)[iid]
    tests = report.get("tests_status") or {}
    status = get_resolution_status(tests) if tests else "RESOLVED_NO"
    return GradeReport(
        instance_id=iid,
        resolved=bool(report.get("resolved")),
        status=status,
        patch_applied=bool(report.get("patch_successfully_applied")),
        fail_to_pass=dict(tests.get("FAIL_TO_PASS", {})),
        pass_to_pass=dict(tests.get("PASS_TO_PASS", {})),
        swebench_version=version,
    )


def test_status_map(instance: dict[str, Any], spec: RepoSpec, log_text: str) -> dict[str, str]:
    """Per-test statuses parsed from an eval log by swebench's parser for the repo (used to derive FAIL_TO_PASS)."""
    from swebench.harness.grading import get_logs_eval

    with tempfile.TemporaryDirectory(prefix="nextstate-grade-") as tmp, _PARSING:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log_text, encoding="utf-8")
        status, found = get_logs_eval(_test_spec(instance, spec), str(path))
    return dict(status) if found else {}


def _test_spec(instance: dict[str, Any], spec: RepoSpec):
    f2p, p2p = instance.get("FAIL_TO_PASS", []), instance.get("PASS_TO_PASS", [])
    if classic_api():
        from swebench.harness.test_spec.test_spec import TestSpec

        _register_with_swebench(spec)
        _use_spec_parser(spec)
        return TestSpec(
            instance_id=instance["instance_id"],
            repo=spec.repo,
            version=spec.version,
            repo_script_list=[],
            eval_script_list=[],
            env_script_list=[],
            arch="x86_64",
            FAIL_TO_PASS=list(f2p),
            PASS_TO_PASS=list(p2p),
            language="py",
            docker_specs={},
            namespace=None,
        )
    try:
        from swebench.types import TestSpec as TestSpec5
    except ImportError as exc:
        raise SwebenchUnavailable(f"swebench {swebench_version()}: unknown API (expected 4.x or 5.x)") from exc
    return TestSpec5(
        instance_id=instance["instance_id"],
        image="",
        eval_script_list=[],
        repo=spec.repo,
        version=spec.version,
        FAIL_TO_PASS=list(f2p),
        PASS_TO_PASS=list(p2p),
        log_parser=spec.log_parser,
        eval_type="pass_and_fail",
    )


# swebench 4.x reads the log parser from a table by repo. For the repos it does not know, the table holds the parser
# of the spec being graded, set under this lock for the whole parse (two specs of one repo may name different ones).
_PARSING = threading.Lock()
_PARSERS_WE_SET: set[str] = set()


def _register_with_swebench(spec: RepoSpec) -> str:
    """swebench 4.x looks the test command up by (repo, version): add the ones it does not know (never overridden:
    the first registered spec's stays, and the eval script puts the instance's own back). Returns the test command
    swebench will write for the spec's (repo, version)."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    versions = MAP_REPO_VERSION_TO_SPECS.setdefault(spec.repo, {})
    versions.setdefault(spec.version, spec.raw)
    return versions[spec.version]["test_cmd"]


def _use_spec_parser(spec: RepoSpec) -> None:
    """Make the spec's log parser the one swebench reads for its repo, unless swebench has its own for that repo.
    Only while holding `_PARSING`: set anywhere else, it could change the parser under another spec's parse."""
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.log_parsers import python as parsers

    if spec.repo not in MAP_REPO_TO_PARSER or spec.repo in _PARSERS_WE_SET:
        MAP_REPO_TO_PARSER[spec.repo] = getattr(parsers, spec.log_parser)
        _PARSERS_WE_SET.add(spec.repo)
