"""The swebench wrapper and the pure parts of the swe family: specs, instance validation, the eval script, Python choice,
and swebench's verdict on eval logs (swebench's real grader on real log text)."""

from __future__ import annotations

import json

import pytest
import swebench  # the swe extra, always installed: a broken one fails

from envs.swe import grading
from envs.swe.instances import bundled_instances, validate_swe_instance
from envs.swe.pythons import Interpreter, choose_python

INSTANCE = {
    "instance_id": "nextstate__textkit-1",
    "repo": "nextstate/textkit",
    "version": "1.0",
    "base_commit": "0" * 40,
    "problem_statement": "slugify ...",
    "test_patch": "diff --git a/tests/test_slug.py b/tests/test_slug.py\n--- a/tests/test_slug.py\n+++ b/tests/test_slug.py\n"
    "@@ -1 +1 @@\n-x\n+y\ndiff --git a/tests/data/x.csv b/tests/data/x.csv\n",
    "patch": "",
    "FAIL_TO_PASS": ["tests/test_slug.py::test_new"],
    "PASS_TO_PASS": ["tests/test_slug.py::test_old"],
}


def _log(statuses: dict[str, str], applied: bool = True) -> str:
    if not applied:
        return ">>>>> Patch Apply Failed\n"
    lines = [f"{s} {t}" for t, s in statuses.items()]
    return "+ : '>>>>> Start Test Output'\n" + "\n".join(lines) + "\n+ : '>>>>> End Test Output'\n"


def test_bundled_and_swebench_specs():
    spec = grading.repo_spec(INSTANCE)
    assert spec.source == "bundled" and spec.python == "3.11" and "-rA" in spec.test_cmd
    if not grading.classic_api():
        pytest.skip("swebench 5.x has no spec tables")
    real = grading.repo_spec({"repo": "psf/requests", "version": "2.0"})
    assert real.source.startswith("swebench 4") and real.python == "3.9"
    install, note = real.venv_install()  # requests installs non-editable: a shared venv needs it editable
    assert install == "python -m pip install -e ." and "editable" in note
    flask = grading.repo_spec({"repo": "pallets/flask", "version": "2.3"})
    assert flask.packages == "requirements.txt"
    assert grading.requirement_paths("pallets/flask") == ["requirements/dev.txt"]


def test_unknown_spec_says_what_to_do():
    with pytest.raises(grading.SpecNotFound, match="nextstate_spec"):
        grading.repo_spec({"repo": "someone/unknown", "version": "9.9"})
    own = grading.repo_spec(
        {
            "repo": "someone/unknown",
            "version": "9.9",
            "nextstate_spec": {"python": "3.10", "install": "pip install -e .", "test_cmd": "pytest -rA"},
        }
    )
    assert own.source == "instance" and own.python == "3.10"


def test_pre_install_steps_split_into_repo_and_system_steps():
    spec = grading._spec_from_dict(
        "a/b",
        "1",
        {
            "python": "3.9",
            "pre_install": ["sed -i 's/pytest/pytest -rA/' tox.ini", "apt-get update && apt-get install -y graphviz"],
        },
        "test",
    )
    assert spec.repo_steps() == ["sed -i 's/pytest/pytest -rA/' tox.ini"]
    assert spec.skipped_steps() == ["apt-get update && apt-get install -y graphviz"]


def test_eval_script_is_the_official_one_with_our_venv():
    script = grading.eval_script(INSTANCE, grading.repo_spec(INSTANCE))
    assert script.startswith("#!/bin/bash\nset -uxo pipefail\n")
    assert "conda" not in script and f"source {grading.VENV_DIR}/bin/activate" in script
    assert ": '>>>>> Start Test Output'" in script and ": '>>>>> End Test Output'" in script
    assert "pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_slug.py" in script
    assert "x.csv" not in script.split("Start Test Output")[1].split("\n")[1]  # data files are not test directives
    assert f"git checkout {INSTANCE['base_commit']} tests/test_slug.py" in script
    assert grading.test_directives(INSTANCE) == ["tests/test_slug.py"]


