"""The test tiers (pyproject.toml, `addopts`): `python -m pytest` runs every component's tests; `python -m pytest -m slow`
the experiment tier. A parametrized check over many cases of the same component keeps one case in the default tier
and the rest in the experiment tier, so the default still exercises each component and CI still runs every case."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest


def first_fast(cases: Iterable[Any], ids: Callable[[Any], str] | None = None) -> list[Any]:
    """`cases` as pytest params: the first in the default tier, the others marked slow."""
    return [pytest.param(c, id=ids(c) if ids else None, marks=() if i == 0 else pytest.mark.slow)
            for i, c in enumerate(cases)]


__all__ = ["first_fast"]
