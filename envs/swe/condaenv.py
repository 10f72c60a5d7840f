"""A spec's conda environment (`packages: environment.yml`) as pip requirements.

No conda or Miniconda can be downloaded here, so the environment SWE-bench creates with `conda env create` /
`conda env update` is approximated by a venv: each conda dependency becomes the PyPI requirement of the same package
(conda's `name=1.2` is `name==1.2.*`, a build string is dropped, a few conda names differ from PyPI's), the `pip:`
section is taken as written, and what only conda provides (the interpreter itself, compilers, C libraries) is left out.
The spec's `pip_packages` are installed after this, as SWE-bench does, so the versions it pins win.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

# conda package name -> PyPI distribution name (None: nothing to install from PyPI)
CONDA_TO_PYPI: dict[str, str | None] = {
    "python": None,
    "pip": None,
    "matplotlib-base": "matplotlib",
    "dask-core": "dask",
    "pytables": "tables",
    "iris": "scitools-iris",
    "python-graphviz": "graphviz",
    "pytorch": "torch",
    "libnetcdf": None,
    "hdf5": None,
    "libgdal": None,
    "gdal": None,
    "proj": None,
    "geos": None,
    "eccodes": None,
    "cdms2": None,  # conda-forge only
    "c-compiler": None,
    "cxx-compiler": None,
    "compilers": None,
    "make": None,
    "cmake": "cmake",
    "nodejs": None,
    "pandoc": None,
    "graphviz": None,  # the C program; the python bindings are python-graphviz
    "imagemagick": None,
    "ffmpeg": None,
    "ghostscript": None,
    "texlive-core": None,
}

_SPEC = re.compile(r"^\s*(?:[\w.-]+::)?([A-Za-z0-9_.\-]+)\s*(.*?)\s*$")


@dataclass
class CondaRequirements:
    requirements: list[str] = field(default_factory=list)  # pip requirement lines
    left_out: list[str] = field(default_factory=list)  # conda dependencies with no PyPI counterpart


def conda_to_pip(spec: str) -> str | None:
    """One conda match spec ('numpy>=1.20', 'pandas=1.5', 'netcdf4 1.6.*', 'conda-forge::zarr') as a pip requirement,
    or None when the package has no PyPI counterpart."""
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"not a conda package spec: {spec!r}")
    name, version = m.group(1), m.group(2).replace(" ", "")
    pypi = CONDA_TO_PYPI.get(name.lower(), name)
    if pypi is None:
        return None
    if not version:
        return pypi
    if version.startswith("=") and not version.startswith("=="):  # conda's fuzzy `=1.2` means 1.2.*
        version = version[1:]
        version = version.split("=")[0]  # `=1.2=py39_0`: the build string goes
        return f"{pypi}=={version}" if "*" in version else f"{pypi}=={version}.*"
    if version[0].isdigit():  # `name 1.6.*`
        return f"{pypi}=={version}"
    return f"{pypi}{version}"


def pip_requirements(environment_yml: str) -> CondaRequirements:
    """The pip requirements that stand for an environment.yml's dependencies."""
    doc = yaml.safe_load(environment_yml) or {}
    out = CondaRequirements()
    for dep in doc.get("dependencies") or []:
        if isinstance(dep, dict):
            out.requirements += [str(p) for p in dep.get("pip", []) or []]
            continue
        req = conda_to_pip(str(dep))
        if req is None:
            out.left_out.append(str(dep))
        else:
            out.requirements.append(req)
    return out
