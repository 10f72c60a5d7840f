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

# conda package name -> PyPI distribution name (None: nothing to install from PyPI; a list: several)
CONDA_TO_PYPI: dict[str, str | list[str] | None] = {
    "cfgrib": ["cfgrib", "ecmwflibs"],  # conda's cfgrib brings the ecCodes library; on PyPI ecmwflibs carries it
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


def conda_to_pip(spec: str) -> list[str]:
    """One conda match spec ('numpy>=1.20', 'pandas=1.5', 'netcdf4 1.6.*', 'conda-forge::zarr') as pip requirements
    (none when the package has no PyPI counterpart)."""
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"not a conda package spec: {spec!r}")
    name, version = m.group(1), m.group(2).replace(" ", "")
    mapped = CONDA_TO_PYPI.get(name.lower(), name)
    if mapped is None:
        return []
    if isinstance(mapped, list):  # the package and what conda's build of it carries
        return [_requirement(mapped[0], version), *mapped[1:]]
    return [_requirement(mapped, version)]


def _requirement(pypi: str, version: str) -> str:
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
        reqs = conda_to_pip(str(dep))
        if not reqs:
            out.left_out.append(str(dep))
        out.requirements += reqs
    return out


# Run by the environment's python with the distribution names as arguments: prints [dist, module, error] for each
# distribution whose module fails to import with anything but ImportError (a binding whose C library conda would have
# brought and PyPI did not: a test suite's `importorskip` skips on ImportError, but such an error breaks collection)
_IMPORT_CHECK = """
import importlib, importlib.metadata as md, json, re, sys
bad = []
for dist in sys.argv[1:]:
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        continue
    tops = (d.read_text("top_level.txt") or "").split() or [re.sub(r"[-.]", "_", dist).lower()]
    for top in tops:
        if top.startswith("_"):
            continue
        try:
            importlib.import_module(top)
        except ImportError:
            pass
        except BaseException as exc:
            bad.append([dist, top, repr(exc)[:160]])
            break
print(json.dumps(bad))
"""


def broken_imports_command(python: str, requirements: list[str]) -> str:
    """The shell command that lists the installed `requirements` whose import breaks (see _IMPORT_CHECK), as JSON."""
    names = [re.split(r"[<>=!~\[; ]", r.strip(), maxsplit=1)[0] for r in requirements if r.strip()]
    quoted = " ".join(f"'{n}'" for n in names if re.fullmatch(r"[A-Za-z0-9_.\-]+", n))
    return f"{python} - {quoted} 2>/dev/null <<'EOF_NEXTSTATE_CHECK'\n{_IMPORT_CHECK}\nEOF_NEXTSTATE_CHECK"
