"""The pieces of the task-directory verifier's runner that need no sandbox: resolving paths inside a built root as its
own processes would (never on the host), reading a program's ELF loader, and the harness's own reward-file reader."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from envs.runtime.host_paths import read_beneath
from envs.terminal.test_runner import Interpreter, RunnerUnavailable, elf_interpreter, image_interpreter, in_root


def test_in_root_resolves_links_inside_the_root_only(tmp_path):
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "python3.11").write_text("")
    (root / "usr" / "bin" / "python3").symlink_to("python3.11")
    (root / "bin").symlink_to("usr/bin")
    (root / "etc").mkdir()
    (root / "etc" / "away").symlink_to("/etc/passwd")  # absolute: resolved inside the root, where it is missing
    (root / "etc" / "up").symlink_to("../../../../../usr/bin/python3")  # `..` stops at the root
    (root / "loop").symlink_to("loop")
    assert in_root(root, "/bin/python3") == "usr/bin/python3.11"
    assert in_root(root, "/etc/up") == "usr/bin/python3.11"
    assert in_root(root, "/etc/away") is None and in_root(root, "/loop") is None


def test_elf_interpreter_reads_a_programs_loader(tmp_path):
    loader = elf_interpreter(Path(os.path.realpath(shutil.which("ls"))))
    assert loader is not None and "ld-linux" in loader
    (tmp_path / "script").write_text("#!/bin/sh\necho hi\n")
    assert elf_interpreter(tmp_path / "script") is None


def test_image_interpreter_names_what_is_missing(tmp_path):
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "python3").write_text("#!/bin/sh\n# a shim\n")
    with pytest.raises(RunnerUnavailable, match=r"no dynamically linked python3 .* \(found: /usr/bin/python3\)"):
        image_interpreter(tmp_path, "/usr/bin")
    argv = Interpreter("/i/ld.so", "/i/lib", "/i/python3").argv("--idle")
    assert argv[:5] == ["/i/ld.so", "--inhibit-cache", "--library-path", "/i/lib", "/i/python3"]
    assert argv[5:8] == ["-I", "-S", "-B"]  # isolated, no site, no bytecode written


def test_read_beneath_never_follows_a_link(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "reward.txt").write_text("1\n")
    (tmp_path / "d" / "link").symlink_to(tmp_path / "d" / "reward.txt")
    (tmp_path / "via").symlink_to(tmp_path / "d")
    os.mkfifo(tmp_path / "d" / "fifo")
    assert read_beneath(tmp_path, "d/reward.txt") == b"1\n"
    assert read_beneath(tmp_path, "d/link") is None and read_beneath(tmp_path, "via/reward.txt") is None
    assert read_beneath(tmp_path, "d/fifo") is None and read_beneath(tmp_path, "d/none") is None
    with pytest.raises(ValueError, match="without '..'"):
        read_beneath(tmp_path, "d/../d/reward.txt")


def test_the_runner_wheels_follow_the_images_python():
    from envs.terminal.test_runner import RUNNER_WHEEL_SETS, runner_wheels

    assert runner_wheels("3.13") == ((3, 9), RUNNER_WHEEL_SETS[(3, 9)])
    assert runner_wheels("3.9")[0] == (3, 9) and runner_wheels("3.8")[1][0] == "pytest==8.3.5"
    assert runner_wheels("3.7")[1][0] == "pytest==7.4.4" and runner_wheels("3.6")[1][0] == "pytest==7.0.1"
    with pytest.raises(RunnerUnavailable, match=r"Python 3\.5; the verifier's pytest runs on 3\.6 or newer"):
        runner_wheels("3.5")


def test_the_images_python_version_from_its_name_or_its_library(tmp_path):
    from envs.terminal.test_runner import python_version

    assert python_version(tmp_path, "usr/local/bin/python3.12") == "3.12"
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "python3.7").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "python3.7" / "os.py").write_text("")
    assert python_version(tmp_path, "usr/bin/python3") == "3.7"
    (tmp_path / "usr" / "lib" / "python3.9").mkdir()
    (tmp_path / "usr" / "lib" / "python3.9" / "os.py").write_text("")
    with pytest.raises(RunnerUnavailable, match="cannot tell the Python version"):
        python_version(tmp_path, "usr/bin/python3")
