"""The software stack recorded with every run and experiment (rollout/stack.py) and its use on resume (rollout/run.py)."""

import logging
import platform

import numpy
import torch

from rollout.run import with_stack
from rollout.stack import SoftwareStack, software_stack, stack_differences


def test_the_stack_names_the_installed_versions_and_the_cpu_kernels():
    s = software_stack()
    assert s.python == platform.python_version()
    assert s.packages["torch"] == torch.__version__ and s.packages["numpy"] == numpy.__version__
    assert s.cpu_capability == torch.backends.cpu.get_cpu_capability()
    line = s.line()
    assert f"torch {torch.__version__}" in line and f"({s.cpu_capability})" in line
    assert SoftwareStack(**s.to_dict()) == s  # what a report reads back from experiment.json


def test_differences_name_each_changed_part():
    a = software_stack().to_dict()
    other = "AVX2" if a["cpu_capability"] == "AVX512" else "AVX512"  # a capability this machine's kernels are not
    b = {**a, "cpu_capability": other, "packages": {**a["packages"], "torch": "9.9.9", "newpkg": "1.0"}}
    assert stack_differences(a, a) == []
    assert stack_differences(a, b) == [f"cpu_capability: {a['cpu_capability']} -> {other}",
                                       "newpkg: None -> 1.0", f"torch: {a['packages']['torch']} -> 9.9.9"]


def test_a_resume_on_another_stack_says_so_and_keeps_the_first(caplog):
    now = software_stack().to_dict()
    fresh = with_stack({"run": {"name": "r"}}, now)
    assert fresh["stack"] == now and "stack_before_resume" not in fresh
    assert with_stack(fresh, now) == fresh  # resumed on the same stack: nothing to say
    older = {**now, "packages": {**now["packages"], "transformers": "0.0.1"}}
    with caplog.at_level(logging.WARNING, logger="nextstate"):
        resumed = with_stack({"run": {"name": "r"}, "stack": older}, now)
    assert resumed["stack"] == now and resumed["stack_before_resume"] == older
    assert "transformers: 0.0.1 ->" in caplog.text
