"""Env registry: built-in families, `register()`, and third-party plugins from the `nextstate.envs` entry-point group.

Plugins are discovered by name only; their code is imported when an env is made, so each Ray worker resolves them in
its own process. Errors say what to do next.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nextstate.envs"
GYM_NAMESPACE = "nextstate"

BUILTIN: dict[str, str] = {
    "toolcall": "envs.toolcall.env:ToolCallEnv",
    "terminal": "envs.terminal.env:TerminalEnv",
    "swe": "envs.swe.env:SWEEnv",
    "gui": "envs.gui.env:GUIEnv",
}

REQUIRED_METHODS = ("reset", "step", "close", "tasks")


class UnknownEnvError(LookupError):
    """No env of that name is registered."""


class PluginLoadError(ImportError):
    """A registered env could not be imported or is not an env class."""


@dataclass(frozen=True)
class EnvSpec:
    name: str
    entry_point: str | Callable[..., Any]  # "module:attr" or a class / factory
    origin: str  # "built-in", "register()", or "entry point of <dist> <version>"
    kwargs: dict[str, Any] = field(default_factory=dict)


_specs: dict[str, EnvSpec] = {n: EnvSpec(n, ep, "built-in") for n, ep in BUILTIN.items()}
_plugins_scanned = False


def _scan_entry_points() -> None:
    global _plugins_scanned
    if _plugins_scanned:
        return
    _plugins_scanned = True
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "an unknown distribution"
        if ep.name in _specs:
            log.warning("entry point %r of %s ignored: the name is taken by %s", ep.name, dist, _specs[ep.name].origin)
            continue
        _specs[ep.name] = EnvSpec(ep.name, ep.value, f"entry point '{ep.name} = {ep.value}' of {dist}")
        _register_with_gymnasium(ep.name)


def register(name: str, entry_point: str | Callable[..., Any], *, overwrite: bool = False, **kwargs: Any) -> None:
    """Register an env class or factory (or a "module:attr" string) under `name`, with default constructor kwargs."""
    _scan_entry_points()
    if not name or "/" in name:
        raise ValueError(f"invalid env name {name!r}: use a plain identifier like 'myenv'")
    if name in _specs and not overwrite:
        raise ValueError(f"env {name!r} is already registered ({_specs[name].origin}); pass overwrite=True to replace it")
    _specs[name] = EnvSpec(name, entry_point, "register()", dict(kwargs))
    _register_with_gymnasium(name)


def names() -> list[str]:
    """All registered env names, built-ins and plugins."""
    _scan_entry_points()
    return sorted(_specs)


def spec(name: str) -> EnvSpec:
    _scan_entry_points()
    try:
        return _specs[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_specs), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownEnvError(
            f"no env {name!r}; known: {', '.join(sorted(_specs))}.{hint} Third-party envs register through the "
            f"'{ENTRY_POINT_GROUP}' entry-point group of an installed distribution, or envs.register(name, cls)."
        ) from None


def env_class(name: str) -> Callable[..., Any]:
    """Import and return the class (or factory) registered under `name`."""
    s = spec(name)
    target = s.entry_point
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
        except Exception as exc:
            raise PluginLoadError(
                f"env {name!r} ({s.origin}) could not be loaded from {target!r}: {type(exc).__name__}: {exc}. "
                "Is its distribution installed in this interpreter (and in the Ray workers' environment)?"
            ) from exc
        target = obj
    if isinstance(target, type):
        missing = [m for m in REQUIRED_METHODS if not callable(getattr(target, m, None))]
        if missing:
            raise PluginLoadError(
                f"env {name!r} ({s.origin}) resolves to class {target.__qualname__}, which lacks {', '.join(missing)}: "
                "an env must implement reset, step, close and tasks (subclass envs.AgentEnv to get them)."
            )
    elif not callable(target):
        raise PluginLoadError(f"env {name!r} ({s.origin}) resolves to {target!r}, which is not a class or factory")
    return target


def make(name: str, **kwargs: Any):
    """Build the env registered under `name`; `kwargs` override the registered defaults."""
    factory = env_class(name)
    env = factory(**{**spec(name).kwargs, **kwargs})
    missing = [m for m in ("reset", "step", "close") if not callable(getattr(env, m, None))]
    if missing:
        raise PluginLoadError(f"env {name!r}: the object built by {factory!r} lacks {', '.join(missing)}")
    return env


def task_set(name: str, split: str = "train"):
    """The bundled tasks of env `name` for `split`, without building an env."""
    return env_class(name).tasks(split)


def _register_with_gymnasium(name: str) -> None:
    import gymnasium

    env_id = f"{GYM_NAMESPACE}/{name}"
    if env_id in gymnasium.registry:
        del gymnasium.registry[env_id]
    gymnasium.register(env_id, entry_point=_GymFactory(name))


@dataclass(frozen=True)
class _GymFactory:
    """Picklable entry point for gymnasium.make("nextstate/<name>")."""

    name: str

    def __call__(self, **kwargs: Any):
        return make(self.name, **kwargs)


for _name in BUILTIN:
    _register_with_gymnasium(_name)
_scan_entry_points()  # names only (cheap); plugin code is imported at make()