def test_an_instances_own_spec_keeps_its_test_command_after_another_of_its_repo_version():
    """swebench reads the test command by (repo, version) from a table the first spec in a process registers; an
    instance's own `nextstate_spec` for the same (repo, version) still runs its own command."""
    first = grading.eval_script(INSTANCE, grading.repo_spec(INSTANCE))
    own = dict(INSTANCE, nextstate_spec={"python": "3.11", "install": "python -m pip install -e .",
                                         "test_cmd": "tox --current-env -epy311 --"})
    script = grading.eval_script(own, grading.repo_spec(own))
    assert "pytest --no-header" in first and "tox --current-env -epy311 -- tests/test_slug.py" in script
    assert "pytest --no-header" not in script


def test_an_instances_own_log_parser_parses_its_log_after_another_spec_of_its_repo():
    """swebench reads the log parser by repo; two specs of one repo it does not know, naming different parsers, each
    get their own (the second used to get the first one's, and a sympy-style log parsed as pytest's: nothing)."""
    spec = grading.repo_spec(INSTANCE)
    pytest_style = grading.test_status_map(INSTANCE, spec, _log({"tests/test_slug.py::test_new": "PASSED"}))
    own = dict(INSTANCE, nextstate_spec={"python": "3.11", "install": "python -m pip install -e .",
                                         "test_cmd": "bin/test -C --verbose", "log_parser": "parse_log_sympy"})
    sympy_log = "+ : '>>>>> Start Test Output'\ntest_new ok\ntest_old F\n+ : '>>>>> End Test Output'\n"
    own_statuses = grading.test_status_map(own, grading.repo_spec(own), sympy_log)
    assert own_statuses == {"test_new": "PASSED", "test_old": "FAILED"}
    assert pytest_style == {"tests/test_slug.py::test_new": "PASSED"}
    again = grading.test_status_map(INSTANCE, spec, _log({"tests/test_slug.py::test_old": "FAILED"}))
    assert again == {"tests/test_slug.py::test_old": "FAILED"}  # and the first spec's parser is back for its logs


def test_grade_uses_swebench_verdicts():
    spec = grading.repo_spec(INSTANCE)
    ok = grading.grade(
        INSTANCE,
        spec,
        "diff",
        _log({"tests/test_slug.py::test_new": "PASSED", "tests/test_slug.py::test_old": "PASSED"}),
    )
    assert ok.resolved and ok.status == "RESOLVED_FULL" and ok.patch_applied and ok.tests_passed == 2
    f2p_fails = grading.grade(
        INSTANCE,
        spec,
        "diff",
        _log({"tests/test_slug.py::test_new": "FAILED", "tests/test_slug.py::test_old": "PASSED"}),
    )
    assert not f2p_fails.resolved and f2p_fails.status == "RESOLVED_NO"
    p2p_breaks = grading.grade(
        INSTANCE,
        spec,
        "diff",
        _log({"tests/test_slug.py::test_new": "PASSED", "tests/test_slug.py::test_old": "FAILED"}),
    )
    assert not p2p_breaks.resolved and p2p_breaks.pass_to_pass["failure"] == ["tests/test_slug.py::test_old"]
    not_applied = grading.grade(INSTANCE, spec, "diff", _log({}, applied=False))
    assert not not_applied.resolved and not not_applied.patch_applied
    missing = grading.grade(INSTANCE, spec, "diff", _log({"tests/test_slug.py::test_old": "PASSED"}))
    assert not missing.resolved  # a FAIL_TO_PASS test that did not run is a failure


def test_instance_validation_normalizes_hf_rows():
    row = dict(INSTANCE, FAIL_TO_PASS=json.dumps(["a::b"]), PASS_TO_PASS="[]", version=0.3)
    out = validate_swe_instance(row)
    assert out["id"] == "nextstate__textkit-1" and out["FAIL_TO_PASS"] == ["a::b"] and out["PASS_TO_PASS"] == []
    assert out["version"] == "0.3"
    with pytest.raises(ValueError, match="lacks base_commit"):
        validate_swe_instance({k: v for k, v in INSTANCE.items() if k != "base_commit"})
    with pytest.raises(ValueError, match="no FAIL_TO_PASS"):
        validate_swe_instance(dict(INSTANCE, FAIL_TO_PASS=[]))


