"""OSWorld's own metric modules as a reference for differential tests.

They come from PyPI's `desktop-env` (`pip install desktop-env --no-deps`: the package pins torch 2.5 and numpy < 2, so
its dependencies are not installed). Its package `__init__` imports every metric module and their heavy dependencies,
so the modules are loaded by file path under empty parent packages, and the optional libraries a tested function never
calls (OCR, audio, video, PDF rendering, formula parsing) are stubbed as empty modules.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path

import pytest

INSTALL = "pip install desktop-env --no-deps"
# imported at module level by OSWorld's metric files, used only by functions these tests do not call
STUBS = ("formulas", "easyocr", "cv2", "acoustid", "librosa", "fastdtw", "fitz", "borb", "borb.pdf", "PyPDF2",
         "pdfplumber", "mutagen", "mutagen.easyid3")


@functools.lru_cache(maxsize=1)
def _root() -> Path | None:
    spec = importlib.util.find_spec("desktop_env")  # finding it does not run its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "evaluators" / "metrics"
    return root if root.is_dir() else None


def reference(name: str) -> types.ModuleType:
    """desktop_env.evaluators.metrics.<name>, or skip the test saying how to get it."""
    root = _root()
    if root is None:
        pytest.skip(f"OSWorld's metrics are not installed (the differential reference): {INSTALL}")
    full = f"desktop_env.evaluators.metrics.{name}"
    if full in sys.modules:
        return sys.modules[full]
    for pkg, path in (("desktop_env", root.parent.parent), ("desktop_env.evaluators", root.parent),
                      ("desktop_env.evaluators.metrics", root)):
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(path)]  # a namespace-like parent: its real __init__ never runs
            sys.modules[pkg] = mod
    added = [s for s in STUBS if s not in sys.modules and (s in ("formulas", "easyocr")
                                                          or importlib.util.find_spec(s.split(".")[0]) is None)]
    for stub in added:
        mod = types.ModuleType(stub)
        mod.__getattr__ = lambda attr: object  # type: ignore[method-assign]  # `from stub import X` gets a placeholder
        sys.modules[stub] = mod
    spec = importlib.util.spec_from_file_location(full, root / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules[full]
        pytest.skip(f"OSWorld's {name} metrics need {exc.name!r}, which is not installed here")
    finally:
        for stub in added:  # the stubs must not stand in for the real packages in other tests
            sys.modules.pop(stub, None)
    return module
