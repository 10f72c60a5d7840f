"""The pip requirements that stand for a spec's `packages`, read from the environment_setup_commit's checkout as
SWE-bench reads them: a requirements file (with its `-r` includes, cleaned as swebench cleans it), a conda
environment.yml (envs.swe.condaenv), or conda package names (installed from PyPI under the same names)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable

from envs.swe.condaenv import pip_requirements
from envs.swe.grading import RepoSpec, clean_requirements, environment_yml_paths, requirement_paths


def read_requirements(read_file: Callable[[str], str], spec: RepoSpec, notes: list[str]) -> list[str]:
    """`read_file(path)` reads a file of the checkout (raising OSError when it is missing); deviations from the
    official environment go to `notes`."""
    if spec.packages == "requirements.txt":
        return clean_requirements(_requirements_file(read_file, spec.repo)).splitlines()
    if spec.packages == "environment.yml":
        for path in environment_yml_paths(spec.repo):
            try:
                text = read_file(path)
            except OSError:
                continue
            conda = pip_requirements(text)
            notes.append(f"the spec's conda environment ({path}) was installed from PyPI")
            if conda.left_out:
                notes.append(f"conda-only dependencies left out: {', '.join(conda.left_out)}")
            return conda.requirements
        raise FileNotFoundError(f"{spec.repo}: no environment file at {environment_yml_paths(spec.repo)}")
    if spec.packages.strip():
        notes.append(f"conda packages '{spec.packages}' were installed with pip")
        return shlex.split(spec.packages)
    return []


def _requirements_file(read_file: Callable[[str], str], repo: str) -> str:
    for path in requirement_paths(repo):
        try:
            text = read_file(path)
        except OSError:
            continue
        lines: list[str] = []
        for line in text.splitlines():
            if line.strip().startswith("-r"):
                ref = os.path.normpath(os.path.join(os.path.dirname(path), line.strip()[2:].strip()))
                try:
                    lines += read_file(ref).splitlines()
                except OSError:
                    pass
            else:
                lines.append(line)
        return "\n".join(lines)
    raise FileNotFoundError(f"{repo}: no requirements file at {requirement_paths(repo)}")
