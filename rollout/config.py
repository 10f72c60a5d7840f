"""Config nodes -> plain dicts and dataclasses (Hydra stays at the edge: everything inside takes dataclasses)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

#: Options whose value is a free-form mapping (resources, runtime fields, request extras, demonstration options). Hydra
#: refuses a new key in any dict of a composed config ("Key 'docker' is not in struct"), so `key={docker: 1}` on the
#: command line would work only as `++key=...`; `open_dict_overrides` writes it so for these keys, and only these: a
#: misspelt key elsewhere still fails.
OPEN_DICT_OPTIONS = frozenset({
    "farm.worker_resources", "env.runtime_options", "policy.chat_template_kwargs", "policy.extra_body",
    "policy.warm_start.demonstrations", "judge.extra_body",
})


def open_dict_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides with `key={...}` of an OPEN_DICT_OPTIONS key turned into `++key={...}` (merged into the default
    mapping, new keys added), so every documented `key={...}` works as written."""
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and key in OPEN_DICT_OPTIONS and value.lstrip().startswith("{"):
            o = f"++{o}"
        out.append(o)
    return out


def plain(node: Any) -> dict[str, Any]:
    """A resolved plain dict from a config node (or a mapping / None)."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def dataclass_from(cls: type, node: Any, **extra: Any) -> Any:
    """Build dataclass `cls` from a config node, rejecting unknown keys with a message that lists the known ones."""
    data = {**plain(node), **extra}
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for {cls.__name__}; known: {sorted(known)}")
    return cls(**data)


def server_client_config(cls: type, options: Mapping[str, Any], what: str, owner: str | None = None) -> Any:
    """Build the config dataclass `cls` of a client of model servers (a policy, the LLM judge) from a mapping: `url` is
    shorthand for `urls=[url]`; unknown keys are an error that names the known ones (`what` and `owner` name the
    client in it)."""
    d = dict(options)
    url = d.pop("url", None)
    if url and not d.get("urls"):
        d["urls"] = [url]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        where = f" for {owner}" if owner else ""
        raise ValueError(f"unknown {what} option(s) {unknown}{where}; known: url, {', '.join(sorted(known))}")
    return cls(**d)