def test_python_choice_prefers_exact_then_nearest():
    pool = (
        Interpreter("/p/3.8", (3, 8, 18), "/p"),
        Interpreter("/p/3.10", (3, 10, 13), "/p"),
        Interpreter("/p/3.10b", (3, 10, 2), "/p"),
        Interpreter("/p/3.12", (3, 12, 1), "/p"),
    )
    exact = choose_python("3.10", pool)
    assert exact.exact and exact.interpreter.version == (3, 10, 13)
    near = choose_python("3.9", pool)
    assert not near.exact and near.interpreter.version == (3, 10, 13)  # equidistant 3.8 / 3.10: the newer
    assert choose_python("3.6", pool).interpreter.version == (3, 8, 18)
    with pytest.raises(ValueError):
        choose_python("three", pool)


def test_bundled_set():
    rows = bundled_instances("all")
    assert len(rows) >= 8 and len({r["repo"] for r in rows}) >= 3
    assert bundled_instances("train") and bundled_instances("eval")
    for r in rows:
        assert r["FAIL_TO_PASS"] and r["PASS_TO_PASS"] and r["patch"] and r["test_patch"]
        assert not set(r["FAIL_TO_PASS"]) & set(r["PASS_TO_PASS"])


def test_instances_load_from_jsonl_and_parquet(tmp_path):
    import pyarrow as pa  # the swe extra, always installed: a broken one fails
    import pyarrow.parquet as pq

    from envs.taskfile import load_tasks

    rows = [
        dict(r, FAIL_TO_PASS=json.dumps(r["FAIL_TO_PASS"]), PASS_TO_PASS=json.dumps(r["PASS_TO_PASS"]))
        for r in bundled_instances("all")[:3]
    ]
    for r in rows:
        r.pop("id")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "lite.parquet")
    (tmp_path / "lite.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("lite.parquet", "lite.jsonl"):
        tasks = load_tasks(tmp_path / name, validate_swe_instance)
        assert [t["id"] for t in tasks] == [r["instance_id"] for r in rows]
        assert tasks[0]["FAIL_TO_PASS"] == json.loads(rows[0]["FAIL_TO_PASS"])


def test_own_eval_script_matches_the_official_one(monkeypatch):
    """Without swebench 4.x (e.g. 5.x installed) the eval script is built here: the steps must be the official ones."""
    if not grading.classic_api():
        pytest.skip("needs swebench 4.x to compare with")
    spec = grading.repo_spec(INSTANCE)
    official = [ln for ln in grading.eval_script(INSTANCE, spec).splitlines() if not ln.startswith("git config")]
    monkeypatch.setattr(grading, "classic_api", lambda: False)
    ours = grading.eval_script(INSTANCE, spec).splitlines()
    steps = lambda lines: [ln for ln in lines if ln.startswith(("git checkout", "git apply", ": '", "pytest"))]
    assert steps(ours) == steps(official) and len(steps(ours)) == 6


def test_official_eval_script_keeps_swebench_lines_ours_swaps_the_environment():
    if not grading.classic_api():
        pytest.skip("needs swebench 4.x")
    spec = grading.repo_spec(INSTANCE)
    official = grading.eval_script(INSTANCE, spec, official=True)
    ours = grading.eval_script(INSTANCE, spec)
    # SWE-bench's own image: its conda activation and the install it re-runs after the patch, as written
    assert "conda activate testbed" in official and f"\n{spec.install}\n" in official
    assert "conda" not in ours and f"\n{spec.install}\n" not in ours
    assert f"source {grading.VENV_DIR}/bin/activate" in ours


def test_conda_environment_becomes_pip_requirements():
    from envs.swe.condaenv import conda_to_pip, pip_requirements

    assert conda_to_pip("numpy>=1.20") == ["numpy>=1.20"]
    assert conda_to_pip("pandas=1.5") == ["pandas==1.5.*"]  # conda's fuzzy `=`
    assert conda_to_pip("pint=0.19=py_0") == ["pint==0.19.*"]  # a build string goes
    assert conda_to_pip("netcdf4 1.6.*") == ["netcdf4==1.6.*"]
    assert conda_to_pip("conda-forge::dask-core") == ["dask"]  # a channel prefix goes; conda's name -> PyPI's
    assert conda_to_pip("cfgrib") == ["cfgrib", "ecmwflibs"]  # and what conda's build carries
    assert conda_to_pip("python=3.10") == [] and conda_to_pip("hdf5") == []
    yml = "name: t\ndependencies:\n  - python=3.10\n  - numpy\n  - hdf5\n  - pip\n  - pip:\n      - numbagg\n"
    reqs = pip_requirements(yml)
    assert reqs.requirements == ["numpy", "numbagg"] and reqs.left_out == ["python=3.10", "hdf5", "pip"]


def test_cutoff_install_targets_and_exact_pins():
    from envs.swe.cutoff import check_cutoff, compile_step, install_target

    assert install_target("python -m pip install -e .[test] --verbose") == ".[test]"
    assert install_target("python -m pip install .") == "."
    assert install_target("python -m pip install -v --no-use-pep517 --no-build-isolation -e .") == "."
    assert install_target("python setup.py develop") is None
    step = compile_step("/tmp/a.in", "/tmp/a.pins", "2024-09-01", "/c.txt")
    assert "--exclude-newer 2024-09-01" in step and "-c /c.txt" in step
    assert "--exclude-newer-package" in step  # exact pins are taken as given, however new
    assert "setuptools" not in step  # `-c`: binds the install only, build tools included
    as_env = compile_step("/tmp/a.in", "/tmp/a.pins", "2024-09-01", for_env_var=True)
    assert "/^\\(setuptools\\|wheel\\|pip\\)==/d" in as_env  # PIP_CONSTRAINT: the build tools are each build's
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        check_cutoff("last summer")
    assert check_cutoff("") == ""


def test_network_failures_are_recognized_in_logs():
    from envs.swe.network import network_failure

    log = "ok\n\x1b[91mE   socket.gaierror: [Errno -3] Temporary failure in name resolution\x1b[0m\nmore\n"
    assert network_failure(log) == "E   socket.gaierror: [Errno -3] Temporary failure in name resolution"
    assert network_failure("E   OSError: [Errno 101] Network is unreachable") is not None
    # a refused connection to a test's own local server is not the network
    assert network_failure("ConnectionRefusedError: [Errno 111] Connection refused") is None
    assert network_failure("PASSED tests/test_x.py::test_y") is None
    # only the tests' output counts: an install step's retries before it are not the tests needing the network
    install = "WARNING: Retrying ... NewConnectionError: [Errno 101] Network is unreachable\n"
    tests = "+ : '>>>>> Start Test Output'\nPASSED t::a\n+ : '>>>>> End Test Output'\n"
    assert network_failure(install + tests) is None


def test_validation_verdicts():
    from envs.swe.validate import REFUSED, RUNNABLE, Record, Verdict, decide, summary, table

    def rec(gold: Verdict, empty: Verdict | None = None) -> Record:
        return decide(Record("a__b-1", "a/b", "1", "local", REFUSED, gold=gold, empty=empty))

    ok = Verdict(True, "RESOLVED_FULL", 1.0)
    no = Verdict(False, "RESOLVED_NO", 1.0, fail_to_pass_failed=["t::f2p"], pass_to_pass_failed=["t::p2p"])
    assert rec(ok, no).verdict == RUNNABLE
    assert rec(ok, ok).cause == "empty"
    assert rec(no).cause == "gold" and "FAIL_TO_PASS failing 1: t::f2p" in rec(no).reason
    offline = Verdict(False, "RESOLVED_NO", 1.0, fail_to_pass_failed=["t::f2p"], network_error="gaierror(-3, ...)")
    assert rec(offline).cause == "network" and rec(offline).reason == "tests need the network: gaierror(-3, ...)"
    timed = Verdict(False, "RESOLVED_NO", 1.0, timed_out=True)
    assert rec(timed).cause == "timeout"
    records = [rec(ok, no), rec(no), rec(offline)]
    s = summary(records)
    assert s["runnable"] == 1 and s["refused_by_cause"] == {"gold": 1, "network": 1}
    assert s["gold_resolved_of_graded"] == "1/2"  # a network refusal is not held against the gold patch
    assert "| a__b-1 | local |" in table(records)
