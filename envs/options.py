"""Options as data: build a config dataclass from a plain mapping (a config file's, a constructor's **kwargs).

This is the one unknown-key check of NextState: every layer above builds its config dataclasses through
`from_options`, so a misspelt key fails the same way everywhere, with the known keys listed. It lives in `envs`, the
lowest layer, because env runtimes and the GUI env take such options too.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import Any


class UnknownOptionError(ValueError, TypeError):
    """A key that the dataclass it configures does not have. A ValueError (bad config) and a TypeError (what an
    unexpected keyword argument raises), so callers of either convention catch it."""


def check_known(known: Iterable[str], options: Mapping[str, Any], what: str) -> None:
    """Raise UnknownOptionError naming the keys of `options` that are not in `known`, and listing the known ones."""
    names = sorted(known)
    unknown = sorted(set(options) - set(names))
    if unknown:
        close = [m for k in unknown for m in (difflib.get_close_matches(k, names, n=1)
                                              or [n for n in names if n.startswith(k)][:1])]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UnknownOptionError(f"unknown {what} option(s) {', '.join(unknown)}{hint}; known: {', '.join(names)}")


def _dataclass_type(hint: Any) -> type | None:
    """The dataclass a field holds (directly or as `X | None`), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]) and isinstance(args[0], type):
        return args[0]
    return None


def from_options(cls: type, options: Mapping[str, Any] | None, what: str | None = None, **fixed: Any) -> Any:
    """`cls(**options, **fixed)`, rejecting keys `cls` does not have. A field that holds a dataclass may be given as a
    mapping: it is built the same way (or by that class's own `from_config(mapping)` when it has one, e.g. a retry
    policy that names exception classes), its unknown keys reported with their full dotted name."""
    what = what or cls.__name__
    data = dict(options or {})
    check_known((f.name for f in dataclasses.fields(cls)), {**data, **fixed}, what)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a hint naming something only a type checker sees: no nested building
        hints = {}
    for key, value in data.items():
        sub = _dataclass_type(hints.get(key))
        if sub is not None and isinstance(value, Mapping):
            convert = getattr(sub, "from_config", None)
            data[key] = convert(value) if convert is not None else from_options(sub, value, f"{what}.{key}")
    return cls(**data, **fixed)


__all__ = ["UnknownOptionError", "check_known", "from_options"]
